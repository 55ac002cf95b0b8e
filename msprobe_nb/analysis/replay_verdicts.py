"""Verdicts refined by measured own errors: which calls to replay, and what their measurement decides.

The replay itself runs torch (``msprobe_nb.precheck.own_error``); this module is the torch-free half: it
picks the suspect calls of a compare table and, given each side's measured own error per call, rewrites the
precision model's verdict of those calls (the statistics' estimate gives way to the measurement), then the
result's ``diverges``, ``result`` and ``reasons`` (docs/compare.md, "Own error by replay").
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from . import precision_model as P

#: the measurement's columns, one row per (call, side, output)
COLUMNS = ("step", "rank", "call", "side", "side_call", "output", "dtype", "op_class", "precision", "own_err",
           "own_bound", "own_ratio", "reduction_len", "inherited_err", "ms", "note")
_SIDE = {"npu": "the NPU's", "bench": "the bench's"}


def _api_outputs(t: pd.DataFrame) -> pd.DataFrame:
    """The judged output rows of API calls (the rows the precision model gives a verdict)."""
    return t[(t["verdict"].astype(str) != "") & ~t["call"].astype(str).str.startswith(("Module.", "Cell."))]


def suspects(t: pd.DataFrame, calls: list[str] | None, *, n: int = 8, around: int = 1) -> list[tuple]:
    """(step, rank, call, bench step, bench rank, bench call) to replay, in execution order: the named
    ``calls``, or the anomalous calls and each pair's first diverging API call (at most ``n``) with ``around``
    judged calls either side of each; where there is none, the ``n`` calls with the largest bound ratio."""
    out = _api_outputs(t)
    if not len(out):
        return []
    per_call = out.groupby(["pair", "call"], sort=False).agg(
        step=("step", "first"), rank=("rank", "first"), ci=("call_index", "min"), b_step=("bench_step", "first"),
        b_rank=("bench_rank", "first"), b_call=("bench_call", "first"), ratio=("bound_ratio", "max"),
        anom=("verdict", lambda v: bool((v == P.ANOMALOUS).any())),
        div=("diverges", "any")).reset_index().sort_values(["pair", "ci"], kind="stable").reset_index(drop=True)
    if calls is not None:
        chosen = per_call.index[per_call["call"].isin(calls)].tolist()
    else:
        first_div = per_call[per_call["div"]].groupby("pair").head(1).index.tolist()
        core = sorted(set(per_call.index[per_call["anom"]].tolist()) | set(first_div))[:max(int(n), 0)]
        if not core:
            core = per_call["ratio"].fillna(-1).nlargest(max(int(n), 0)).index.tolist()
        chosen = set()
        for i in core:
            same = per_call.index[per_call["pair"] == per_call.at[i, "pair"]]
            lo, hi = same.min(), same.max()
            chosen.update(range(max(lo, i - around), min(hi, i + around) + 1))
        chosen = sorted(chosen)
    sel = per_call.loc[chosen]
    return [(int(r.step), int(r.rank), str(r.call), int(r.b_step), int(r.b_rank), str(r.b_call))
            for r in sel.itertuples()]


def refine(result: Any, m: pd.DataFrame) -> None:
    """Rewrite, in place, the verdicts of the calls measured in ``m`` (:data:`COLUMNS`): a call is anomalous
    when either side's own error exceeds ``tolerance`` times its bound, within precision when both are
    measured within it; its figures are the worse side's. Then the pairs judged by the model, ``diverges``
    and the grades follow, as compare() made them."""
    from .compare import _one_verdict, _quiet_noise
    ctx = result._ctx
    tol = ctx.precision.tolerance
    ok = m[m["own_ratio"].notna()]
    if not len(ok):
        return
    for c, fill in (("npu_own_err", np.nan), ("bench_own_err", np.nan), ("npu_own_bound", np.nan),
                    ("bench_own_bound", np.nan), ("verdict_by", "")):
        if c not in result.columns:
            result[c] = pd.Series(fill, index=result.index, dtype=object if fill == "" else float)
    worst = ok.loc[ok.groupby(["step", "rank", "call", "side"])["own_ratio"].idxmax()]
    key = list(zip(result["step"].astype(int), result["rank"].astype(int), result["call"].astype(str)))
    judged = (result["verdict"].astype(str) != "").to_numpy()
    cols = {c: result[c].to_numpy(dtype=object).copy() for c in ("verdict", "verdict_by", "precision")}
    nums = {c: result[c].to_numpy(dtype=float).copy() for c in ("npu_own_err", "bench_own_err", "npu_own_bound",
                                                               "bench_own_bound", "own_err", "bound", "bound_ratio",
                                                               "own_allowance", "inherited_err")}
    for (step, rank, call), g in worst.groupby(["step", "rank", "call"]):
        rows = np.flatnonzero(judged & np.array([k == (step, rank, call) for k in key], dtype=bool))
        if not len(rows):
            continue
        by = {s: g[g["side"] == s].iloc[0] for s in ("npu", "bench") if (g["side"] == s).any()}
        for s, r in by.items():
            nums[f"{s}_own_err"][rows], nums[f"{s}_own_bound"][rows] = r["own_err"], r["own_bound"]
        w = max(by.values(), key=lambda r: r["own_ratio"])
        cols["verdict"][rows] = P.ANOMALOUS if w["own_ratio"] > tol else P.WITHIN
        cols["verdict_by"][rows] = f"replay:{w['side']}"
        cols["precision"][rows] = w["precision"]
        nums["own_err"][rows], nums["bound"][rows] = w["own_err"], w["own_bound"]
        nums["own_allowance"][rows], nums["bound_ratio"][rows] = w["own_bound"], w["own_ratio"]
        inh = g["inherited_err"].dropna()
        if len(inh):
            nums["inherited_err"][rows] = float(inh.max())
    for c, v in {**cols, **nums}.items():
        result[c] = v
    t = pd.DataFrame(result)
    verdict = cols["verdict"]
    ctx.noisy = P.noise_pairs(t, verdict, ctx.thresholds.diverge_skip_ops)
    exact = t["diverges_exact"].to_numpy(dtype=bool)
    result["diverges"] = P.precision_diverges(t, exact, verdict, ctx.noisy)
    graded = getattr(ctx, "graded_reasons", None)
    if graded is not None:  # the grades again from msprobe's, then the verdicts over them
        result["result"] = result["msprobe_result"].to_numpy(dtype=object)
        result["reasons"] = pd.Series([list(x) for x in graded.reindex(result.index)], index=result.index,
                                      dtype=object)
        _one_verdict(result, ctx.thresholds)
        _quiet_noise(result)


def describe_replay(row: Any, tolerance: float) -> str:
    """A verdict measured by replay, with its figures, in words."""
    side = str(row.get("verdict_by", "")).partition(":")[2] or "npu"
    cls = str(row.get("op_class", "other"))
    what = P.DESCRIBE.get(cls, "this op")
    k = row.get("reduction_len", np.nan)
    if cls in ("matmul", "softmax", "normalisation", "reduction") and k == k and k and k > 1:
        what += f" over {int(k)}"
    prec = row.get("precision", "") or "its"
    other = "bench" if side == "npu" else "npu"
    o_err, o_b = float(row.get(f"{other}_own_err", np.nan)), float(row.get(f"{other}_own_bound", np.nan))
    also = f"; {_SIDE[other]} own error {o_err:.3g} ({o_err / o_b:.2g}x its bound)" if o_err == o_err and o_b else ""
    inh = float(row.get("inherited_err", np.nan))
    inh_s = f", inherited error {inh:.3g}" if inh == inh else ""
    ratio = float(row["bound_ratio"])
    if row.get("verdict") == P.ANOMALOUS:
        blame = "the bench's kernel is wrong, not the NPU's" if side == "bench" else "not precision noise"
        return (f"anomalous: own error {float(row['own_err']):.3g} (measured by replay, {_SIDE[side][:-2]} side) "
                f"is {ratio:.3g}x what {prec} allows for {what} (bound {float(row['bound']):.3g}, tolerance "
                f"{tolerance:g}x{inh_s}{also}): {blame}")
    return f"within precision: own error measured by replay {ratio:.3g}x its bound for {what} in {prec}{also}"
