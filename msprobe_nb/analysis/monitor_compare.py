"""``compare_monitors(a, b)``: two runs' monitor records step by step, and where they first part.

Per step, rank, name and kind: ``norm_ratio`` (a's norm over b's; 1 where both are 0) and, for gradients,
``direction``: the fraction of values whose signs agree between the runs (from the sign bitmaps), or where the
runs recorded histograms instead, the overlap of the two normalised histograms (the sum of the smaller share
of each bin). Learning rates per parameter group are compared too. A row ``parts`` (the table, the heat map)
when its norm ratio is off 1 by more than ``norm_tolerance``, its direction is below ``direction_min``, or one
side is not finite and the other is.

``first_divergence()`` is where the runs leave their own agreement. Runs that are bitwise equal at first
(same seed, same device) part at the first value that differs at all; runs that differ from the start (two
devices) part at the first step after their first ``band_steps`` where a series' ratio leaves the band it held
over those steps (widened by its own width, or by ``band_rtol`` where it is narrower). Within that step, what
parted first is the earliest kind in the order a step makes them (``monitor_schema.CAUSAL_ORDER``: the weights
its forward used, activations, gradients, optimizer state), and of that kind the row that parts the most.
docs/monitor.md gives every threshold.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.store.monitor_schema import CAUSAL_ORDER, KIND_ROLE

from .monitor_frame import MonitorFrame, layer_of, load_monitor

__all__ = ["BAND_RTOL", "BAND_STEPS", "DIRECTION_MIN", "NORM_TOLERANCE", "MonitorComparison", "MonitorDivergence",
           "compare_monitors"]

#: a norm ratio off 1 by more than this parts (relative)
NORM_TOLERANCE = 0.01
#: a direction similarity below this parts (1: every sign agrees; 0.5: as if unrelated)
DIRECTION_MIN = 0.9
#: runs that differ from the start: the steps whose ratios make each series' band
BAND_STEPS = 20
#: and the least half-width of a band (relative), for series whose early ratios hardly moved
BAND_RTOL = 1e-3
_KEY = ["step", "rank", "name", "kind"]
_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.int64)


@dataclass(frozen=True)
class MonitorDivergence:
    """Where two runs first part: the step, the rank, the row (name, its layer, kind), why, and ``what``
    parted first (weight, gradient, optimizer state, ...); ``band``: the ratios the series held before (1, 1
    for runs that were bitwise equal); ``mode``: ``bitwise`` or ``band``."""

    step: int
    rank: int
    name: str
    layer: str
    kind: str
    norm_ratio: float
    direction: float
    reason: str
    what: str = ""
    band: tuple[float, float] = (1.0, 1.0)
    mode: str = "bitwise"

    def __str__(self) -> str:
        first = f" ({self.what} first)" if self.what else ""
        return (f"step {self.step}, rank {self.rank}: {self.kind} of {self.name} (layer {self.layer}){first}: "
                f"{self.reason}")


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

    def __init__(self, a: MonitorFrame, b: MonitorFrame, norm_tolerance: float, direction_min: float,
                 band_steps: int = BAND_STEPS, band_rtol: float = BAND_RTOL) -> None:
        self.a, self.b = a, b
        self.setup_note: str | None = None  # compare_monitors' line on the runs' set-ups (None: none to give)
        self.norm_tolerance, self.direction_min = float(norm_tolerance), float(direction_min)
        self.band_steps, self.band_rtol = int(band_steps), float(band_rtol)
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
        """Where the runs leave their own agreement (module docstring): the step, and in it what parted first;
        a learning-rate change of a parameter group at or before that step counts as its first parameter's.
        None when they never part."""
        first_lr = int(self.lr["step"].min()) if len(self.lr) else None
        found = self._first_parting()
        if first_lr is not None and (found is None or first_lr <= found.step):
            r = self.lr.loc[self.lr["step"] == first_lr].iloc[0]
            return MonitorDivergence(first_lr, int(r["rank"]), r["name"], layer_of(r["name"], "weight"), "lr",
                                     float(r["lr_a"] / r["lr_b"]) if r["lr_b"] else float("inf"), float("nan"),
                                     f"learning rate {r['lr_a']:g} vs {r['lr_b']:g}", KIND_ROLE["lr"])
        return found

    def _first_parting(self) -> MonitorDivergence | None:
        t = self.table
        if t.empty:
            return None
        t = t.loc[t["kind"].isin(CAUSAL_ORDER)]
        na, nb = t["norm_a"].to_numpy(np.float64), t["norm_b"].to_numpy(np.float64)
        direction = t["direction"].to_numpy(np.float64)
        steps = t["step"].to_numpy(np.int64)
        first = steps.min()
        same = (na == nb) | (np.isnan(na) & np.isnan(nb))
        exact = bool(same[steps == first].all()) and not (direction[steps == first] < 1).any() \
            and self._scalars_equal(int(first))
        if exact:
            differs = ~same | (direction < 1)
            loss_step = self._first_loss_difference()
            if not differs.any() and loss_step is None:
                return None
            step = int(steps[differs].min()) if differs.any() else int(loss_step or 0)  # loss_step is set here
            if loss_step is not None and loss_step < step:
                step = loss_step
            at = t.loc[differs & (steps == step)]
            if at.empty:  # only the loss differs at that step
                return MonitorDivergence(step, 0, "loss", "loss", "scalar", float("nan"), float("nan"),
                                         "the loss is the first value that differs", "loss")
            return self._pick(at, "bitwise", (1.0, 1.0),
                              lambda r: f"the first value that differs: norm {r['norm_a']:.9g} vs {r['norm_b']:.9g} "
                                        f"(ratio {r['norm_ratio']:.9g}; bitwise equal before)")
        return self._first_band_exit(t)

    def _first_band_exit(self, t: pd.DataFrame) -> MonitorDivergence | None:
        """Runs that differ from the start: the first step past the early ones where a series leaves its band."""
        steps = np.sort(t["step"].unique())
        if len(steps) <= self.band_steps:
            return None
        early_end = steps[self.band_steps - 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            logr = np.log(np.abs(t["norm_ratio"].to_numpy(np.float64)))
        t = t.assign(_logr=logr)
        key = ["rank", "name", "kind"]
        early = t.loc[(t["step"] <= early_end) & np.isfinite(t["_logr"])].groupby(key)["_logr"].agg(["min", "max"])
        late = t.loc[t["step"] > early_end].merge(early, left_on=key, right_index=True, how="left")
        width = np.maximum(late["max"] - late["min"], np.log1p(self.band_rtol))
        lo, hi = late["min"] - width, late["max"] + width
        fa, fb = np.isfinite(late["norm_a"]), np.isfinite(late["norm_b"])
        lr = late["_logr"]
        outside = (fa != fb) | (np.isfinite(lr) & ((lr < lo) | (lr > hi)))
        outside |= late["direction"] < self.direction_min
        if not outside.any():
            return None
        late = late.assign(_lo=np.exp(lo), _hi=np.exp(hi), _far=np.abs(lr - (lo + hi) / 2) / width)
        step = int(late.loc[outside, "step"].min())
        at = late.loc[outside & (late["step"] == step)]
        first, last = int(steps[0]), int(early_end)

        def reason(r: Any) -> str:
            if np.isfinite(r["norm_a"]) != np.isfinite(r["norm_b"]):
                return f"norm {r['norm_a']:.6g} vs {r['norm_b']:.6g} (one side not finite)"
            if r["direction"] < self.direction_min:
                return f"direction similarity {r['direction']:.3f} (below {self.direction_min:g})"
            return (f"norm ratio {r['norm_ratio']:.6g} left the band [{r['_lo']:.6g}, {r['_hi']:.6g}] it held "
                    f"over steps {first}-{last}")

        return self._pick(at, "band", None, reason, score="_far")

    def _pick(self, at: pd.DataFrame, mode: str, band: tuple[float, float] | None, reason: Any,
              score: str | None = None) -> MonitorDivergence:
        """The row of ``at`` (the rows that part in one step) that parted first: the earliest kind in the
        step's causal order, then the one that parts the most."""
        pos = {k: i for i, k in enumerate(CAUSAL_ORDER)}
        at = at.assign(_kind=at["kind"].map(pos), _score=at[score] if score else _score(at, 0.0))
        r = at.sort_values(["_kind", "_score"], ascending=[True, False], kind="stable").iloc[0]
        b = band if band is not None else (float(r["_lo"]), float(r["_hi"]))
        return MonitorDivergence(int(r["step"]), int(r["rank"]), r["name"], r["layer"], r["kind"],
                                 float(r["norm_ratio"]), float(r["direction"]), reason(r), KIND_ROLE[r["kind"]],
                                 b, mode)

    def _scalars_equal(self, step: int) -> bool:
        s = self.scalars.loc[self.scalars["step"] == step]
        if "loss_a" not in s or "loss_b" not in s:
            return True
        a, b = s["loss_a"].to_numpy(np.float64), s["loss_b"].to_numpy(np.float64)
        return bool(((a == b) | (np.isnan(a) & np.isnan(b))).all())

    def _first_loss_difference(self) -> int | None:
        s = self.scalars
        if "loss_a" not in s or "loss_b" not in s:
            return None
        a, b = s["loss_a"].to_numpy(np.float64), s["loss_b"].to_numpy(np.float64)
        off = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        return int(s["step"].to_numpy()[off].min()) if off.any() else None

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


def compare_monitors(a: str | Path | MonitorFrame, b: str | Path | MonitorFrame, norm_tolerance: float = NORM_TOLERANCE,
                     direction_min: float = DIRECTION_MIN, band_steps: int = BAND_STEPS,
                     band_rtol: float = BAND_RTOL) -> MonitorComparison:
    """Compare the monitor records ``a`` and ``b`` (folders or loaded ``MonitorFrame``)."""
    if norm_tolerance < 0 or not 0 <= direction_min <= 1 or band_steps < 1 or band_rtol < 0:
        raise ValueError(f"norm_tolerance must be >= 0, direction_min in 0..1, band_steps >= 1 and band_rtol >= 0, "
                         f"not {norm_tolerance!r}, {direction_min!r}, {band_steps!r}, {band_rtol!r}")
    from .setup_compare import setup_pointer  # the runs' set-ups, when both carry a record (docs/setup_check.md)
    ma, mb = load_monitor(a), load_monitor(b)
    if (pointer := setup_pointer(ma.path, mb.path)) is not None:
        print(f"msprobe_nb: {pointer}")
    out = MonitorComparison(ma, mb, norm_tolerance, direction_min, band_steps, band_rtol)
    out.setup_note = pointer
    return out
