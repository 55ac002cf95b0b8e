"""``load_monitor(path)``: a monitor record as DataFrames, and ``anomalies()``: its alert rules over every step.

The rules are the store's ``monitor_rules``, the very object the running ``Monitor`` judges each step with:
``anomalies()`` replays the record through it step by step, so what the run printed and what the record
lists agree (docs/monitor.md). Thresholds default to those the run was recorded with. pandas and numpy only;
the HDF5 reader is imported when a record is loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.store.monitor_rules import AlertRules, alert_message
from msprobe_nb.store.monitor_schema import ANOMALY_COLUMNS, PARAM_KINDS, RULES, SPIKE_KINDS, SPIKE_SCALARS, THRESHOLDS

__all__ = ["ANOMALY_COLUMNS", "MonitorFrame", "RULES", "SPIKE_KINDS", "layer_of", "load_monitor"]

_RULE_ARGS = ("warmup", "window", "spike_z", "spike_ratio", "direction_drop", "spike_floor")


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
    #: the scalars as recorded (step, rank, name, value): a step that did not record one has no row
    _scalar_rows: pd.DataFrame | None = field(default=None, repr=False)

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
        return THRESHOLDS[name]

    def signs(self, rank: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
        """(table of the gradient sign bitmaps of ``rank``: step, name, numel, start, nbytes; their bytes)."""
        return self._signs.get(int(rank), (pd.DataFrame(columns=["step", "name", "numel", "start", "nbytes"]),
                                           np.zeros(0, np.uint8)))

    def _series(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """(the magnitudes the spike rule watches: step, rank, name, kind, value; the sign agreements the drop
        rule watches, or None), as the running monitor handed them to the rules."""
        s = self.stats
        watch = s.loc[s["kind"].isin(SPIKE_KINDS), ["step", "rank", "name", "kind", "norm"]]
        parts = [watch.rename(columns={"norm": "value"})]
        sc = self._scalar_rows
        if sc is None:  # a frame built by hand: the wide scalars, a missing value taken as not recorded
            sc = self.scalars.melt(id_vars=["step", "rank"], var_name="name").dropna(subset=["value"])
        sc = sc.loc[sc["name"].isin(SPIKE_SCALARS)]
        parts.append(sc[["step", "rank", "name", "value"]].assign(kind="scalar"))
        direction = None
        if "sign_agree" in s.columns:
            big = (s["kind"] == "grad") & (s["numel"] >= self.threshold("direction_min_numel"))
            direction = s.loc[big, ["step", "rank", "name", "sign_agree"]].rename(columns={"sign_agree": "value"})
            direction = direction.assign(kind="direction")
        return pd.concat(parts, ignore_index=True), direction

    def anomalies(self, **thresholds: float) -> pd.DataFrame:
        """Every alert of the rules over the record, most severe first: the non-finite values (each series'
        first, by step), then spikes and direction drops by severity; ``ANOMALY_COLUMNS``. Thresholds
        (``warmup``, ``window``, ``spike_z``, ``spike_ratio``, ``spike_floor``, ``direction_drop``) default
        to the run's."""
        unknown = sorted(set(thresholds) - set(_RULE_ARGS))
        if unknown:
            raise TypeError(f"anomalies() got unknown threshold(s) {unknown}; known: {', '.join(_RULE_ARGS)}")
        args = {k: thresholds[k] if thresholds.get(k) is not None else self.threshold(k) for k in _RULE_ARGS}
        mags, direction = self._series()
        found = _replay(mags, args, direction=False)
        if direction is not None:
            found += _replay(direction, args, direction=True)
        if not found:
            return pd.DataFrame(columns=ANOMALY_COLUMNS)
        out = pd.DataFrame(found, columns=["step", "rank", "name", "kind", "rule", "value", "reference", "severity"])
        out["message"] = [alert_message(r.rule, r.kind, r.name, r.value, r.reference)
                          for r in out.itertuples(index=False)]
        out["kind"] = out["kind"].replace({"direction": "grad"})
        out["layer"] = [layer_of(n, k) for n, k in zip(out["name"], out["kind"], strict=True)]
        pos = {n: i for i, n in enumerate(self.order)}
        out["_rule"] = out["rule"].map({r: i for i, r in enumerate(RULES)})
        out["_pos"] = out["name"].map(pos).fillna(len(pos))
        out["_sev"] = -out["severity"]
        out = out.sort_values(["_rule", "_sev", "step", "rank", "_pos"], kind="stable")
        return out[ANOMALY_COLUMNS].reset_index(drop=True)

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        ranks = sorted(self.meta)
        return (f"MonitorFrame({self.path!r}: {len(self)} step(s), rank(s) {ranks}, {self.stats['name'].nunique()} "
                f"name(s), columns {self.columns})")


def _replay(series: pd.DataFrame, thresholds: dict[str, Any], direction: bool) -> list[tuple]:
    """Feed ``series`` (step, rank, name, kind, value) to a fresh ``AlertRules`` one step at a time, as the
    run did; (step, rank, name, kind, rule, value, reference, severity) per alert."""
    if series.empty:
        return []
    t = series.sort_values("step", kind="stable").reset_index(drop=True)
    key = t.groupby(["rank", "kind", "name"], sort=False).ngroup().to_numpy()
    steps, values = t["step"].to_numpy(np.int64), t["value"].to_numpy(np.float64)
    rules = AlertRules(**thresholds)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(steps)) + 1, [len(t)]])
    rank, name, kind = t["rank"].to_numpy(), t["name"].to_numpy(), t["kind"].to_numpy()
    row_of = {}
    out = []
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        ids = key[a:b]
        found = rules.observe(int(steps[a]), ids, values[a:b], direction=direction)
        if not found:
            continue
        for i in range(a, b):
            row_of[key[i]] = i
        for al in found:
            i = row_of[al.series]
            out.append((al.step, int(rank[i]), name[i], kind[i], al.rule, al.value, al.reference, al.severity))
    return out


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


def load_monitor(path: str | Path | MonitorFrame) -> MonitorFrame:
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
    rows = pd.concat([pd.DataFrame({"step": r["scalar_step"].astype(np.int64), "rank": r["rank"],
                                    "name": np.asarray(r["names"], dtype=object)[r["scalar_name"]]
                                    if len(r["scalar_name"]) else np.zeros(0, object), "value": r["scalar_value"]})
                      for r in raws], ignore_index=True)
    return MonitorFrame(str(path), st, sc, meta, order, signs, rows)
