"""The monitor's alert rules, the one implementation (numpy only): the running ``Monitor`` applies them step by
step as it trains, and ``load_monitor(...).anomalies()`` replays the record through the same object, so the
two agree by construction (tests/test_monitor_alerts.py checks it on random planted series).

Each series (a gradient's norm, an activation's, the loss, ...) is judged against its own recent past, in
logs (norms move by factors):

* ``nonfinite``: a value is NaN or infinite, the first time in its series (what follows is its consequence);
* ``spike``: once a series holds ``warmup`` positive finite values, a value that jumps from the previous
  one, beyond the series' typical change per step (the median change over its last ``window`` values), by
  more than a factor ``spike_ratio`` and by more than ``spike_z`` robust standard deviations of its changes
  (1.4826 x their median absolute deviation), and is at least ``spike_floor`` x the series' level over its
  warm-up. A jump, so that training's trends (norms fall by orders of magnitude, rise for a while in an
  early phase) are followed, not flagged; robust statistics, so that one earlier spike does not hide the
  next; the floor, so that the noise of a series that has converged to nothing (a loss of 1e-7 that
  wobbles by factors) is not news;
* ``direction_drop``: a gradient's sign agreement with its previous step that fell from the previous one
  (same rule, on the values themselves) by more than ``spike_z`` robust deviations and by more than
  ``direction_drop`` x that previous value.

A series' typical change and spread are refreshed every ``REFRESH`` values (from its first judged one on), so
most steps cost one small median per series. Zero and negative magnitudes are neither judged nor kept (a norm
of 0 says nothing of a spike; a loss that can be negative is not watched). docs/monitor.md gives the
thresholds (``monitor_schema.THRESHOLDS``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from msprobe_nb.store.monitor_schema import THRESHOLDS

__all__ = ["MAD_TO_SIGMA", "Alert", "AlertRules", "alert_message"]

#: the MAD of normally distributed values times this is their standard deviation
MAD_TO_SIGMA = 1.4826
#: a series' typical change and spread are recomputed from its window every this many of its values (and at
#: its first judged value): a step then costs a small median, not two partitions of every window
REFRESH = 8


@dataclass(frozen=True)
class Alert:
    """One hit of a rule: the series (an id the caller assigned), the value, what the series' previous value
    and typical change led to expect (``reference``) and ``severity``: how far past the rule's bar (1: at it;
    inf: not finite)."""

    step: int
    series: int
    rule: str
    value: float
    reference: float
    severity: float


class AlertRules:
    """Running windows of many series, indexed by small integer ids, and the rules above over them."""

    def __init__(self, warmup: int = int(THRESHOLDS["warmup"]), window: int = int(THRESHOLDS["window"]),
                 spike_z: float = THRESHOLDS["spike_z"], spike_ratio: float = THRESHOLDS["spike_ratio"],
                 direction_drop: float = THRESHOLDS["direction_drop"],
                 spike_floor: float = THRESHOLDS["spike_floor"]) -> None:
        if not (2 <= int(warmup) <= int(window)) or spike_z < 0 or spike_ratio < 1 or not 0 <= direction_drop <= 1 \
                or not 0 <= spike_floor:
            raise ValueError(f"alert thresholds out of range: warmup={warmup!r}, window={window!r} (2 <= warmup "
                             f"<= window), spike_z={spike_z!r} (>= 0), spike_ratio={spike_ratio!r} (>= 1), "
                             f"direction_drop={direction_drop!r} (0..1), spike_floor={spike_floor!r} (>= 0)")
        self.warmup, self.window = int(warmup), int(window)
        self.spike_z, self.spike_ratio, self.direction_drop = float(spike_z), float(spike_ratio), float(direction_drop)
        self.spike_floor = float(spike_floor)
        self._log_ratio = math.log(self.spike_ratio)
        self._log_floor = math.log(self.spike_floor) if self.spike_floor > 0 else -math.inf
        self._buf = np.zeros((0, self.window))
        self._count = np.zeros(0, np.int64)
        self._told = np.zeros(0, bool)  # per series: its first non-finite value was reported
        self._slope = np.zeros(0)  # per series: its median change per step at its last refresh
        self._bar = np.zeros(0)  # and how far a value must jump from the previous one (in the rule's direction)
        self._low = np.zeros(0)  # the log of the least value a spike may have (spike_floor x its warm-up level)
        self._diffs = np.zeros((0, self.window))  # per series: its last ``window`` changes (a ring, any order)
        self._last = np.zeros(0)  # and its last value kept

    @property
    def thresholds(self) -> dict[str, float]:
        return {"warmup": self.warmup, "window": self.window, "spike_z": self.spike_z,
                "spike_ratio": self.spike_ratio, "direction_drop": self.direction_drop, "spike_floor": self.spike_floor}

    def _grow(self, n: int) -> None:
        if n > len(self._count):
            extra = max(n - len(self._count), len(self._count) // 2)
            self._buf = np.concatenate([self._buf, np.zeros((extra, self.window))])
            self._count = np.concatenate([self._count, np.zeros(extra, np.int64)])
            self._told = np.concatenate([self._told, np.zeros(extra, bool)])
            self._slope = np.concatenate([self._slope, np.zeros(extra)])
            self._bar = np.concatenate([self._bar, np.zeros(extra)])
            self._low = np.concatenate([self._low, np.zeros(extra)])
            self._diffs = np.concatenate([self._diffs, np.zeros((extra, self.window))])
            self._last = np.concatenate([self._last, np.zeros(extra)])

    def _refresh(self, series: np.ndarray, count: np.ndarray, direction: bool, prev: np.ndarray) -> None:
        """Recompute the typical change per step and the hit bar of ``series`` from their windows (and, at
        the end of a series' warm-up, its floor)."""
        n = np.minimum(count - 1, self.window)  # the changes held: positions 0..n-1 of each ring
        slope, mad = np.empty(len(series)), np.empty(len(series))
        for k in ([int(n[0])] if (n == n[0]).all() else np.unique(n)):
            at = slice(None) if len(series) and (n == k).all() else np.flatnonzero(n == k)
            d = self._diffs[series[at], :k]
            m = _median(d)
            slope[at] = m
            mad[at] = _median(np.abs(d - m[:, None]))
        floor = self.direction_drop * prev if direction else self._log_ratio
        self._slope[series] = slope
        self._bar[series] = np.maximum(self.spike_z * MAD_TO_SIGMA * mad, floor)
        first = count == self.warmup
        if first.any() and not direction:
            at = np.flatnonzero(first)
            self._low[series[at]] = _median(self._buf[series[at], :self.warmup]) + self._log_floor

    def _steady(self, step: int, series: np.ndarray, values: np.ndarray, x: np.ndarray, c: int,
                direction: bool) -> list[Alert]:
        """``observe`` in the common case: every value judged, every series as long (``c`` values)."""
        prev = self._last[series]
        if (c - self.warmup) % REFRESH == 0:
            self._refresh(series, self._count[series], direction, prev)
        expected = prev + self._slope[series]
        dev = expected - x if direction else x - expected
        bar = self._bar[series]
        hit = dev > bar  # the bar is >= 0: a hit is past the expected value in the rule's direction
        if not direction:
            hit &= x >= self._low[series]
        out = []
        if hit.any():
            for j in np.flatnonzero(hit):
                ref = float(expected[j]) if direction else math.exp(expected[j])
                sev = float(dev[j] / bar[j]) if bar[j] > 0 else math.inf
                out.append(Alert(step, int(series[j]), "direction_drop" if direction else "spike", float(values[j]),
                                 ref, sev))
        self._keep(series, x, c)
        return out

    def _keep(self, series: np.ndarray, x: np.ndarray, c: int | np.ndarray) -> None:
        """Add ``x`` to the windows of ``series``, which held ``c`` values each."""
        w = self.window
        self._diffs[series, (c - 1) % w] = np.where(c > 0, x - self._last[series], 0.0)
        self._buf[series, c % w] = x
        self._last[series] = x
        self._count[series] = c + 1

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
                x = np.log(np.where(ok, values, 1.0))
            else:
                x = np.log(values)
        count = self._count[series]
        c0 = int(count[0])
        if c0 >= self.warmup and not out and ok.all() and (count == c0).all():
            return self._steady(step, series, values, x, c0, direction)
        if ok.all() and count.min() >= self.warmup:  # the common case: every value judged
            judge, s = None, series
        else:
            judge = np.flatnonzero(ok & (count >= self.warmup))
            s = series[judge]
        if len(s):
            cs = count if judge is None else count[judge]
            prev = self._last[s]
            stale = (cs - self.warmup) % REFRESH == 0
            if stale.any():
                self._refresh(s[stale], cs[stale], direction, prev[stale])
            med = prev + self._slope[s]  # what the series' typical change makes of its previous value
            bar = self._bar[s]
            xs = x if judge is None else x[judge]
            dev = med - xs if direction else xs - med
            hit = (dev > bar) & (dev > 0)
            if not direction:
                hit &= xs >= self._low[s]
            for j in np.flatnonzero(hit):
                i = j if judge is None else judge[j]
                ref = float(med[j]) if direction else math.exp(med[j])
                sev = float(dev[j] / bar[j]) if bar[j] > 0 else math.inf
                out.append(Alert(step, int(series[i]), "direction_drop" if direction else "spike", float(values[i]),
                                 ref, sev))
        if ok.all():
            self._keep(series, x, count)
        else:
            self._keep(series[ok], x[ok], count[ok])
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
        return f"{what} spiked to {value:.4g}, {value / reference:.3g}x the {reference:.4g} expected"
    return f"{what}: {value:.1%} of signs agree with the previous step, after {reference:.1%}"
