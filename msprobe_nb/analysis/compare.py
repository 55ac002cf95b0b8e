"""compare(npu, bench) -> CompareResult: match rows, compute metrics, grade, find the first divergence.

The result is a DataFrame (one row per matched pair or unmatched row, NPU execution order) with extra
methods: :meth:`CompareResult.first_divergence`, :meth:`CompareResult.calls_summary`,
:meth:`CompareResult.to_msprobe_csv` and :attr:`CompareResult.unmatched`. Columns are listed in
``docs/compare.md``.
"""
from __future__ import annotations

import json
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import metrics as M
from .divergence import Divergence, find_divergences
from .grading import Thresholds, grade, summarize_calls
from .matching import Mapping, MatchError, match_rows, parse_calls

MODES = ("auto", "statistics", "tensor", "md5")
_REQUIRED = ("step", "rank", "call_index", "call", "name")


class CompareError(ValueError):
    """Two dumps cannot be compared (missing, empty, wrong kind, nothing in common, bad options)."""


@dataclass
class _Side:
    calls: pd.DataFrame
    dump: Any = None
    source: str = ""
    task: str = "statistics"


@dataclass
class _Context:
    mode: str
    npu: _Side
    bench: _Side
    thresholds: Thresholds
    pairs: pd.DataFrame
    unpaired: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    stack_ids: dict | None = None


# --------------------------------------------------------------------------------------------- inputs
def _load_side(x: Any, label: str) -> _Side:
    if isinstance(x, (str, os.PathLike)):
        p = Path(x)
        if not p.exists():
            raise CompareError(f"{label} dump not found: {p}")
        try:
            from msprobe_nb.store.dump import load
        except ImportError as e:  # pragma: no cover - depends on the store layer being installed
            raise CompareError(f"cannot read dumps: msprobe_nb.store.dump is unavailable ({e})") from None
        try:
            dump = load(p)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CompareError(f"cannot read the {label} dump {p}: {e}") from None
        return _side_from_dump(dump, label, str(p))
    if isinstance(x, pd.DataFrame):
        return _Side(_check_calls(x, label), None, label, _infer_task(x))
    if hasattr(x, "calls"):
        return _side_from_dump(x, label, str(getattr(x, "source", "") or label))
    raise CompareError(f"{label}: expected a dump path, a Dump or a calls DataFrame, got {type(x).__name__}")


def _side_from_dump(dump: Any, label: str, source: str) -> _Side:
    calls = _check_calls(dump.calls, label)
    task = str(getattr(dump, "task", "") or _infer_task(calls))
    return _Side(calls, dump, source, task)


