"""msprobe's compare CSV for a compare result: its columns, names, order and cell formats, then ours.

Written for existing scripts that read msprobe's CSVs; the cell rules are in docs/compare.md ("msprobe CSV").
It sits in the analysis layer beside the result it formats (the store layer, which writes msprobe's dump
formats, must not import analysis).
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from . import metrics as M

if TYPE_CHECKING:
    from .compare import CompareResult

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


def _fmt_float(x: float | np.floating) -> str:
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
                    dtype=np.object_)[:-1]


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
    cols["Result"] = t["msprobe_result" if "msprobe_result" in t else "result"].to_numpy(dtype=object)
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
