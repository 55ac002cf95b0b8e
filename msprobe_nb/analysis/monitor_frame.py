"""``load_monitor(path)``: a monitor record as DataFrames, and ``anomalies()``: its alert rules over every step.

The rules are the ones the running ``Monitor`` prints (docs/monitor.md): ``nonfinite`` (a NaN or infinite value
first seen in a series), ``spike`` (above ``(1 + spike) x`` the mean of the series' earlier finite values, once
it has ``min_history`` of them) and ``direction_drop`` (a gradient's sign agreement with its previous step
below ``(1 - direction_drop) x`` its history's mean). Thresholds default to those the run was recorded with.
pandas and numpy only; the HDF5 reader is imported when a record is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["ANOMALY_COLUMNS", "MonitorFrame", "RULES", "SPIKE_KINDS", "layer_of",
           "load_monitor"]

#: the rules, in the order anomalies of one step are listed
RULES = ("nonfinite", "spike", "direction_drop")
#: kinds whose norms the spike rule watches; the scalars ``loss`` and ``grad_norm`` are watched too
SPIKE_KINDS = ("grad", "act", "act_grad")
SPIKE_SCALARS = ("loss", "grad_norm")
#: fallbacks for records that do not name their thresholds (the Monitor's defaults)
DEFAULTS = {"spike": 0.5, "min_history": 5, "direction_drop": 0.3, "direction_min_numel": 256}
ANOMALY_COLUMNS = ["step", "rank", "name", "layer", "kind", "rule", "value", "reference", "message"]
PARAM_KINDS = ("weight", "grad", "exp_avg", "exp_avg_sq")


def layer_of(name: str, kind: str) -> str:
    """The module a row belongs to: a parameter's module path (``layers.3.fc.weight`` -> ``layers.3.fc``), a
    module's own name for activations."""
    if kind in PARAM_KINDS and "." in name:
        return name.rsplit(".", 1)[0]
    return name


