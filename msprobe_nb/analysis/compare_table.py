"""The compare table's columns: both sides' fields side by side, their metrics, ``err`` and ``diverges``.

``compare()`` (compare.py) matches the rows and hands the match here; this module builds one array per
column (vectorised: distinct values are converted once), computes the statistics or tensor metrics, and
decides which rows diverge (docs/compare.md, "err and diverges"). The grading is grading.py's.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.capture.random_apis import INPLACE_DRAWS
from msprobe_nb.progress import bar

from . import metrics as M
from .grading import Thresholds
from .matching import parse_calls


def _obj(s: pd.Series, na: Any = "") -> np.ndarray:
    return s.to_numpy(dtype=object, na_value=na)


def _take(a: np.ndarray, idx: np.ndarray, fill: Any) -> np.ndarray:
    ok = idx >= 0
    out = np.full(len(idx), fill, dtype=a.dtype if a.dtype != object else object)
    out[ok] = a[idx[ok]]
    return out


def _shape(x: Any) -> tuple | None:
    return tuple(int(v) for v in x) if isinstance(x, (list, tuple, np.ndarray)) else None


def _shapes(s: pd.Series) -> np.ndarray:
    """Shapes as tuples (None for non-tensors), converting each distinct shape once."""
    a = s.to_numpy(dtype=object)
    try:
        codes, uniq = pd.factorize(a)
    except TypeError:  # unhashable lists
        return np.array([_shape(x) for x in a] + [None], dtype=object)[:-1]
    norm = np.array([_shape(x) for x in uniq] + [None], dtype=object)
    return norm[codes]  # code -1 (missing) picks the trailing None


def shape_differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise ``a[i] != b[i]`` for arrays of shape tuples (None == None)."""
    codes, _ = pd.factorize(np.concatenate([a, b]))
    return codes[: len(a)] != codes[len(a):]


def _bools(s: pd.Series) -> np.ndarray:
    if isinstance(s.dtype, pd.BooleanDtype):
        return s.to_numpy(dtype=object, na_value=None)
    a = s.to_numpy(dtype=object)
    return np.array([None if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)) else bool(x)
                     for x in a] + [None], dtype=object)[:-1]


def _ops(df: pd.DataFrame) -> np.ndarray:
    op = _obj(df["op"]).copy()  # a copy: to_numpy may hand out the frame's own array, which is the caller's
    empty = op == ""
    if empty.any():
        calls = _obj(df["call"])
        codes, uniq = pd.factorize(calls[empty])
        base, _, _ = parse_calls(uniq.astype(object))
        derived = np.array([b.split(".")[-2] if b.count(".") >= 2 else b for b in base] + [""], dtype=object)[:-1]
        op[empty] = derived[codes]
    return op