def _check_calls(df: Any, label: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise CompareError(f"{label}: calls is not a DataFrame")
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise CompareError(f"{label}: not a calls table (missing columns {missing})")
    if df.empty:
        raise CompareError(f"{label} dump is empty: it recorded no calls")
    from msprobe_nb.store.schema import COLUMN_NAMES, coerce_calls
    if list(df.columns) != COLUMN_NAMES:
        df = coerce_calls(df)
    return df


def _infer_task(df: pd.DataFrame) -> str:
    if "data_name" in df.columns and (df["data_name"].fillna("") != "").any():
        return "tensor"
    if "hash" in df.columns and (df["hash"].fillna("") != "").any():
        return "md5"
    return "statistics"


def _resolve_mode(mode: str, npu: _Side, bench: _Side, notes: list[str]) -> str:
    if mode not in MODES:
        raise CompareError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    nt, bt = npu.task, bench.task
    if mode == "auto":
        if nt == bt == "tensor" and _has_tensors(npu) and _has_tensors(bench):
            return "tensor"
        if nt == bt == "md5":
            return "md5"
        if nt != bt:
            notes.append(f"NPU dump task is {nt!r}, bench dump task is {bt!r}: compared in statistics mode")
        return "statistics"
    if mode == "tensor":
        for side, label in ((npu, "NPU"), (bench, "bench")):
            if side.task != "tensor" or not _has_tensors(side):
                raise CompareError(f"tensor mode needs tensor dumps on both sides, but the {label} dump is "
                                   f"task {side.task!r}{'' if _has_tensors(side) else ' without tensor data'}; "
                                   "use mode='statistics'")
    if mode == "md5":
        for side, label in ((npu, "NPU"), (bench, "bench")):
            if (side.calls["hash"].fillna("") == "").all():
                raise CompareError(f"md5 mode needs content hashes, and the {label} dump has none")
    return mode


def _has_tensors(side: _Side) -> bool:
    return side.dump is not None and callable(getattr(side.dump, "tensor", None))


# --------------------------------------------------------------------------------------------- columns
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
    op = _obj(df["op"])
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


# --------------------------------------------------------------------------------------------- compare
def compare(npu: Any, bench: Any, *, mode: str = "auto", fuzzy: bool = False, mapping: Any = None,
            thresholds: Thresholds | dict | None = None, rank_map: dict | None = None, step_map: dict | None = None,
            progress: bool | None = None) -> CompareResult:
    """Compare an NPU dump with a bench dump.

    ``npu`` / ``bench``: a dump path, a ``Dump`` or a calls DataFrame. ``mode``: auto | statistics |
    tensor | md5. ``fuzzy``: ignore call counters. ``mapping``: :class:`Mapping`, dict or JSON/YAML file.
    ``thresholds``: :class:`Thresholds` or a dict of its fields. ``rank_map`` / ``step_map``: pair NPU
    rank/step k with bench rank/step v. ``progress``: tqdm bar in tensor mode (default: on a terminal when
    there are over 100 tensors). Raises :class:`CompareError` on input that cannot be compared.
    """
    th = _thresholds(thresholds)
    n_side, b_side = _load_side(npu, "NPU"), _load_side(bench, "bench")
    notes: list[str] = []
    mode = _resolve_mode(mode, n_side, b_side, notes)
    try:
        mp = Mapping.load(mapping)
        m = match_rows(n_side.calls, b_side.calls, fuzzy=fuzzy, mapping=mp, rank_map=rank_map, step_map=step_map)
    except MatchError as e:
        raise CompareError(str(e)) from None
    notes += m.notes
    t = _build_table(n_side.calls, b_side.calls, m, mode, th)
    if not (t["match"] == "matched").any():
        raise CompareError(
            f"no row of the NPU dump matches the bench dump ({int((t['match'] == 'npu_only').sum())} NPU rows, "
            f"{int((t['match'] == 'bench_only').sum())} bench rows): they look like different models or runs. "
            f"NPU calls start {list(dict.fromkeys(n_side.calls['call'].head(50)))[:3]}, bench calls start "
            f"{list(dict.fromkeys(b_side.calls['call'].head(50)))[:3]}; try fuzzy=True or a mapping")
    n_rows = int((t["match"] != "bench_only").sum())
    b_rows = int((t["match"] != "npu_only").sum())
    n_matched = int((t["match"] == "matched").sum())
    if n_matched < 0.5 * min(n_rows, b_rows):
        notes.append(f"only {n_matched} of {n_rows} NPU rows and {b_rows} bench rows matched: are these dumps of "
                     "the same model and step? fuzzy=True or a mapping may pair more")
    if mode == "tensor":
        _tensor_metrics(t, n_side.dump, b_side.dump, th, progress)
    _errors(t, mode, th)
    t["result"], reasons = grade(t, mode, th)
    t["reasons"] = np.empty(len(reasons), dtype=object)
    t["reasons"][:] = reasons
    res = CompareResult(_frame(t))
    res._ctx = _Context(mode, n_side, b_side, th, m.pairs, m.unpaired, notes)
    if len(m.unpaired):
        for note in notes:
            if "without a counterpart" in note:
                warnings.warn(note, stacklevel=2)
    return res


def _thresholds(th: Any) -> Thresholds:
    if th is None:
        return Thresholds()
    if isinstance(th, Thresholds):
        return th
    if isinstance(th, dict):
        unknown = sorted(set(th) - set(Thresholds.fields()))
        if unknown:
            raise CompareError(f"unknown thresholds {unknown}; known: {', '.join(Thresholds.fields())}")
        try:
            return Thresholds(**th)
        except ValueError as e:
            raise CompareError(str(e)) from None
    raise CompareError(f"thresholds must be a Thresholds or a dict, got {type(th).__name__}")


def _build_table(nc: pd.DataFrame, bc: pd.DataFrame, m: Any, mode: str, th: Thresholds) -> dict[str, np.ndarray]:
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


def _frame(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """The result table; text columns stay object dtype (no per-column string inference on big tables)."""
    return pd.DataFrame({k: pd.Series(v, dtype=object, copy=False) if v.dtype == object else v
                         for k, v in cols.items()}, copy=False)


def _tensor_metrics(t: dict[str, np.ndarray], nd: Any, bd: Any, th: Thresholds, progress: bool | None) -> None:
    n = len(t["match"])
    out = {c: np.full(n, np.nan) for c in M.TENSOR_COLUMNS}
    nim = np.full(n, None, dtype=object)
    status = np.full(n, "", dtype=object)
    msgs = np.full(n, None, dtype=object)
    comparable, kind = t["comparable"], t["kind"]
    todo = np.flatnonzero(comparable & (kind == "tensor"))
    ndn, bdn = t["npu_data_name"], t["bench_data_name"]
    steps, ranks = (t["step"], t["bench_step"]), (t["rank"], t["bench_rank"])
    if progress is None:
        progress = len(todo) > 100 and sys.stderr.isatty() and "PYTEST_CURRENT_TEST" not in os.environ
    it = todo
    if progress:
        from tqdm import tqdm
        it = tqdm(todo, desc="comparing tensors", unit="tensor")
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
    direct = getattr(dump, "load_tensor", None)  # straight to the file: no lookup in the calls table
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


def _errors(t: dict[str, np.ndarray], mode: str, th: Thresholds) -> None:
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


def uninitialised_rows(t: Any, th: Thresholds) -> np.ndarray:
    """Rows that hold uninitialised memory: outputs of ``empty``-like APIs, and inputs whose producer is one
    (a tensor made by ``empty_like`` and not yet written by a recorded call). Their values are never compared."""
    skip = np.array(th.diverge_skip_ops, dtype=object)
    io = np.asarray(t["io"], dtype=object)
    out = np.isin(np.asarray(t["op"], dtype=object), skip) & (io == "output")
    prod = np.asarray(t["producer"], dtype=object)
    has = prod != ""
    if has.any():
        codes, uniq = pd.factorize(prod[has])
        bad = np.isin(np.array([_op_of_call(str(u)) for u in uniq], dtype=object), skip)
        inputs = np.zeros(len(io), dtype=bool)
        inputs[np.flatnonzero(has)] = bad[codes]
        out |= inputs & np.isin(io, ("input", "parameters"))
    return out & (np.asarray(t["kind"], dtype=object) == "tensor")


# --------------------------------------------------------------------------------------------- result
class CompareResult(pd.DataFrame):
    """The compare table (a DataFrame) plus the context needed for divergence and export.

    Slicing it returns plain DataFrames; the methods below work on the whole result.
    """

    _metadata = ["_ctx"]

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame

    # -- context
    @property
    def mode(self) -> str:
        """statistics | tensor | md5."""
        return self._ctx.mode

    @property
    def thresholds(self) -> Thresholds:
        return self._ctx.thresholds

    @property
    def notes(self) -> list[str]:
        """Things the user should know about this comparison (unpaired ranks, task differences, ...)."""
        return list(self._ctx.notes)

    @property
    def pairs(self) -> pd.DataFrame:
        """The (step, rank) pairs compared."""
        return self._ctx.pairs.copy()

    @property
    def unpaired(self) -> pd.DataFrame:
        """(side, step, rank, rows) of groups that had no counterpart and were not compared."""
        return self._ctx.unpaired.copy()

    @property
    def unmatched(self) -> pd.DataFrame:
        """Rows without a partner on the other side (``match`` is npu_only or bench_only)."""
        cols = ["step", "rank", "call_index", "call", "name", "match", "bench_name", "kind", "match_note"]
        return pd.DataFrame(self.loc[self["match"] != "matched", cols]).reset_index(drop=True)

    def counts(self) -> dict[str, int]:
        """Number of rows per result, plus unmatched rows and diverging rows."""
        vc = pd.Series(self["result"]).value_counts()
        return {"rows": len(self), "pass": int(vc.get("pass", 0)), "warning": int(vc.get("warning", 0)),
                "error": int(vc.get("error", 0)), "unmatched": int((self["match"] != "matched").sum()),
                "diverging": int(self["diverges"].sum())}

    def calls_summary(self) -> pd.DataFrame:
        """One row per call: worst result, all reasons, rows, unmatched rows, worst row and errors."""
        return summarize_calls(pd.DataFrame(self))

    # -- divergence
    def _stack_of(self, call: str, step: int, rank: int) -> list[str]:
        """Frames recorded for an NPU call ([] when none)."""
        dump = self._ctx.npu.dump
        if dump is None:
            return []
        ctx = self._ctx
        if getattr(ctx, "stack_ids", None) is None:
            t = self[(self["npu_stack_id"] >= 0) & (self["match"] != "bench_only")]
            ctx.stack_ids = dict(zip(zip(t["call"], t["step"].astype(int), t["rank"].astype(int)),
                                     t["npu_stack_id"].astype(int)))
        sid = ctx.stack_ids.get((call, int(step), int(rank)))
        frames = getattr(dump, "stack_frames", None)
        if isinstance(frames, dict):
            return list(frames.get(sid, [])) if sid is not None else []
        try:
            return list(dump.stack(call) or [])
        except Exception:  # noqa: BLE001 - a stack is a nicety, never a failure
            return []

    def divergences(self, thresholds: Thresholds | None = None) -> list[Divergence]:
        """The first divergence of each (step, rank) pair."""
        t = pd.DataFrame(self)
        th = thresholds or self.thresholds
        if thresholds is not None and (thresholds.diverge_rtol, thresholds.diverge_rtol_by_dtype) != \
                (self.thresholds.diverge_rtol, self.thresholds.diverge_rtol_by_dtype):
            t["diverges"] = diverging(t, th)
        return find_divergences(t, th, self._stack_of, self.mode)

    def first_divergence(self, step: int | None = None, rank: int | None = None,
                         thresholds: Thresholds | None = None) -> Divergence | None:
        """The earliest call whose inputs agree and outputs diverge (see docs/compare.md); None if all agree.

        Without ``step``/``rank``: the earliest step, then the earliest call, over all ranks.
        """
        ds = [d for d in self.divergences(thresholds)
              if (step is None or d.step == step) and (rank is None or d.rank == rank)]
        if not ds:
            return None
        return min(ds, key=lambda d: (d.step, d.call_index, d.rank))

    # -- export
    def to_msprobe_csv(self, path: str | os.PathLike, *, include_bench_only: bool = True) -> Path:
        """Write msprobe's compare CSV for this mode (its columns and order, our extra columns after)."""
        df = msprobe_frame(self, include_bench_only=include_bench_only)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False, lineterminator="\n")
        return path

    def to_msprobe_frame(self, *, include_bench_only: bool = True) -> pd.DataFrame:
        """The msprobe CSV as a DataFrame of strings."""
        return msprobe_frame(self, include_bench_only=include_bench_only)

    def summary(self) -> str:
        """A few lines: mode, counts, notes and the first divergence."""
        c = self.counts()
        lines = [f"mode {self.mode}: {c['rows']} rows, {c['pass']} pass, {c['warning']} warning, "
                 f"{c['error']} error, {c['unmatched']} unmatched"]
        lines += [f"note: {n}" for n in self.notes]
        d = self.first_divergence()
        lines.append(str(d) if d is not None else "no divergence: every matched row agrees within tolerance")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------- msprobe CSV
COMMON_HEADER = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                 "NPU Requires_grad", "Bench Requires_grad"]
STATS_HEADER = ["NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
                "Bench l2norm"]
