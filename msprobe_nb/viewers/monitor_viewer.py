"""``MonitorViewer(g)``: a monitor record or a comparison of two, in a notebook.

A heat map of layer x step for a chosen value and kind (a comparison's ``norm_ratio`` of gradients first), the
loss and gradient-norm curves (two runs overlaid), the anomaly list, and the numbers of one step and layer:
clicking a heat map cell or an anomaly in the list opens them. The state is plain Python (``state``,
``set_state``, ``click_cell``, ``open_anomaly``) over :mod:`msprobe_nb.viewers.monitor_plots`, so everything works
and is tested without a browser; the heat map is a small anywidget canvas where anywidget is installed, else a
PNG with a step and a name picker.
"""
from __future__ import annotations

import base64
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from . import monitor_plots as MP
from .plots import figure_png

__all__ = ["ANOMALIES_SHOWN", "HEAT_MAX_WIDTH", "HEATMAP_MAX_STEPS", "MonitorViewer", "anomaly_options",
           "heatmap_payload"]

#: steps shown side by side in the heat map before they are binned
HEATMAP_MAX_STEPS = 300
#: pixels the heat map canvas may take (the whole viewer fits a 900 px wide page)
HEAT_MAX_WIDTH = 820
#: rows of the anomaly list in view (it scrolls)
ANOMALIES_SHOWN = 8

_HEAT_ESM = r"""
function render({ model, el }) {
  const wrap = document.createElement("div");
  wrap.style.cssText = "overflow-x:hidden;overflow-y:auto;max-height:32em;max-width:100%;border:1px solid #ccc";
  const canvas = document.createElement("canvas");
  const tip = document.createElement("div");
  tip.className = "heat-tip";
  tip.style.cssText = "font:12px monospace;color:#444;height:1.4em;white-space:nowrap;overflow:hidden";
  // the colour scale: a gradient bar from 0 to 1 of the cells' shade, with what the ends mean (its label)
  const bar = document.createElement("div");
  bar.className = "heat-colorbar";
  bar.style.cssText = "display:flex;align-items:center;gap:6px;font:12px sans-serif;margin-top:4px";
  const barCanvas = document.createElement("canvas"); barCanvas.width = 240; barCanvas.height = 14;
  const lo = document.createElement("span"), hi = document.createElement("span"), lab = document.createElement("span");
  lo.textContent = "0"; hi.textContent = "1"; lab.className = "heat-colorbar-label";
  bar.append(lo, barCanvas, hi, lab);
  wrap.appendChild(canvas); el.appendChild(tip); el.appendChild(wrap); el.appendChild(bar);
  function shade(v) {
    const g = Math.round(240 - v * 0.94), b = Math.round(200 - v * 0.78);
    return v === 255 ? "#ddd" : `rgb(${255 - Math.round(v * 0.4)},${g},${b})`;
  }
  const bctx = barCanvas.getContext("2d");
  for (let x = 0; x < barCanvas.width; x++) {
    bctx.fillStyle = shade(Math.round(x / (barCanvas.width - 1) * 254)); bctx.fillRect(x, 0, 1, barCanvas.height);
  }
  // the cells start after a gutter of layer names (left) and above a row of step ticks (bottom); the canvas
  // says where (data-left, data-top) so a reader of its pixels finds the cells
  const FONT = "10px sans-serif", TICKS = 14;
  function gutter(ctx, rows, ch) {
    if (ch < 9) return 0;
    ctx.font = FONT;
    return Math.min(220, Math.ceil(Math.max(0, ...rows.map(r => ctx.measureText(String(r)).width))) + 6);
  }
  function draw() {
    const p = model.get("payload"); const rows = p.rows || [], cols = p.cols || [];
    tip.textContent = "";  // a new picture: the old hover text is stale
    lab.textContent = p.scale_label || "";
    const ch = p.cell_h || 10;
    const left = gutter(canvas.getContext("2d"), rows, ch);
    // cells as wide as asked, narrower where needed so the map fits its width (no horizontal scroll)
    const avail = Math.min(p.max_width || 860, wrap.clientWidth > 2 ? wrap.clientWidth - 2 : p.max_width || 860);
    const room = Math.max(100, avail - left);
    const cw = Math.max(1, Math.min(p.cell_w || 4, Math.floor(room / Math.max(1, cols.length))));
    canvas.dataset.cellW = cw;
    canvas.width = Math.max(1, left + cols.length * cw); canvas.height = Math.max(1, rows.length * ch + TICKS);
    canvas.dataset.left = left; canvas.dataset.top = 0;
    const ctx = canvas.getContext("2d");
    ctx.font = FONT; ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    const bytes = Uint8Array.from(atob(p.shades || ""), c => c.charCodeAt(0));
    for (let r = 0; r < rows.length; r++) for (let c = 0; c < cols.length; c++) {
      ctx.fillStyle = shade(bytes[r * cols.length + c]);
      ctx.fillRect(left + c * cw, r * ch, cw, ch);
    }
    ctx.fillStyle = "#333"; ctx.textBaseline = "middle"; ctx.textAlign = "right";
    if (left) for (let r = 0; r < rows.length; r++) ctx.fillText(String(rows[r]), left - 3, r * ch + ch / 2, left - 4);
    ctx.textAlign = "left"; ctx.textBaseline = "top";
    const every = Math.max(1, Math.ceil(40 / cw));  // a step label every 40 px or more
    for (let c = 0; c < cols.length; c += every) {
      ctx.fillRect(left + c * cw, rows.length * ch, 1, 3);
      ctx.fillText(String(cols[c]), left + c * cw + 1, rows.length * ch + 3);
    }
    const sel = p.selected;
    if (sel) {
      ctx.strokeStyle = "#1565c0"; ctx.lineWidth = 2; ctx.strokeRect(left + sel[1] * cw, sel[0] * ch, cw, ch);
    }
  }
  function at(e) {
    const p = model.get("payload"); const b = canvas.getBoundingClientRect();
    const c = Math.floor((e.clientX - b.left - Number(canvas.dataset.left || 0)) / Number(canvas.dataset.cellW || 4));
    const r = Math.floor((e.clientY - b.top) / (p.cell_h || 10));
    return (r >= 0 && r < p.rows.length && c >= 0 && c < p.cols.length) ? [r, c] : null;
  }
  canvas.addEventListener("mousemove", e => { const q = at(e); const p = model.get("payload");
    const v = q && p.values ? p.values[q[0]][q[1]] : "";
    tip.textContent = q ? `${p.rows[q[0]]} @ step ${p.cols[q[1]]}${v ? ": " + v : ""}` : ""; });
  canvas.addEventListener("mouseleave", () => { tip.textContent = ""; });
  canvas.addEventListener("click", e => {
    const q = at(e); if (q) model.send({ event: "cell", row: q[0], col: q[1] }); });
  model.on("change:payload", draw); draw();
  // the output's width is known once shown (and changes with the page): redraw to fit it
  let seen = 0;
  new ResizeObserver(() => { if (wrap.clientWidth !== seen) { seen = wrap.clientWidth; draw(); } }).observe(wrap);
}
export default { render };
"""

