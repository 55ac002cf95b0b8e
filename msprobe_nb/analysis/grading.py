"""Grading: pass / warning / error per row and per call, with every reason kept.

The rules follow msprobe's compare checkers (docs/compare.md lists them and where we differ); every
number they use is a field of :class:`Thresholds`. Call-level rules mark the output row that actually
breaks the rule, not the call's first output row.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from .metrics import STATS

LEVELS = ("pass", "warning", "error")
_LEVEL = {name: i for i, name in enumerate(LEVELS)}
INPUT_IO = ("input", "parameters")
OUTPUT_IO = ("output", "parameters_grad")


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the grading and first-divergence rules (override any field, or use ``.msprobe()``).

    Relative errors are fractions (0.5 = 50 %). Levels are ``"pass"``, ``"warning"`` or ``"error"``.
    """

    #: statistics mode: a call's inputs "agree" when their largest NormRelativeErr is below this ...
    norm_rel_input_ok: float = 0.1
    #: ... and then an output with NormRelativeErr above this is an error
    norm_rel_output_error: float = 0.5
    #: warning when the largest output NormRelativeErr is this many times the largest input one
    norm_rel_growth_warning: float = 10.0
    #: warning when the inputs are identical and an output NormRelativeErr exceeds this
    norm_rel_output_warning: float = 0.1
    #: tensor mode: inputs agree when their smallest One Thousandth Err Ratio is above this ...
    one_thousandth_input_ok: float = 0.9
    #: ... and then an output whose ratio is below this is an error (msprobe's code; its docs say 0.6)
    one_thousandth_output_error: float = 0.1
    #: tensor mode: inputs agree when their smallest Cosine is above this ...
    cosine_input_ok: float = 0.9
    #: ... and then an output whose Cosine is lower by more than this is a warning
    cosine_drop_warning: float = 0.1
    #: level of fp16/bf16/fp32 dtype differences (msprobe: error)
    dtype_mismatch_level: str = "warning"
    #: level of requires_grad differences
    requires_grad_level: str = "error"
    #: level of rows without a partner on the other side
    unmatched_level: str = "warning"
    #: a bench statistic is "~0" when |value| <= near_zero_rtol * max(|max|, |min|) of the bench tensor
    near_zero_rtol: float = 1e-2
    #: explain relative errors above this that come from a ~0 bench value
    near_zero_note_min: float = 0.01
    #: first divergence: a row diverges when its scale-aware relative error (column ``err``) exceeds this
    diverge_rtol: float = 1e-3
    #: ... except for rows of these dtypes, where it is this instead (about one or two units in the last place:
    #: a tolerance under a dtype's resolution would call every rounding difference a divergence); a row takes
    #: the larger tolerance of its two sides' dtypes
    diverge_rtol_by_dtype: tuple[tuple[str, float], ...] = (("torch.bfloat16", 1e-2), ("torch.float16", 2e-3))
    #: first divergence ignores these APIs (their outputs are uninitialised memory)
    diverge_skip_ops: tuple[str, ...] = ("empty", "empty_like", "empty_with_format", "new_empty_strided",
                                         "new_empty", "empty_strided")
    #: APIs whose output is a view of their first input: a view of uninitialised memory is not compared either
    view_ops: tuple[str, ...] = ("view", "view_as", "reshape", "reshape_as", "as_strided", "flatten", "unflatten",
                                 "t", "transpose", "permute", "squeeze", "unsqueeze", "narrow", "select", "split",
                                 "chunk", "unbind", "split_with_sizes", "expand", "expand_as", "__getitem__",
                                 "detach", "alias")
    #: (op, io, arg) of arguments that hold no value, only room for one: a collective's output buffer before the
    #: call, and the all-gather output buffer FSDP2's copy-in op returns fresh. They are never compared.
    buffer_args: tuple[tuple[str, str, str], ...] = (
        ("all_gather_single", "input", "0"), ("all_gather_into_tensor", "input", "0"),
        ("_all_gather_base", "input", "0"), ("reduce_scatter_single", "input", "0"),
        ("reduce_scatter_tensor", "input", "0"), ("_reduce_scatter_base", "input", "0"),
        ("all_to_all_single", "input", "0"), ("all_gather_copy_in", "output", "1"))
    #: APIs whose outputs are uninitialised or not numeric: no metric rule applies to them
    skip_ops: tuple[str, ...] = ("empty", "empty_like", "numpy", "to", "__setitem__", "empty_with_format",
                                 "new_empty_strided", "new_empty", "empty_strided")
    #: collectives whose inputs and outputs hold different data: input-vs-output rules are skipped
    skip_input_rules_ops: tuple[str, ...] = ("_reduce_scatter_base", "_all_gather_base", "all_to_all_single",
                                             "batch_isend_irecv", "reduce_scatter_tensor", "all_gather_into_tensor")

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(f.default, float) and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                 or v != v):
                raise ValueError(f"Thresholds.{f.name} must be a number, got {v!r}")
            if f.name == "diverge_rtol_by_dtype":
                pairs = dict(v) if isinstance(v, dict) else v
                if isinstance(pairs, dict):
                    pairs = tuple(pairs.items())
                ok = isinstance(pairs, (tuple, list)) and all(
                    isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str)
                    and isinstance(p[1], (int, float)) and not isinstance(p[1], bool) for p in pairs)
                if not ok:
                    raise ValueError(f"Thresholds.{f.name} must map dtype names to numbers, got {v!r}")
                object.__setattr__(self, f.name, tuple((str(d), float(r)) for d, r in pairs))
            elif f.name == "buffer_args":
                triples = isinstance(v, (tuple, list)) and all(
                    isinstance(p, (tuple, list)) and len(p) == 3 and all(isinstance(x, str) for x in p) for p in v)
                if not triples:
                    raise ValueError(f"Thresholds.{f.name} must be a tuple of (op, io, arg) names, got {v!r}")
                object.__setattr__(self, f.name, tuple(tuple(p) for p in v))
            elif isinstance(f.default, tuple) and not (isinstance(v, (tuple, list))
                                                       and all(isinstance(x, str) for x in v)):
                raise ValueError(f"Thresholds.{f.name} must be a tuple of op names, got {v!r}")
        for name in ("dtype_mismatch_level", "requires_grad_level", "unmatched_level"):
            if getattr(self, name) not in _LEVEL:
                raise ValueError(f"Thresholds.{name} must be one of {LEVELS}, got {getattr(self, name)!r}")

    def rtol_of(self, npu_dtype: Any, bench_dtype: Any) -> np.ndarray:
        """The first-divergence tolerance of each row, from its two sides' dtypes."""
        by = dict(self.diverge_rtol_by_dtype)
        n = pd.Series(np.asarray(npu_dtype, dtype=object)).map(by).to_numpy(dtype=float, na_value=np.nan)
        b = pd.Series(np.asarray(bench_dtype, dtype=object)).map(by).to_numpy(dtype=float, na_value=np.nan)
        d = self.diverge_rtol
        return np.maximum(np.where(np.isnan(n), d, n), np.where(np.isnan(b), d, b))

    @classmethod
    def msprobe(cls, **overrides: Any) -> Thresholds:
        """msprobe's own levels where ours differ (fp16/bf16/fp32 dtype differences are errors)."""
        return replace(cls(dtype_mismatch_level="error"), **overrides)

    @classmethod
    def fields(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def _pct(x: float) -> str:
    return "inf" if x == np.inf else f"{x * 100:.3g}%"


def _g(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (float, np.floating)) else str(x)


class _Reasons:
    """Collects (row, level, text) and folds them into levels and reason lists."""

    def __init__(self, n: int) -> None:
        self.level = np.zeros(n, dtype=np.int8)
        self.items: list[tuple[np.ndarray, list[str], int]] = []

    def add(self, mask_or_idx: np.ndarray, level: int | str, texts: Any) -> None:
        idx = np.flatnonzero(mask_or_idx) if mask_or_idx.dtype == bool else np.asarray(mask_or_idx, dtype=np.int64)
        if len(idx) == 0:
            return
        lvl = _LEVEL[level] if isinstance(level, str) else level
        if isinstance(texts, str):
            texts = [texts] * len(idx)
        elif callable(texts):
            texts = [texts(int(i)) for i in idx]
        prefix = {0: "note", 1: "warning", 2: "error"}[lvl]
        self.items.append((idx, [f"{prefix}: {t}" for t in texts], lvl))
        if lvl:
            np.maximum.at(self.level, idx, np.int8(lvl))

    def lists(self) -> list[list[str]]:
        gc_on = gc.isenabled()
        gc.disable()  # a million fresh lists would otherwise trigger full collections over the whole table
        try:
            out: list[list[str]] = [[] for _ in range(len(self.level))]
            for idx, texts, _ in self.items:
                for i, t in zip(idx.tolist(), texts):
                    out[i].append(t)
        finally:
            if gc_on:
                gc.enable()
        return out


def _nrows(t: Any) -> int:
    return len(t) if isinstance(t, pd.DataFrame) else len(next(iter(t.values()), ()))


def _arr(t: Any, col: str, default: Any = np.nan) -> np.ndarray:
    """A column of a DataFrame or of a dict of numpy arrays, missing values replaced by ``default``."""
    if col not in t:
        return np.full(_nrows(t), default, dtype=object if not isinstance(default, float) else float)
    s = t[col]
    if not isinstance(s, pd.Series):
        a = np.asarray(s)
        return a.astype(float) if isinstance(default, float) else a
    if isinstance(default, float):
        return pd.to_numeric(s, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return s.to_numpy(dtype=object, na_value=default)


def _shape_differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    codes, _ = pd.factorize(np.concatenate([a, b]))
    return codes[: len(a)] != codes[len(a):]


def grade(t: Any, mode: str, th: Thresholds) -> tuple[np.ndarray, list[list[str]]]:
    """Grade every row of a compare table (DataFrame or dict of arrays); returns (results, reason lists)."""
    n = _nrows(t)
    r = _Reasons(n)
    match = _arr(t, "match", "")
    matched = match == "matched"
    kind = _arr(t, "kind", "")
    io = _arr(t, "io", "")
    op = _arr(t, "op", "")
    skip = np.isin(op, np.array(th.skip_ops, dtype=object))
    live = matched & ~skip & ~_arr(t, "uninitialised", False).astype(bool)  # garbage memory: no rule applies
    tensor = live & (kind == "tensor")

    note = _arr(t, "match_note", "")
    r.add(match == "npu_only", th.unmatched_level, lambda i: note[i] or "no bench row matched")
    r.add(match == "bench_only", th.unmatched_level, "bench row without an NPU counterpart")

    nk, bk = _arr(t, "npu_kind", ""), _arr(t, "bench_kind", "")
    kind_diff = live & (nk != bk)
    r.add(kind_diff, "error", lambda i: f"kind differs: NPU {nk[i]}, bench {bk[i]} (not compared)")
    nd, bd = _arr(t, "npu_dtype", ""), _arr(t, "bench_dtype", "")
    comparable = _arr(t, "comparable", False).astype(bool)
    bad_dtype = live & ~kind_diff & ~comparable
    r.add(bad_dtype, "error", lambda i: f"dtype differs: {nd[i]} vs {bd[i]} (not compared, bench shown as N/A)")
    soft_dtype = tensor & comparable & (nd != bd)
    r.add(soft_dtype, th.dtype_mismatch_level, lambda i: f"dtype differs: {nd[i]} vs {bd[i]} (compared anyway)")
    ns, bs = _arr(t, "npu_shape", None), _arr(t, "bench_shape", None)
    shape_diff = tensor & comparable & _shape_differs(ns, bs)
    r.add(shape_diff, "error", lambda i: f"shape differs: {list(ns[i] or ())} vs {list(bs[i] or ())}")
    nrg, brg = _arr(t, "npu_requires_grad", None), _arr(t, "bench_requires_grad", None)
    rg_diff = tensor & np.array([a is not None and b is not None and bool(a) != bool(b) for a, b in zip(nrg, brg)],
                                dtype=bool)
    r.add(rg_diff, th.requires_grad_level, lambda i: f"requires_grad differs: NPU {nrg[i]}, bench {brg[i]}")

    ok = tensor & comparable
    nmax, nmin, bmax, bmin = (_arr(t, c) for c in ("npu_max", "npu_min", "bench_max", "bench_min"))
    n_bad = ~np.isfinite(nmax) | ~np.isfinite(nmin)
    b_bad = ~np.isfinite(bmax) | ~np.isfinite(bmin)
    # NaN in max/min also means "not recorded" for some dtypes: only count rows where a side has numbers
    recorded = ~(np.isnan(nmax) & np.isnan(nmin) & np.isnan(bmax) & np.isnan(bmin))
    npu_only_bad = ok & recorded & n_bad & ~b_bad
    bench_only_bad = ok & recorded & b_bad & ~n_bad
    r.add(npu_only_bad, "error",
          lambda i: f"NaN/inf in the NPU tensor (max {_g(nmax[i])}, min {_g(nmin[i])}), not in the bench one")
    r.add(bench_only_bad, "warning",
          lambda i: f"NaN/inf in the bench tensor (max {_g(bmax[i])}, min {_g(bmin[i])}), not in the NPU one")
    if "npu_nan_count" in t:
        cnt = {k: _arr(t, k) for k in ("npu_nan_count", "bench_nan_count", "npu_inf_count", "bench_inf_count")}
        known = ~np.isnan(cnt["npu_nan_count"]) & ~np.isnan(cnt["bench_nan_count"])
        known_i = ~np.isnan(cnt["npu_inf_count"]) & ~np.isnan(cnt["bench_inf_count"])
        differ = (known & (cnt["npu_nan_count"] != cnt["bench_nan_count"])) | (
            known_i & (cnt["npu_inf_count"] != cnt["bench_inf_count"]))
        r.add(ok & differ & ~npu_only_bad & ~bench_only_bad, "error", lambda i: (
            f"NaN/inf counts differ: NPU {_g(cnt['npu_nan_count'][i])} NaN {_g(cnt['npu_inf_count'][i])} inf, "
            f"bench {_g(cnt['bench_nan_count'][i])} NaN {_g(cnt['bench_inf_count'][i])} inf"))
    nim = _arr(t, "nan_inf_match", None)
    r.add(ok & np.array([v is False for v in nim], dtype=bool), "error",
          "NaN/inf positions (or signs) differ between NPU and bench")

    nv, bv = _arr(t, "npu_value", ""), _arr(t, "bench_value", "")
    val_diff = live & (kind == "value") & comparable & (nv != bv)
    r.add(val_diff, "error", lambda i: f"value differs: {nv[i]} vs {bv[i]}")
    nh, bh = _arr(t, "npu_hash", ""), _arr(t, "bench_hash", "")
    if mode == "md5":
        has = ok & (nh != "") & (bh != "")
        r.add(has & (nh != bh), "error", lambda i: f"content hash differs: {nh[i]} vs {bh[i]}")
        r.add(ok & ((nh == "") != (bh == "")), "warning", "content hash recorded on one side only")

    _near_zero_notes(t, r, ok & ~shape_diff, th)
    tmsg = _arr(t, "tensor_messages", None)
    status = _arr(t, "tensor_status", "")
    nodata = ok & (status == "nodata")
    r.add(nodata, "warning", lambda i: "not compared: " + (tmsg[i][0] if tmsg[i] else "no tensor data"))
    bad_file = ok & (status == "file")
    r.add(bad_file, "error", lambda i: "tensor file contradicts the dump (" + "; ".join(tmsg[i] or []) + ")")
    for i in np.flatnonzero(ok & ~nodata & ~bad_file):
        if tmsg[i]:
            r.add(np.full(len(tmsg[i]), i, dtype=np.int64), 0, list(tmsg[i]))  # every message, not the first

    call_ok = ok & ~shape_diff & ~bad_dtype
    if mode == "statistics":
        _stats_call_rules(t, r, call_ok, io, op, th)
    elif mode == "tensor":
        _tensor_call_rules(t, r, call_ok, io, op, th)
    return np.array(LEVELS, dtype=object)[r.level], r.lists()


def near_zero_bits(t: Any) -> np.ndarray:
    """The ``near_zero`` labels ('mean', 'max,mean', ...) as bit masks (1 max, 2 min, 4 mean, 8 norm)."""
    if "near_zero" not in t:
        return np.zeros(_nrows(t), dtype=np.int64)
    codes, uniq = pd.factorize(_arr(t, "near_zero", ""))
    bits = np.array([sum(1 << b for b, s in enumerate(STATS) if s in str(u).split(",")) for u in uniq] or [0],
                    dtype=np.int64)
    return bits[codes]


def _near_zero_notes(t: Any, r: _Reasons, ok: np.ndarray, th: Thresholds) -> None:
    if "near_zero" not in t:
        return
    near = near_zero_bits(t)
    label = {"max": "MaxRelativeErr", "min": "MinRelativeErr", "mean": "MeanRelativeErr", "norm": "NormRelativeErr"}
    for bit, s in enumerate(STATS):
        rel = _arr(t, f"{s}_rel")
        m = ok & ((near & (1 << bit)) > 0) & (rel > th.near_zero_note_min)
        if not m.any():
            continue
        b, d = _arr(t, f"bench_{s}"), _arr(t, f"{s}_diff")
        scale = np.fmax(np.abs(_arr(t, "bench_max")), np.abs(_arr(t, "bench_min")))
        r.add(m, 0, lambda i, s=s, b=b, d=d, rel=rel, scale=scale: (
            f"{label[s]} {_pct(rel[i])} is not meaningful: bench {s} {_g(b[i])} is ~0 next to the tensor's "
            f"largest magnitude {_g(scale[i])}; |{s} diff| = {_g(abs(d[i]))}"))


def _call_codes(t: Any) -> np.ndarray:
    pair = np.asarray(t["pair"], dtype=np.int64) if "pair" in t else np.zeros(_nrows(t), dtype=np.int64)
    cc, _ = pd.factorize(_arr(t, "call", ""))
    codes, _ = pd.factorize(pair * (int(cc.max(initial=0)) + 1) + cc)
    return codes


def _group_reduce(codes: np.ndarray, values: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """Per-call max/min of ``values`` over rows in ``mask`` (NaN for calls without such rows)."""
    out = np.full(int(codes.max(initial=-1)) + 1, np.nan)
    v = np.where(mask, values, np.nan)
    s = pd.Series(v).groupby(codes).max() if how == "max" else pd.Series(v).groupby(codes).min()
    out[s.index.to_numpy()] = s.to_numpy()
    return out


def _arg_extreme(codes: np.ndarray, values: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """Per-call row index holding the max/min of ``values`` among ``mask`` rows (-1 when none)."""
    ncode = int(codes.max(initial=-1)) + 1
    best = np.full(ncode, -1, dtype=np.int64)
    idx = np.flatnonzero(mask & ~np.isnan(values))
    if len(idx) == 0:
        return best
    v = values[idx] if how == "max" else -values[idx]
    order = np.lexsort((-idx, v, codes[idx]))  # per code ascending value; last one wins (first row on ties)
    c_sorted = codes[idx][order]
    last = np.r_[c_sorted[1:] != c_sorted[:-1], True]
    best[c_sorted[last]] = idx[order][last]
    return best


def _stats_call_rules(t: Any, r: _Reasons, ok: np.ndarray, io: np.ndarray, op: np.ndarray,
                      th: Thresholds) -> None:
    codes = _call_codes(t)
    norm = _arr(t, "norm_rel")
    near = near_zero_bits(t)
    # an all-zero bench tensor makes NormRelativeErr inf: use the error relative to the NPU norm instead
    zero_b = ok & ((near & 8) > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        norm = np.where(zero_b, np.abs(_arr(t, "norm_diff")) / np.abs(_arr(t, "npu_norm")), norm)
    use_in = ok & np.isin(io, INPUT_IO) & ~np.isin(op, np.array(th.skip_input_rules_ops, dtype=object))
    is_out = ok & np.isin(io, OUTPUT_IO)
    in_max = _group_reduce(codes, norm, use_in, "max")
    has_in = ~np.isnan(in_max)
    row_in = in_max[codes]
    err_rows = is_out & has_in[codes] & (row_in < th.norm_rel_input_ok) & (norm > th.norm_rel_output_error)
    r.add(err_rows, "error", lambda i: (
        f"NormRelativeErr of this output {_pct(float(norm[i]))} > {_pct(th.norm_rel_output_error)} while the inputs "
        f"agree (largest input NormRelativeErr {_pct(row_in[i])})"))
    worst = _arg_extreme(codes, norm, is_out, "max")
    for c in np.flatnonzero((worst >= 0) & has_in):
        i = int(worst[c])
        o, a = norm[i], in_max[c]
        with np.errstate(divide="ignore", invalid="ignore"):  # inf / inf: no growth to speak of
            growth = o / a if a > 0 else np.nan
        if (a > 0 and growth > th.norm_rel_growth_warning) or (a == 0 and o > th.norm_rel_output_warning):
            why = (f"{growth:.3g}x the largest input's ({_pct(a)})" if a > 0
                   else f"above {_pct(th.norm_rel_output_warning)} while the inputs are identical")
            r.add(np.array([i]), "warning", f"NormRelativeErr of this output ({_pct(o)}) is {why}")


def _tensor_call_rules(t: Any, r: _Reasons, ok: np.ndarray, io: np.ndarray, op: np.ndarray,
                       th: Thresholds) -> None:
    codes = _call_codes(t)
    use_in = ok & np.isin(io, INPUT_IO) & ~np.isin(op, np.array(th.skip_input_rules_ops, dtype=object))
    is_out = ok & np.isin(io, OUTPUT_IO)
    ratio = _arr(t, "one_thousandth")
    in_min = _group_reduce(codes, ratio, use_in, "min")[codes]
    bad = is_out & (in_min > th.one_thousandth_input_ok) & (ratio < th.one_thousandth_output_error)
    r.add(bad, "error", lambda i: (
        f"One Thousandth Err Ratio of this output {ratio[i]:.4g} < {th.one_thousandth_output_error} while the "
        f"inputs agree (smallest input ratio {in_min[i]:.4g})"))
    cos = _arr(t, "cosine")
    cin = _group_reduce(codes, cos, use_in, "min")
    worst = _arg_extreme(codes, cos, is_out, "min")
    for c in np.flatnonzero(worst >= 0):
        i = int(worst[c])
        if cin[c] > th.cosine_input_ok and cin[c] - cos[i] > th.cosine_drop_warning:
            r.add(np.array([i]), "warning", f"Cosine drops from {cin[c]:.6g} (inputs) to {cos[i]:.6g} (this output)")


def summarize_calls(t: pd.DataFrame) -> pd.DataFrame:
    """One row per call: worst result, every reason (prefixed by the row's io.arg), counts and errors."""
    if t.empty:
        return pd.DataFrame(columns=["step", "rank", "call_index", "call", "result", "reasons", "rows",
                                     "unmatched", "worst_row", "err", "input_err", "output_err"])
    codes = _call_codes(t)
    lvl = t["result"].map(_LEVEL).to_numpy(dtype=np.int64)
    err = _arr(t, "err")
    io = _arr(t, "io", "")
    key = lvl + np.arctan(np.where(np.isnan(err), -1.0, err)) / np.pi  # level first, then error
    worst = _arg_extreme(codes, key, np.ones(len(t), dtype=bool), "max")
    first = np.full(len(worst), len(t), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(t)))
    g = pd.Series(lvl).groupby(codes)
    names = _arr(t, "name", "")
    calls = _arr(t, "call", "")
    reasons: list[list[str]] = [[] for _ in range(len(worst))]
    for i, rs in enumerate(t["reasons"].tolist()):
        if rs:
            tag = names[i][len(calls[i]) + 1:] if names[i].startswith(calls[i]) else names[i]
            lst = reasons[codes[i]]
            for x in rs:
                item = f"{tag}: {x}"
                if item not in lst:
                    lst.append(item)
    unmatched = pd.Series(t["match"].to_numpy() != "matched").groupby(codes).sum().to_numpy()
    in_err = _group_reduce(codes, err, np.isin(io, INPUT_IO), "max")
    out_err = _group_reduce(codes, err, np.isin(io, OUTPUT_IO), "max")
    out = pd.DataFrame({
        "step": t["step"].to_numpy()[first],
        "rank": t["rank"].to_numpy()[first],
        "call_index": t["call_index"].to_numpy()[first],
        "call": calls[first],
        "result": np.array(LEVELS, dtype=object)[g.max().to_numpy()],
        "reasons": reasons,
        "rows": g.size().to_numpy(),
        "unmatched": unmatched,
        "worst_row": names[worst],
        "err": _group_reduce(codes, err, np.ones(len(t), dtype=bool), "max"),
        "input_err": in_err,
        "output_err": out_err,
    })
    return out.iloc[np.argsort(first, kind="stable")].reset_index(drop=True)  # table order: execution order
