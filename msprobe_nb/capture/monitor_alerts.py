"""The monitor's alert rules as they run, step by step, on the host values of a step (numpy only).

Three rules, the same ones ``load_monitor(...).anomalies()`` applies to the whole record afterwards
(docs/monitor.md names every threshold):

* ``nonfinite``: a value is NaN or infinite for the first time in its series;
* ``spike``: a value above ``(1 + spike) x`` the mean of its series' earlier finite values, once the series
  has ``min_history`` of them;
* ``direction_drop``: a gradient's sign agreement with the previous step below ``(1 - direction_drop) x`` the
  mean of its earlier agreements (same history rule), for tensors of ``DIRECTION_MIN_NUMEL`` values or more.

Each series is reported at most once per rule while the run goes on (the record keeps every value).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DIRECTION_DROP", "DIRECTION_MIN_NUMEL", "MIN_HISTORY", "SPIKE", "AlertRules", "RuntimeAlert"]

#: a value above (1 + SPIKE) x its history's mean is a spike (msprobe's turbulence rule, the same default)
SPIKE = 0.5
#: a series needs this many earlier finite values before spikes and drops are judged
MIN_HISTORY = 5
#: a sign agreement below (1 - DIRECTION_DROP) x its history's mean is a sudden drop in direction
DIRECTION_DROP = 0.3
#: the direction rule judges tensors of at least this many values (a few signs flip by chance)
DIRECTION_MIN_NUMEL = 256


@dataclass(frozen=True)
class RuntimeAlert:
    """One alert raised while the run goes on: the series (an id the caller assigned) and what broke."""

    step: int
    series: int
    rule: str
    value: float
    reference: float


class AlertRules:
    """Running histories of many series, indexed by small integer ids, and the rules above over them."""

    def __init__(self, spike: float = SPIKE, min_history: int = MIN_HISTORY,
                 direction_drop: float = DIRECTION_DROP) -> None:
        if spike < 0 or not 0 <= direction_drop <= 1 or min_history < 1:
            raise ValueError(f"alert thresholds out of range: spike={spike!r} (>= 0), direction_drop="
                             f"{direction_drop!r} (0..1), min_history={min_history!r} (>= 1)")
        self.spike, self.min_history, self.direction_drop = float(spike), int(min_history), float(direction_drop)
        self._sum = np.zeros(0)
        self._count = np.zeros(0, np.int64)
        self._told = np.zeros((0, 3), bool)  # per series: nonfinite, spike, direction_drop already reported

    def _grow(self, n: int) -> None:
        if n > len(self._sum):
            extra = n - len(self._sum)
            self._sum = np.concatenate([self._sum, np.zeros(extra)])
            self._count = np.concatenate([self._count, np.zeros(extra, np.int64)])
            self._told = np.concatenate([self._told, np.zeros((extra, 3), bool)])

    def observe(self, step: int, series: np.ndarray, values: np.ndarray,
                direction: bool = False) -> list[RuntimeAlert]:
        """Judge one step's ``values`` of ``series`` (ids, each at most once), then add them to the history.

        ``direction``: the values are sign agreements (the drop rule) rather than magnitudes (the spike rule).
        Returns the alerts not reported before for their series and rule.
        """
        series = np.asarray(series, np.int64)
        values = np.asarray(values, np.float64)
        if not len(series):
            return []
        self._grow(int(series.max()) + 1)
        s, c = self._sum[series], self._count[series]
        mean = s / np.maximum(c, 1)  # 0 where there is no history yet: not judged below anyway
        finite = np.isfinite(values)
        if direction:  # agreement is NaN on a first step only: never non-finite news
            rule, col = "direction_drop", 2
            hit = values < (1 - self.direction_drop) * mean
        else:
            rule, col = "spike", 1
            hit = values > (1 + self.spike) * mean
        hit &= finite
        hit &= c >= self.min_history
        out = []
        if not direction and not finite.all():
            for i in np.flatnonzero(~finite & ~self._told[series, 0]):
                out.append(RuntimeAlert(step, int(series[i]), "nonfinite", float(values[i]), float("nan")))
                self._told[series[i], 0] = True
        if hit.any():
            for i in np.flatnonzero(hit & ~self._told[series, col]):
                out.append(RuntimeAlert(step, int(series[i]), rule, float(values[i]), float(mean[i])))
                self._told[series[i], col] = True
        if finite.all():  # ids are unique: a fancy-index add, no np.add.at
            self._sum[series] += values
            self._count[series] += 1
        else:
            kept = series[finite]
            self._sum[kept] += values[finite]
            self._count[kept] += 1
        return out
