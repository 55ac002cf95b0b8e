"""Comparison metrics: msprobe's definitions, vectorised, plus the ones msprobe lacks.

Statistics mode works on whole columns at once (:func:`stats_metrics`); tensor mode compares one pair of
tensors at a time (:func:`tensor_metrics`). Relative errors are fractions here (0.5 = 50 %); only the
msprobe CSV export turns them into percent strings. See ``docs/compare.md`` for every definition.
"""
from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

#: dtypes msprobe treats as comparable with each other (besides equal dtypes)
COMPATIBLE_FLOATS = frozenset({"torch.float16", "torch.float32", "torch.bfloat16"})
STATS = ("max", "min", "mean", "norm")
#: one thousandth / five thousandths relative-error tolerances of msprobe's ratio metrics
ONE_THOUSANDTH = 0.001
FIVE_THOUSANDTHS = 0.005
#: tensor metric columns, in msprobe's order, then ours
TENSOR_COLUMNS = ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth", "five_thousandths",
                  "rmse", "mean_abs_err", "rel_l2_err")

# why a row has no (or only partial) tensor metrics; see docs/compare.md
ST_OK, ST_SCALAR, ST_LEN1, ST_EMPTY, ST_SHAPE, ST_NANINF, ST_NODATA, ST_FILE = (
    "", "scalar", "length1", "empty", "shape", "naninf", "nodata", "file")


def file_contradiction(x: Any, shape: Any, vmax: float, vmin: float) -> str | None:
    """Why a tensor file cannot be the tensor its dump recorded (another shape, or a max or min that is not
    the recorded one), or None. Max and min are elements, so they match exactly up to the float32 rounding
    a recorder may apply; a file swapped, truncated into another shape or rewritten shows here."""
    held = tuple(getattr(x, "shape", np.shape(x)))
    if shape is not None and held != tuple(shape):
        return f"the tensor file holds shape {list(held)}, the dump records {list(shape)}"
    is_complex = getattr(x, "is_complex", None)  # a torch tensor: numpy cannot take a bf16 one
    if is_complex() if callable(is_complex) else np.iscomplexobj(x):
        return None  # complex tensors have no max or min
    a = _to_numpy(x)
    if a.size == 0 or not np.issubdtype(a.dtype, np.number):
        return None
    with np.errstate(invalid="ignore"):
        real = a[np.isfinite(a)] if np.issubdtype(a.dtype, np.floating) else a
    if real.size == 0:
        return None
    for what, got, want in (("max", float(real.max()), vmax), ("min", float(real.min()), vmin)):
        if want is None or not math.isfinite(want):
            continue
        if abs(got - want) > 1e-6 * max(abs(got), abs(want)) + 1e-30:
            return f"the tensor file's {what} is {got:.6g}, the dump records {want:.6g}"
    return None


