"""``compare_prechecks(npu, gpu)``: two pre-checks of the same run, one per device, side by side.

Each device's output was graded against its own high-precision bench; here the same output's grades and
metrics are put next to each other, and an output is flagged where the first device (the NPU) does worse
than the second (the GPU): it fails where the other passes, or one of its error metrics is well above the
other's. Torch-free: it reads two :class:`AccCheckResult` tables (or their CSV files).
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.precheck.result import AccCheckResult
from msprobe_nb.precheck.standards import dtype_info

__all__ = ["COMPARED_METRICS", "RATIO_LIMITS", "compare_prechecks"]

#: metrics compared device against device (smaller is better for each)
COMPARED_METRICS = ("rmse", "max_rel_err", "mean_rel_err", "small_value_err_ratio", "max_ulp_err", "ulp_err_ratio")
#: (warning above, error above) for the ratio first device / second device of a metric
RATIO_LIMITS = (1.5, 2.0)
_KEY = ["step", "rank", "api", "direction", "output"]


def _as_result(x: Any) -> pd.DataFrame:
    if isinstance(x, (str, bytes)) or hasattr(x, "__fspath__"):
        return pd.DataFrame(AccCheckResult.read_csv(os.fsdecode(x)))
    if not isinstance(x, pd.DataFrame):
        raise TypeError(f"compare_prechecks takes AccCheckResult tables or their CSV paths, got {type(x).__name__}")
    return pd.DataFrame(x)


def _ratio(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    if b == 0:
        return math.inf if a > 0 else 1.0
    return a / b


def _floor(metric: str, row: dict, na: str, nb: str) -> float:
    """The least the second device's metric counts as, so that an exact second device does not make every
    rounding of the first an error: half an epsilon for relative errors, one ULP, one element in a thousand,
    and for the RMSE the reference kernel's (both pre-checks ran one on their bench)."""
    eps = dtype_info(str(row.get(f"{na}_dtype") or "")).eps
    if metric in ("max_rel_err", "mean_rel_err"):
        return eps / 2
    if metric == "max_ulp_err":
        return 1.0
    if metric == "rmse":
        refs = [float(row.get(f"{side}_ref_rmse", math.nan)) for side in (na, nb)]
        return max([r for r in refs if math.isfinite(r)] or [0.0])
    return 1e-3


def compare_prechecks(npu: Any, gpu: Any, *, names: tuple[str, str] = ("npu", "gpu")) -> pd.DataFrame:
    """One row per output of either pre-check: both verdicts, each compared metric of both and their ratio,
    and ``verdict``: error where the first device fails and the second does not, or a metric is over
    ``RATIO_LIMITS[1]`` times the second's; warning where both fail (the op, not the device), or a ratio is
    over ``RATIO_LIMITS[0]``; pass otherwise; ``unmatched`` for an output only one side has."""
    a, b = _as_result(npu), _as_result(gpu)
    na, nb = names
    for t in (a, b):
        t["output"] = t["output"].fillna("").astype(str)
    metrics = [m for m in COMPARED_METRICS if m in a.columns or m in b.columns]
    keep = _KEY + ["call_index", "op", "dtype", "standard", "verdict", "ref_rmse"] + metrics
    left = a.reindex(columns=keep).add_prefix(f"{na}_").rename(columns={f"{na}_{k}": k for k in _KEY})
    right = b.reindex(columns=keep).add_prefix(f"{nb}_").rename(columns={f"{nb}_{k}": k for k in _KEY})
    t = left.merge(right, on=_KEY, how="outer", indicator=True)
    verdicts, reasons = [], []
    for row in t.to_dict("records"):
        if row["_merge"] != "both":
            verdicts.append("unmatched")
            reasons.append(f"only in the {na if row['_merge'] == 'left_only' else nb} pre-check")
            continue
        va, vb = row[f"{na}_verdict"], row[f"{nb}_verdict"]
        v, why = "pass", []
        if va == "error" and vb != "error":
            v = "error"
            why.append(f"{na} fails ({row[f'{na}_standard']}) where {nb} gives {vb}")
        elif va == "error":
            v = "warning"
            why.append(f"both fail: the op or the bench, not only {na}")
        elif "unchecked" in (va, vb):
            v = "unchecked"
            why.append(f"{na} {va}, {nb} {vb}")
        for m in metrics:
            x, y = float(row.get(f"{na}_{m}", np.nan)), float(row.get(f"{nb}_{m}", np.nan))
            r = _ratio(x, max(y, _floor(m, row, na, nb))) if math.isfinite(y) else math.nan
            if math.isfinite(r) and r > RATIO_LIMITS[1] or r == math.inf:
                v = "error" if v != "unchecked" else v
                why.append(f"{m} {row[f'{na}_{m}']:.3g} is {r:.3g}x {nb}'s {row[f'{nb}_{m}']:.3g}")
            elif math.isfinite(r) and r > RATIO_LIMITS[0] and v == "pass":
                v = "warning"
                why.append(f"{m} is {r:.3g}x {nb}'s")
        verdicts.append(v)
        reasons.append(" | ".join(why))
    t = t.drop(columns="_merge")
    for m in metrics:
        num = pd.to_numeric(t[f"{na}_{m}"], errors="coerce")
        den = pd.to_numeric(t[f"{nb}_{m}"], errors="coerce")
        t[f"{m}_ratio"] = [_ratio(x, y) for x, y in zip(num, den, strict=True)]
    t["verdict"] = verdicts
    t["reasons"] = reasons
    order = t[f"{na}_call_index"].fillna(t[f"{nb}_call_index"])
    t = t.assign(_o=order).sort_values(["step", "rank", "_o"], kind="stable").drop(columns="_o")
    lead = _KEY + ["verdict", "reasons", f"{na}_verdict", f"{nb}_verdict"]
    return t[lead + [c for c in t.columns if c not in lead]].reset_index(drop=True)
