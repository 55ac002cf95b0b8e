"""Precision model: the error a call's output may carry, given its inputs' error and its own precision.

Two devices never compute bitwise alike: each kernel rounds in its own way, and the differences grow
through the network. This module tells that noise from a wrong kernel. For every compared call it bounds
the output's error by what its inputs' error propagates to (by the op's class: movement, additive,
multiplicative, matmul, activation, exponential, softmax, normalisation, reduction, cast) plus what the
call's own rounding allows (the unit roundoff ``u`` of the coarser side's dtype, or of the run's working
precision, times a per-class count), and compares the output's measured error with that bound.

Errors here are *scale-relative*: a statistic's difference over the bench tensor's largest magnitude (the
norm's over the bench norm), so a mean near zero does not make a tiny difference look large. All from the
statistics both dumps hold; no tensor is needed. The rule, its assumptions and its limits are in
docs/compare.md ("Precision model").
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.analysis.op_classes import (  # noqa: F401 - the model's vocabulary, re-exported for callers
    DESCRIBE,
    MOVEMENT_SAMPLING,
    OP_CLASS,
    OWN_ROUNDINGS,
    SHORT,
    UNIT_ROUNDOFF,
    op_class,
    unit_roundoff,
)

WITHIN, ANOMALOUS = "within precision", "anomalous"
_MASK = 1e30  # a statistic this large is a mask value (finfo.min), not data


def _col(t: Any, c: str, default: float = np.nan) -> np.ndarray:
    if c not in t:
        return np.full(len(t["match"]), default)
    a = np.asarray(t[c])
    if a.dtype.kind in "fiub":
        return a.astype(float, copy=False)
    return pd.to_numeric(pd.Series(a, dtype=object), errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def scale_relative_errors(t: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(error, scale, norm error, norm) per row. ``error``: the largest difference of max, min and mean over
    the bench tensor's largest magnitude ``scale``, or the norm's relative difference where larger; ``norm
    error``: |npu norm - bench norm| / bench norm. A masked tensor (a statistic of 1e30 or more: finfo.min,
    inf) is judged by its max alone and has no norm error."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bmax, bmin = _col(t, "bench_max"), _col(t, "bench_min")
        nmax, nmin = _col(t, "npu_max"), _col(t, "npu_min")
        amax, amin = np.abs(bmax), np.abs(bmin)
        masked = ~(amin < _MASK) | ~(amax < _MASK)
        scale = np.where(masked, np.where(amax < _MASK, amax, np.nan), np.fmax(amax, amin))
        err = np.zeros(len(scale))
        for s, n, b in (("max", nmax, bmax), ("min", nmin, bmin), ("mean", _col(t, "npu_mean"),
                                                                   _col(t, "bench_mean"))):
            ok = (np.abs(b) < _MASK) & (np.abs(n) < _MASK) & ~(masked & (s != "max"))
            err = np.fmax(err, np.where(ok & (scale > 0), np.abs(n - b) / scale, np.nan))
        nn_, bn = _col(t, "npu_norm"), _col(t, "bench_norm")
        en = np.where(~masked & (bn > 0), np.abs(nn_ - bn) / bn, np.nan)
        en = np.where(~masked & (bn == 0), np.where(nn_ == 0, 0.0, np.inf), en)
        err = np.fmax(err, en)
        zero = (scale == 0) & ~masked
        err = np.where(zero, np.where(np.fmax(np.abs(nmax), np.abs(nmin)) == 0, 0.0, np.inf), err)
    return err, scale, en, np.where(masked, np.nan, bn)


def _floor_u(u_row: np.ndarray, pair: np.ndarray, tensor: np.ndarray, floor: str) -> np.ndarray:
    """Per row, the unit roundoff of its side's working precision: the coarsest floating dtype that side
    computes in within the (step, rank) pair (``floor="auto"``), a named dtype, or none."""
    if floor == "none":
        return np.zeros(len(pair))
    if floor != "auto":
        name = floor if floor.startswith("torch.") else {v: k for k, v in SHORT.items()}.get(floor, floor)
        return np.full(len(pair), UNIT_ROUNDOFF[name])
    u = np.where(tensor, u_row, np.nan)
    if len(pair) and pair.min() == pair.max():  # one (step, rank) pair: no grouping
        return np.full(len(pair), np.nan_to_num(np.nanmax(u, initial=0.0) if (~np.isnan(u)).any() else 0.0))
    s = pd.Series(u).groupby(pair).max()
    return np.nan_to_num(s.reindex(pair).to_numpy(dtype=float), nan=0.0)


def _numel(shapes: np.ndarray) -> np.ndarray:
    codes, uniq = pd.factorize(np.asarray(shapes, dtype=object))
    n = np.array([float(np.prod(u)) if isinstance(u, tuple) else np.nan for u in uniq] + [np.nan])
    return n[codes]


def _last_dim(shapes: np.ndarray) -> np.ndarray:
    codes, uniq = pd.factorize(np.asarray(shapes, dtype=object))
    n = np.array([float(u[-1]) if isinstance(u, tuple) and len(u) else np.nan for u in uniq] + [np.nan])
    return n[codes]


_GROUPS: dict[Any, tuple] = {}  # codes array -> its sort order, during one assess() (reduceat beats .at)


def _groups(codes: np.ndarray) -> tuple:
    """(codes, stable sort order, start of each code's run in it, the codes present), cached."""
    g = _GROUPS.get(id(codes))
    if g is None or g[0] is not codes:
        order = np.argsort(codes, kind="stable")
        sc = codes[order]
        starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]]) if len(sc) else np.zeros(0, dtype=np.int64)
        g = _GROUPS[id(codes)] = (codes, order, starts, sc[starts])
    return g


