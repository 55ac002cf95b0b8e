"""``compare_monitors(a, b)``: two runs' monitor records step by step, and where they first part.

Per step, rank, name and kind: ``norm_ratio`` (a's norm over b's; 1 where both are 0) and, for gradients,
``direction``: the fraction of values whose signs agree between the runs (from the sign bitmaps), or where the
runs recorded histograms instead, the overlap of the two normalised histograms (the sum of the smaller share
of each bin). Learning rates per parameter group are compared too. A row parts when its norm ratio is off 1 by
more than ``norm_tolerance``, its direction is below ``direction_min``, one side is not finite and the other
is, or its group's learning rates differ; ``first_divergence()`` names the first step and, in it, the row that
parts the most. docs/monitor.md gives every threshold.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .monitor_frame import MonitorFrame, layer_of, load_monitor

__all__ = ["DIRECTION_MIN", "NORM_TOLERANCE", "MonitorComparison", "MonitorDivergence", "compare_monitors"]

#: a norm ratio off 1 by more than this parts (relative)
NORM_TOLERANCE = 0.01
#: a direction similarity below this parts (1: every sign agrees; 0.5: as if unrelated)
DIRECTION_MIN = 0.9
_KEY = ["step", "rank", "name", "kind"]
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.int64)


@dataclass(frozen=True)
class MonitorDivergence:
    """Where two runs first part: the step, the rank, the row (name, its layer, kind) and why."""

    step: int
    rank: int
    name: str
    layer: str
    kind: str
    norm_ratio: float
    direction: float
    reason: str

    def __str__(self) -> str:
        return f"step {self.step}, rank {self.rank}: {self.kind} of {self.name} (layer {self.layer}): {self.reason}"


def _sign_direction(a: MonitorFrame, b: MonitorFrame) -> pd.DataFrame:
    """step, rank, name, direction: the share of gradient signs that agree between the runs."""
    out = []
    for rank in sorted(set(a._signs) & set(b._signs)):
        ta, ba = a.signs(rank)
        tb, bb = b.signs(rank)
        m = ta.merge(tb, on=["step", "name"], suffixes=("_a", "_b"))
        m = m.loc[m["numel_a"] == m["numel_b"]].reset_index(drop=True)
        if m.empty:
            continue
        n = m["nbytes_a"].to_numpy()
        pos = np.concatenate([[0], np.cumsum(n)[:-1]])
        within = np.arange(int(n.sum())) - np.repeat(pos, n)
        xa = ba[np.repeat(m["start_a"].to_numpy(), n) + within]
        xb = bb[np.repeat(m["start_b"].to_numpy(), n) + within]
        differ = np.add.reduceat(_POPCOUNT[xa ^ xb], pos) if len(pos) else np.zeros(0, np.int64)
        out.append(pd.DataFrame({"step": m["step"], "rank": rank, "name": m["name"],
                                 "direction": 1.0 - differ / m["numel_a"].to_numpy()}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["step", "rank", "name", "direction"])


def _hist_direction(m: pd.DataFrame) -> pd.Series:
    """Overlap of the two runs' normalised histograms per row (NaN where either has none)."""
    ha = sorted(c for c in m.columns if c.startswith("hist_") and c.endswith("_a"))
    hb = [c[:-2] + "_b" for c in ha]
    if not ha or not all(c in m.columns for c in hb):
        return pd.Series(np.nan, index=m.index)
    pa, pb = m[ha].to_numpy(np.float64), m[hb].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        pa, pb = pa / pa.sum(axis=1, keepdims=True), pb / pb.sum(axis=1, keepdims=True)
    ok = np.isfinite(pa).all(1) & np.isfinite(pb).all(1)
    return pd.Series(np.minimum(pa, pb).sum(axis=1), index=m.index).where(ok)


def _lr_rows(a: MonitorFrame, b: MonitorFrame) -> pd.DataFrame:
    """Per step, rank and parameter group whose learning rates differ: a row naming the group's first parameter."""
    rows = []
    cols = [c for c in a.scalars.columns if (c == "lr" or c.startswith("lr/")) and c in b.scalars.columns]
    if not cols:
        return pd.DataFrame(columns=[*_KEY, "lr_a", "lr_b"])
    m = a.scalars.merge(b.scalars, on=["step", "rank"], suffixes=("_a", "_b"))
    for c in cols:
        va, vb = m[f"{c}_a"].to_numpy(np.float64), m[f"{c}_b"].to_numpy(np.float64)
        off = ~np.isclose(va, vb, rtol=1e-12, atol=0.0, equal_nan=True)
        group = 0 if c == "lr" else int(c.split("/", 1)[1])
        names = (a.meta.get(0) or next(iter(a.meta.values()), {})).get("groups") or []
        first = names[group][0] if group < len(names) and names[group] else c
        for i in np.flatnonzero(off):
            rows.append({"step": int(m["step"].iloc[i]), "rank": int(m["rank"].iloc[i]), "name": first,
                         "kind": "lr", "lr_a": float(va[i]), "lr_b": float(vb[i])})
    return pd.DataFrame(rows, columns=[*_KEY, "lr_a", "lr_b"])


