"""The ``overflow_check`` task: keep only the calls around a rank's first overflow.

A step is recorded as the statistics task records it: every summary stays on its tensor's device until
the step ends, where the recorder reads them all back at once (one synchronisation per step, none per
call). Only then is the step searched for its first overflow: the first call, in execution order, whose
inputs (inputs, parameters) are all finite and whose outputs hold a NaN or an infinity. That call and the
:data:`CALLS_BEFORE` calls before it are written; a step without one writes nothing. Once an overflow is
written the rank records no further step.

The search is per rank: on several ranks, the rank where the overflow started is the one whose overflow
call is not a collective fed by another rank's non-finite values (``find_overflow`` on the dumps sorts
that out across ranks).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from msprobe_nb.store.schema import Coded

#: calls written before the first overflowing call (its inputs' producers are usually among them)
CALLS_BEFORE = 8


def _values(col: Any) -> np.ndarray:
    if isinstance(col, Coded):
        return np.asarray(col.values, dtype=object)[np.asarray(col.codes)]
    return np.asarray(col, dtype=object)


def _take(col: Any, keep: np.ndarray) -> Any:
    if isinstance(col, Coded):
        return Coded(np.asarray(col.codes)[keep], col.values)
    if isinstance(col, np.ndarray):
        return col[keep]
    return [v for v, k in zip(col, keep) if k]


def first_overflow(columns: dict[str, Any]) -> int | None:
    """``call_index`` of the first call whose inputs are finite and outputs are not, or None.

    Innermost first: a module whose outputs overflow because a call inside it did (at mix, or a submodule at
    L0) starts before that call, so among such calls the one with no overflowing call nested inside it is
    the origin (the ``parent`` chain says what is nested in what), and the earliest of those is named.
    """
    counts = [np.nan_to_num(np.asarray(columns[c], dtype=np.float64), nan=0.0)
              for c in ("nan_count", "posinf_count", "neginf_count")]
    bad = (counts[0] + counts[1] + counts[2]) > 0
    if not bad.any():
        return None
    index = np.asarray(_values(columns["call_index"]), dtype=np.int64)
    output = _values(columns["io"]) == "output"
    bad_in = set(index[bad & ~output].tolist())
    made = [i for i in sorted(set(index[bad & output].tolist())) if i not in bad_in]
    if not made:
        return None
    if "parent" not in columns or "call" not in columns:
        return made[0]
    names, parents = _values(columns["call"]), _values(columns["parent"])
    call_of: dict[int, str] = {}
    parent_of: dict[str, str] = {}
    for i, c, p in zip(index.tolist(), names.tolist(), parents.tolist()):
        call_of.setdefault(i, c)
        parent_of.setdefault(c, p if isinstance(p, str) else "")
    made_calls = {call_of[i] for i in made}
    enclosing: set[str] = set()  # overflowing calls that hold another overflowing call
    for i in made:
        p, depth = parent_of.get(call_of[i], ""), 0
        while p and depth < 10_000:  # a damaged chain cannot loop forever
            if p in made_calls:
                enclosing.add(p)
            p, depth = parent_of.get(p, ""), depth + 1
    return next((i for i in made if call_of[i] not in enclosing), made[0])


class OverflowWatch:
    """The recorder's filter for the overflow_check task (one per recorder)."""

    def __init__(self, calls_before: int = CALLS_BEFORE):
        self.calls_before = calls_before
        self.found = False

    def keep(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """The step's data reduced to the rows of the calls around its first overflow; None without one."""
        if self.found:
            return None
        cols = data["columns"]
        first = first_overflow(cols)
        if first is None:
            return None
        index = np.asarray(_values(cols["call_index"]), dtype=np.int64)
        calls = np.unique(index)
        at = int(np.searchsorted(calls, first))
        wanted = calls[max(0, at - self.calls_before): at + 1]
        keep = np.isin(index, wanted)
        self.found = True
        names = set(_take(cols["name"], keep))
        tensors = {k: v for k, v in data["tensors"].items() if k.partition("/")[2] in names}
        return {**data, "columns": {k: _take(v, keep) for k, v in cols.items()}, "tensors": tensors}
