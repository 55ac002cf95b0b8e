"""``DumpViewer(dump)``: browse one recorded run in a notebook (filter, sort, page, call detail, plots).

The viewer's logic lives in plain Python: :attr:`state` (a :class:`ViewerState`), :meth:`set_state`,
:attr:`rows` (the current page), :attr:`selected` (a :class:`Detail`). The ipywidgets shell (``.widget``,
shown by ``display(viewer)``) only mirrors that state, so everything can be tested without a browser.
"""
from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from msprobe_nb.analysis.divergence import is_user_file, parse_frame

from . import plots as P
from .table import (
    CRITERIA,
    DIRECTIONS,
    IOS,
    TableIndex,
    cell_styles,
    n_pages,
    render_html,
)

__all__ = ["Detail", "DumpViewer", "ViewerState", "parse_frames"]

PAGE_SIZES = (25, 50, 100, 200, 500)


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


FILTER_KEYS = frozenset((*CRITERIA, "regex"))
SORT_KEYS = frozenset(("sort_by", "ascending"))


@dataclass
class Detail:
    """One selected call: its rows (inputs, outputs, parameters, with statistics), stack and reasons."""

    call: str
    step: int
    rank: int
    rows: pd.DataFrame
    stack: list[str] = field(default_factory=list)
    frames: pd.DataFrame = field(default_factory=pd.DataFrame)
    bench_stack: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    tensor_rows: list[str] = field(default_factory=list)  #: rows with a whole tensor to plot
    html: str = ""

    @property
    def inputs(self) -> pd.DataFrame:
        return self.rows[self.rows["io"].isin(["input", "parameters"])]

    @property
    def outputs(self) -> pd.DataFrame:
        return self.rows[self.rows["io"].isin(["output", "parameters_grad"])]

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        user = self.frames[self.frames["user"]] if len(self.frames) and "user" in self.frames else self.frames
        where = f", at {user.iloc[0]['file']}:{user.iloc[0]['line']}" if len(user) else ""
        return (f"<Detail {self.call} (step {self.step}, rank {self.rank}): {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs{where}{'; ' + '; '.join(self.reasons[:3]) if self.reasons else ''}>")


def parse_frames(stack: list[str]) -> pd.DataFrame:
    """Stack frames as a table: ``file``, ``line``, ``func``, ``code``, ``user`` (outside torch/site-packages)."""
    rows = []
    for fr in stack or []:
        parsed = parse_frame(fr)
        if parsed is None:
            code = fr.split("\n", 1)[1].strip() if "\n" in fr else ""
            rows.append({"file": "", "line": -1, "func": "", "code": code or fr, "user": False})
            continue
        f, line, func, code = parsed
        rows.append({"file": f, "line": line, "func": func, "code": code, "user": is_user_file(f)})
    return pd.DataFrame(rows, columns=["file", "line", "func", "code", "user"])


def frames_html(frames: pd.DataFrame, title: str = "stack") -> str:
    """User frames in full, internal frames folded away."""
    if frames.empty:
        return f"<p><b>{html.escape(title)}</b>: none recorded</p>"
    out = [f"<p><b>{html.escape(title)}</b> ({int(frames['user'].sum())} user frames, "
           f"{int((~frames['user']).sum())} internal)</p><table class='msnb-t'>"]
    internal = []
    for r in frames.itertuples():
        row = (f"<tr><td>{html.escape(str(r.file))}:{r.line}</td><td>{html.escape(str(r.func))}</td>"
               f"<td><code>{html.escape(str(r.code))}</code></td></tr>")
        if r.user:
            out.append(row.replace("<tr>", "<tr style='font-weight:bold'>"))
        else:
            internal.append(row)
    out.append("</table>")
    if internal:
        out.append("<details><summary>internal frames</summary><table class='msnb-t' style='color:#777'>"
                   + "".join(internal) + "</table></details>")
    return "".join(out)


