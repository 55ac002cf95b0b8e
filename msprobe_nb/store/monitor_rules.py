"""The monitor's alert rules, the one implementation (numpy only): the running ``Monitor`` applies them step by
step as it trains, and ``load_monitor(...).anomalies()`` replays the record through the same object, so the
two agree by construction (tests/test_monitor_alerts.py checks it on random planted series).

Each series (a gradient's norm, an activation's, the loss, ...) is judged against its own recent past:

* ``nonfinite``: a value is NaN or infinite, the first time in its series (what follows is its consequence);
* ``spike``: once a series holds ``warmup`` positive finite values, a value whose log lies more than
  ``spike_z`` robust standard deviations (1.4826 x the median absolute deviation) above the median of the
  series' last ``window`` log values, and at least ``spike_ratio`` times that median. Logs, since norms move
  by factors; the median and the MAD, since one earlier spike must not hide the next; a window, so that the
  slow trend of training (norms fall by orders of magnitude) is not a spike;
* ``direction_drop``: a gradient's sign agreement with its previous step that fell below the median of its
  window by more than ``spike_z`` robust deviations and by more than ``direction_drop`` x that median.

Zero and negative magnitudes are neither judged nor kept (a norm of 0 says nothing of a spike; a loss that
can be negative is not watched). docs/monitor.md gives the thresholds (``monitor_schema.THRESHOLDS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from msprobe_nb.store.monitor_schema import THRESHOLDS

__all__ = ["MAD_TO_SIGMA", "Alert", "AlertRules", "alert_message"]

#: the MAD of normally distributed values times this is their standard deviation
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Alert:
    """One hit of a rule: the series (an id the caller assigned), the value, the series' median over its
    window (``reference``) and ``severity``: how far past the rule's threshold (1: at it; inf: not finite)."""

    step: int
    series: int
    rule: str
    value: float
    reference: float
    severity: float


class AlertRules:
    """Running windows of many series, indexed by small integer ids, and the rules above over them."""

    def __init__(self, warmup: int = THRESHOLDS["warmup"], window: int = THRESHOLDS["window"],
                 spike_z: float = THRESHOLDS["spike_z"], spike_ratio: float = THRESHOLDS["spike_ratio"],
                 direction_drop: float = THRESHOLDS["direction_drop"]) -> None:
        if not (1 <= int(warmup) <= int(window)) or spike_z < 0 or spike_ratio < 1 or not 0 <= direction_drop <= 1:
            raise ValueError(f"alert thresholds out of range: warmup={warmup!r}, window={window!r} (1 <= warmup "
                             f"<= window), spike_z={spike_z!r} (>= 0), spike_ratio={spike_ratio!r} (>= 1), "
                             f"direction_drop={direction_drop!r} (0..1)")
        self.warmup, self.window = int(warmup), int(window)
        self.spike_z, self.spike_ratio, self.direction_drop = float(spike_z), float(spike_ratio), float(direction_drop)
        self._log_ratio = math.log(self.spike_ratio)
        self._buf = np.zeros((0, self.window))
        self._count = np.zeros(0, np.int64)
        self._told = np.zeros(0, bool)  # per series: its first non-finite value was reported

    @property
    def thresholds(self) -> dict[str, float]:
        return {"warmup": self.warmup, "window": self.window, "spike_z": self.spike_z,
                "spike_ratio": self.spike_ratio, "direction_drop": self.direction_drop}

    def _grow(self, n: int) -> None:
        if n > len(self._count):
            extra = max(n - len(self._count), len(self._count) // 2)
            self._buf = np.concatenate([self._buf, np.zeros((extra, self.window))])
            self._count = np.concatenate([self._count, np.zeros(extra, np.int64)])
            self._told = np.concatenate([self._told, np.zeros(extra, bool)])

    def _robust(self, series: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(median, MAD) of each series' window (its last min(count, window) values)."""
        n = np.minimum(count, self.window)
        if n.min() == n.max():  # the common case: every series judged has as many values
            block = self._buf[series, :n[0]]
            m = _median(block)
            return m, _median(np.abs(block - m[:, None]))
        med, mad = np.empty(len(series)), np.empty(len(series))
        for k in np.unique(n):
            at = np.flatnonzero(n == k)
            block = self._buf[series[at], :k]
            m = _median(block)
            med[at] = m
            mad[at] = _median(np.abs(block - m[:, None]))
        return med, mad

    def observe(self, step: int, series: np.ndarray, values: np.ndarray, direction: bool = False) -> list[Alert]:
        """Judge one step's ``values`` of ``series`` (ids, each at most once), then add them to the windows.
        ``direction``: the values are sign agreements (the drop rule) rather than magnitudes (the spike rule)."""
        series = np.asarray(series, np.int64)
        values = np.asarray(values, np.float64)
        if not len(series):
            return []
        self._grow(int(series.max()) + 1)
        out: list[Alert] = []
        if direction:
            ok = np.isfinite(values)
            x = values
        else:
            ok = (values > 0) & (values < math.inf)  # False for NaN too
            if not ok.all():
                bad = ~np.isfinite(values) & ~self._told[series]
                for i in np.flatnonzero(bad):
                    out.append(Alert(step, int(series[i]), "nonfinite", float(values[i]), math.nan, math.inf))
                self._told[series[bad]] = True
            with np.errstate(divide="ignore", invalid="ignore"):
                x = np.log(values)
        count = self._count[series]
        judge = np.flatnonzero(ok & (count >= self.warmup))
        if len(judge):
            s = series[judge]
            med, mad = self._robust(s, count[judge])
            if direction:
                dev, floor = med - x[judge], self.direction_drop * med
            else:
                dev, floor = x[judge] - med, self._log_ratio
            bar = np.maximum(self.spike_z * MAD_TO_SIGMA * mad, floor)
            for j in np.flatnonzero((dev > bar) & (dev > 0)):
                i = judge[j]
                ref = float(med[j]) if direction else math.exp(med[j])
                sev = float(dev[j] / bar[j]) if bar[j] > 0 else math.inf
                out.append(Alert(step, int(series[i]), "direction_drop" if direction else "spike", float(values[i]),
                                 ref, sev))
        if ok.all():
            self._buf[series, count % self.window] = x
            self._count[series] = count + 1
            return out
        keep = series[ok]
        pos = self._count[keep] % self.window
        self._buf[keep, pos] = x[ok]
        self._count[keep] += 1
        return out


def _median(block: np.ndarray) -> np.ndarray:
    """The median of each row (``np.median``'s value, from one partition: a step judges many rows)."""
    k = block.shape[1]
    h = k // 2
    if k % 2:
        return np.partition(block, h, axis=1)[:, h]
    p = np.partition(block, (h - 1, h), axis=1)
    return (p[:, h - 1] + p[:, h]) / 2


def alert_message(rule: str, kind: str, name: str, value: float, reference: float) -> str:
    """The words of one alert (the console's and ``anomalies()``'s ``message``). ``kind``: the row's kind,
    ``scalar`` for a per-step scalar, ``direction`` for a gradient's sign agreement."""
    what = {"scalar": name, "direction": f"gradient direction of {name}"}.get(kind, f"{kind} of {name}")
    if rule == "nonfinite":
        return f"{what} is {value} (first seen)"
    if rule == "spike":
        return f"{what} spiked to {value:.4g}, {value / reference:.3g}x its median {reference:.4g}"
    return f"{what}: {value:.1%} of signs agree with the previous step, against a median {reference:.1%}"
