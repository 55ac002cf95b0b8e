"""The training monitor's alerts as the run goes: the one rule implementation (``store.monitor_rules``) fed
each committed step, every alert kept, and a bounded summary printed (a line per step with news, at most
``ALERT_LINES`` of them)."""
from __future__ import annotations

import sys

import numpy as np

from msprobe_nb.store.monitor_rules import AlertRules, alert_message
from msprobe_nb.store.monitor_schema import RULES, SPIKE_KINDS, SPIKE_SCALARS, THRESHOLDS

#: lines the console gets from the alert rules over a whole run (one per step with news, at most); the rest
#: are counted in one last line (``Monitor.alerts`` keeps every alert, ``anomalies()`` lists them)
ALERT_LINES = 10


class LiveAlerts:
    """The alert rules applied to a run's steps as they are committed, for one rank."""

    def __init__(self, rules: AlertRules, rank: int, col: dict[str, int]):
        self.rules, self.rank, self.col = rules, rank, col
        self.alerts: list[str] = []
        self._lines_printed = 0
        self._printed: set[tuple[str, int]] = set()  # (rule, series) already on the console
        self._series: dict[tuple[str, str], int] = {}
        self._alert_memo: tuple | None = None  # the last step's (kinds, names, scalars) and their series ids

    def observe(self, step: int, names: list[str], kinds: list[str], values: np.ndarray,
                scalars: dict[str, float]) -> None:
        """Judge one committed step's values (rows of ``names`` / ``kinds``, columns as ``col``) and scalars."""
        sc = [n for n in SPIKE_SCALARS if n in scalars]
        memo = self._alert_memo
        if memo is None or memo[0] != kinds or memo[1] != names or memo[2] != sc:  # most steps repeat the last
            rows = np.fromiter((i for i, k in enumerate(kinds) if k in SPIKE_KINDS), np.int64)
            keys = [(kinds[i], names[i]) for i in rows] + [("scalar", n) for n in sc]
            ids = np.fromiter((self._series.setdefault(k, len(self._series)) for k in keys), np.int64, len(keys))
            drows = dids = None
            if "sign_agree" in self.col:
                numel = values[:, self.col["numel"]]
                big = THRESHOLDS["direction_min_numel"]
                drows = np.fromiter((i for i, k in enumerate(kinds) if k == "grad" and numel[i] >= big), np.int64)
                dids = np.fromiter((self._series.setdefault(("direction", names[i]), len(self._series))
                                    for i in drows), np.int64, len(drows))
            memo = self._alert_memo = (list(kinds), list(names), sc, rows, ids, drows, dids)
        _, _, _, rows, ids, drows, dids = memo
        vals = np.concatenate([values[rows, 0], np.asarray([scalars[n] for n in sc], np.float64)])
        found = self.rules.observe(step, ids, vals)
        if drows is not None:
            found += self.rules.observe(step, dids, values[drows, self.col["sign_agree"]], direction=True)
        if found:
            self._report(step, found)

    def _report(self, step: int, found: list) -> None:
        """Keep every alert's line in ``alerts``; print a bounded summary: per step with news (a series and rule
        not printed before), its most severe alert and how many more it had, for ``ALERT_LINES`` such steps."""
        label = {v: k for k, v in self._series.items()}
        rank = {r: i for i, r in enumerate(RULES)}
        found = sorted(found, key=lambda a: (rank[a.rule], -a.severity))
        lines = []
        for a in found:
            kind, name = label[a.series]
            msg = alert_message(a.rule, kind, name, a.value, a.reference)
            lines.append(f"msprobe_nb monitor: step {step}, rank {self.rank}: {msg}")
        self.alerts += lines
        news = [i for i, a in enumerate(found) if (a.rule, a.series) not in self._printed]
        if not news:
            return
        self._printed.update((found[i].rule, found[i].series) for i in news)
        if self._lines_printed >= ALERT_LINES:
            return
        self._lines_printed += 1
        text = lines[news[0]]
        if len(found) > 1:
            text += (f"\nmsprobe_nb monitor: step {step}, rank {self.rank}: and {len(found) - 1} more alert(s) "
                     "(mon.alerts, load_monitor(...).anomalies())")
        if self._lines_printed == ALERT_LINES:
            text += (f"\nmsprobe_nb monitor: rank {self.rank}: {ALERT_LINES} steps with alerts printed; later ones "
                     "are not printed (mon.alerts keeps them)")
        print(text, file=sys.stdout, flush=True)
