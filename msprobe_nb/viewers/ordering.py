"""What the viewers show first: a row's reasons by severity (the one that set its verdict first) and the
direction a header click sorts a column in first (metrics descending: the worst rows, not every zero error)."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ASCENDING_FIRST", "descending_first", "reason_rank", "reasons_by_severity"]

#: reasons begin with their level; the one that set the verdict comes first
_REASON_RANK = {"error": 0, "warning": 1, "unmatched": 2, "note": 3}


def reason_rank(reason: Any) -> int:
    """0 for an error reason, 1 warning, 3 a note: from ``"level: text"`` or ``"row: level: text"``."""
    parts = str(reason).split(":", 2)
    for p in parts[:2]:
        if p.strip() in _REASON_RANK:
            return _REASON_RANK[p.strip()]
    return 3


def reasons_by_severity(reasons: Any) -> Any:
    """``reasons`` (a list of ``"level: text"``) ordered error, warning, then notes, stably: the first one shown
    (and the one a narrow cell keeps) is the one that set the row's verdict. Other values come back as they are."""
    if not isinstance(reasons, (list, tuple, np.ndarray)) or len(reasons) < 2:
        return reasons
    return sorted(reasons, key=reason_rank)


#: numeric columns that keep ascending as their first sort (an order or an id, or a metric whose low end is bad)
ASCENDING_FIRST = frozenset(("call_index", "step", "rank", "bench_step", "bench_rank", "bench_call_index",
                             "cosine", "npu_stack_id", "pair"))


def descending_first(column: str, numeric: bool) -> bool:
    """Whether a header click on ``column`` sorts it descending first: metric columns (largest error first,
    not every zero), not names, ids or the order."""
    return numeric and column not in ASCENDING_FIRST
