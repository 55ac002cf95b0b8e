"""A string or shape column's ids in the writer's interned tables, reused row by row from the last step's.

A training loop hands the writer the same names, arguments and shapes step after step; the writer compares a
column with the last step's first and takes its ids whole when they are equal. Some columns are never equal:
AdamW's step size is new text on some rows of every step, so every row went back to the table. Where
``_column_ids`` (optional C, setup.py) is built, a column that differs from the last step's keeps the id of each
row equal to the last step's row at its index, and only the others are looked up in the table; the writer
interns what the table lacks. Without it every row of such a column is looked up.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from msprobe_nb.store.c_functions import optional_function

#: the layout of _column_ids this Python expects (COLUMN_IDS_ABI in _column_ids.c)
COLUMN_IDS_ABI = 1
_ids = optional_function("_column_ids", COLUMN_IDS_ABI, "ids")  # None: the writer looks up every row


def ids_by_row(values: Any, table: dict, last: tuple[Any, np.ndarray] | None) -> tuple[np.ndarray, list[int]] | None:
    """``(ids, lacking)``: each value's int32 id (``last``'s, a ``(values, ids)`` of the last step, where the row at
    that index holds the same value; else ``table``'s), and the indices ``table`` lacks (their ids -1, for the
    caller to fill). None where the C extension is not built or ``values`` is not a list; an unhashable value
    raises TypeError, as a lookup would."""
    if _ids is None or type(values) is not list:
        return None
    prev, prev_ids = None, None
    if last is not None and type(last[0]) is list and last[1].dtype == np.int32 and len(last[1]) == len(last[0]):
        prev, prev_ids = last
    out = np.empty(len(values), np.int32)
    lacking = _ids(values, table, prev, prev_ids, out)
    return out, lacking
