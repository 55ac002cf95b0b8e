""":class:`BaseViewer`: what :class:`~msprobe_nb.viewers.DumpViewer` and
:class:`~msprobe_nb.viewers.CompareViewer` share.

The state and its transitions are a :class:`~msprobe_nb.viewers.view_state.TableView`; this class adds what
a viewer makes of them (the page as highlighted HTML, the selected call's :class:`Detail`, figures) and
the ipywidgets shell (:class:`~msprobe_nb.viewers.viewer_widgets.ViewerWidgets`), built on first use.
A viewer fills in the hooks: ``_build_detail`` and ``_tensor_figure`` (what a call's detail is),
``_header_html``, ``_mark_call``, ``_divergence``, and the ``_leading_tabs`` / ``_extra_*`` / ``_sync_extra`` /
``_on_tab`` hooks of the shell for widgets of its own.
"""
from __future__ import annotations

import html
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from . import plots as P
from .detail import Detail
from .table import cell_styles, grid_columns, page_payload, render_html
from .tree import TreeNode, module_tree
from .view_state import TableView, ViewerState
from .viewer_widgets import ViewerWidgets

__all__ = ["BaseViewer"]

#: columns the grid's colours and flags read, besides those it shows
_PAYLOAD_COLUMNS = ("call", "result", "match", "near_zero", "nan_count", "posinf_count", "neginf_count", "max",
                    "min", "mean", "norm", "diverges", "nan_inf_match")