class _Viewer:
    """Shared logic of the viewers: state, filtered/sorted positions, paging, selection, widgets."""

    #: columns shown in the table, in order (those the table lacks are skipped)
    COLUMNS: ClassVar[list[str]] = []
    METRICS: ClassVar[list[str]] = []
    DETAIL_COLUMNS: ClassVar[list[str]] = []

    def __init__(self, table: pd.DataFrame, *, thresholds: Any = None, columns: list[str] | None = None,
                 page_size: int = 50):
        self._table = table
        self._ix = TableIndex(table)
        self.thresholds = thresholds
        self.state = ViewerState(page_size=int(page_size), metric=self.METRICS[0] if self.METRICS else "")
        self.messages: list[str] = []
        multi = [c for c in ("step", "rank") if c in table.columns and len(self._ix.uniques(c)) > 1]
        self.columns = list(columns) if columns else [c for c in multi + self.COLUMNS if c in table.columns]
        self._positions = np.arange(len(table))
        self._filtered = np.arange(len(table))
        self._detail_key: tuple | None = None
        self._detail: Detail | None = None
        self._w: dict[str, Any] | None = None
        self._widget = None
        self._syncing = False
        self._recompute(filters=True)

    # ------------------------------------------------------------------ state
    def set_state(self, **kw: Any) -> _Viewer:
        """Change state fields (filters reset the page to 0 unless ``page`` is given); returns self."""
        names = {f.name for f in dataclasses.fields(ViewerState)}
        bad = set(kw) - names
        if bad:
            raise TypeError(f"unknown state fields {sorted(bad)}; known: {sorted(names)}")
        old = dataclasses.replace(self.state)
        for k, v in kw.items():
            setattr(self.state, k, v)
        filt = any(getattr(old, k) != getattr(self.state, k) for k in FILTER_KEYS if k in kw)
        srt = any(getattr(old, k) != getattr(self.state, k) for k in SORT_KEYS if k in kw)
        if "page_size" in kw:
            self.state.page_size = max(1, int(self.state.page_size))
            if "page" not in kw:  # keep the first visible row on screen
                self.state.page = (old.page * old.page_size) // self.state.page_size
        if filt and "page" not in kw:
            self.state.page = 0
        if "selected" in kw and self.state.selected != old.selected:
            if "selected_step" not in kw:
                self.state.selected_step = None
            if "selected_rank" not in kw:
                self.state.selected_rank = None
            if "detail_row" not in kw:
                self.state.detail_row = None
        if filt or srt:
            self._recompute(filters=filt)
        self._clamp_page()
        if self._w is not None:
            self._sync_widgets(plots="metric" in kw or "module_by" in kw or filt)
        return self

    def _recompute(self, filters: bool) -> None:
        if filters:
            mask, msgs = self._ix.mask(**self.state.filters())
            self.messages = msgs
            self._filtered = np.flatnonzero(mask)
        self._positions = self._ix.order(self._filtered, self.state.sort_by, self.state.ascending)

    def _clamp_page(self) -> None:
        self.state.page = min(max(0, int(self.state.page)), self.n_pages - 1)

    # ------------------------------------------------------------------ table
    @property
    def table(self) -> pd.DataFrame:
        """The whole table the viewer browses."""
        return self._table

    @property
    def n_rows(self) -> int:
        """Rows passing the filters."""
        return len(self._positions)

    @property
    def n_pages(self) -> int:
        return n_pages(self.n_rows, self.state.page_size)

    @property
    def view(self) -> pd.DataFrame:
        """All filtered rows, sorted (a copy; prefer :attr:`rows` for display)."""
        return self._table.iloc[self._positions]

    def _page_positions(self) -> np.ndarray:
        s = self.state
        return self._positions[s.page * s.page_size:(s.page + 1) * s.page_size]

    @property
    def rows(self) -> pd.DataFrame:
        """The current page (every column of the table)."""
        return self._table.iloc[self._page_positions()]

    def next_page(self) -> _Viewer:
        return self.set_state(page=self.state.page + 1)

    def prev_page(self) -> _Viewer:
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

    def status(self) -> str:
        """One line: rows shown, page, active filters and messages."""
        s = self.state
        active = []
        for k, v in s.filters().items():
            if k == "regex" or v is None or v == "" or v == () or v == []:
                continue
            active.append(f"{k}={v!r}" + (" (regex)" if k == "call" and s.regex else ""))
        text = (f"{self.n_rows:,} of {len(self._table):,} rows · page {s.page + 1}/{self.n_pages}"
                + (f" · filters: {', '.join(active)}" if active else ""))
        return text + "".join(f" · ⚠ {m}" for m in self.messages)

    # ------------------------------------------------------------------ selection
    def select(self, call: str | None, step: int | None = None, rank: int | None = None) -> _Viewer:
        """Select a call (its detail becomes :attr:`selected`)."""
        return self.set_state(selected=call, selected_step=step, selected_rank=rank)

    def select_row(self, position: int) -> _Viewer:
        """Select the call of row ``position`` of the filtered, sorted view (the ``#`` column)."""
        if not 0 <= position < self.n_rows:
            raise IndexError(f"row {position} is outside the {self.n_rows} filtered rows")
        r = self._table.iloc[int(self._positions[position])]
        return self.select(str(r["call"]), int(r["step"]), int(r["rank"]))

    def goto(self, call: str, step: int | None = None, rank: int | None = None) -> _Viewer:
        """Select ``call`` and turn to the page holding its first row (if the filters let it through)."""
        m = self._ix.isin("call", [call])[self._positions]
        if step is not None:
            m &= self._table["step"].to_numpy()[self._positions] == step
        if rank is not None:
            m &= self._table["rank"].to_numpy()[self._positions] == rank
        hit = np.flatnonzero(m)
        kw: dict[str, Any] = {"selected": call, "selected_step": step, "selected_rank": rank}
        if len(hit):
            kw["page"] = int(hit[0]) // self.state.page_size
        return self.set_state(**kw)

    def _call_rows(self, call: str, step: int | None, rank: int | None) -> pd.DataFrame:
        """Rows of one call at one (step, rank); the first step/rank in view (else in the table) by default."""
        m = self._ix.isin("call", [call])
        if not m.any():
            return self._table.iloc[:0]
        st, rk = self._table["step"].to_numpy(), self._table["rank"].to_numpy()
        if step is None or rank is None:
            if step is not None:
                m = m & (st == step)
            if rank is not None:
                m = m & (rk == rank)
            in_view = np.zeros(len(m), dtype=bool)
            in_view[self._filtered] = True
            idx = np.flatnonzero(m & in_view)
            if not len(idx):
                idx = np.flatnonzero(m)
            if not len(idx):
                return self._table.iloc[:0]
            step, rank = int(st[idx[0]]), int(rk[idx[0]])
        return self._table.iloc[np.flatnonzero(m & (st == step) & (rk == rank))]

    @property
    def selected(self) -> Detail | None:
        """Detail of the selected call (None when nothing, or an unknown call, is selected)."""
        s = self.state
        if not s.selected:
            return None
        key = (s.selected, s.selected_step, s.selected_rank, s.detail_row)
        if key != self._detail_key:
            rows = self._call_rows(s.selected, s.selected_step, s.selected_rank)
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
        return P.metric_along_order(self._plot_table(), metric, self._divergence(), thresholds=self.thresholds)

    def module_figure(self, metric: str | None = None, by: str | None = None, top: int = 20):
        """``metric`` summed per module of the filtered rows."""
        metric = metric or self.state.metric or (self.METRICS[0] if self.METRICS else "")
        return P.errors_by_module(self._plot_table(), metric, by or self.state.module_by, top)

    def _plot_table(self) -> pd.DataFrame:
        return self._table.iloc[self._filtered] if len(self._filtered) < len(self._table) else self._table

    def _divergence(self) -> Any:
        return None

    # ------------------------------------------------------------------ widgets
    @property
    def widget(self):
        """The ipywidgets shell (built on first use)."""
        if self._widget is None:
            self._widget = self._build_widget()
            self._sync_widgets(plots=False)
        return self._widget

    def _repr_mimebundle_(self, **kwargs: Any):
        """The widget, with the current page as static HTML for frontends without widgets (nbconvert)."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle.setdefault("text/html", self._header_html() + f"<p>{html.escape(self.status())}</p>" + self.html())
        return bundle

    def _extra_filter_widgets(self, w: dict[str, Any]) -> list:
        return []

    def _extra_tabs(self, w: dict[str, Any]) -> list[tuple[str, Any]]:
        return []

    def _header_html(self) -> str:
        return ""

    def _build_widget(self):
        import ipywidgets as W

        s = self.state
        w: dict[str, Any] = {}
        self._w = w
        lay = W.Layout
        w["header"] = W.HTML(self._header_html())
        w["call"] = W.Text(value=s.call, placeholder="call name contains…", description="call",
                           continuous_update=False, layout=lay(width="28em"))
        w["regex"] = W.Checkbox(value=s.regex, description="regex", indent=False, layout=lay(width="6em"))
        fams = self._ix.uniques("family")
        w["family"] = W.Dropdown(options=["all", *fams], value="all", description="family",
                                 layout=lay(width="14em"))
        w["module"] = W.Combobox(value=s.module, options=self._ix.module_choices()[:5000], ensure_option=False,
                                 placeholder="module path or call", description="module",
                                 continuous_update=False, layout=lay(width="24em"))
        w["direction"] = W.ToggleButtons(options=["all", *[d for d in DIRECTIONS if d in self._ix.uniques(
            "direction")]], value="all", description="direction", style={"button_width": "auto"})
        w["io"] = W.ToggleButtons(options=["all", *[i for i in IOS if i in self._ix.uniques("io")]], value="all",
                                  description="io", style={"button_width": "auto"})
        w["step"] = W.Dropdown(options=["all", *[str(x) for x in self._ix.uniques("step")]], value="all",
                               description="step", layout=lay(width="10em"))
        w["rank"] = W.Dropdown(options=["all", *[str(x) for x in self._ix.uniques("rank")]], value="all",
                               description="rank", layout=lay(width="10em"))
        extra = self._extra_filter_widgets(w)
        w["status"] = W.HTML()
        cols = [c for c in self._table.columns if c not in ("reasons", "tensor_messages")]
        w["sort_by"] = W.Dropdown(options=[("execution order", "")] + [(c, c) for c in cols], value="",
                                  description="sort", layout=lay(width="18em"))
        w["ascending"] = W.ToggleButton(value=not s.ascending, description="descending", icon="sort",
                                        layout=lay(width="9em"))
        w["page_size"] = W.Dropdown(options=sorted({*PAGE_SIZES, s.page_size}), value=s.page_size,
                                    description="rows/page", layout=lay(width="12em"))
        w["prev"] = W.Button(description="◀ prev", layout=lay(width="6em"))
        w["next"] = W.Button(description="next ▶", layout=lay(width="6em"))
        w["page"] = W.BoundedIntText(value=s.page + 1, min=1, max=self.n_pages, description="page",
                                     layout=lay(width="10em"))
        w["table"] = W.HTML(layout=lay(max_height="34em", overflow="auto"))
        w["pick"] = W.Dropdown(options=[], description="select", layout=lay(width="40em"))
        w["pick_text"] = W.Text(placeholder="or type a call name, Enter", continuous_update=False,
                                layout=lay(width="28em"))
        w["detail"] = W.HTML()
        w["detail_row"] = W.Dropdown(options=[], description="tensor", layout=lay(width="40em", display="none"))
        w["detail_img"] = W.Image(format="png", layout=lay(display="none"))
        w["metric"] = W.Dropdown(options=[m for m in self.METRICS if m in self._table.columns] or [s.metric],
                                 value=s.metric if s.metric in self._table.columns else None,
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
        tabs = [("Table", table_tab), ("Detail", detail_tab), ("Plots", plot_tab), *self._extra_tabs(w)]
        w["tabs"] = W.Tab(children=[t for _, t in tabs], titles=[n for n, _ in tabs])
        w["plots_drawn"] = False

        def obs(name: str, conv):
            def handler(change):
                if not self._syncing:
                    self.set_state(**{name: conv(change["new"])})
            w[name].observe(handler, names="value")

        def opt(v):
            return None if v in ("all", "", None) else v

        def num(v):
            return None if v in ("all", "", None) else int(v)

        obs("call", str)
        obs("regex", bool)
        obs("family", opt)
        obs("module", str)
        obs("direction", opt)
        obs("io", opt)
        obs("step", num)
        obs("rank", num)
        obs("sort_by", lambda v: v or None)
        w["ascending"].observe(lambda c: None if self._syncing else self.set_state(ascending=not c["new"]),
                               names="value")
        obs("page_size", int)
        w["page"].observe(lambda c: None if self._syncing else self.set_state(page=int(c["new"]) - 1),
                          names="value")
        w["prev"].on_click(lambda _: self.prev_page())
        w["next"].on_click(lambda _: self.next_page())

        def on_pick(c):
            if not self._syncing and c["new"] is not None:
                self.select_row(int(c["new"]))
                w["tabs"].selected_index = 1

        w["pick"].observe(on_pick, names="value")

        def on_pick_text(c):
            if not self._syncing and c["new"].strip():
                self.goto(c["new"].strip())
                w["tabs"].selected_index = 1

        w["pick_text"].observe(on_pick_text, names="value")
        w["detail_row"].observe(lambda c: None if self._syncing or c["new"] is None
                                else self.set_state(detail_row=c["new"]), names="value")
        obs("metric", str)
        obs("module_by", str)

        def on_tab(c):
            if c["new"] == 2 and not w["plots_drawn"]:
                self._draw_plots()
            self._on_tab(c["new"])

        w["tabs"].observe(on_tab, names="selected_index")
        return W.VBox([w["header"], filt_row1, filt_row2, filt_row3, w["status"], w["tabs"]])

    def _on_tab(self, index: int) -> None:
        pass

    def _draw_plots(self) -> None:
        w = self._w
        if w is None:
            return
        try:
            w["plot_order"].value = P.figure_png(self.metric_figure())
            w["plot_module"].value = P.figure_png(self.module_figure())
            w["plot_msg"].value = ""
        except Exception as e:  # noqa: BLE001 - show the reason in the pane, never break the viewer
            w["plot_msg"].value = f"<p style='color:#c0392b'>cannot plot: {html.escape(str(e))}</p>"
        w["plots_drawn"] = True

    def _sync_widgets(self, plots: bool) -> None:
        """Mirror :attr:`state` into the widgets (no observer runs while this does)."""
        w = self._w
        if w is None:
            return
        s = self.state
        self._syncing = True
        try:
            def one(v):
                if isinstance(v, (list, tuple, set)):
                    v = list(v)
                    return str(v[0]) if len(v) == 1 else "all"
                return "all" if v is None or v == "" else str(v)

            w["call"].value, w["regex"].value, w["module"].value = s.call, bool(s.regex), s.module or ""
            for k in ("family", "direction", "io", "step", "rank", *self._extra_state_widgets()):
                v = one(getattr(s, k))
                if v in w[k].options or any(v == o[1] if isinstance(o, tuple) else False for o in w[k].options):
                    w[k].value = v
            w["sort_by"].value = s.sort_by or ""
            w["ascending"].value = not s.ascending
            if s.page_size not in w["page_size"].options:
                w["page_size"].options = sorted({*w["page_size"].options, s.page_size})
            w["page_size"].value = s.page_size
            w["page"].max = self.n_pages
            w["page"].value = s.page + 1
            w["prev"].disabled = s.page <= 0
            w["next"].disabled = s.page >= self.n_pages - 1
            w["status"].value = f"<span style='font-size:12px'>{html.escape(self.status())}</span>"
            w["table"].value = self.html()
            pos = self._page_positions()
            calls = self._table["call"].to_numpy(dtype=object)[pos] if len(pos) else []
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
            self._sync_extra()
        finally:
            self._syncing = False
        if plots:
            w["plots_drawn"] = False
            if w["tabs"].selected_index == 2:
                self._draw_plots()

    def _extra_state_widgets(self) -> tuple[str, ...]:
        return ()

    def _sync_extra(self) -> None:
        pass

    def _sync_detail(self) -> None:
        w = self._w
        s = self.state
        key = (s.selected, s.selected_step, s.selected_rank, s.detail_row)
        if w.get("detail_key", ()) == key:  # unchanged: keep the rendered pane (plots cost ~0.3 s)
            return
        w["detail_key"] = key
        d = self.selected
        if d is None:
            msg = "select a call in the Table tab" if not self.state.selected else \
                f"no call {self.state.selected!r} in this table"
            w["detail"].value = f"<p>{html.escape(msg)}</p>"
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"
            return
        w["detail"].value = d.html
        if d.tensor_rows:
            w["detail_row"].options = d.tensor_rows
            w["detail_row"].value = self.state.detail_row if self.state.detail_row in d.tensor_rows \
                else d.tensor_rows[0]
            w["detail_row"].layout.display = ""
            try:
                fig = self.detail_figure(w["detail_row"].value)
                w["detail_img"].value = P.figure_png(fig) if fig is not None else b""
                w["detail_img"].layout.display = "" if fig is not None else "none"
            except Exception as e:  # noqa: BLE001 - a missing tensor file must not break the pane
                w["detail"].value = d.html + f"<p style='color:#c0392b'>cannot plot: {html.escape(str(e))}</p>"
                w["detail_img"].layout.display = "none"
        else:
            w["detail_row"].layout.display = "none"
            w["detail_img"].layout.display = "none"


# ------------------------------------------------------------------------------------------ DumpViewer
class DumpViewer(_Viewer):
    """Browse one dump: ``DumpViewer(dump)`` with a ``Dump``, a dump path or a calls DataFrame.

    ``state`` / ``set_state(**kw)`` / ``rows`` / ``selected`` drive it from code; ``display(viewer)`` shows it.
    """

    COLUMNS: ClassVar[list[str]] = ["call_index", "call", "io", "arg", "kind", "dtype", "shape", "max", "min",
                                    "mean", "norm", "nan_count", "posinf_count", "neginf_count", "value",
                                    "requires_grad"]
    METRICS: ClassVar[list[str]] = ["norm", "max", "min", "mean", "nan_count"]
    DETAIL_COLUMNS: ClassVar[list[str]] = ["io", "arg", "kind", "dtype", "shape", "max", "min", "mean", "norm",
                                           "nan_count", "posinf_count", "neginf_count", "value", "requires_grad",
                                           "device", "producer", "rng"]

    def __init__(self, dump: Any, *, columns: list[str] | None = None, page_size: int = 50,
                 divergence: Any = None):
        if isinstance(dump, (str, bytes)) or hasattr(dump, "__fspath__"):
            from msprobe_nb.store.dump import load

            dump = load(dump)
        self.dump = dump if not isinstance(dump, pd.DataFrame) else None
        calls = dump if isinstance(dump, pd.DataFrame) else dump.calls
        self.divergence = divergence
        super().__init__(calls, columns=columns, page_size=page_size)

    def _divergence(self) -> Any:
        return self.divergence

    def _mark_call(self) -> str | None:
        return self.state.selected

    def _header_html(self) -> str:
        d = self.dump
        what = html.escape(repr(d)) if d is not None else f"{len(self._table):,} rows"
        return f"<b>DumpViewer</b> <span style='font-size:12px'>{what}</span>"

    def _build_detail(self, rows: pd.DataFrame) -> Detail:
        r0 = rows.iloc[0]
        call, step, rank = str(r0["call"]), int(r0["step"]), int(r0["rank"])
        stack: list[str] = []
        if self.dump is not None:
            sid = int(r0["stack_id"]) if "stack_id" in rows.columns else -1
            frames_map = getattr(self.dump, "stack_frames", None)
            if isinstance(frames_map, dict) and sid >= 0:
                stack = list(frames_map.get(sid, []))
            elif sid >= 0:
                try:
                    stack = list(self.dump.stack(call))
                except (KeyError, AttributeError):
                    stack = []
        frames = parse_frames(stack)
        has_t = (rows["kind"].astype(object) == "tensor") & (rows["data_name"].astype(object).fillna("") != "") \
            if "data_name" in rows.columns else pd.Series(False, index=rows.index)
        tensor_rows = [str(n) for n in rows.loc[has_t.to_numpy(dtype=bool), "name"]] if self.dump is not None else []
        cols = [c for c in self.DETAIL_COLUMNS if c in rows.columns]
        parent = str(r0.get("parent", "") or "")
        head = (f"<h4 style='margin:4px 0'>{html.escape(call)}</h4><p style='font-size:12px'>step {step}, "
                f"rank {rank}, call #{int(r0['call_index'])}" + (f", inside {html.escape(parent)}" if parent else "")
                + "</p>")
        body = render_html(rows, cols, cell_styles(rows[cols], self.thresholds))
        return Detail(call=call, step=step, rank=rank, rows=rows, stack=stack, frames=frames,
                      tensor_rows=tensor_rows, html=head + body + frames_html(frames))

    def _tensor_figure(self, d: Detail, name: str):
        return P.tensor_values(self.dump.tensor(name, step=d.step, rank=d.rank), name)
