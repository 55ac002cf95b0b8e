"""What a viewer shows, as plain Python over a DataFrame: :class:`ViewerState` and its transitions.

:class:`TableView` holds one table, its :class:`~msprobe_nb.viewers.table.TableIndex` and a
:class:`ViewerState`; :meth:`TableView.update` applies a change (filters reset the page, a page size keeps
the first visible row on screen, a new selection forgets the old one's step, rank and tensor row) and keeps
the filtered, sorted positions and the page in step with it. No widgets: the viewers' ipywidgets shell
(:mod:`msprobe_nb.viewers.viewer_widgets`) only mirrors this state.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .table import CRITERIA, TableIndex, n_pages

__all__ = ["FILTER_KEYS", "SORT_KEYS", "STATE_FIELDS", "TableView", "ViewerState", "next_sort"]


@dataclass
class ViewerState:
    """Everything a viewer shows: filters, sort, page, selection, plot choices. Widgets mirror it."""

    call: str = ""                 #: text (or regex) the call name must contain
    regex: bool = False
    family: Any = None             #: API family or list of families (None: all)
    module: str = ""               #: module call or module path whose subtree to show
    direction: Any = None          #: forward | backward | parameters_grad (or a list)
    io: Any = None                 #: input | output | parameters | parameters_grad (or a list)
    verdict: Any = None            #: pass | warning | error (compare tables)
    kind: Any = None               #: tensor | value | none
    match: Any = None              #: matched | npu_only | bench_only (compare tables)
    diverges: bool | None = None   #: only rows that diverge (True) or do not (False)
    step: Any = None
    rank: Any = None
    sort_by: str | None = None     #: column; None keeps execution order
    ascending: bool = True
    page: int = 0
    page_size: int = 50
    selected: str | None = None    #: selected call name
    selected_step: int | None = None
    selected_rank: int | None = None
    detail_row: str | None = None  #: row name whose whole tensor(s) the detail plot shows
    metric: str = ""               #: metric of the execution-order plot ("" = the viewer's default)
    module_by: str = "module"      #: "module" (module path) or "parent" (module call) for the per-module plot

    def filters(self) -> dict[str, Any]:
        """The filter criteria, as :func:`~msprobe_nb.viewers.table.filter_rows` takes them."""
        return {k: getattr(self, k) for k in (*CRITERIA, "regex")}


def next_sort(sort_by: str | None, ascending: bool, column: str,
              descending_first: bool = False) -> tuple[str | None, bool]:
    """The sort after a click on ``column``'s header: ascending, then descending, then execution order
    (``descending_first``, for metric columns: descending, then ascending, so the first click shows the worst)."""
    if not column or column == "#":
        return None, True
    first = not descending_first
    if sort_by != column:
        return column, first
    if ascending == first:
        return column, not first
    return None, True


FILTER_KEYS = frozenset((*CRITERIA, "regex"))
SORT_KEYS = frozenset(("sort_by", "ascending"))
STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(ViewerState))


class TableView:
    """The filtered, sorted, paged view of ``table`` that :attr:`state` describes.

    ``positions``: the rows passing the filters, sorted, as positions in ``table``; ``filtered``: the same
    rows in execution (table) order; ``messages``: what the last filtering had to say (an invalid regex).
    """

    def __init__(self, table: pd.DataFrame, *, page_size: int = 50, metric: str = ""):
        self.table = table
        self.ix = TableIndex(table)
        self.state = ViewerState(page_size=int(page_size), metric=metric)
        self.messages: list[str] = []
        self.positions = np.arange(len(table))
        self.filtered = np.arange(len(table))
        self._recompute(filters=True)

    # ------------------------------------------------------------------ transitions
    def update(self, **kw: Any) -> bool:
        """Change state fields (filters reset the page to 0 unless ``page`` is given).

        Returns whether a filter changed (the rows to plot then changed too).
        """
        bad = set(kw) - STATE_FIELDS
        if bad:
            raise TypeError(f"unknown state fields {sorted(bad)}; known: {sorted(STATE_FIELDS)}")
        s = self.state
        old = dataclasses.replace(s)
        for k, v in kw.items():
            setattr(s, k, v)
        filt = any(getattr(old, k) != getattr(s, k) for k in FILTER_KEYS if k in kw)
        srt = any(getattr(old, k) != getattr(s, k) for k in SORT_KEYS if k in kw)
        if "page_size" in kw:
            s.page_size = max(1, int(s.page_size))
            if "page" not in kw:  # keep the first visible row on screen
                s.page = (old.page * old.page_size) // s.page_size
        if filt and "page" not in kw:
            s.page = 0
        if "selected" in kw and s.selected != old.selected:
            if "selected_step" not in kw:
                s.selected_step = None
            if "selected_rank" not in kw:
                s.selected_rank = None
            if "detail_row" not in kw:
                s.detail_row = None
        if filt or srt:
            self._recompute(filters=filt)
        s.page = min(max(0, int(s.page)), self.n_pages - 1)
        return filt

    def _recompute(self, filters: bool) -> None:
        if filters:
            mask, msgs = self.ix.mask(**self.state.filters())
            self.messages = msgs
            self.filtered = np.flatnonzero(mask)
        self.positions = self.ix.order(self.filtered, self.state.sort_by, self.state.ascending)

    # ------------------------------------------------------------------ rows
    @property
    def n_rows(self) -> int:
        """Rows passing the filters."""
        return len(self.positions)

    @property
    def n_pages(self) -> int:
        return n_pages(self.n_rows, self.state.page_size)

    def page_positions(self) -> np.ndarray:
        """Positions in ``table`` of the current page's rows."""
        s = self.state
        return self.positions[s.page * s.page_size:(s.page + 1) * s.page_size]

    def filtered_table(self) -> pd.DataFrame:
        """The rows passing the filters, in execution order (the table itself when every row passes)."""
        return self.table.iloc[self.filtered] if len(self.filtered) < len(self.table) else self.table

    def status(self) -> str:
        """One line: rows shown, page, active filters and messages."""
        s = self.state
        active = []
        for k, v in s.filters().items():
            if k == "regex" or v is None or v == "" or v == () or v == []:
                continue
            active.append(f"{k}={v!r}" + (" (regex)" if k == "call" and s.regex else ""))
        text = (f"{self.n_rows:,} of {len(self.table):,} rows · page {s.page + 1}/{self.n_pages}"
                + (f" · filters: {', '.join(active)}" if active else ""))
        return text + "".join(f" · ⚠ {m}" for m in self.messages)

    # ------------------------------------------------------------------ calls
    def row_at(self, position: int) -> tuple[str, int, int]:
        """(call, step, rank) of row ``position`` of the filtered, sorted view (the ``#`` column)."""
        if not 0 <= position < self.n_rows:
            raise IndexError(f"row {position} is outside the {self.n_rows} filtered rows")
        r = self.table.iloc[int(self.positions[position])]
        return str(r["call"]), int(r["step"]), int(r["rank"])

    def page_of(self, call: str, step: int | None = None, rank: int | None = None) -> int | None:
        """The page holding the first row of ``call`` (at ``step``, ``rank`` if given) in the view, or None."""
        m = self.ix.isin("call", [call])[self.positions]
        if step is not None:
            m &= self.table["step"].to_numpy()[self.positions] == step
        if rank is not None:
            m &= self.table["rank"].to_numpy()[self.positions] == rank
        hit = np.flatnonzero(m)
        return int(hit[0]) // self.state.page_size if len(hit) else None

    def call_rows(self, call: str, step: int | None, rank: int | None) -> pd.DataFrame:
        """Rows of one call at one (step, rank); the first step/rank in view (else in the table) by default."""
        table = self.table
        m = self.ix.isin("call", [call])
        if not m.any():
            return table.iloc[:0]
        st, rk = table["step"].to_numpy(), table["rank"].to_numpy()
        if step is None or rank is None:
            if step is not None:
                m = m & (st == step)
            if rank is not None:
                m = m & (rk == rank)
            in_view = np.zeros(len(m), dtype=bool)
            in_view[self.filtered] = True
            idx = np.flatnonzero(m & in_view)
            if not len(idx):
                idx = np.flatnonzero(m)
            if not len(idx):
                return table.iloc[:0]
            step, rank = int(st[idx[0]]), int(rk[idx[0]])
        return table.iloc[np.flatnonzero(m & (st == step) & (rk == rank))]