_heat_class: Any = None


def _heat_widget(**kw: Any):
    """The heat map canvas (an anywidget), or None where anywidget is not installed."""
    global _heat_class
    if _heat_class is None:
        try:
            import anywidget
            import traitlets as T
        except ImportError:
            _heat_class = False
            return None

        class HeatMap(anywidget.AnyWidget):
            """Cells of ``payload`` (``heatmap_payload``); a click sends ``{"event": "cell", "row", "col"}``."""

            _esm = _HEAT_ESM
            payload = T.Dict().tag(sync=True)

            def __init__(self, **k: Any):
                super().__init__(**k)
                self.on_cell = None
                self.on_msg(self._on_msg)

            def _on_msg(self, _w: Any, content: Any, _b: Any) -> None:
                if isinstance(content, dict) and content.get("event") == "cell" and self.on_cell:
                    self.on_cell(int(content["row"]), int(content["col"]))

        _heat_class = HeatMap
    return _heat_class(**kw) if _heat_class else None


def heatmap_payload(h: pd.DataFrame, value: str, selected: tuple[int, str] | None = None) -> dict[str, Any]:
    """What the canvas draws: row names, step columns, one shade byte per cell (255: no value), the selection."""
    shade = MP.heat_scale(h, value) if not h.empty else np.zeros((0, 0))
    b = np.where(np.isnan(shade), 255, np.round(shade * 254)).astype(np.uint8)
    sel = None
    if selected is not None and selected[1] in h.index and len(h.columns):
        cols = list(h.columns)
        col = max((i for i, c in enumerate(cols) if c <= selected[0]), default=0)
        sel = [list(h.index).index(selected[1]), col]
    values = MP.format_numbers(h).to_numpy().tolist() if not h.empty else []
    return {"rows": [str(x) for x in h.index], "cols": [int(c) for c in h.columns],
            "shades": base64.b64encode(b.tobytes()).decode(), "cell_w": 4 if len(h.columns) > 100 else 10,
            "cell_h": 10, "selected": sel, "values": values, "scale_label": MP.scale_label(value),
            "max_width": HEAT_MAX_WIDTH}