TAIL_HEADER = ["Requires_grad Consistent", "Result", "Err_message", "NPU_Stack_Info"]
#: msprobe's column order per mode (copied from its own compare CSVs)
MSPROBE_HEADERS = {
    "statistics": COMMON_HEADER + ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr",
                                   "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"]
    + STATS_HEADER + TAIL_HEADER,
    "tensor": COMMON_HEADER + ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                               "Five Thousandths Err Ratio"] + STATS_HEADER + TAIL_HEADER + ["Data_name"],
    "md5": COMMON_HEADER + ["NPU MD5", "BENCH MD5"] + TAIL_HEADER,
}
#: our columns appended after msprobe's, per mode
EXTRA_COLUMNS = {
    "statistics": ["step", "rank", "match", "near_zero", "err", "diverges"],
    "tensor": ["step", "rank", "match", "rmse", "mean_abs_err", "rel_l2_err", "nan_inf_match", "near_zero", "err",
               "diverges"],
    "md5": ["step", "rank", "match", "err", "diverges"],
}
_NUM, _NAN, _INF, _NINF, _NA, _DEV, _OTHER = range(7)


def _fmt_float(x: float) -> str:
    return str(float(x))


def _side_strings(t: pd.DataFrame, side: str, shown: np.ndarray) -> dict[str, np.ndarray]:
    """msprobe's text for one side: dtype, shape, requires_grad and the four statistics."""
    n = len(t["match"])
    kind = t[f"{side}_kind"].to_numpy(dtype=object)
    dtype = t[f"{side}_dtype"].to_numpy(dtype=object)
    vt = t[f"{side}_value_type"].to_numpy(dtype=object)
    val = t[f"{side}_value"].to_numpy(dtype=object)
    shape = t[f"{side}_shape"].to_numpy(dtype=object)
    rg = t[f"{side}_requires_grad"].to_numpy(dtype=object)
    out: dict[str, np.ndarray] = {k: np.full(n, "N/A", dtype=object) for k in ("dtype", "shape", "rg", *M.STATS)}
    is_t, is_v, is_none = shown & (kind == "tensor"), shown & (kind == "value"), shown & (kind == "none")
    out["dtype"][is_t] = dtype[is_t]
    out["dtype"][is_v] = np.array([f"<class '{x}'>" for x in vt[is_v]] + [""], dtype=object)[:-1]
    out["shape"][is_t] = np.array([str(list(x)) if x is not None else "N/A" for x in shape[is_t]] + [""],
                                  dtype=object)[:-1]
    out["shape"][is_v] = "[]"
    out["rg"][is_t] = np.array([str(x) if x is not None else "N/A" for x in rg[is_t]] + [""], dtype=object)[:-1]
    is_int = np.array([("int" in d or "uint" in d) for d in dtype], dtype=bool)
    is_bool = dtype == "torch.bool"
    vmax = t[f"{side}_max"].to_numpy(dtype=float)
    nanc = t[f"{side}_nan_count"].to_numpy(dtype=float) if f"{side}_nan_count" in t else np.full(n, np.nan)
    for s in M.STATS:
        x = t[f"{side}_{s}"].to_numpy(dtype=float)
        o = out[s]
        o[is_v] = val[is_v]
        o[is_none] = "None"
        idx = np.flatnonzero(is_t)
        strs = []
        for i in idx:
            v = x[i]
            if math.isnan(v):
                # NaN is a NaN element when the NaN count says so; without a count, a float tensor always has
                # a max, so NaN there (and wherever max is NaN) is a real NaN
                real = (nanc[i] > 0) if not math.isnan(nanc[i]) else (
                    not (is_int[i] or is_bool[i]) and (s == "max" or math.isnan(vmax[i])))
                strs.append("nan" if real else "None")
            elif is_bool[i] and s in ("max", "min"):
                strs.append(str(bool(v)))
            elif is_int[i] and math.isfinite(v):
                strs.append(str(int(v)))
            else:
                strs.append(_fmt_float(v))
        o[idx] = np.array(strs + [""], dtype=object)[:-1]
    return out