def stats_metrics(npu: dict[str, np.ndarray], bench: dict[str, np.ndarray], *, same: np.ndarray | None = None,
                  differ: np.ndarray | None = None, near_zero_rtol: float = 1e-2) -> dict[str, np.ndarray]:
    """Diffs, relative errors, near-zero flags and a scale-aware error for aligned statistics.

    ``npu`` / ``bench`` map ``max``/``min``/``mean``/``norm`` to float arrays of equal length (NaN = not
    recorded). ``same`` / ``differ`` (bool arrays) settle rows whose float form cannot tell, such as two
    non-numeric values. Returns ``<s>_diff``, ``<s>_rel`` (|diff|/|bench|; 0 when equal as recorded, inf
    when bench is 0), ``near_zero`` (bit mask: 1 max, 2 min, 4 mean, 8 norm) and ``err`` (the row's
    largest scale-aware relative error, see docs/compare.md).
    """
    out: dict[str, np.ndarray] = {}
    n_len = len(npu["max"])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        bmax, bmin = np.abs(bench["max"]), np.abs(bench["min"])
        scale = np.fmax(bmax, bmin)                    # the bench tensor's largest magnitude
        nscale = np.fmax(np.abs(npu["max"]), np.abs(npu["min"]))
        near = np.zeros(n_len, dtype=np.int8)
        err = np.zeros(n_len)
        for bit, s in enumerate(STATS):
            n, b = npu[s], bench[s]
            equal = (n == b) | (np.isnan(n) & np.isnan(b))
            if same is not None:
                equal |= same
            if differ is not None:
                equal &= ~differ
            diff = np.where(equal, 0.0, n - b)
            rel = np.where(equal, 0.0, np.where((b == 0) | np.isinf(diff), np.inf, np.abs(diff) / np.abs(b)))
            rel = np.where(np.isnan(diff), np.nan, rel)
            out[f"{s}_diff"], out[f"{s}_rel"] = diff, rel
            ad = np.abs(diff)
            if s == "norm":
                # the norm is only ~0 when the whole bench tensor is ~0: compare against the NPU's size
                zero = (scale == 0) & (ad > 0)
                e = np.where(zero, ad / np.fmax(np.abs(n), nscale), rel)
            else:
                floor = near_zero_rtol * scale
                zero = (np.abs(b) <= floor) & (ad > 0) & np.isfinite(b)
                e = np.where(zero, ad / np.where(floor > 0, floor, np.fmax(nscale, np.abs(n))), rel)
            near |= np.where(zero, np.int8(1 << bit), np.int8(0))
            # inf against a finite value is a full disagreement (inf / inf above, against an all-zero bench, is NaN)
            e = np.where(np.isnan(e) & ~equal & (np.isinf(n) != np.isinf(b)), np.inf, e)
            if s in ("max", "min"):
                # max/min are always recorded for a tensor: NaN there means the tensor holds NaN, so NaN on
                # one side only is a full disagreement (mean/norm may simply not have been recorded)
                e = np.where(np.isnan(e) & ~equal & (np.isnan(n) != np.isnan(b)), np.inf, e)
            err = np.fmax(err, np.nan_to_num(e, nan=0.0, posinf=np.inf))
        if differ is not None:
            err = np.where(differ, np.inf, err)
        out["near_zero"] = near
        out["err"] = err
    return out


def near_zero_labels(mask: np.ndarray) -> np.ndarray:
    """Bit masks of :func:`stats_metrics` as comma-separated stat names ('' when none)."""
    table = np.array([",".join(s for b, s in enumerate(STATS) if m & (1 << b)) for m in range(16)], dtype=object)
    return table[np.asarray(mask, dtype=np.int64) & 15]


def _to_numpy(x: Any) -> np.ndarray:
    """A tensor or array as a numpy array msprobe would compare (bf16/fp8 -> fp32, bool -> fp32). Numpy arrays
    (what the kit's HDF5 loader gives the analysis) need no torch; torch is imported only for a torch tensor."""
    torch = None if isinstance(x, np.ndarray) else sys.modules.get("torch")  # no torch loaded: x is no tensor
    if torch is not None:
        if isinstance(x, torch.Tensor):
            t = x.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.is_complex():
                t = torch.view_as_real(t)
            if t.dtype in (torch.bfloat16, torch.bool) or t.dtype.itemsize == 1 and t.is_floating_point():
                t = t.float()
            return t.contiguous().numpy()
    a = np.asarray(x)
    if a.dtype == bool:
        a = a.astype(np.float32)
    if np.iscomplexobj(a):
        a = np.stack([a.real, a.imag], axis=-1)
    return a


def _float_dtype(a: np.ndarray, b: np.ndarray) -> np.dtype:
    dt = np.result_type(a, b)
    return dt if np.issubdtype(dt, np.floating) else np.dtype(np.float64)