def anomaly_options(a: pd.DataFrame, limit: int = 500) -> list[tuple[str, int]]:
    """(label, row) of each of the first ``limit`` anomalies for the list: ``step S, rank R: message``, after
    the run's letter in a comparison."""
    head = a.head(limit)
    runs = head["run"].tolist() if "run" in head.columns else [None] * len(head)
    return [(f"{run + ': ' if run else ''}step {step}, rank {rank}: {m}", i) for i, (run, step, rank, m) in
            enumerate(zip(runs, head["step"], head["rank"], head["message"], strict=True))]


class MonitorViewer:
    """Browse ``source``: a ``MonitorFrame`` (``load_monitor``), a ``MonitorComparison`` (``compare_monitors``)
    or a path (loaded). ``state``: value, kind, rank and the selected (step, name); ``click_cell(step, name)``
    opens a cell's numbers (``selected_numbers``), ``open_anomaly(i)`` the cell of the i-th anomaly."""

    _heat_frame: pd.DataFrame  # the heat map shown (set by ``_sync`` when the widget is built)

    def __init__(self, source: Any, value: str | None = None, kind: str = "grad",
                 names: tuple[str, str] | None = None) -> None:
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            from msprobe_nb.analysis.monitor_frame import load_monitor

            source = load_monitor(source)
        self.source = source
        self.comparison = MP.is_comparison(source)
        #: the two runs' names in legends (given, or the folders' names)
        self.names = MP.run_names(source, names) if self.comparison else ("a", "b")
        fd = source.first_divergence() if self.comparison else None
        self.divergence = fd
        self.state: dict[str, Any] = {"value": value or MP.value_choices(source)[0], "kind": kind, "rank": None,
                                      "selected": (fd.step, fd.name) if fd is not None and fd.kind == kind else None}
        self._widget = None
        self._quiet = False  # True while the viewer sets the kind dropdown itself
        self._anomalies: pd.DataFrame | None = None

    # -- the model ---------------------------------------------------------------------------------------
    def kinds(self) -> list[str]:
        rows = self.source.table if self.comparison else self.source.stats
        return sorted(set(rows["kind"]))

    def heatmap(self) -> pd.DataFrame:
        s = self.state
        return MP.heatmap_frame(self.source, s["value"], s["kind"], s["rank"], max_steps=HEATMAP_MAX_STEPS)

    def curves(self) -> pd.DataFrame:
        return MP.curves_frame(self.source, self.state["rank"])

    def anomalies(self) -> pd.DataFrame:
        """The source's anomalies (the rules run over the whole record once; a copy each call)."""
        return self._anomaly_frame().copy()

    def _anomaly_frame(self) -> pd.DataFrame:
        if self._anomalies is None:
            self._anomalies = MP.anomaly_frame(self.source)
        return self._anomalies

    def selected_numbers(self) -> pd.DataFrame:
        sel = self.state["selected"]
        if sel is None:
            return pd.DataFrame()
        return MP.cell_numbers(self.source, sel[0], sel[1], self.state["rank"])

    def set_state(self, **changes: Any) -> None:
        """Change ``value``, ``kind``, ``rank`` or ``selected`` (unknown keys or values are a ValueError)."""
        bad = sorted(set(changes) - set(self.state))
        if bad:
            raise ValueError(f"unknown viewer state {bad}; known: {sorted(self.state)}")
        if "value" in changes and changes["value"] not in MP.value_choices(self.source):
            raise ValueError(f"value {changes['value']!r} is not one of {MP.value_choices(self.source)}")
        if "kind" in changes and changes["kind"] not in self.kinds():
            raise ValueError(f"kind {changes['kind']!r} is not one of {self.kinds()}")
        self.state.update(changes)
        self._sync()

    def click_cell(self, step: int, name: str) -> pd.DataFrame:
        """Open the numbers of ``name`` at ``step`` (what a click on that heat map cell does); returns them."""
        self.state["selected"] = (int(step), str(name))
        self._sync(heat=False)
        return self.selected_numbers()

    def open_anomaly(self, i: int) -> pd.DataFrame:
        """Open the anomaly at row ``i`` of ``anomalies()`` (what a click on it in the list does): the heat map
        turns to its kind with its cell marked, and its step and layer's numbers open; returns them. A scalar's
        anomaly (the loss, the total gradient norm) has no cell: its step's numbers of that scalar are shown."""
        a = self._anomaly_frame()
        if not 0 <= int(i) < len(a):
            raise IndexError(f"anomaly {i} out of range: the list has {len(a)}")
        r = a.iloc[int(i)]
        step, name, kind = int(r["step"]), str(r["name"]), str(r["kind"])
        self.state["selected"] = (step, name)
        if kind in self.kinds() and kind != self.state["kind"]:
            self.state["kind"] = kind
            if self._widget is not None:
                self._quiet = True  # the dropdown follows; its observer must not sync a second time
                try:
                    self._w_kind.value = kind
                finally:
                    self._quiet = False
            self._sync()
        else:
            self._sync(heat=False)
        return self.selected_numbers()

    def _on_kind(self, kind: str) -> None:
        if not self._quiet:
            self.set_state(kind=kind)

    def _on_anomaly(self, i: Any) -> None:
        if i is not None:
            self.open_anomaly(i)

    def _on_cell(self, row: int, col: int) -> None:
        h = self._heat_frame
        self.click_cell(int(h.columns[col]), str(h.index[row]))

    # -- the widgets -------------------------------------------------------------------------------------
    def widget(self):
        """The ipywidgets layout (built once)."""
        if self._widget is None:
            self._build()
        return self._widget

    @property
    def widgets(self) -> MappingProxyType:
        """The layout's widgets by name ("value", "kind", "heat", "curves", "anomalies", "numbers", ...),
        read-only: for tests and for users who script the viewer (built on first use)."""
        self.widget()
        names = {"value": "_w_value", "kind": "_w_kind", "heat": "_heat", "heat_image": "_heat_img",
                 "step": "_w_step", "layer": "_w_name", "curves": "_curves_img", "anomalies": "_anoms",
                 "anomalies_head": "_anoms_head", "numbers": "_numbers"}
        return MappingProxyType({k: getattr(self, a) for k, a in names.items() if getattr(self, a, None) is not None})

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def _build(self) -> None:
        import ipywidgets as W

        s = self.state
        self._w_value = W.Dropdown(options=MP.value_choices(self.source), value=s["value"], description="value")
        self._w_kind = W.Dropdown(options=self.kinds(), value=s["kind"] if s["kind"] in self.kinds() else None,
                                  description="kind")
        self._w_value.observe(lambda ch: self.set_state(value=ch["new"]), names="value")
        self._w_kind.observe(lambda ch: self._on_kind(ch["new"]), names="value")
        self._heat = _heat_widget()
        if self._heat is not None:
            self._heat.on_cell = self._on_cell
            heat_box = self._heat
        else:  # no anywidget: a picture, and a step and a name to open
            self._heat_img = W.Image(format="png")
            self._w_step = W.BoundedIntText(description="step", min=0, max=max(self._all_steps() or [0]))
            self._w_name = W.Dropdown(description="layer", options=[])
            open_btn = W.Button(description="open")
            open_btn.on_click(lambda _b: self.click_cell(self._w_step.value, self._w_name.value))
            heat_box = W.VBox([self._heat_img, W.HBox([self._w_step, self._w_name, open_btn])])
        self._curves_img = W.Image(format="png")
        a = self._anomaly_frame()  # the source's, whatever the state: listed once
        self._anoms_head = W.HTML(f"<b>anomalies</b> ({len(a)}; a click opens one)" if len(a)
                                  else "<b>anomalies</b>: none")
        self._anoms = W.Select(options=anomaly_options(a), value=None, rows=ANOMALIES_SHOWN,
                               layout=W.Layout(width="100%"))
        self._anoms.observe(lambda ch: self._on_anomaly(ch["new"]), names="value")
        self._numbers = W.HTML(layout=W.Layout(max_width="880px", overflow="auto"))
        head = W.HTML(f"<b>first divergence:</b> {self.divergence}" if self.comparison else "")
        self._widget = W.VBox([head, W.HBox([self._w_value, self._w_kind]), heat_box, self._numbers,
                               self._curves_img, self._anoms_head, self._anoms])
        self._sync()

    def _all_steps(self) -> list[int]:
        return self.source.a.steps if self.comparison else self.source.steps

    def _sync(self, heat: bool = True) -> None:
        if self._widget is None:
            return
        s = self.state
        if heat:
            self._heat_frame = h = self.heatmap()
            if self._heat is not None:
                self._heat.payload = heatmap_payload(h, s["value"], s["selected"])
            else:
                self._heat_img.value = figure_png(MP.heatmap_figure(h, s["value"], mark=s["selected"]))
                self._w_name.options = list(h.index)
            fd = self.divergence.step if self.divergence is not None else None
            self._curves_img.value = figure_png(MP.curves_figure(self.curves(), fd, self.names))
        elif self._heat is not None:
            self._heat.payload = heatmap_payload(self._heat_frame, s["value"], s["selected"])
        n = self.selected_numbers()
        sel = s["selected"]
        self._numbers.value = ("" if sel is None else f"<b>step {sel[0]}, {sel[1]}</b>"
                               + MP.format_numbers(n.drop(columns=["step", "name"], errors="ignore"))
                               .to_html(index=False).replace('<table ', '<table style="font-size:12px" ', 1))

    def __repr__(self) -> str:
        what = "comparison" if self.comparison else "record"
        return f"MonitorViewer({what}, value={self.state['value']!r}, kind={self.state['kind']!r})"
