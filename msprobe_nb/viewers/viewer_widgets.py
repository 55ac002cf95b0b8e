"""The viewers' ipywidgets shell: :class:`ViewerWidgets` builds the widgets and wires them both ways.

A widget the user changes calls the viewer's ``set_state``; :meth:`ViewerWidgets.sync` mirrors the state
back into every widget (with the observers muted while it does). The shell holds no state of its own
beyond what is drawn: the viewer (a :class:`~msprobe_nb.viewers.base.BaseViewer`) and its
:class:`~msprobe_nb.viewers.view_state.TableView` are the truth.

Where anywidget is installed (:mod:`msprobe_nb.viewers.grid_widget`), the table is a data grid (a click on
a row selects its call and shows its detail below; a click on a header sorts), the call filter applies as
you type, and a model tree beside the grid filters it to a module. Without anywidget the shell falls back to
plain ipywidgets: a static HTML page, a row picker, a sort menu, a filter applied on Enter and the tree as a
list. Both are laid out in wrapping rows, so nothing is cut at 900 px.

A viewer adds widgets of its own through its hooks: ``_extra_filter_widgets(shell)`` (widgets for the
filter row, stored in ``shell.w``), ``_extra_state_widgets()`` (names of those that mirror a state field
of the same name), ``_sync_extra(shell)``, ``_extra_tabs(shell)`` (``(title, widget)`` pairs after Table,
Detail and Plots) and ``_on_tab(index)``.
"""
from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pandas as pd

from . import grid_widget as G
from . import plots as P
from .table import DIRECTIONS, IOS, descending_first
from .tree import divergence_path, tree_payload, visible_nodes, walk
from .view_state import next_sort

if TYPE_CHECKING:
    from .base import BaseViewer
    from .view_state import TableView

__all__ = ["PAGE_SIZES", "ViewerWidgets", "fixed", "opt", "toggles_layout", "wrap_row"]

PAGE_SIZES = (25, 50, 100, 200, 500)
_TREE_GLYPH = {"error": "●", "warning": "◐", "nan": "◐", "unmatched": "○", "pass": "·", "": " "}


def opt(v: Any) -> Any:
    """A choice widget's value as a state value: "all" (or nothing) is no filter."""
    return None if v in ("all", "", None) else v


def _num(v: Any) -> int | None:
    return None if v in ("all", "", None) else int(v)


def _one(v: Any) -> str:
    """A state value as a single-choice widget's value ("all" for none, or for a list of several)."""
    if isinstance(v, (list, tuple, set)):
        v = list(v)
        return str(v[0]) if len(v) == 1 else "all"
    return "all" if v is None or v == "" else str(v)


def fixed(width: str = "auto", **kw: Any):
    """A layout that keeps its widget whole in a wrapping row (never shrunk, never wrapped inside)."""
    import ipywidgets as W

    return W.Layout(**{"width": width, "flex": "0 0 auto", "margin": "2px 10px 2px 0", **kw})


def toggles_layout():
    """A toggle-button group's layout: its label and its buttons on one line, kept whole."""
    return fixed(display="flex", align_items="center")


def wrap_row(children: list, **kw: Any):
    """A row that wraps its widgets onto the next line when the page is narrow."""
    import ipywidgets as W

    return W.Box(children, layout=W.Layout(**{"display": "flex", "flex_flow": "row wrap", "align_items": "center",
                                              "max_width": "100%", **kw}))