def _by(codes: np.ndarray, n: int, values: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """Per call code, the max or sum of ``values`` (never negative) over rows in ``mask`` (0 where none)."""
    v = np.where(mask, np.nan_to_num(values, nan=0.0), 0.0)
    if how == "sum":
        return np.bincount(codes, weights=v, minlength=n)
    out = np.zeros(n)
    g = _groups(codes)
    if len(g[1]):
        out[g[3]] = np.maximum.reduceat(v[g[1]], g[2])
    return out


def _calls(t: Any, n: int) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row -> call code, number of calls, each call's first row, class, is-backward, forward call code)."""
    from .grading import _call_codes
    codes = _call_codes(t)
    nc = int(codes.max(initial=-1)) + 1
    g = _groups(codes)
    first = np.full(nc, n, dtype=np.int64)
    first[g[3]] = g[1][g[2]]  # a stable sort: the first row of each call
    calls = np.asarray(t["call"], dtype=object)
    op = np.asarray(t["op"], dtype=object) if "op" in t else np.full(n, "", dtype=object)
    ccall = calls[first]
    ocodes, uops = pd.factorize(pd.Series(op[first], dtype=object).fillna(""))
    by_op = np.array([op_class(str(o)) for o in uops] + ["other"], dtype=object)[ocodes]
    names = pd.Series(ccall, dtype=object)
    module = names.str.startswith(("Module.", "Cell.")).to_numpy(dtype=bool) if nc else np.zeros(0, dtype=bool)
    ccls = np.where(module, "composite", by_op).astype(object)
    cbwd = names.str.contains(".backward", regex=False).to_numpy(dtype=bool) if nc else np.zeros(0, dtype=bool)
    pair = np.asarray(t["pair"], dtype=np.int64) if "pair" in t else np.zeros(n, dtype=np.int64)
    return codes, nc, first, ccls, cbwd, _forward_codes(ccall, cbwd, pair[first])


def _propagate(e: np.ndarray, s: np.ndarray, codes: np.ndarray, nc: int, cl: np.ndarray, bw: np.ndarray,
               fwd: np.ndarray, is_in: np.ndarray, is_out: np.ndarray, x0: np.ndarray, op: np.ndarray,
               red: np.ndarray, sigma: np.ndarray, bmin: np.ndarray, arg: np.ndarray) -> np.ndarray:
    """What the inputs' errors ``e`` (relative to the scales ``s``) propagate to in each output row, by the
    class of its call (the rules of docs/compare.md, "Precision model")."""
    ae = e * s
    sum_ae, max_ae = _by(codes, nc, ae, is_in, "sum"), _by(codes, nc, ae, is_in, "max")
    sum_e, max_e = _by(codes, nc, e, is_in, "sum"), _by(codes, nc, e, is_in, "max")
    ae_norm = _by(codes, nc, ae / sigma, is_in, "max")
    out_e = _by(codes, nc, e, is_out, "max")
    x_ae = _by(codes, nc, ae, x0, "max")
    cached = _GROUPS.get(("scales", id(s)))  # what depends on the scales only: once per scale array
    if cached is None or cached[0] is not s:
        cached = _GROUPS[("scales", id(s))] = (s, _by(codes, nc, s, is_in, "max"), _by(
            codes, nc, np.where(bmin > 0, bmin, s), x0, "max"), _by(codes, nc, s, is_out, "max"), _by(
            codes, nc, s, is_in & (arg != "0"), "max"), _by(codes, nc, s, x0, "max"), _by(codes, nc, sigma, x0, "max"))
    max_s, min_pos, out_s, w_s, x_s, x_sigma = cached[1:]
    has_f = fwd >= 0
    fi = np.where(has_f, fwd, 0)
    f_e = np.where(has_f, np.fmax(max_e[fi], out_e[fi]), 0.0)
    f_ae = np.where(has_f, max_ae[fi], 0.0)
    f_out_ae = np.where(has_f, out_e[fi] * out_s[fi], 0.0)
    f_out_s = np.where(has_f, out_s[fi], 1.0)
    f_w_s = np.where(has_f & (w_s[fi] > 0), w_s[fi], 1.0)
    f_sigma = np.where(has_f & (x_sigma[fi] > 0), x_sigma[fi], 1.0)
    f_xs, f_xae = np.where(has_f, x_s[fi], 0.0), np.where(has_f, x_ae[fi], 0.0)
    oi = np.flatnonzero(is_out)  # the formulas are evaluated on output rows only
    rc = codes[oi]
    so = np.where(s[oi] > 0, s[oi], np.nan)
    opo, argo, redo = op[oi], arg[oi], red[oi]
    mv = max_ae[rc] / so
    prop_o = np.zeros(len(oi))
    clo, bwo = cl[rc], bw[rc]
    for c in set(pd.unique(clo)) - {"composite"}:
        for back in (False, True):
            k = np.flatnonzero((clo == c) & (bwo == back))
            if len(k):
                prop_o[k] = _rule(c, back, k, rc[k], so[k], mv[k], opo[k], argo[k], redo[k], locals())
    prop = np.full(len(e), np.nan)
    prop[oi] = np.where(s[oi] == 0, 0.0, np.where(clo == "composite", np.nan, prop_o))
    return prop


def _rule(c: str, back: bool, k: np.ndarray, rc: np.ndarray, so: np.ndarray, mv: np.ndarray, op: np.ndarray,
          arg: np.ndarray, red: np.ndarray, v: dict) -> np.ndarray:
    """One class's propagation rule on its output rows (``v``: the per-call aggregates of _propagate)."""
    sum_ae, max_ae, sum_e, max_s = v["sum_ae"][rc], v["max_ae"][rc], v["sum_e"][rc], v["max_s"][rc]
    if not back:
        if c in ("movement", "cast"):
            return mv
        if c == "additive":
            return sum_ae / so
        if c in ("multiplicative", "matmul"):
            return sum_e
        if c == "activation":
            return 1.13 * mv
        if c == "exponential":
            return max_ae
        if c == "root":
            return 0.5 * max_ae / v["min_pos"][rc]
        if c == "softmax":
            return np.where(np.isin(op, ("log_softmax", "_log_softmax", "logsumexp")), 2 * mv, 2 * max_ae)
        if c == "normalisation":
            return 2 * v["ae_norm"][rc] + sum_e
        if c == "reduction":
            spread = np.isin(op, ("var", "std", "var_mean", "norm", "linalg_vector_norm"))
            return np.where(np.isin(op, ("sum", "cumsum")), red * mv,
                            np.where(spread, 2 * max_s * mv * np.fmax(1.0, max_s / so), 2 * mv))
        return 2 * np.fmax(sum_ae / so, sum_e)
    f_e, f_ae = v["f_e"][rc], v["f_ae"][rc]
    g_mv = red * sum_ae / so
    # weight and bias gradients sum over the rows of the batch: cancellation there is the data's, not the op's
    rows_sum = red * (max_ae * v["f_xs"][rc] + max_s * v["f_xae"][rc]) / so
    if c in ("movement", "cast", "additive"):
        return g_mv
    if c == "multiplicative":
        return sum_e + f_e + g_mv
    if c == "matmul":
        return sum_e + f_e + np.where(arg != "0", rows_sum, 0.0)
    if c == "activation":
        return (1.13 * max_ae + max_s * f_ae) / so
    if c == "exponential":
        return sum_e + f_e + f_ae
    if c == "root":
        return sum_e + 2 * f_e
    if c == "softmax":
        return 2 * (v["f_out_s"][rc] * max_ae + max_s * v["f_out_ae"][rc]) / so + sum_e
    if c == "normalisation":
        ws, sg = v["f_w_s"][rc], v["f_sigma"][rc]
        return 3 * (ws / sg) * red * (max_ae + max_s * 2 * f_ae / sg) / so + np.where(arg != "0", rows_sum, 0.0)
    if c == "reduction":
        return sum_e + 2 * f_ae + g_mv
    return 2 * (sum_e + f_e) + g_mv


def assess(t: Any, tolerance: float = 3.0, floor: str = "auto") -> dict[str, np.ndarray]:
    """Per row of a compare table (dict of arrays or DataFrame): ``op_class``, ``precision`` (the coarser
    side's working precision, short name), ``inherited_err`` (what the inputs' error propagates to),
    ``own_err`` (output error beyond it), ``bound`` (inherited + the call's own rounding allowance),
    ``bound_ratio`` (output error / bound, the worse of the two channels: elementwise scale and norm) and
    ``verdict`` ('within precision', 'anomalous', or '' for rows not judged: inputs, values, unmatched rows,
    module calls). A row is anomalous when its ratio exceeds ``tolerance``."""
    try:
        return _assess(t, tolerance, floor)
    finally:
        _GROUPS.clear()


def _assess(t: Any, tolerance: float, floor: str) -> dict[str, np.ndarray]:
    from .grading import INPUT_IO, OUTPUT_IO
    n = len(t["match"])
    io = np.asarray(t["io"], dtype=object)
    op = np.asarray(t["op"], dtype=object) if "op" in t else np.full(n, "", dtype=object)
    arg = np.asarray(t["arg"], dtype=object) if "arg" in t else np.full(n, "0", dtype=object)
    uninit = np.asarray(t["uninitialised"], dtype=bool) if "uninitialised" in t else np.zeros(n, dtype=bool)
    tensor = (np.asarray(t["match"], dtype=object) == "matched") & np.asarray(t["comparable"], dtype=bool) \
        & (np.asarray(t["kind"], dtype=object) == "tensor") & ~uninit
    pair = np.asarray(t["pair"], dtype=np.int64) if "pair" in t else np.zeros(n, dtype=np.int64)
    codes, nc, first, ccls, cbwd, fwd = _calls(t, n)
    cl = ccls[codes]
    is_in = tensor & np.isin(io, INPUT_IO)
    is_out = tensor & np.isin(io, OUTPUT_IO)
    x0 = is_in & (arg == "0")
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        e, s, en, norm = scale_relative_errors(t)
        e = np.where((np.asarray(t["err"], dtype=float) == np.inf) & tensor, np.inf, e)
        un_row, ub_row = unit_roundoff(t["npu_dtype"]), unit_roundoff(t["bench_dtype"])
        u_n = np.fmax(np.nan_to_num(un_row), _floor_u(un_row, pair, tensor, floor))
        u_b = np.fmax(np.nan_to_num(ub_row), _floor_u(ub_row, pair, tensor, floor))
        numel = _numel(t["npu_shape"])
        in_numel = _by(codes, nc, numel, is_in, "max")
        red = np.fmax(1.0, in_numel[codes] / numel)  # elements reduced into one output element
        k_len = _by(codes, nc, _last_dim(t["npu_shape"]), x0, "max")
        # gradients of a weight (matmul) or of a lookup table (embedding) sum over the rows of the batch
        rows_g = np.nan_to_num(in_numel[codes] / k_len[codes], nan=1.0)
        sums = cbwd[codes] & (((cl == "matmul") & (arg != "0")) | np.isin(op, ("embedding", "index_select",
                                                                                  "gather", "index")))
        red = np.where(sums, np.fmax(red, rows_g), red)
        fk = np.where(fwd >= 0, k_len[np.where(fwd >= 0, fwd, 0)], np.nan)
        klen = np.where(cbwd[codes], np.fmax(fk[codes], red), np.where(cl == "reduction", red, k_len[codes]))
        k_own = pd.Series(cl).map(OWN_ROUNDINGS).to_numpy(dtype=float, na_value=np.nan)
        acc = np.where(np.isin(cl, ("matmul", "reduction", "softmax", "normalisation")),
                       np.sqrt(np.nan_to_num(klen, nan=1.0)) * 2.0 ** -23, 0.0)
        own_allow = k_own * (u_n + u_b) + acc
        nm, bm = _col(t, "bench_mean"), _col(t, "bench_min")
        sigma = np.sqrt(np.fmax(norm ** 2 / numel - nm ** 2, 0.0))
        sigma = np.where(sigma > 1e-3 * s, sigma, s)
        rms = norm / np.sqrt(numel)
        args = (codes, nc, ccls, cbwd, fwd, is_in, is_out, x0, op, red, sigma, bm, arg)
        # an input carries at least the error its producer may make, whatever its statistics show: the
        # producer's own allowance, then (a second pass) the producer's whole bound
        producers = _Producers(t, codes, nc, pair, ccls, is_in)
        floor_in = floor_own = producers.floor(own_allow, is_out)
        for _ in range(2):
            e_in = np.where(is_in, np.fmax(np.nan_to_num(e), floor_in), e)
            prop = _propagate(e_in, s, *args)
            bound = prop + own_allow
            floor_in = producers.floor(bound, is_out)
        # data movement computes nothing: a part of a tensor may show the error of any of its elements, which
        # its statistics only sample; it is allowed what reached the tensor along the chain of pass-through
        # calls behind it, and at least a few roundings of the working precision
        mv = np.isin(cl, ("movement", "cast")) & is_out
        if mv.any():
            chained = _by(codes, nc, producers.floor(bound, is_out, chain=True) * s, is_in, "max")[codes] / s
            bound = np.where(mv, np.fmax(bound, np.fmax(chained, MOVEMENT_SAMPLING * (u_n + u_b))), bound)
        # the norm channel: a systematic change (a scaled output, a wrong eps) moves the norm, noise hardly
        # does: n elements with independent errors of at most b move the norm by about b * scale / norm
        en_in = np.where(is_in, np.fmax(np.nan_to_num(en), np.sqrt(3.0) * floor_own * s / norm), en)
        prop_n = _propagate(en_in, rms, *args)
        # (the elementwise error level: what the inputs' observed errors propagate to, plus its own rounding)
        level = _propagate(np.where(is_in, np.nan_to_num(e), e), s, *args) + own_allow
        level = np.where(mv, bound, level)  # a part of a tensor: the sampling allowance of the max channel
        bound_n = prop_n + np.sqrt(3.0) * level * s / norm
        judged = is_out & (cl != "composite") & ~np.isnan(e) & ~np.isnan(bound)
        r1 = np.where(bound > 0, e / bound, np.where(e > 0, np.inf, 0.0))
        r2 = np.where(bound_n > 0, en / bound_n, np.where(en > 0, np.inf, 0.0))
        ratio = np.where(judged, np.fmax(r1, np.nan_to_num(r2)), np.nan)
        ratio = np.where(judged & np.isinf(prop), 0.0, ratio)  # an input already a hard mismatch: not judged
    verdict = np.where(judged, np.where(ratio > tolerance, ANOMALOUS, WITHIN), "").astype(object)
    inv = {v: SHORT[k] for k, v in UNIT_ROUNDOFF.items()}
    uu = np.fmax(u_n, u_b)
    codes_u, uniq_u = pd.factorize(uu)
    pname = np.array([inv.get(float(x), "") for x in uniq_u] + [""], dtype=object)[codes_u]
    return {"op_class": np.where(is_out, cl, "").astype(object),
            "precision": np.where(judged, pname, "").astype(object),
            "inherited_err": np.where(judged, prop, np.nan),
            "own_err": np.where(judged, np.fmax(e - np.nan_to_num(prop), 0.0), np.nan),
            "own_allowance": np.where(judged, own_allow, np.nan),
            "bound": np.where(judged, bound, np.nan),
            "bound_ratio": ratio, "verdict": verdict,
            "reduction_len": np.where(judged, klen, np.nan)}


class _Producers:
    """Who made each input: the producer's call code per row (-1: unknown), modules' parents, and the calls
    that pass their inputs through unchanged in precision (data movement, casts, modules), along which an
    input's floor is carried (a view of a view of a matmul's output carries the matmul's error)."""

    def __init__(self, t: Any, codes: np.ndarray, nc: int, pair: np.ndarray, ccls: np.ndarray, is_in: np.ndarray):
        n = len(codes)
        self.codes, self.nc, self.is_in = codes, nc, is_in
        calls = np.asarray(t["call"], dtype=object)
        first = np.full(nc, n, dtype=np.int64)
        np.minimum.at(first, codes, np.arange(n))
        key = pd.Series(np.arange(nc), index=pd.MultiIndex.from_arrays([pair[first], calls[first]]))
        key = key[~key.index.duplicated()]
        self.prod = np.full(n, -1, dtype=np.int64)
        if "producer" in t:
            prod = np.asarray(t["producer"], dtype=object)
            has = is_in & (prod != "")
            if has.any():
                got = key.reindex(pd.MultiIndex.from_arrays([pair[has], prod[has]])).to_numpy(dtype=float)
                self.prod[np.flatnonzero(has)] = np.where(np.isnan(got), -1, got).astype(np.int64)
        self.parent = np.full(nc, -1, dtype=np.int64)
        if "parent" in t:
            parent = np.asarray(t["parent"], dtype=object)[first]
            got = key.reindex(pd.MultiIndex.from_arrays([pair[first], parent])).to_numpy(dtype=float)
            self.parent = np.where(np.isnan(got), -1, got).astype(np.int64)
        self.through = np.isin(ccls, ("movement", "cast", "composite"))
        e = (self.prod >= 0) & self.through[codes] if nc else np.zeros(n, dtype=bool)
        self.edge_to, self.edge_from = codes[e], self.prod[e]

    def floor(self, per_row: np.ndarray, is_out: np.ndarray, chain: bool = False) -> np.ndarray:
        """Per input row, the largest ``per_row`` over its producer's outputs, carried through modules
        (their children's) and through pass-through calls (their producers'); 0 where unknown."""
        per_call = _by(self.codes, self.nc, per_row, is_out, "max")
        hp = self.parent >= 0
        for _ in range(4):
            np.maximum.at(per_call, self.parent[hp], per_call[hp])
        for _ in range(8 if chain else 0):
            if not len(self.edge_to):
                break
            before = per_call.copy()
            np.maximum.at(per_call, self.edge_to, per_call[self.edge_from])
            if np.array_equal(before, per_call):
                break
        return np.where(self.prod >= 0, per_call[np.where(self.prod >= 0, self.prod, 0)], 0.0)


def _forward_codes(ccall: np.ndarray, cbwd: np.ndarray, cpair: np.ndarray) -> np.ndarray:
    """For each call code, the code of its forward call in the same pair (-1 for forward calls or none)."""
    out = np.full(len(ccall), -1, dtype=np.int64)
    if not cbwd.any():
        return out
    b = np.flatnonzero(cbwd)
    names = pd.Series(ccall[b], dtype=object).str.replace(".backward", ".forward", regex=False).to_numpy(dtype=object)
    if len(cpair) and cpair.min() == cpair.max():  # one (step, rank) pair: an index of call names
        idx = pd.Index(pd.Series(ccall, dtype=object))
        if idx.is_unique:
            out[b] = idx.get_indexer(pd.Series(names, dtype=object))
            return out
    key: dict = {}
    for i, k in enumerate(zip(cpair.tolist(), ccall.tolist())):
        key.setdefault(k, i)
    out[b] = [key.get((p, c), -1) for p, c in zip(cpair[b].tolist(), names.tolist())]
    return out


# --------------------------------------------------------------------------------------------- verdicts
ASSESS_COLUMNS = ("op_class", "precision", "inherited_err", "own_err", "own_allowance", "bound", "bound_ratio",
                  "verdict", "reduction_len")
_METRIC_REASONS = ("NormRelativeErr", "One Thousandth Err Ratio", "Cosine drops", "(compared anyway)",
                   "diverges from the bench")


def noise_pairs(t: Any, verdict: np.ndarray, skip_ops: tuple[str, ...] = ()) -> np.ndarray:
    """The (step, rank) pairs whose runs differ by precision noise from their first difference on: the first
    API call that differs at all differs in its outputs only, in value (not only in dtype), and within
    precision. Pairs bitwise equal up to a call that differs beyond precision (a planted cause), or whose
    first difference is an argument, an input from outside or an extra call, keep the exact rule."""
    n = len(t["match"])
    if n == 0:
        return np.array([], dtype=np.int64)
    from .grading import OUTPUT_IO
    match = np.asarray(t["match"], dtype=object)
    calls = np.asarray(t["call"], dtype=object)
    api = ~pd.Series(calls).str.startswith(("Module.", "Cell.")).to_numpy(dtype=bool)
    err = np.asarray(t["err"], dtype=float)
    kind = np.asarray(t["kind"], dtype=object)
    uninit = np.asarray(t["uninitialised"], dtype=bool) if "uninitialised" in t else np.zeros(n, dtype=bool)
    op = np.asarray(t["op"], dtype=object) if "op" in t else np.full(n, "", dtype=object)
    dt_diff = (kind == "tensor") & (np.asarray(t["npu_dtype"], dtype=object) != np.asarray(t["bench_dtype"],
                                                                                          dtype=object))
    live = api & ~uninit & ~np.isin(op, np.array(skip_ops, dtype=object))
    with np.errstate(invalid="ignore"):
        diff = live & (match == "matched") & ((err > 0) | dt_diff)
    diff |= live & (match == "npu_only")
    pair = np.asarray(t["pair"], dtype=np.int64) if "pair" in t else np.zeros(n, dtype=np.int64)
    ci = np.asarray(t["call_index"], dtype=np.int64)
    idx = np.flatnonzero(diff)
    if len(idx) == 0:
        return np.array([], dtype=np.int64)
    order = idx[np.lexsort((ci[idx], pair[idx]))]
    firsts = order[np.r_[True, pair[order][1:] != pair[order][:-1]]]
    io = np.asarray(t["io"], dtype=object)
    out = []
    for i in firsts:
        p, c = pair[i], calls[i]
        rows = np.flatnonzero(diff & (pair == p) & (calls == c))
        ok = (match[rows] == "matched").all() and (kind[rows] == "tensor").all() \
            and np.isin(io[rows], OUTPUT_IO).all() and np.isfinite(err[rows]).all() \
            and (err[rows] > 0).any() and (verdict[rows] == WITHIN).all()
        if ok:
            out.append(int(p))
    return np.array(out, dtype=np.int64)


def precision_diverges(t: Any, diverges: np.ndarray, verdict: np.ndarray, noisy: np.ndarray) -> np.ndarray:
    """``diverges`` with the rows of noisy pairs replaced: there a row diverges when its call is anomalous
    (beyond precision) or it is a hard mismatch (shape, NaN/inf, a value that differs)."""
    pair = np.asarray(t["pair"], dtype=np.int64) if "pair" in t else np.zeros(len(diverges), dtype=np.int64)
    inp = np.isin(pair, noisy)
    if not inp.any():
        return diverges
    hard = (np.asarray(t["err"], dtype=float) == np.inf) & (np.asarray(t["match"], dtype=object) == "matched")
    if "npu_value" in t:  # a dtype argument that follows each side's precision (bf16 here, fp32 there)
        names = np.array(sorted(UNIT_ROUNDOFF), dtype=object)
        hard &= ~(np.isin(np.asarray(t["npu_value"], dtype=object), names)
                  & np.isin(np.asarray(t["bench_value"], dtype=object), names))
    return np.where(inp, (verdict == ANOMALOUS) | (hard & diverges), diverges)


def quiet_noise(result: np.ndarray, reasons: list, keep: np.ndarray) -> tuple[np.ndarray, list]:
    """Rows in ``keep`` lose the levels that only their metrics gave them (msprobe's metric rules, a dtype
    difference compared anyway): those reasons become notes, since the row is within precision."""
    from .grading import LEVELS
    result = np.asarray(result, dtype=object).copy()
    reasons = list(reasons)
    rank = {"note": 0, "warning": 1, "error": 2}
    for i in np.flatnonzero(keep & (result != "pass")):
        new, lvl = [], 0
        for r in reasons[i]:
            head, _, text = str(r).partition(": ")
            by_design = text.startswith("value differs: torch.") and " vs torch." in text  # a dtype argument
            if head in ("warning", "error") and (by_design or any(m in text for m in _METRIC_REASONS)):
                r = f"note: {text} (within precision)"
                head = "note"
            lvl = max(lvl, rank.get(head, 0))
            new.append(r)
        reasons[i] = new
        result[i] = LEVELS[lvl]
    return result, reasons


def describe(row: Any, tolerance: float) -> str:
    """The verdict of one output row with its figures, in words."""
    if str(row.get("verdict_by", "")).startswith("replay"):  # measured, not estimated (replay_verdicts)
        from .replay_verdicts import describe_replay
        return describe_replay(row, tolerance)
    cls = str(row.get("op_class", "other"))
    what = DESCRIBE.get(cls, "this op")
    k = row.get("reduction_len", np.nan)
    if cls in ("matmul", "softmax", "normalisation", "reduction") and k == k and k and k > 1:
        what += f" over {int(k)}"
    prec = row.get("precision", "") or "its"
    ratio, own, inh = float(row["bound_ratio"]), float(row["own_err"]), float(row["inherited_err"])
    allow = float(row.get("own_allowance", np.nan))
    own_x = own / allow if allow and allow == allow else np.inf
    if row.get("verdict") == ANOMALOUS:
        return (f"anomalous: own error {own:.3g} is {own_x:.3g}x what {prec} allows for {what} (inherited error "
                f"{inh:.3g}, bound {float(row['bound']):.3g}; output error {ratio:.3g}x the bound, tolerance "
                f"{tolerance:g}x): not precision noise")
    return f"within precision: output error {ratio:.3g}x its bound for {what} in {prec}"


def summary_line(t: Any) -> str:
    """One line: every call within precision (and the largest ratio, where), or the anomalous calls."""
    v = np.asarray(t["verdict"], dtype=object) if "verdict" in t else np.array([], dtype=object)
    judged = v != ""
    if not judged.any():
        return "no call judged by the precision model"
    ratio = np.asarray(t["bound_ratio"], dtype=float)
    calls = np.asarray(t["call"], dtype=object)
    prec = sorted({p for p in np.asarray(t["precision"], dtype=object)[judged] if p})
    pname = "/".join(prec) or "their"
    anom = judged & (v == ANOMALOUS)
    if anom.any():
        names = list(dict.fromkeys(calls[anom]))
        return f"{len(names)} call(s) beyond {pname} precision, first {names[0]}"
    i = int(np.nanargmax(np.where(judged, ratio, -1.0)))
    return f"every call within {pname} precision; largest output error {ratio[i]:.2g}x its bound at {calls[i]}"


@dataclass(frozen=True)
class Precision:
    """What a user can tune in the precision model (``compare(..., precision=Precision(tolerance=8))`` or a
    dict of these fields; ``precision=False`` keeps the exact rule alone)."""

    #: a call is anomalous when its output error exceeds this many times its bound
    tolerance: float = 3.0
    #: the working precision each side is assumed to compute in at least: "auto" (the coarsest floating
    #: dtype the side uses in the (step, rank) pair: a run under bf16 autocast rounds like bf16 even where a
    #: tensor is fp32), "none" (each tensor's own dtype), or a dtype ("bf16", "torch.float16", ...)
    floor: str = "auto"
    enabled: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)) or not self.tolerance > 0:
            raise ValueError(f"Precision.tolerance must be a positive number, got {self.tolerance!r}")
        names = set(UNIT_ROUNDOFF) | set(SHORT.values()) | {"auto", "none"}
        if self.floor not in names:
            raise ValueError(f"Precision.floor must be one of {sorted(names)}, got {self.floor!r}")

    @classmethod
    def of(cls, x: Any) -> Precision:
        if x is None or x is True:
            return cls()
        if x is False:
            return cls(enabled=False)
        if isinstance(x, cls):
            return x
        if isinstance(x, dict):
            unknown = sorted(set(x) - {f.name for f in fields(cls)})
            if unknown:
                raise ValueError(f"unknown precision options {unknown}; known: tolerance, floor, enabled")
            return cls(**x)
        raise ValueError(f"precision must be a Precision, a dict, True or False, got {type(x).__name__}")


def apply(t: dict, p: Precision, skip_ops: tuple[str, ...] = ()) -> np.ndarray:
    """Add the verdict columns to a compare table (dict of arrays) and return its noisy pairs; ``diverges``
    of those pairs follows the verdicts (the exact rule's, ``diverges_exact``, is kept)."""
    n = len(t["match"])
    if p.enabled:
        a = assess(t, p.tolerance, p.floor)
    else:  # the exact rule alone: no verdicts (the columns stay, empty)
        a = {k: np.full(n, "", dtype=object) if k in ("verdict", "precision", "op_class") else np.full(n, np.nan)
             for k in ASSESS_COLUMNS}
    for k, v in a.items():
        t[k] = v
    noisy = noise_pairs(t, a["verdict"], skip_ops) if p.enabled else np.array([], dtype=np.int64)
    t["diverges_exact"] = np.asarray(t["diverges"], dtype=bool).copy()
    t["diverges"] = precision_diverges(t, t["diverges_exact"], a["verdict"], noisy)
    return noisy