def _values(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(python value as text, numeric value or NaN, value is numeric) for value rows (text '' elsewhere)."""
    kind = _obj(df["kind"])
    text = np.where(kind == "value", _obj(df["value"]), "").astype(object)
    num = np.full(len(df), np.nan)
    isnum = np.zeros(len(df), dtype=bool)
    rows = np.flatnonzero(kind == "value")
    if len(rows):
        codes, uniq = pd.factorize(text[rows])
        parsed = [_parse_value(u) for u in uniq]
        shown = np.array([p[0] for p in parsed] + [""], dtype=object)[:-1]
        nums = np.array([p[1] for p in parsed] + [np.nan], dtype=float)[:-1]
        text[rows] = shown[codes]
        num[rows] = nums[codes]
        isnum[rows] = ~np.isnan(nums[codes]) | np.array([p[2] for p in parsed] + [False])[:-1][codes]
    return text, num, isnum


def _parse_value(s: str) -> tuple[str, float, bool]:
    try:
        v = json.loads(s) if s else None
    except (TypeError, ValueError):
        return s, math.nan, False
    if isinstance(v, bool) or v is None:
        return str(v), math.nan, False
    if isinstance(v, (int, float)):
        return str(v), float(v), True
    return str(v), math.nan, False


# --------------------------------------------------------------------------------------------- table
def build_table(nc: pd.DataFrame, bc: pd.DataFrame, m: Any, mode: str, th: Thresholds) -> dict[str, np.ndarray]:
    ni, bi = m.npu_idx, m.bench_idx
    has_n, has_b = ni >= 0, bi >= 0
    match = np.where(has_n & has_b, "matched", np.where(has_n, "npu_only", "bench_only")).astype(object)
    cols: dict[str, Any] = {}

    def both(col: str, conv: Any, fill: Any) -> tuple[np.ndarray, np.ndarray]:
        return _take(conv(nc[col]), ni, fill), _take(conv(bc[col]), bi, fill)

    def pick(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(has_n, a, b)

    n_step, b_step = both("step", lambda s: s.to_numpy(dtype=np.int64), -1)
    n_rank, b_rank = both("rank", lambda s: s.to_numpy(dtype=np.int64), -1)
    pairs = m.pairs
    pair_step, pair_rank = pairs["step"].to_numpy(np.int64), pairs["rank"].to_numpy(np.int64)
    cols["step"] = np.where(has_n, n_step, pair_step[m.pair])
    cols["rank"] = np.where(has_n, n_rank, pair_rank[m.pair])
    n_ci, b_ci = both("call_index", lambda s: s.to_numpy(dtype=np.int64), -1)
    cols["call_index"] = n_ci
    n_call, b_call = both("call", _obj, "")
    n_name, b_name = both("name", _obj, "")
    cols["call"], cols["name"] = pick(n_call, b_call), pick(n_name, b_name)
    for c in ("io", "arg"):
        a, b = both(c, _obj, "")
        cols[c] = pick(a, b)
    n_kind, b_kind = both("kind", _obj, "")
    cols["kind"] = pick(n_kind, b_kind)
    cols["match"] = match
    cols["bench_step"] = np.where(has_b, b_step, pairs["bench_step"].to_numpy(np.int64)[m.pair])
    cols["bench_rank"] = np.where(has_b, b_rank, pairs["bench_rank"].to_numpy(np.int64)[m.pair])
    cols["bench_call_index"] = b_ci
    cols["bench_call"], cols["bench_name"] = b_call, b_name
    cols["pair"] = m.pair
    cols["op"] = pick(_take(_ops(nc), ni, ""), _take(_ops(bc), bi, ""))
    cols["npu_kind"], cols["bench_kind"] = n_kind, b_kind
    n_dt, b_dt = both("dtype", _obj, "")
    cols["npu_dtype"], cols["bench_dtype"] = n_dt, b_dt
    cols["npu_shape"], cols["bench_shape"] = both("shape", _shapes, None)
    cols["npu_requires_grad"], cols["bench_requires_grad"] = both("requires_grad", _bools, None)

    nv_text, nv_num, nv_isnum = (_take(a, ni, f) for a, f in zip(_values(nc), ("", np.nan, False)))
    bv_text, bv_num, bv_isnum = (_take(a, bi, f) for a, f in zip(_values(bc), ("", np.nan, False)))
    stats_n, stats_b = {}, {}
    for s in M.STATS:
        a, b = both(s, lambda x: x.to_numpy(dtype=float, na_value=np.nan), np.nan)
        stats_n[s] = np.where(n_kind == "value", nv_num, a)
        stats_b[s] = np.where(b_kind == "value", bv_num, b)
    for side, st in (("npu", stats_n), ("bench", stats_b)):
        for s in M.STATS:
            cols[f"{side}_{s}"] = st[s]
    num = lambda x: x.to_numpy(dtype=float, na_value=np.nan)  # noqa: E731
    cols["npu_nan_count"], cols["bench_nan_count"] = both("nan_count", num, np.nan)
    n_inf = num(nc["posinf_count"]) + num(nc["neginf_count"])
    b_inf = num(bc["posinf_count"]) + num(bc["neginf_count"])
    cols["npu_inf_count"], cols["bench_inf_count"] = _take(n_inf, ni, np.nan), _take(b_inf, bi, np.nan)
    n_vt, b_vt = both("value_type", _obj, "")
    cols["npu_value_type"], cols["bench_value_type"] = n_vt, b_vt
    cols["npu_value"], cols["bench_value"] = nv_text, bv_text
    if mode == "md5" or (nc["hash"].fillna("") != "").any() or (bc["hash"].fillna("") != "").any():
        cols["npu_hash"], cols["bench_hash"] = both("hash", _obj, "")
    if mode == "tensor":
        cols["npu_data_name"], cols["bench_data_name"] = both("data_name", _obj, "")
    cols["npu_stack_id"] = _take(nc["stack_id"].to_numpy(dtype=np.int64), ni, -1)
    cols["producer"] = _take(_obj(nc["producer"]), ni, "")
    cols["bench_producer"] = _take(_obj(bc["producer"]), bi, "")
    cols["tensor_id"] = _take(nc["tensor_id"].to_numpy(dtype=float, na_value=np.nan), ni, np.nan)
    cols["parent"] = _take(_obj(nc["parent"]), ni, "")
    cols["npu_rng_state"], cols["bench_rng_state"] = both("rng_state", _obj, "")

    matched = match == "matched"
    tensor_ok = M.tensor_dtype_ok(n_dt, b_dt)
    comparable = matched & (n_kind == b_kind) & np.where(
        n_kind == "tensor", tensor_ok, np.where(n_kind == "value", n_vt == b_vt, True))
    cols["comparable"] = comparable
    notes = np.full(len(ni), "", dtype=object)
    for i, v in m.notes_by_row.items():
        notes[i] = v
    cols["match_note"] = notes

    vals = matched & (n_kind == "value") & (b_kind == "value")
    same = vals & (nv_text == bv_text)
    differ = vals & ~same & ~(nv_isnum & bv_isnum)
    sm = M.stats_metrics(stats_n, stats_b, same=same, differ=differ, near_zero_rtol=th.near_zero_rtol)
    off = ~comparable
    for s in M.STATS:
        cols[f"{s}_diff"] = np.where(off, np.nan, sm[f"{s}_diff"])
    for s in M.STATS:
        cols[f"{s}_rel"] = np.where(off, np.nan, sm[f"{s}_rel"])
    near = np.where(off | (n_kind != "tensor"), 0, sm["near_zero"])
    cols["near_zero"] = M.near_zero_labels(near)
    cols["err"] = np.where(matched, np.where(off, np.inf, sm["err"]), np.nan)
    return cols


def result_frame(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """The result table; text columns stay object dtype (no per-column string inference on big tables)."""
    return pd.DataFrame({k: pd.Series(v, dtype=object, copy=False) if v.dtype == object else v
                         for k, v in cols.items()}, copy=False)


def add_tensor_metrics(t: dict[str, np.ndarray], nd: Any, bd: Any, th: Thresholds, progress: bool | None) -> None:
    n = len(t["match"])
    out = {c: np.full(n, np.nan) for c in M.TENSOR_COLUMNS}
    nim = np.full(n, None, dtype=object)
    status = np.full(n, "", dtype=object)
    msgs = np.full(n, None, dtype=object)
    comparable, kind = t["comparable"], t["kind"]
    todo = np.flatnonzero(comparable & (kind == "tensor"))
    ndn, bdn = t["npu_data_name"], t["bench_data_name"]
    steps, ranks = (t["step"], t["bench_step"]), (t["rank"], t["bench_rank"])
    it = bar(todo, desc="comparing tensors", unit="tensor", minimum=100, explicit=progress)
    for i in it:
        if not ndn[i] or not bdn[i]:
            status[i] = M.ST_NODATA
            msgs[i] = ["no tensor data recorded for this row"]
            continue
        try:
            a = _load_tensor(nd, ndn[i], steps[0][i], ranks[0][i])
            b = _load_tensor(bd, bdn[i], steps[1][i], ranks[1][i])
        except Exception as e:  # noqa: BLE001 - a missing or unreadable file must not stop the compare
            status[i] = M.ST_NODATA
            msgs[i] = [f"tensor data unavailable: {type(e).__name__}: {e}"]
            continue
        why = [f"{side}: {w}" for side, x, k in (("NPU", a, "npu"), ("bench", b, "bench"))
               if (w := M.file_contradiction(x, t[f"{k}_shape"][i], t[f"{k}_max"][i], t[f"{k}_min"][i]))]
        if why:  # not the tensor the dump describes: no metric of it means anything
            status[i], msgs[i] = M.ST_FILE, why
            continue
        r = M.tensor_metrics(a, b, near_zero_rtol=th.near_zero_rtol)
        for c in M.TENSOR_COLUMNS:
            out[c][i] = r[c]
        nim[i], status[i], msgs[i] = r["nan_inf_match"], r["status"], r["messages"] or None
    for c in M.TENSOR_COLUMNS:
        t[c] = out[c]
    t["nan_inf_match"] = nim
    t["tensor_status"] = status
    t["tensor_messages"] = msgs


def _load_tensor(dump: Any, data_name: str, step: int, rank: int) -> Any:
    direct = getattr(dump, "load_array", None) or getattr(dump, "load_tensor", None)  # straight to the file
    if direct is not None:
        return direct(data_name, step=int(step), rank=int(rank))
    try:
        return dump.tensor(data_name, step=int(step), rank=int(rank))
    except TypeError:
        return dump.tensor(data_name)


def nonfinite_counts_differ(t: Any) -> np.ndarray:
    """Rows whose NaN or inf counts were recorded on both sides and differ."""
    out = np.zeros(len(t["match"]), dtype=bool)
    for k in ("nan", "inf"):
        a, b = np.asarray(t[f"npu_{k}_count"], dtype=float), np.asarray(t[f"bench_{k}_count"], dtype=float)
        out |= ~np.isnan(a) & ~np.isnan(b) & (a != b)
    return out


def mark_errors(t: dict[str, np.ndarray], mode: str, th: Thresholds) -> None:
    """Final ``err`` (scale-aware relative error, inf for hard mismatches) and ``diverges``."""
    err = t["err"].copy()
    matched = t["match"] == "matched"
    comparable = t["comparable"]
    tensor = comparable & (t["kind"] == "tensor")
    shape_diff = tensor & shape_differs(t["npu_shape"], t["bench_shape"])
    value_diff = comparable & (t["kind"] == "value") & (t["npu_value"] != t["bench_value"])
    hard = shape_diff | value_diff | tensor & nonfinite_counts_differ(t)
    if mode == "tensor":
        rl2 = t["rel_l2_err"]
        err = np.where(tensor & ~np.isnan(rl2), rl2, err)
        hard |= tensor & np.isin(t["tensor_status"], [M.ST_NANINF, M.ST_SHAPE, M.ST_FILE])
    if mode != "tensor" and "npu_hash" in t:  # content hashes, where both sides have them, are exact
        nh, bh = t["npu_hash"], t["bench_hash"]
        hard |= tensor & (nh != "") & (bh != "") & (nh != bh)
    err = np.where(hard & matched, np.inf, err)
    uninit = uninitialised_rows(t, th)
    err = np.where(uninit, np.nan, err)
    t["err"] = err
    t["uninitialised"] = uninit
    t["diverges"] = diverging(t, th)


def diverging(t: Any, th: Thresholds) -> np.ndarray:
    """Rows that diverge: matched, not uninitialised memory, and an ``err`` above the row's tolerance
    (``diverge_rtol``, or ``diverge_rtol_by_dtype`` for bf16 / fp16 rows) or a tensor
    dtype that differs (fp16 vs fp32 is comparable, so no hard mismatch, but a call whose inputs agree and
    whose output dtype differs is where the runs part ways)."""
    matched = np.asarray(t["match"], dtype=object) == "matched"
    tensor = np.asarray(t["comparable"], dtype=bool) & (np.asarray(t["kind"], dtype=object) == "tensor")
    dtype_diff = tensor & (np.asarray(t["npu_dtype"], dtype=object) != np.asarray(t["bench_dtype"], dtype=object))
    err = np.asarray(t["err"], dtype=float)
    with np.errstate(invalid="ignore"):
        over = err > th.rtol_of(t["npu_dtype"], t["bench_dtype"])
    return matched & ~np.asarray(t["uninitialised"], dtype=bool) & (over | dtype_diff)


def _op_of_call(call: str) -> str:
    """The op of an API call name (``Torch.empty_like.0.forward`` -> ``empty_like``); '' for modules."""
    parts = call.split(".")
    return parts[1] if len(parts) >= 4 and parts[0] not in ("Module", "Cell") else ""


def _destinations(t: Any, th: Thresholds, io: np.ndarray, op: np.ndarray, arg: np.ndarray) -> np.ndarray:
    """Rows of tensors that are only room for a result: an ``out=`` argument before its call, and a tensor used
    only as one, directly or through views made for it (FSDP2 views its unsharded parameters' freed and
    reallocated memory as the ``out=`` of its all-gather copy-out). Their values are whatever the memory held."""
    is_out = (io == "input") & ((arg == "out") | np.char.startswith(arg.astype(str), "out."))
    if "tensor_id" not in t or not is_out.any():
        return is_out
    tid = np.asarray(t["tensor_id"], dtype=float)
    valid = ~np.isnan(tid)
    step, rank = np.asarray(t["step"], dtype=np.int64), np.asarray(t["rank"], dtype=np.int64)
    key = np.where(valid, rank * 2.0 ** 44 + step * 2.0 ** 28 + np.nan_to_num(tid), np.nan)
    calls = np.asarray(t["call"], dtype=object)
    is_view = np.isin(op, np.array(th.view_ops, dtype=object))
    consumer = (io == "input") & valid
    view_in = is_view & consumer & (arg == "0")
    view_out = is_view & (io == "output") & (arg == "0") & valid
    out_key = dict(zip(zip(rank[view_out], step[view_out], calls[view_out]), key[view_out]))
    view_in_at = np.flatnonzero(view_in)
    view_in_out = np.array([out_key.get((rank[i], step[i], calls[i]), np.nan) for i in view_in_at], dtype=float)
    ck = key[consumer]
    dest: set = set()
    while True:
        ok = is_out.copy()
        ok[view_in_at] |= np.isin(view_in_out, np.array(list(dest), dtype=float))
        every = pd.Series(ok[consumer]).groupby(ck).all()
        found = set(every.index[every.to_numpy(dtype=bool)])
        if found == dest:
            break
        dest = found
    return is_out | (valid & np.isin(key, np.array(list(dest), dtype=float)) & np.isin(io, ("input", "output")))


#: in-place draws (``bernoulli_``, ``uniform_``, ...: Tensor methods and aten ops alike) overwrite their ``self``
#: input without reading it: at L2 a dropout mask is drawn into ``empty_like`` memory
_OVERWRITING_DRAWS = np.array(sorted({op for _, op in INPLACE_DRAWS}), dtype=object)


def uninitialised_rows(t: Any, th: Thresholds) -> np.ndarray:
    """Rows that hold uninitialised memory: outputs of ``empty``-like APIs, inputs whose producer is one
    (a tensor made by ``empty_like`` and not yet written by a recorded call), the ``self`` input of an in-place
    draw (overwritten unread), and the buffers of ``Thresholds.buffer_args`` (a collective's output tensor
    before the call). Their values are never compared."""
    skip = np.array(th.diverge_skip_ops, dtype=object)
    io = np.asarray(t["io"], dtype=object)
    op = np.asarray(t["op"], dtype=object)
    arg = np.asarray(t["arg"], dtype=object)
    out = np.isin(op, skip) & (io == "output")
    prod = np.asarray(t["producer"], dtype=object)
    has = prod != ""
    if has.any():
        codes, uniq = pd.factorize(prod[has])
        bad = np.isin(np.array([_op_of_call(str(u)) for u in uniq], dtype=object), skip)
        made = set(uniq[bad])  # calls whose outputs are uninitialised memory
        # a view of uninitialised memory is uninitialised too (FSDP2 views its fresh all-gather buffers as the
        # destinations of a copy): follow views of views, call by call along the producers
        calls = np.asarray(t["call"], dtype=object)
        view_input = np.isin(op, np.array(th.view_ops, dtype=object)) & (io == "input") & (arg == "0") & has
        while made:
            viewed = set(calls[view_input & np.isin(prod, np.array(list(made), dtype=object))]) - made
            if not viewed:
                break
            made |= viewed
            out |= np.isin(calls, np.array(list(viewed), dtype=object)) & (io == "output")
        inputs = np.zeros(len(io), dtype=bool)
        inputs[np.flatnonzero(has)] = np.isin(uniq, np.array(list(made), dtype=object))[codes]
        out |= inputs & np.isin(io, ("input", "parameters"))
    out |= _destinations(t, th, io, op, arg)
    out |= np.isin(op, _OVERWRITING_DRAWS) & (io == "input") & (arg == "0")  # whatever it held is drawn over
    if th.buffer_args:
        for b_op, b_io, b_arg in th.buffer_args:
            out |= (op == b_op) & (io == b_io) & (arg == b_arg)
    return out & (np.asarray(t["kind"], dtype=object) == "tensor")