class ViewerWidgets:
    """The widgets of ``viewer`` by name (:attr:`w`) in one box (:attr:`box`), mirroring its state.

    :attr:`grid` is the data grid (None in the plain-ipywidgets fallback), :attr:`tree` the model tree.
    """

    def __init__(self, viewer: BaseViewer, table_view: TableView):
        self.viewer = viewer
        self.table_view = table_view
        self.w: dict[str, Any] = {}
        self.syncing = False  #: True while :meth:`sync` writes the widgets (their observers then do nothing)
        self.grid = None
        self.tree = None
        self.titles: list[str] = []  #: the tabs' titles in order; tabs are found by title, never by position
        self.box = self._build()

    def select_tab(self, title: str) -> None:
        """Show the tab of that title (a viewer's leading tabs move the others' positions)."""
        self.w["tabs"].selected_index = self.titles.index(title)

    @property
    def selected_tab(self) -> str:
        """The title of the tab shown."""
        i = self.w["tabs"].selected_index
        return self.titles[i] if i is not None and 0 <= i < len(self.titles) else ""

    # ------------------------------------------------------------------ wiring
    def bind(self, name: str, conv: Callable[[Any], Any]) -> None:
        """Widget ``name``'s new value, through ``conv``, becomes the state field of the same name."""
        def handler(change):
            if not self.syncing:
                self.viewer.set_state(**{name: conv(change["new"])})

        self.w[name].observe(handler, names="value")

    def _build(self):
        import ipywidgets as W

        v, tv, w = self.viewer, self.table_view, self.w
        s, ix, lay = v.state, tv.ix, W.Layout
        auto = {"description_width": "auto"}
        self.grid = G.data_grid(layout=lay(width="100%", min_width="0"))
        w["header"] = W.HTML(v._header_html(), layout=lay(max_width="100%"))
        live = G.live_text(value=s.call, description="call", placeholder="call name contains… (or a regex)",
                           hint="filters as you type", layout=fixed("auto", min_width="18em"))
        if live is not None:
            live.layout.flex = "1 1 22em"
            live.layout.max_width = "34em"
            w["call"] = live
        else:
            w["call"] = W.Text(value=s.call, placeholder="call name contains… then Enter", description="call",
                               continuous_update=False, style=auto, layout=fixed("24em"))
        w["regex"] = W.Checkbox(value=s.regex, description="regex", indent=False, layout=fixed("5.5em"))
        fams = ix.uniques("family")
        w["family"] = W.Dropdown(options=["all", *fams], value="all", description="family", style=auto,
                                 layout=fixed("13em"))
        w["module"] = W.Combobox(value=s.module, options=ix.module_choices()[:5000], ensure_option=False,
                                 placeholder="module path or call, Enter", description="module",
                                 continuous_update=False, style=auto, layout=fixed("20em"))
        w["direction"] = W.ToggleButtons(options=["all", *[d for d in DIRECTIONS if d in ix.uniques(
            "direction")]], value="all", description="direction", style={"button_width": "auto", **auto},
            layout=toggles_layout())
        w["io"] = W.ToggleButtons(options=["all", *[i for i in IOS if i in ix.uniques("io")]], value="all",
                                  description="io", style={"button_width": "auto", **auto}, layout=toggles_layout())
        w["step"] = W.Dropdown(options=["all", *[str(x) for x in ix.uniques("step")]], value="all",
                               description="step", style=auto, layout=fixed("8em"))
        w["rank"] = W.Dropdown(options=["all", *[str(x) for x in ix.uniques("rank")]], value="all",
                               description="rank", style=auto, layout=fixed("8em"))
        for k in ("step", "rank"):
            if len(w[k].options) <= 2:
                w[k].layout.display = "none"  # one step, one rank: nothing to choose
        w["clear"] = W.Button(description="clear filters", icon="times", layout=fixed())
        extra = v._extra_filter_widgets(self)
        w["status"] = W.HTML(layout=lay(max_width="100%"))
        cols = [c for c in tv.table.columns if c not in ("reasons", "tensor_messages")]
        w["sort_by"] = W.Dropdown(options=[("execution order", "")] + [(c, c) for c in cols], value="",
                                  description="sort", style=auto, layout=fixed("16em"))
        w["ascending"] = W.ToggleButton(value=not s.ascending, description="descending", icon="sort",
                                        layout=fixed())
        w["page_size"] = W.Dropdown(options=sorted({*PAGE_SIZES, s.page_size}), value=s.page_size,
                                    description="rows/page", style=auto, layout=fixed("11em"))
        w["prev"] = W.Button(description="◀ prev", layout=fixed())
        w["next"] = W.Button(description="next ▶", layout=fixed())
        w["page"] = W.BoundedIntText(value=s.page + 1, min=1, max=tv.n_pages, description="page", style=auto,
                                     layout=fixed("8em"))
        w["pick_text"] = W.Text(placeholder="go to a call by name, Enter", continuous_update=False,
                                layout=fixed("18em"))
        w["detail"] = G.html_pane(layout=lay(max_width="100%")) or W.HTML(layout=lay(max_width="100%",
                                                                                   overflow="auto"))
        w["detail_row"] = W.Dropdown(options=[], description="tensor", style=auto,
                                     layout=lay(width="auto", max_width="100%", display="none"))
        w["detail_img"] = W.Image(format="png", layout=lay(display="none", max_width="100%"))
        w["metric"] = W.Dropdown(options=[m for m in v.METRICS if m in tv.table.columns] or [s.metric],
                                 value=s.metric if s.metric in tv.table.columns else None,
                                 description="metric", style=auto, layout=fixed("14em"))
        w["module_by"] = W.ToggleButtons(options=[("by module path", "module"), ("by module call", "parent")],
                                         value=s.module_by, style={"button_width": "auto"},
                                         layout=toggles_layout())
        w["plot_order"] = W.Image(format="png", layout=lay(max_width="100%"))
        w["plot_module"] = W.Image(format="png", layout=lay(max_width="100%"))
        w["plot_msg"] = W.HTML()

        # the table: a data grid, or (fallback) a static page, a sort menu and a row picker
        if self.grid is not None:
            w["grid"] = self.grid
            self.grid.handlers["row"] = lambda c: self.on_row(int(c["pos"]))
            self.grid.handlers["sort"] = lambda c: self.on_header(str(c.get("column") or ""))
            nav = wrap_row([w["prev"], w["page"], w["next"], w["page_size"], w["pick_text"]])
            table_widget = self.grid
        else:
            w["table"] = W.HTML(layout=lay(max_height="34em", overflow="auto", width="100%"))
            w["pick"] = W.Dropdown(options=[], description="select", style=auto,
                                   layout=fixed("32em", max_width="100%"))
            nav = wrap_row([w["sort_by"], w["ascending"], w["page_size"], w["prev"], w["page"], w["next"],
                            w["pick"], w["pick_text"]])
            table_widget = w["table"]
        tree_box = self._build_tree(W)
        grid_box = W.VBox([nav, table_widget], layout=lay(flex="1 1 520px", min_width="0", max_width="100%"))
        if tree_box is not None:
            main = wrap_row([tree_box, grid_box], align_items="flex-start")
        else:  # alone in the tab's column: its 520px basis would be a height, empty space under a short table
            grid_box.layout.flex = "0 0 auto"
            main = grid_box
        w["detail_here"] = W.VBox([w["detail"]], layout=lay(border_top="1px solid #ddd", margin="6px 0 0 0"))
        table_tab = W.VBox([main, w["detail_here"]])
        detail_tab = W.VBox([w["detail"], w["detail_row"], w["detail_img"]])
        plot_tab = W.VBox([wrap_row([w["metric"], w["module_by"]]), w["plot_msg"], w["plot_order"],
                           w["plot_module"]])
        tabs = [*v._leading_tabs(self), ("Table", table_tab), ("Detail", detail_tab), ("Plots", plot_tab),
                *v._extra_tabs(self)]
        self.titles = [n for n, _ in tabs]
        w["tabs"] = W.Tab(children=[t for _, t in tabs], titles=self.titles, layout=lay(max_width="100%"))
        w["tabs"].selected_index = self.titles.index("Table")  # a leading tab is a lead: the table holds the answer
        w["plots_drawn"] = False

        self.bind("call", str)
        self.bind("regex", bool)
        self.bind("family", opt)
        self.bind("module", str)
        self.bind("direction", opt)
        self.bind("io", opt)
        self.bind("step", _num)
        self.bind("rank", _num)
        self.bind("sort_by", lambda x: x or None)
        self.bind("ascending", lambda x: not x)
        self.bind("page_size", int)
        self.bind("page", lambda x: int(x) - 1)
        w["prev"].on_click(lambda _: v.prev_page())
        w["next"].on_click(lambda _: v.next_page())
        w["clear"].on_click(lambda _: self.clear_filters())

        if "pick" in w:
            def on_pick(c):
                if not self.syncing and c["new"] is not None:
                    v.select_row(int(c["new"]))
                    self.select_tab("Detail")

            w["pick"].observe(on_pick, names="value")

        def on_pick_text(c):
            if not self.syncing and c["new"].strip():
                v.goto(c["new"].strip())

        w["pick_text"].observe(on_pick_text, names="value")
        w["detail_row"].observe(lambda c: None if self.syncing or c["new"] is None
                                else v.set_state(detail_row=c["new"]), names="value")
        self.bind("metric", str)
        self.bind("module_by", str)

        def on_tab(c):
            title = self.titles[c["new"]] if c["new"] is not None and 0 <= c["new"] < len(self.titles) else ""
            if title == "Detail":
                self.draw_detail_figure()
            if title == "Plots" and not w["plots_drawn"]:
                self.draw_plots()
            v._on_tab(title)

        w["tabs"].observe(on_tab, names="selected_index")
        filters = wrap_row([w["call"], w["regex"], w["family"], w["module"], w["direction"], w["io"], w["step"],
                            w["rank"], *extra, w["clear"]])
        for name, cls in (("detail", "msnb-detail"), ("status", "msnb-status"), ("tabs", "msnb-tabs"),
                          ("header", "msnb-header")):
            w[name].add_class(cls)
        filters.add_class("msnb-filters")
        box = W.VBox([w["header"], filters, w["status"], w["tabs"]],
                     layout=lay(width="100%", max_width="100%", overflow="hidden"))
        box.add_class("msnb-viewer")
        return box

    def _build_tree(self, W):
        """The model tree beside the grid (None when the table has no module calls)."""
        v, w = self.viewer, self.w
        nodes = v.model_tree()
        if not nodes:
            return None
        opened = divergence_path(nodes)
        self.tree = G.tree_view(nodes=tree_payload(nodes), expanded=opened, layout=W.Layout(width="100%"))
        if self.tree is not None:
            w["tree"] = self.tree
            self.tree.handlers["node"] = lambda c: self.on_node(str(c["id"]))
            body = self.tree
        else:  # a list: the path to the divergence open, the rest folded
            shown = visible_nodes(nodes, set(opened) | {n.call for n in nodes})
            opts = [("  " * n.depth + f"{_TREE_GLYPH.get(n.verdict, ' ')} {n.label}", n.call) for n in shown]
            w["tree"] = W.Select(options=opts, value=None, rows=min(16, max(4, len(opts))),
                                 layout=W.Layout(width="100%"))
            w["tree"].observe(lambda c: None if self.syncing or c["new"] is None else self.on_node(c["new"]),
                              names="value")
            body = w["tree"]
        n_mod = sum(1 for _ in walk(nodes))
        title = W.HTML(f"<b>model</b> <span style='font-size:11px;color:#666'>{n_mod} module calls · "
                       "click one to show its calls</span>")
        return W.VBox([title, body], layout=W.Layout(flex="0 1 330px", min_width="220px", max_width="100%",
                                                     margin="0 12px 6px 0"))

    # ------------------------------------------------------------------ events from the browser
    def on_row(self, pos: int) -> None:
        """A click on the grid's row ``pos``: select its call (the detail below and in Detail follows)."""
        if 0 <= pos < self.table_view.n_rows:
            self.viewer.select_row(pos)

    def on_header(self, column: str) -> None:
        """A click on a header: sort by it (ascending, descending, then execution order again; a metric column
        descending first, so that the worst rows come first, not every zero error)."""
        s, t = self.viewer.state, self.table_view.table
        numeric = column in t.columns and pd.api.types.is_numeric_dtype(t[column].dtype) and not \
            pd.api.types.is_bool_dtype(t[column].dtype)
        by, asc = next_sort(s.sort_by, s.ascending, column, descending_first(column, numeric))
        self.viewer.set_state(sort_by=by, ascending=asc, page=0)

    def on_node(self, call: str) -> None:
        """A click on a tree node: the grid shows that module call's subtree, the detail that call."""
        self.viewer.set_state(module=call, selected=call, selected_step=None, selected_rank=None, page=0)

    def clear_filters(self) -> None:
        self.viewer.set_state(call="", regex=False, family=None, module="", direction=None, io=None, step=None,
                              rank=None, verdict=None, match=None, diverges=None)

    # ------------------------------------------------------------------ drawing
    def draw_plots(self) -> None:
        """Draw the Plots tab (done when it is first shown, and again when filters or choices change)."""
        w, v = self.w, self.viewer
        try:
            w["plot_order"].value = P.figure_png(v.metric_figure())
            w["plot_module"].value = P.figure_png(v.module_figure())
            w["plot_msg"].value = ""
        except Exception as e:  # noqa: BLE001 - show the reason in the pane, never break the viewer
            w["plot_msg"].value = f"<p style='color:#c0392b'>cannot plot: {html.escape(str(e))}</p>"
        w["plots_drawn"] = True

    def sync(self, plots: bool, scroll: bool = False) -> None:
        """Mirror the viewer's state into the widgets (no observer runs while this does).

        ``scroll``: bring the selected call's rows into view in the grid (after a go-to).
        """
        w, v, tv = self.w, self.viewer, self.table_view
        s = v.state
        self.syncing = True
        try:
            w["call"].value, w["regex"].value, w["module"].value = s.call, bool(s.regex), s.module or ""
            for k in ("family", "direction", "io", "step", "rank", *v._extra_state_widgets()):
                val = _one(getattr(s, k))
                if val in w[k].options or any(val == o[1] if isinstance(o, tuple) else False for o in w[k].options):
                    w[k].value = val
            w["sort_by"].value = s.sort_by or ""
            w["ascending"].value = not s.ascending
            if s.page_size not in w["page_size"].options:
                w["page_size"].options = sorted({*w["page_size"].options, s.page_size})
            w["page_size"].value = s.page_size
            w["page"].max = tv.n_pages
            w["page"].value = s.page + 1
            w["prev"].disabled = s.page <= 0
            w["next"].disabled = s.page >= tv.n_pages - 1
            hint = " · click a row for its detail, a header to sort" if self.grid is not None else ""
            w["status"].value = f"<span style='font-size:12px'>{html.escape(v.status())}{hint}</span>"
            if self.grid is not None:
                self.grid.payload = v.grid_payload(scroll=scroll)
            else:
                w["table"].value = v.html()
                pos = tv.page_positions()
                calls = tv.table["call"].to_numpy(dtype=object)[pos] if len(pos) else []
                start = s.page * s.page_size
                seen, opts = set(), []
                for i, c in enumerate(calls):
                    if c not in seen:
                        seen.add(c)
                        opts.append((f"#{start + i}  {c}", start + i))
                w["pick"].options = opts
                w["pick"].value = None
            if self.tree is not None:
                self.tree.selected = s.module if s.module.startswith("Module.") else ""
            if s.metric and s.metric in w["metric"].options:
                w["metric"].value = s.metric
            w["module_by"].value = s.module_by
            self._sync_detail()
            v._sync_extra(self)
        finally:
            self.syncing = False
        if plots:
            w["plots_drawn"] = False
            if self.selected_tab == "Plots":
                self.draw_plots()

    def _sync_detail(self) -> None:
        w, v = self.w, self.viewer
        s = v.state
        key = (s.selected, s.selected_step, s.selected_rank, s.detail_row)
        if w.get("detail_key", ()) == key:  # unchanged: keep the rendered pane (plots cost ~0.3 s)
            return
        w["detail_key"] = key
        d = v.selected
        if d is None:
            msg = ("click a row of the table to see its call's inputs, outputs and stack" if not s.selected
                   else f"no call {s.selected!r} in this table")
            w["detail"].value = f"<p style='color:#555'>{html.escape(msg)}</p>"
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"
            return
        w["detail"].value = d.html
        w["detail_img_key"] = None
        if d.tensor_rows:
            w["detail_row"].options = d.tensor_rows
            w["detail_row"].value = s.detail_row if s.detail_row in d.tensor_rows else d.tensor_rows[0]
            w["detail_row"].layout.display = ""
            if self.selected_tab == "Detail":
                self.draw_detail_figure()
        else:
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"

    def draw_detail_figure(self) -> None:
        """The selected call's whole tensors (tensor mode), drawn when the Detail tab shows (~0.3 s)."""
        w, v = self.w, self.viewer
        d = v.selected
        key = w.get("detail_key")
        if d is None or not d.tensor_rows or w.get("detail_img_key") == key:
            return
        w["detail_img_key"] = key
        try:
            fig = v.detail_figure(w["detail_row"].value)
            w["detail_img"].value = P.figure_png(fig) if fig is not None else b""
            w["detail_img"].layout.display = "" if fig is not None else "none"
        except Exception as e:  # noqa: BLE001 - a missing tensor file must not break the pane
            w["detail"].value = d.html + f"<p style='color:#c0392b'>cannot plot: {html.escape(str(e))}</p>"
            w["detail_img"].layout.display = "none"