def _classify(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """msprobe's value classes of statistic strings, and their float value (NaN when not a number)."""
    codes, uniq = pd.factorize(a)
    cls, num = [], []
    for u in uniq:
        low = str(u).lower()
        if low == "nan":
            c = _NAN
        elif low == "inf":
            c = _INF
        elif low == "-inf":
            c = _NINF
        elif low in ("true", "false"):
            c = _OTHER
        else:
            try:
                float(u)
                c = _NUM
            except ValueError:
                c = _DEV if any(k in low for k in ("npu", "cpu", "cuda")) else (_NA if u == "N/A" else _OTHER)
        cls.append(c)
        num.append(float(u) if c == _NUM else math.nan)
    cls_a = np.array(cls + [0], dtype=np.int64)[:-1]
    num_a = np.array(num + [math.nan], dtype=float)[:-1]
    return cls_a[codes], num_a[codes]


def _diff_strings(ns: np.ndarray, bs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """msprobe's "X diff" and "XRelativeErr" text from the two sides' statistic strings."""
    n = len(ns)
    diff = np.full(n, "N/A", dtype=object)
    rel = np.full(n, "N/A", dtype=object)
    nc, nv = _classify(ns)
    bc, bv = _classify(bs)
    equal = ns == bs
    for i in range(n):
        if equal[i]:
            diff[i] = rel[i] = "0"
            continue
        a, b = nc[i], bc[i]
        if a == _NA or b == _NA:
            continue
        if a == _NUM and b == _NUM:
            d = nv[i] - bv[i]
            diff[i] = _fmt_float(d)
            rel[i] = "inf" if bv[i] == 0 else _fmt_float(abs(d / bv[i] * 100)) + "%"
        elif _NAN in (a, b) and a in (_NUM, _NAN, _INF, _NINF) and b in (_NUM, _NAN, _INF, _NINF):
            diff[i] = rel[i] = "Nan"
        elif (a == _INF and b in (_NUM, _NINF)) or (a == _NUM and b == _NINF):
            diff[i] = rel[i] = "inf"
        elif (a == _NINF and b in (_NUM, _INF)) or (a == _NUM and b == _INF):
            diff[i] = rel[i] = "-inf"
        elif a == _DEV and b == _DEV:
            continue
        elif a in (_DEV, _OTHER) or b in (_DEV, _OTHER):
            diff[i] = rel[i] = "Diff"
    return diff, rel


def _fmt12(x: float) -> str:
    return _fmt_float(float(f"{x:.12f}"))


def _tensor_strings(t: pd.DataFrame, shown: np.ndarray) -> dict[str, np.ndarray]:
    n = len(t["match"])
    names = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
             "Five Thousandths Err Ratio"]
    srcs = ["cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth", "five_thousandths"]
    out = {k: np.full(n, "N/A", dtype=object) for k in names}
    kind = t["kind"].to_numpy(dtype=object)
    st = t["tensor_status"].to_numpy(dtype=object)
    vals = {s: t[s].to_numpy(dtype=float) for s in srcs}
    for i in np.flatnonzero(shown):
        if kind[i] != "tensor" or st[i] in (M.ST_NODATA, M.ST_EMPTY):
            for k in names:
                out[k][i] = "unsupported"
            continue
        if st[i] == M.ST_SHAPE:
            for k in names:
                out[k][i] = "shape unmatched"
            continue
        if st[i] == M.ST_NANINF:
            continue  # msprobe: N/A everywhere
        for k, s in zip(names, srcs):
            v = vals[s][i]
            if st[i] == M.ST_SCALAR and s in ("cosine", "euc_dist", "one_thousandth", "five_thousandths"):
                out[k][i] = "unsupported"
            elif st[i] == M.ST_LEN1 and s == "cosine":
                out[k][i] = "unsupported"
            elif math.isnan(v):
                out[k][i] = "Nan"
            elif s == "cosine":
                out[k][i] = _fmt_float(round(v, 6)) if v > 0.9999 else _fmt12(v)
            elif s == "euc_dist":
                out[k][i] = _fmt_float(v)
            else:
                out[k][i] = _fmt12(v)
    return out


def _extra_strings(t: pd.DataFrame, col: str) -> np.ndarray:
    if col not in t.columns:
        return np.full(len(t), "N/A", dtype=object)
    a = t[col].to_numpy(dtype=object)
    return np.array(["N/A" if v is None or (isinstance(v, float) and math.isnan(v)) else
                     (_fmt_float(v) if isinstance(v, (float, np.floating)) else str(v)) for v in a] + [""],
                    dtype=object)[:-1]


def msprobe_frame(r: CompareResult, *, include_bench_only: bool = True) -> pd.DataFrame:
    """msprobe's compare table for ``r.mode`` as strings (the content of :meth:`CompareResult.to_msprobe_csv`)."""
    mode = r.mode
    t = pd.DataFrame(r)
    if not include_bench_only:
        t = t[t["match"] != "bench_only"]
    t = t.reset_index(drop=True)
    match = t["match"].to_numpy(dtype=object)
    has_n, has_b = match != "bench_only", match != "npu_only"
    shown_b = has_b & t["comparable"].to_numpy(dtype=bool)
    ns, bs = _side_strings(t, "npu", has_n), _side_strings(t, "bench", shown_b)
    cols: dict[str, np.ndarray] = {
        "NPU Name": np.where(has_n, t["name"].to_numpy(dtype=object), "N/A"),
        "Bench Name": np.where(shown_b, t["bench_name"].to_numpy(dtype=object), "N/A"),
        "NPU Dtype": ns["dtype"], "Bench Dtype": bs["dtype"],
        "NPU Tensor Shape": ns["shape"], "Bench Tensor Shape": bs["shape"],
        "NPU Requires_grad": ns["rg"], "Bench Requires_grad": bs["rg"],
    }
    if mode == "statistics":
        heads = {"max": ("Max diff", "MaxRelativeErr"), "min": ("Min diff", "MinRelativeErr"),
                 "mean": ("Mean diff", "MeanRelativeErr"), "norm": ("L2norm diff", "NormRelativeErr")}
        for s, (dh, rh) in heads.items():
            cols[dh], cols[rh] = _diff_strings(ns[s], bs[s])
    elif mode == "tensor":
        cols.update(_tensor_strings(t, has_n & shown_b))
    else:
        cols["NPU MD5"] = np.where(has_n, t["npu_hash"].to_numpy(dtype=object), "N/A")
        cols["BENCH MD5"] = np.where(shown_b, t["bench_hash"].to_numpy(dtype=object), "N/A")
    if mode != "md5":
        for side, st in (("NPU", ns), ("Bench", bs)):
            for s, h in zip(M.STATS, ("max", "min", "mean", "l2norm")):
                cols[f"{side} {h}"] = st[s]
    cols["Requires_grad Consistent"] = np.array([str(a == b) for a, b in zip(ns["rg"], bs["rg"])] + [""],
                                                dtype=object)[:-1]
    cols["Result"] = t["result"].to_numpy(dtype=object)
    cols["Err_message"] = np.array([json.dumps(list(x), ensure_ascii=False) for x in t["reasons"]] + [""],
                                   dtype=object)[:-1]
    stack = np.full(len(t), "N/A", dtype=object)
    calls = t["call"].to_numpy(dtype=object)
    first = np.r_[True, calls[1:] != calls[:-1]] & has_n if len(t) else np.zeros(0, dtype=bool)
    cache: dict[tuple, str] = {}
    for i in np.flatnonzero(first):
        key = (calls[i], int(t["step"].iat[i]), int(t["rank"].iat[i]))
        if key not in cache:
            frames = r._stack_of(*key)
            cache[key] = str(list(frames)) if frames else "N/A"
        stack[i] = cache[key]
    cols["NPU_Stack_Info"] = stack
    if mode == "tensor":
        nd = t["npu_data_name"].to_numpy(dtype=object)
        bd = t["bench_data_name"].to_numpy(dtype=object)
        cols["Data_name"] = np.array([str([a or "-1", (b or "-1") if hb else "N/A"])
                                      for a, b, hb in zip(nd, bd, has_b)] + [""], dtype=object)[:-1]
    df = pd.DataFrame({h: cols[h] for h in MSPROBE_HEADERS[mode]})
    for c in EXTRA_COLUMNS[mode]:
        df[c] = _extra_strings(t, c)
    return df