def tensor_metrics(npu: Any, bench: Any, *, near_zero_rtol: float = 1e-2) -> dict[str, Any]:
    """msprobe's tensor metrics for one pair, plus RMSE, mean abs error, relative L2 error and NaN/inf checks.

    Returns a dict with the :data:`TENSOR_COLUMNS` (NaN where not computable), ``nan_inf_match`` (True when
    NaN, +inf and -inf sit at the same positions on both sides, sign included), ``rel_near_zero`` (the max
    relative error comes from an element where the bench value is ~0), ``status`` (one of the ``ST_*``
    codes) and ``messages`` (list of strings explaining every missing or suspicious number).
    """
    res: dict[str, Any] = {c: math.nan for c in TENSOR_COLUMNS}
    res.update(nan_inf_match=None, rel_near_zero=False, status=ST_OK, messages=[])
    msgs = res["messages"]
    n, b = _to_numpy(npu), _to_numpy(bench)
    if n.size == 0 or b.size == 0:
        res["status"] = ST_EMPTY
        msgs.append("empty tensor: nothing to compare")
        return res
    if n.shape != b.shape:
        res["status"] = ST_SHAPE
        msgs.append(f"shape differs: {list(n.shape)} vs {list(b.shape)}")
        return res
    dt = _float_dtype(n, b)
    n, b = n.astype(dt, copy=True), b.astype(dt, copy=True)

    n_nan, b_nan = np.isnan(n), np.isnan(b)
    n_inf, b_inf = np.isinf(n), np.isinf(b)
    if n_nan.any() or b_nan.any() or n_inf.any() or b_inf.any():
        same_pos = np.array_equal(n_nan, b_nan) and np.array_equal(n_inf, b_inf)
        same_sign = same_pos and np.array_equal(np.signbit(n[n_inf]), np.signbit(b[b_inf]))
        res["nan_inf_match"] = bool(same_sign)
        if not same_pos:
            bad = int(np.count_nonzero((n_nan != b_nan) | (n_inf != b_inf)))
            res["status"] = ST_NANINF
            msgs.append(f"NaN/inf positions differ at {bad} element(s) "
                        f"(NPU {int(n_nan.sum())} NaN {int(n_inf.sum())} inf, "
                        f"bench {int(b_nan.sum())} NaN {int(b_inf.sum())} inf)")
            return res
        if not same_sign:
            msgs.append("inf at the same positions but with opposite signs")
        msgs.append("NaN/inf at the same positions on both sides; those elements were set to 0 for the metrics")
        for a, m in ((n, n_nan | n_inf), (b, b_nan | b_inf)):
            a[m] = 0
    else:
        res["nan_inf_match"] = True

    # relative error in the tensors' own float type, zeros of the bench shifted by eps (like msprobe)
    eps = np.finfo(dt).eps
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        zero = b == 0
        bz, nz = np.where(zero, b + eps, b), np.where(zero, n + eps, n)
        rel = np.abs((nz - bz) / bz)
    nf, bf = n.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    d = nf - bf
    ad = np.abs(d)
    res["max_abs_err"] = float(ad.max())
    res["max_rel_err"] = float(rel.max())
    res["rmse"] = float(np.sqrt(np.mean(d * d)))
    res["mean_abs_err"] = float(ad.mean())
    dn, bn = float(np.linalg.norm(d)), float(np.linalg.norm(bf))
    res["rel_l2_err"] = dn / bn if bn > 0 else (0.0 if dn == 0 else math.inf)
    bmax = float(np.abs(bf).max())
    k = int(np.argmax(rel.reshape(-1)))
    if res["max_rel_err"] > 0 and abs(bf[k]) <= near_zero_rtol * bmax:
        res["rel_near_zero"] = True
        msgs.append(f"MaxRelativeErr {res['max_rel_err']:.3g} comes from an element where bench is ~0 "
                    f"({bf[k]:.3g} vs max |bench| {bmax:.3g}); abs err there {ad[k]:.3g}")
    if n.ndim == 0:
        res["status"] = ST_SCALAR
        msgs.append("0-d tensor: Cosine, EucDist and the error ratios are not defined")
        return res
    res["euc_dist"] = dn
    res["one_thousandth"] = float(np.count_nonzero(rel < ONE_THOUSANDTH) / rel.size)
    res["five_thousandths"] = float(np.count_nonzero(rel < FIVE_THOUSANDTHS) / rel.size)
    if nf.size == 1:
        res["status"] = ST_LEN1
        msgs.append("tensor of one element: Cosine is not defined")
        return res
    na, nb = float(np.linalg.norm(nf)), float(np.linalg.norm(bf))
    eps = float(eps)  # a float16 eps would cast a norm past 65504 to inf (and warn) in the comparisons below
    if na <= eps and nb <= eps:
        res["cosine"] = 1.0
    elif na <= eps or nb <= eps:
        msgs.append(f"Cosine undefined: the {'NPU' if na <= eps else 'bench'} tensor is all zeros")
    else:
        cos = float(nf.dot(bf) / (na * nb))
        res["cosine"] = cos
        if not math.isfinite(cos):
            msgs.append("Cosine undefined: overflow in the dot product")
    return res


def tensor_dtype_ok(npu_dtype: np.ndarray, bench_dtype: np.ndarray) -> np.ndarray:
    """msprobe's rule: dtypes are comparable when equal or both fp16/fp32/bf16."""
    cf = np.array(sorted(COMPATIBLE_FLOATS), dtype=object)
    return (npu_dtype == bench_dtype) | (np.isin(npu_dtype, cf) & np.isin(bench_dtype, cf))