@dataclass
class MonitorFrame:
    """A loaded monitor record. ``stats``: one row per step, rank, name and kind with the recorded aggregates;
    ``scalars``: one row per step and rank (``loss``, ``grad_norm``, ``lr``, ``lr/<group>``, ``loss_scale``,
    ``micro_batches``); ``meta``: what each rank recorded; ``order``: names in model order."""

    path: str
    stats: pd.DataFrame
    scalars: pd.DataFrame
    meta: dict[int, dict[str, Any]]
    order: list[str]
    _signs: dict[int, tuple[pd.DataFrame, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.scalars["step"]) | set(self.stats["step"]))

    @property
    def columns(self) -> list[str]:
        """The aggregates recorded (value columns of ``stats``)."""
        return [c for c in self.stats.columns if c not in ("step", "rank", "name", "kind", "layer")]

    def threshold(self, name: str) -> float:
        """The alert threshold ``name`` the run was recorded with (rank 0's), else the default."""
        for m in self.meta.values():
            if name in m:
                return m[name]
        return DEFAULTS[name]

    def signs(self, rank: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
        """(table of the gradient sign bitmaps of ``rank``: step, name, numel, start, nbytes; their bytes)."""
        return self._signs.get(int(rank), (pd.DataFrame(columns=["step", "name", "numel", "start", "nbytes"]),
                                           np.zeros(0, np.uint8)))

    def anomalies(self, spike: float | None = None, min_history: int | None = None,
                  direction_drop: float | None = None) -> pd.DataFrame:
        """Every anomaly by the three rules, by step (then rule, rank, model order): ``ANOMALY_COLUMNS``."""
        spike = self.threshold("spike") if spike is None else spike
        min_history = int(self.threshold("min_history") if min_history is None else min_history)
        direction_drop = self.threshold("direction_drop") if direction_drop is None else direction_drop
        s = self.stats
        watch = s.loc[s["kind"].isin(SPIKE_KINDS), ["step", "rank", "name", "kind", "norm"]]
        if "nan" in s.columns:  # a count that saw NaN / inf although the norm is finite (it cannot be, but cheap)
            bad = s.loc[s["kind"].isin(SPIKE_KINDS), ["nan"] + (["inf"] if "inf" in s.columns else [])].sum(axis=1)
            watch = watch.assign(norm=watch["norm"].where(bad.to_numpy() == 0, np.nan))
        sc = self.scalars
        extra = [sc[["step", "rank", c]].rename(columns={c: "norm"}).assign(name=c, kind="scalar")
                 for c in SPIKE_SCALARS if c in sc.columns]
        series = pd.concat([watch, *extra], ignore_index=True)
        found = [_rule(series, "norm", spike, min_history, direction=False)]
        if "sign_agree" in s.columns:
            big = (s["kind"] == "grad") & (s["numel"] >= self.threshold("direction_min_numel"))
            g = s.loc[big, ["step", "rank", "name", "sign_agree"]]
            found.append(_rule(g.rename(columns={"sign_agree": "norm"}).assign(kind="direction"), "norm",
                               direction_drop, min_history, direction=True))
        out = pd.concat([f for f in found if len(f)], ignore_index=True) if any(len(f) for f in found) else None
        if out is None:
            return pd.DataFrame(columns=ANOMALY_COLUMNS)
        out["kind"] = out["kind"].replace({"direction": "grad"})
        out["layer"] = [layer_of(n, k) for n, k in zip(out["name"], out["kind"], strict=True)]
        pos = {n: i for i, n in enumerate(self.order)}
        out["_rule"] = out["rule"].map({r: i for i, r in enumerate(RULES)})
        out["_pos"] = out["name"].map(pos).fillna(len(pos))
        out = out.sort_values(["step", "_rule", "rank", "_pos"], kind="stable").drop(columns=["_rule", "_pos"])
        out["message"] = [_message(r, spike, direction_drop) for r in out.itertuples(index=False)]
        return out[ANOMALY_COLUMNS].reset_index(drop=True)

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        ranks = sorted(self.meta)
        return (f"MonitorFrame({self.path!r}: {len(self)} step(s), rank(s) {ranks}, {self.stats['name'].nunique()} "
                f"name(s), columns {self.columns})")


def _rule(series: pd.DataFrame, col: str, threshold: float, min_history: int, direction: bool) -> pd.DataFrame:
    """Rows of ``series`` (step, rank, name, kind, col) the rule flags: first non-finite value of each series
    (magnitudes only), spikes or drops against the mean of the series' earlier finite values."""
    if series.empty:
        return series.iloc[0:0]
    t = series.sort_values(["rank", "kind", "name", "step"], kind="stable").reset_index(drop=True)
    v = t[col].to_numpy(np.float64)
    finite = np.isfinite(v)
    key = t.groupby(["rank", "kind", "name"], sort=False).ngroup().to_numpy()
    fin_v = pd.Series(np.where(finite, v, 0.0))
    before_sum = fin_v.groupby(key).cumsum().to_numpy() - np.where(finite, v, 0.0)
    before_n = pd.Series(finite.astype(np.int64)).groupby(key).cumsum().to_numpy() - finite
    mean = np.divide(before_sum, before_n, out=np.full(len(v), np.nan), where=before_n > 0)
    judged = finite & (before_n >= min_history)
    parts = []
    if not direction:
        nf = t.loc[~finite].drop_duplicates(["rank", "kind", "name"])
        parts.append(nf.assign(rule="nonfinite", value=nf[col], reference=np.nan))
        hit = judged & (v > (1 + threshold) * mean)
        rule = "spike"
    else:
        hit = judged & (v < (1 - threshold) * mean)
        rule = "direction_drop"
    parts.append(t.loc[hit].assign(rule=rule, value=v[hit], reference=mean[hit]))
    out = pd.concat(parts, ignore_index=True)
    return out[["step", "rank", "name", "kind", "rule", "value", "reference"]]


def _message(r: Any, spike: float, drop: float) -> str:
    what = r.name if r.kind == "scalar" else f"{r.kind} of {r.name}"
    if r.rule == "nonfinite":
        return f"{what} is {r.value} (first seen)"
    if r.rule == "spike":
        return f"{what} spiked to {r.value:.4g}, above (1 + {spike:g}) x its mean {r.reference:.4g}"
    return (f"gradient direction of {r.name}: {r.value:.1%} of signs agree with the previous step, below "
            f"(1 - {drop:g}) x its mean {r.reference:.1%}")


def _frame_of(raw: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    names = np.asarray(raw["names"], dtype=object)
    kinds = np.asarray(raw["kinds"], dtype=object)
    stats = pd.DataFrame(raw["values"], columns=raw["columns"])
    stats.insert(0, "kind", kinds[raw["row_kind"]] if len(raw["row_kind"]) else np.zeros(0, object))
    stats.insert(0, "name", names[raw["row_name"]] if len(raw["row_name"]) else np.zeros(0, object))
    stats.insert(0, "rank", np.full(len(stats), raw["rank"], np.int64))
    stats.insert(0, "step", raw["row_step"].astype(np.int64))
    sc = pd.DataFrame({"step": raw["scalar_step"].astype(np.int64),
                       "name": names[raw["scalar_name"]] if len(raw["scalar_name"]) else np.zeros(0, object),
                       "value": raw["scalar_value"]})
    wide = sc.pivot_table(index="step", columns="name", values="value", aggfunc="last", sort=True)
    wide = wide.reindex(pd.Index(raw["steps"].astype(np.int64), name="step")).reset_index()
    wide.columns.name = None
    wide.insert(1, "rank", raw["rank"])
    signs = None
    if len(raw["sign_row"]):
        nbytes = (raw["sign_numel"] + 7) // 8
        signs = pd.DataFrame({"step": stats["step"].to_numpy()[raw["sign_row"]],
                              "name": stats["name"].to_numpy()[raw["sign_row"]], "numel": raw["sign_numel"],
                              "start": np.concatenate([[0], np.cumsum(nbytes)[:-1]]), "nbytes": nbytes})
    return stats, wide, signs


def load_monitor(path: str | Path) -> MonitorFrame:
    """Load the monitor record in the folder ``path`` (every rank; a run still going is read up to its last
    committed step). A damaged file is a DumpFormatError naming it."""
    if isinstance(path, MonitorFrame):
        return path
    from msprobe_nb.store.monitor_store import read_monitor

    raws = read_monitor(path)
    stats, scalars, meta, order, signs = [], [], {}, [], {}
    for raw in raws:
        st, sc, sg = _frame_of(raw)
        stats.append(st)
        scalars.append(sc)
        meta[raw["rank"]] = raw["meta"]
        order += [n for n in raw["meta"].get("parameters", []) if n not in order]
        order += [n for n in dict.fromkeys(st["name"]) if n not in order]
        if sg is not None:
            signs[raw["rank"]] = (sg, raw["sign_bytes"])
    st = pd.concat(stats, ignore_index=True)
    sc = pd.concat(scalars, ignore_index=True).sort_values(["step", "rank"], kind="stable").reset_index(drop=True)
    return MonitorFrame(str(path), st, sc, meta, order, signs)