class BaseViewer:
    """Shared logic of the viewers: state, filtered/sorted positions, paging, selection, widgets."""

    #: columns shown in the table, in order (those the table lacks are skipped)
    COLUMNS: list[str] = []  # class defaults; an instance may set its own (CompareViewer: by dump mode)
    METRICS: list[str] = []
    DETAIL_COLUMNS: ClassVar[list[str]] = []

    def __init__(self, table: pd.DataFrame, *, thresholds: Any = None, columns: list[str] | None = None,
                 page_size: int = 50):
        self._table_view = tv = TableView(table, page_size=page_size, metric=self.METRICS[0] if self.METRICS else "")
        self.thresholds = thresholds
        multi = [c for c in ("step", "rank") if c in table.columns and len(tv.ix.uniques(c)) > 1]
        self.columns = list(columns) if columns else grid_columns(multi + self.COLUMNS, table.columns)
        self._tree: list[TreeNode] | None = None
        self._scroll = False
        self._detail_key: tuple | None = None
        self._detail: Detail | None = None
        self._shell: ViewerWidgets | None = None

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> ViewerState:
        """Filters, sort, page, selection and plot choices (change them with :meth:`set_state`)."""
        return self._table_view.state

    @property
    def messages(self) -> list[str]:
        """What the filters (an invalid regex) or the last action had to say; shown in :meth:`status`."""
        return self._table_view.messages

    @messages.setter
    def messages(self, value: list[str]) -> None:
        self._table_view.messages = value

    def set_state(self, **kw: Any) -> BaseViewer:
        """Change state fields (filters reset the page to 0 unless ``page`` is given); returns self."""
        filt = self._table_view.update(**kw)
        scroll, self._scroll = self._scroll, False
        if self._shell is not None:
            self._shell.sync(plots="metric" in kw or "module_by" in kw or filt, scroll=scroll)
        return self

    # ------------------------------------------------------------------ table
    @property
    def table(self) -> pd.DataFrame:
        """The whole table the viewer browses."""
        return self._table_view.table

    @property
    def n_rows(self) -> int:
        """Rows passing the filters."""
        return self._table_view.n_rows

    @property
    def n_pages(self) -> int:
        return self._table_view.n_pages

    @property
    def _positions(self) -> np.ndarray:
        """The filtered, sorted rows as positions in :attr:`table` (row ``#i`` of the view is ``[i]``)."""
        return self._table_view.positions

    @property
    def view(self) -> pd.DataFrame:
        """All filtered rows, sorted (a copy; prefer :attr:`rows` for display)."""
        return self.table.iloc[self._table_view.positions]

    @property
    def rows(self) -> pd.DataFrame:
        """The current page (every column of the table)."""
        return self.table.iloc[self._table_view.page_positions()]

    def next_page(self) -> BaseViewer:
        return self.set_state(page=self.state.page + 1)

    def prev_page(self) -> BaseViewer:
        return self.set_state(page=self.state.page - 1)

    def _mark_call(self) -> str | None:
        return None

    def html(self) -> str:
        """HTML of the current page, highlighted."""
        page = self.rows
        styles = cell_styles(page, self.thresholds)
        mark = self._mark_call()
        marked = (page["call"].astype(object) == mark).to_numpy(dtype=bool) if mark else None
        s = self.state
        return render_html(page, self.columns, styles, start=s.page * s.page_size, sort_by=s.sort_by,
                           ascending=s.ascending, marked=marked)

    def grid_payload(self, scroll: bool = False) -> dict[str, Any]:
        """What the data grid draws for the current page (:func:`~msprobe_nb.viewers.table.page_payload`),
        plus ``page`` and ``scroll_to`` (the first row of the selected call when ``scroll``, else -1)."""
        s = self.state
        pos = self._table_view.page_positions()
        arrays = self._page_arrays()
        page = pd.DataFrame({c: a[pos] for c, a in arrays.items()}, index=self.table.index[pos])
        p = page_payload(page, self.columns, start=s.page * s.page_size, thresholds=self.thresholds,
                         numeric=self._numeric,
                         selected=s.selected, marked=self._mark_call(), sort_by=s.sort_by, ascending=s.ascending)
        p["page"] = s.page
        p["scroll_to"] = p["selected"][0] if scroll and p["selected"] else -1
        p["empty"] = "no rows pass the filters" if self.n_rows == 0 else ""
        return p

    def _page_arrays(self) -> dict[str, np.ndarray]:
        """The columns a grid page reads, as numpy arrays made once (a page is then 50 fancy-indexings, not
        a pandas take over the whole table)."""
        if getattr(self, "_arrays", None) is None:
            t = self.table
            need = [c for c in dict.fromkeys([*self.columns, *_PAYLOAD_COLUMNS]) if c in t.columns]
            self._numeric = {c for c in need if pd.api.types.is_numeric_dtype(t[c].dtype)
                             and not pd.api.types.is_bool_dtype(t[c].dtype)}
            self._arrays = {c: (t[c].to_numpy(dtype=float, na_value=np.nan) if c in self._numeric
                                and pd.api.types.is_float_dtype(t[c].dtype) else t[c].to_numpy()) for c in need}
        return self._arrays

    def model_tree(self) -> list[TreeNode]:
        """The module calls of the table as a tree, worst verdict per node, the divergence's path marked
        (:func:`~msprobe_nb.viewers.tree.module_tree`)."""
        if self._tree is None:
            self._tree = module_tree(self.table, self._divergence(), self._table_view.ix)
        return self._tree

    def status(self) -> str:
        """One line: rows shown, page, active filters and messages."""
        return self._table_view.status()

    # ------------------------------------------------------------------ selection
    def select(self, call: str | None, step: int | None = None, rank: int | None = None) -> BaseViewer:
        """Select a call (its detail becomes :attr:`selected`)."""
        return self.set_state(selected=call, selected_step=step, selected_rank=rank)

    def select_row(self, position: int) -> BaseViewer:
        """Select the call of row ``position`` of the filtered, sorted view (the ``#`` column)."""
        return self.select(*self._table_view.row_at(position))

    def goto(self, call: str, step: int | None = None, rank: int | None = None) -> BaseViewer:
        """Select ``call`` and turn to the page holding its first row (if the filters let it through)."""
        kw: dict[str, Any] = {"selected": call, "selected_step": step, "selected_rank": rank}
        page = self._table_view.page_of(call, step, rank)
        if page is not None:
            kw["page"] = page
        self._scroll = True
        return self.set_state(**kw)

    @property
    def selected(self) -> Detail | None:
        """Detail of the selected call (None when nothing, or an unknown call, is selected)."""
        s = self.state
        if not s.selected:
            return None
        key = (s.selected, s.selected_step, s.selected_rank, s.detail_row)
        if key != self._detail_key:
            rows = self._table_view.call_rows(s.selected, s.selected_step, s.selected_rank)
            self._detail = None if rows.empty else self._build_detail(rows)
            self._detail_key = key
        return self._detail

    def _build_detail(self, rows: pd.DataFrame) -> Detail:  # pragma: no cover - overridden
        raise NotImplementedError

    def detail_figure(self, row: str | None = None):
        """Figure of the selected call's whole tensor(s) (tensor mode), or None."""
        d = self.selected
        if d is None or not d.tensor_rows:
            return None
        name = row or self.state.detail_row or d.tensor_rows[0]
        if name not in d.tensor_rows:
            raise KeyError(f"{name!r} is not a row with a saved tensor of {d.call}; choose from {d.tensor_rows}")
        return self._tensor_figure(d, name)

    def _tensor_figure(self, d: Detail, name: str):  # pragma: no cover - overridden
        return None

    # ------------------------------------------------------------------ plots
    def metric_figure(self, metric: str | None = None):
        """``metric`` along execution order of the filtered rows, first divergence marked."""
        metric = metric or self.state.metric or (self.METRICS[0] if self.METRICS else "")
        return P.metric_along_order(self._table_view.filtered_table(), metric, self._divergence(),
                                    thresholds=self.thresholds)

    def module_figure(self, metric: str | None = None, by: str | None = None, top: int = 60):
        """``metric`` summed per module of the filtered rows, in model order (at most ``top`` bars)."""
        metric = metric or self.state.metric or (self.METRICS[0] if self.METRICS else "")
        return P.errors_by_module(self._table_view.filtered_table(), metric, by or self.state.module_by, top)

    def _divergence(self) -> Any:
        return None

    # ------------------------------------------------------------------ widgets
    @property
    def widget(self):
        """The ipywidgets shell (built on first use)."""
        if self._shell is None:
            self._shell = ViewerWidgets(self, self._table_view)
            self._shell.sync(plots=False, scroll=True)  # opens scrolled to the selected call (the divergence)
        return self._shell.box

    @property
    def _w(self) -> dict[str, Any] | None:
        """The shell's widgets by name (None until :attr:`widget` is first used)."""
        return self._shell.w if self._shell is not None else None

    @property
    def widgets(self) -> MappingProxyType[str, Any]:
        """The shell's widgets by name ("grid", "tabs", "verdict", ...), read-only: for tests and for users who
        script the viewer (built on first use, like :attr:`widget`)."""
        self.widget  # noqa: B018 - builds the shell
        assert self._shell is not None, "the widget property builds the shell"
        return MappingProxyType(self._shell.w)

    def _repr_mimebundle_(self, **kwargs: Any):
        """The widget, with the current page as static HTML for frontends without widgets (nbconvert)."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle.setdefault("text/html", self._header_html() + f"<p>{html.escape(self.status())}</p>" + self.html())
        return bundle

    def _header_html(self) -> str:
        return ""

    # hooks of the widget shell (see ViewerWidgets): a viewer's own filters, state fields, tabs
    def _extra_filter_widgets(self, shell: ViewerWidgets) -> list:
        return []

    def _extra_state_widgets(self) -> tuple[str, ...]:
        return ()

    def _leading_tabs(self, shell: ViewerWidgets) -> list[tuple[str, Any]]:
        return []

    def _extra_tabs(self, shell: ViewerWidgets) -> list[tuple[str, Any]]:
        return []

    def _sync_extra(self, shell: ViewerWidgets) -> None:
        pass

    def _on_tab(self, title: str) -> None:
        pass