class MonitorComparison:
    """Two monitor records side by side. ``table``: per step, rank, name and kind, ``norm_a``, ``norm_b``,
    ``norm_ratio``, ``direction`` and ``parts``; ``scalars``: the runs' scalars side by side (``loss_a``, ...)."""

    def __init__(self, a: MonitorFrame, b: MonitorFrame, norm_tolerance: float, direction_min: float) -> None:
        self.a, self.b = a, b
        self.norm_tolerance, self.direction_min = float(norm_tolerance), float(direction_min)
        keep = [c for c in a.stats.columns if c not in ("layer",)]
        m = a.stats[keep].merge(b.stats[[c for c in b.stats.columns if c != "layer"]], on=_KEY, suffixes=("_a", "_b"))
        na, nb = m["norm_a"].to_numpy(np.float64), m["norm_b"].to_numpy(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where((na == 0) & (nb == 0), 1.0, na / nb)
        t = m[_KEY].copy()
        t["layer"] = [layer_of(n, k) for n, k in zip(t["name"], t["kind"], strict=True)]
        t["norm_a"], t["norm_b"], t["norm_ratio"] = na, nb, ratio
        direction = _hist_direction(m)
        signs = _sign_direction(a, b)
        if len(signs):
            sd = t[["step", "rank", "name", "kind"]].merge(signs.assign(kind="grad"), how="left",
                                                         on=["step", "rank", "name", "kind"])["direction"]
            direction = pd.Series(sd.to_numpy(np.float64), index=t.index).fillna(direction)
        t["direction"] = direction.to_numpy(np.float64)
        fa, fb = np.isfinite(na), np.isfinite(nb)
        off = np.abs(ratio - 1.0) > self.norm_tolerance
        low = t["direction"].to_numpy() < self.direction_min
        t["parts"] = (fa != fb) | (fa & fb & (off | low))
        lr = _lr_rows(a, b)
        self.lr = lr
        self.table = t.reset_index(drop=True)
        sa = a.scalars.merge(b.scalars, on=["step", "rank"], how="outer", suffixes=("_a", "_b"))
        self.scalars = sa.sort_values(["step", "rank"], kind="stable").reset_index(drop=True)
        self.order = a.order + [n for n in b.order if n not in set(a.order)]

    def parting(self) -> pd.DataFrame:
        """The rows that part, by step and then by how far they part (the most first)."""
        t = self.table.loc[self.table["parts"]].copy()
        t["score"] = _score(t, self.direction_min)
        return t.sort_values(["step", "score"], ascending=[True, False], kind="stable").reset_index(drop=True)

    def first_divergence(self) -> MonitorDivergence | None:
        """The first step where the runs part and, in it, the row that parts the most (a learning-rate change
        of a parameter group counts as its first parameter's); None when they never part."""
        p = self.parting()
        first_lr = int(self.lr["step"].min()) if len(self.lr) else None
        if first_lr is not None and (p.empty or first_lr <= int(p["step"].iloc[0])):
            r = self.lr.loc[self.lr["step"] == first_lr].iloc[0]
            return MonitorDivergence(first_lr, int(r["rank"]), r["name"], layer_of(r["name"], "weight"), "lr",
                                     float(r["lr_a"] / r["lr_b"]) if r["lr_b"] else float("inf"), float("nan"),
                                     f"learning rate {r['lr_a']:g} vs {r['lr_b']:g}")
        if p.empty:
            return None
        r = p.iloc[0]
        return MonitorDivergence(int(r["step"]), int(r["rank"]), r["name"], r["layer"], r["kind"],
                                 float(r["norm_ratio"]), float(r["direction"]), _reason(r, self))

    def heatmap(self, value: str = "norm_ratio", kind: str = "grad", rank: int | None = None) -> pd.DataFrame:
        """``value`` per layer row (model order) and step column, for rows of ``kind``."""
        t = self.table.loc[self.table["kind"] == kind]
        if rank is not None:
            t = t.loc[t["rank"] == rank]
        h = t.pivot_table(index="name", columns="step", values=value, aggfunc="first", dropna=False)
        pos = {n: i for i, n in enumerate(self.order)}
        return h.loc[sorted(h.index, key=lambda n: pos.get(n, len(pos)))]

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        fd = self.first_divergence()
        return f"MonitorComparison({len(self.table)} row(s); first divergence: {fd if fd else 'none'})"


def _score(t: pd.DataFrame, direction_min: float) -> np.ndarray:
    r = t["norm_ratio"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = np.abs(np.log(np.abs(r)))
    s = np.where(np.isfinite(s), s, np.inf)
    d = (1.0 - t["direction"].to_numpy(np.float64))
    return np.fmax(s, np.where(np.isfinite(d), d, 0.0))


def _reason(r: Any, c: MonitorComparison) -> str:
    fa, fb = np.isfinite(r["norm_a"]), np.isfinite(r["norm_b"])
    if fa != fb:
        return f"norm {r['norm_a']:.6g} vs {r['norm_b']:.6g} (one side not finite)"
    parts = []
    if abs(r["norm_ratio"] - 1) > c.norm_tolerance:
        parts.append(f"norm ratio {r['norm_ratio']:.6g} (off 1 by more than {c.norm_tolerance:g})")
    if r["direction"] < c.direction_min:
        parts.append(f"direction similarity {r['direction']:.3f} (below {c.direction_min:g})")
    return "; ".join(parts)


def compare_monitors(a: str | Path | MonitorFrame, b: str | Path | MonitorFrame, norm_tolerance: float = NORM_TOLERANCE,
                     direction_min: float = DIRECTION_MIN) -> MonitorComparison:
    """Compare the monitor records ``a`` and ``b`` (folders or loaded ``MonitorFrame``)."""
    if norm_tolerance < 0 or not 0 <= direction_min <= 1:
        raise ValueError(f"norm_tolerance must be >= 0 and direction_min in 0..1, not {norm_tolerance!r}, "
                         f"{direction_min!r}")
    return MonitorComparison(load_monitor(a), load_monitor(b), norm_tolerance, direction_min)
