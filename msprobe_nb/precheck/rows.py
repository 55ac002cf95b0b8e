"""The calls table's API rows as plain Python records, grouped by call: what the replay reads.

Reading a field of a pandas row costs microseconds; a replay reads a dozen per row, so the table is turned
into :class:`Row` tuples once (one pass per column) and grouped by (step, rank, call) in Python.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import pandas as pd

__all__ = ["Row", "api_calls"]

_FIELDS = ("step", "rank", "call_index", "call", "name", "family", "op", "direction", "io", "arg", "is_kwarg",
           "kind", "dtype", "shape", "value_type", "value", "data_name", "min", "max", "mean")


class Row(NamedTuple):
    """One row of the calls table, the fields the replay needs."""

    step: int
    rank: int
    call_index: int
    call: str
    name: str
    family: str
    op: str
    direction: str
    io: str
    arg: str
    is_kwarg: bool
    kind: str
    dtype: str
    shape: Any
    value_type: str
    value: str
    data_name: str
    min: float
    max: float
    mean: float


def _column(frame: pd.DataFrame, name: str) -> list:
    s = frame[name]
    if name in ("min", "max", "mean"):
        return s.astype("float64").tolist()
    if name in ("step", "rank", "call_index"):
        return s.astype("int64").tolist()
    if name == "is_kwarg":
        return s.fillna(False).astype(bool).tolist()
    if name == "shape":
        return s.tolist()
    return s.astype(object).where(s.notna(), "").astype(str).tolist()


def api_calls(calls: pd.DataFrame) -> dict[tuple[int, int, str], list[Row]]:
    """(step, rank, call) -> its rows, for the forward and backward API calls (not modules), in table order."""
    c = calls[(calls["family"] != "Module") & calls["direction"].isin(["forward", "backward"])
              & calls["io"].isin(["input", "output"])]
    out: dict[tuple[int, int, str], list[Row]] = defaultdict(list)
    if c.empty:
        return {}
    for r in map(Row._make, zip(*(_column(c, f) for f in _FIELDS), strict=True)):
        out[(r.step, r.rank, r.call)].append(r)
    return dict(out)
