"""The viewers' ipywidgets shell: :class:`ViewerWidgets` builds the widgets and wires them both ways.

A widget the user changes calls the viewer's ``set_state``; :meth:`ViewerWidgets.sync` mirrors the state
back into every widget (with the observers muted while it does). The shell holds no state of its own
beyond what is drawn: the viewer (a :class:`~msprobe_nb.viewers.base.BaseViewer`) and its
:class:`~msprobe_nb.viewers.view_state.TableView` are the truth.

A viewer adds widgets of its own through its hooks: ``_extra_filter_widgets(shell)`` (widgets for the
third filter row, stored in ``shell.w``), ``_extra_state_widgets()`` (names of those that mirror a state
field of the same name), ``_sync_extra(shell)``, ``_extra_tabs(shell)`` (``(title, widget)`` pairs after
Table, Detail and Plots) and ``_on_tab(index)``.
"""
from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import plots as P
from .table import DIRECTIONS, IOS

if TYPE_CHECKING:
    from .base import BaseViewer
    from .view_state import TableView

__all__ = ["PAGE_SIZES", "ViewerWidgets", "opt"]

PAGE_SIZES = (25, 50, 100, 200, 500)


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


class ViewerWidgets:
    """The widgets of ``viewer`` by name (:attr:`w`) in one box (:attr:`box`), mirroring its state."""

    def __init__(self, viewer: BaseViewer, table_view: TableView):
        self.viewer = viewer
        self.table_view = table_view
        self.w: dict[str, Any] = {}
        self.syncing = False  #: True while :meth:`sync` writes the widgets (their observers then do nothing)
        self.box = self._build()

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
        w["header"] = W.HTML(v._header_html())
        w["call"] = W.Text(value=s.call, placeholder="call name contains…", description="call",
                           continuous_update=False, layout=lay(width="28em"))
        w["regex"] = W.Checkbox(value=s.regex, description="regex", indent=False, layout=lay(width="6em"))
        fams = ix.uniques("family")
        w["family"] = W.Dropdown(options=["all", *fams], value="all", description="family",
                                 layout=lay(width="14em"))
        w["module"] = W.Combobox(value=s.module, options=ix.module_choices()[:5000], ensure_option=False,
                                 placeholder="module path or call", description="module",
                                 continuous_update=False, layout=lay(width="24em"))
        w["direction"] = W.ToggleButtons(options=["all", *[d for d in DIRECTIONS if d in ix.uniques(
            "direction")]], value="all", description="direction", style={"button_width": "auto"})
        w["io"] = W.ToggleButtons(options=["all", *[i for i in IOS if i in ix.uniques("io")]], value="all",
                                  description="io", style={"button_width": "auto"})
        w["step"] = W.Dropdown(options=["all", *[str(x) for x in ix.uniques("step")]], value="all",
                               description="step", layout=lay(width="10em"))
        w["rank"] = W.Dropdown(options=["all", *[str(x) for x in ix.uniques("rank")]], value="all",
                               description="rank", layout=lay(width="10em"))
        extra = v._extra_filter_widgets(self)
        w["status"] = W.HTML()
        cols = [c for c in tv.table.columns if c not in ("reasons", "tensor_messages")]
        w["sort_by"] = W.Dropdown(options=[("execution order", "")] + [(c, c) for c in cols], value="",
                                  description="sort", layout=lay(width="18em"))
        w["ascending"] = W.ToggleButton(value=not s.ascending, description="descending", icon="sort",
                                        layout=lay(width="9em"))
        w["page_size"] = W.Dropdown(options=sorted({*PAGE_SIZES, s.page_size}), value=s.page_size,
                                    description="rows/page", layout=lay(width="12em"))
        w["prev"] = W.Button(description="◀ prev", layout=lay(width="6em"))
        w["next"] = W.Button(description="next ▶", layout=lay(width="6em"))
        w["page"] = W.BoundedIntText(value=s.page + 1, min=1, max=tv.n_pages, description="page",
                                     layout=lay(width="10em"))
        w["table"] = W.HTML(layout=lay(max_height="34em", overflow="auto"))
        w["pick"] = W.Dropdown(options=[], description="select", layout=lay(width="40em"))
        w["pick_text"] = W.Text(placeholder="or type a call name, Enter", continuous_update=False,
                                layout=lay(width="28em"))
        w["detail"] = W.HTML()
        w["detail_row"] = W.Dropdown(options=[], description="tensor", layout=lay(width="40em", display="none"))
        w["detail_img"] = W.Image(format="png", layout=lay(display="none"))
        w["metric"] = W.Dropdown(options=[m for m in v.METRICS if m in tv.table.columns] or [s.metric],
                                 value=s.metric if s.metric in tv.table.columns else None,
                                 description="metric", layout=lay(width="16em"))
        w["module_by"] = W.ToggleButtons(options=[("by module path", "module"), ("by module call", "parent")],
                                         value=s.module_by, style={"button_width": "auto"})
        w["plot_order"] = W.Image(format="png")
        w["plot_module"] = W.Image(format="png")
        w["plot_msg"] = W.HTML()

        filt_row1 = W.HBox([w["call"], w["regex"], w["family"], w["module"]])
        filt_row2 = W.HBox([w["direction"], w["io"]])
        filt_row3 = W.HBox([w["step"], w["rank"], *extra])
        nav = W.HBox([w["sort_by"], w["ascending"], w["page_size"], w["prev"], w["page"], w["next"]])
        table_tab = W.VBox([nav, w["table"], W.HBox([w["pick"], w["pick_text"]])])
        detail_tab = W.VBox([w["detail"], w["detail_row"], w["detail_img"]])
        plot_tab = W.VBox([W.HBox([w["metric"], w["module_by"]]), w["plot_msg"], w["plot_order"],
                           w["plot_module"]])
        tabs = [("Table", table_tab), ("Detail", detail_tab), ("Plots", plot_tab), *v._extra_tabs(self)]
        w["tabs"] = W.Tab(children=[t for _, t in tabs], titles=[n for n, _ in tabs])
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

        def on_pick(c):
            if not self.syncing and c["new"] is not None:
                v.select_row(int(c["new"]))
                w["tabs"].selected_index = 1

        w["pick"].observe(on_pick, names="value")

        def on_pick_text(c):
            if not self.syncing and c["new"].strip():
                v.goto(c["new"].strip())
                w["tabs"].selected_index = 1

        w["pick_text"].observe(on_pick_text, names="value")
        w["detail_row"].observe(lambda c: None if self.syncing or c["new"] is None
                                else v.set_state(detail_row=c["new"]), names="value")
        self.bind("metric", str)
        self.bind("module_by", str)

        def on_tab(c):
            if c["new"] == 2 and not w["plots_drawn"]:
                self.draw_plots()
            v._on_tab(c["new"])

        w["tabs"].observe(on_tab, names="selected_index")
        return W.VBox([w["header"], filt_row1, filt_row2, filt_row3, w["status"], w["tabs"]])

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

    def sync(self, plots: bool) -> None:
        """Mirror the viewer's state into the widgets (no observer runs while this does)."""
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
            w["status"].value = f"<span style='font-size:12px'>{html.escape(v.status())}</span>"
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
            if s.metric and s.metric in w["metric"].options:
                w["metric"].value = s.metric
            w["module_by"].value = s.module_by
            self._sync_detail()
            v._sync_extra(self)
        finally:
            self.syncing = False
        if plots:
            w["plots_drawn"] = False
            if w["tabs"].selected_index == 2:
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
            msg = "select a call in the Table tab" if not s.selected else f"no call {s.selected!r} in this table"
            w["detail"].value = f"<p>{html.escape(msg)}</p>"
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"
            return
        w["detail"].value = d.html
        if d.tensor_rows:
            w["detail_row"].options = d.tensor_rows
            w["detail_row"].value = s.detail_row if s.detail_row in d.tensor_rows else d.tensor_rows[0]
            w["detail_row"].layout.display = ""
            try:
                fig = v.detail_figure(w["detail_row"].value)
                w["detail_img"].value = P.figure_png(fig) if fig is not None else b""
                w["detail_img"].layout.display = "" if fig is not None else "none"
            except Exception as e:  # noqa: BLE001 - a missing tensor file must not break the pane
                w["detail"].value = d.html + f"<p style='color:#c0392b'>cannot plot: {html.escape(str(e))}</p>"
                w["detail_img"].layout.display = "none"
        else:
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"
