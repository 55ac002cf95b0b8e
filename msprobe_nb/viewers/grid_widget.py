"""The viewers' browser-side widgets, on anywidget (imported lazily; None where it is not installed).

* :func:`data_grid`: the data grid. Python sends one page at a time (:func:`~msprobe_nb.viewers.table.page_payload`:
  text cells, verdict per row, flagged cells); the browser draws it with a sticky header and a frozen name
  column, and sends back a click on a row (``{"event": "row", "pos": i}``) or on a header
  (``{"event": "sort", "column": c}``).
* :func:`live_text`: a text box that applies as you type (debounced in the browser, Enter applies at once).
* :func:`html_pane`: HTML shown as it is (the call's detail: no typesetting pass over it);
* :func:`tree_view`: the model tree (:func:`~msprobe_nb.viewers.tree.tree_payload`), collapsible in the
  browser; a click on a node sends ``{"event": "node", "id": call}``.

Each factory returns None when anywidget cannot be imported; the shell then falls back to plain ipywidgets.
Python-side handlers are plain callables, so tests drive the widgets without a browser
(``grid.click_row(i)``, ``grid.click_header(c)``, ``tree.click_node(call)``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["GRID_CSS", "available", "data_grid", "html_pane", "live_text", "tree_view"]

from .palette import RESULT_COLOURS, VERDICT_COLOURS, result_css

_classes: dict[str, Any] | None = None

def _grid_css() -> str:
    """The grid's CSS; its verdict colours are the ones the detail pane and static HTML use (table.py)."""
    rows = "".join(f".msnb-grid tr.v-{v}{{background:{c}}}\n" for v, c in VERDICT_COLOURS.items() if c)
    res = "".join(f".msnb-grid tr.v-{v} td.res{{{result_css(v)}}}\n" for v in RESULT_COLOURS)
    return _GRID_CSS_BASE + rows + res


_GRID_CSS_BASE = """
.msnb-grid{font:12px/1.35 var(--jp-code-font-family,monospace);color:var(--jp-ui-font-color1,#222);
  min-width:0;max-width:100%;--msnb-name-w:17em}
.msnb-grid .msnb-scroll{overflow:auto;max-height:30em;border:1px solid #ccc;position:relative}
.msnb-grid table{border-collapse:separate;border-spacing:0;width:max-content}
.msnb-grid th{position:sticky;top:0;z-index:2;background:#eceff1;text-align:left;padding:3px 6px;
  border-bottom:1px solid #999;cursor:pointer;user-select:none;white-space:nowrap}
.msnb-grid th:hover{background:#dfe5e8}
.msnb-grid th.num,.msnb-grid td.num{text-align:right}
.msnb-grid td{padding:1px 6px;border-bottom:1px solid #e6e6e6;white-space:nowrap;max-width:28em;
  overflow:hidden;text-overflow:ellipsis;background:inherit}
.msnb-grid tr{cursor:pointer;background:#fff}
.msnb-grid tbody tr:hover td{filter:brightness(0.95)}
.msnb-grid tr.sel td{box-shadow:inset 0 1px 0 #1565c0,inset 0 -1px 0 #1565c0}
.msnb-grid tr.sel td:first-child{box-shadow:inset 3px 0 0 #1565c0,inset 0 1px 0 #1565c0,inset 0 -1px 0 #1565c0}
.msnb-grid tr.mark td:first-child{box-shadow:inset 3px 0 0 #c0392b}
.msnb-grid td.flag{background:#f1948a;font-weight:bold}
.msnb-grid .pos{position:sticky;left:0;z-index:1;width:4.5em;min-width:4.5em;max-width:4.5em;
  box-sizing:border-box;color:#666}
.msnb-grid .frz{position:sticky;left:4.5em;z-index:1;width:var(--msnb-name-w);min-width:var(--msnb-name-w);
  max-width:var(--msnb-name-w);box-sizing:border-box;border-right:1px solid #bbb;text-overflow:clip}
.msnb-grid.frozen-res .res{position:sticky;left:calc(4.5em + var(--msnb-name-w));z-index:1;
  border-right:1px solid #bbb}
.msnb-grid th.pos,.msnb-grid th.frz,.msnb-grid.frozen-res th.res{z-index:3}
.msnb-grid th.frz .msnb-rs{position:absolute;top:0;right:-3px;width:7px;height:100%;cursor:col-resize;z-index:4}
.msnb-grid th.frz .msnb-rs:hover,.msnb-grid th.frz .msnb-rs.on{background:#90a4ae}
.msnb-grid .msnb-empty{padding:8px;color:#777}
"""

GRID_CSS = _grid_css()

_GRID_ESM = r"""
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
// a long name cut in its middle, so that its end (".backward.output.0") stays readable
function middle(s, n) {
  s = String(s);
  if (n < 4 || s.length <= n) return s;
  const tail = Math.ceil((n - 1) * 0.65), head = n - 1 - tail;
  return s.slice(0, head) + "…" + s.slice(s.length - tail);
}
function render({ model, el }) {
  el.classList.add("msnb-grid");
  const scroll = document.createElement("div");
  scroll.className = "msnb-scroll";
  el.appendChild(scroll);
  let nameW = null;     // the name column's width in px once the user drags it
  let want = -1;        // a row to scroll to once the grid is laid out
  let dragged = false;  // a resize just ended: the click that follows is not a sort
  function charPx() {
    const probe = document.createElement("span");
    probe.style.cssText = "position:absolute;visibility:hidden;white-space:pre";
    probe.textContent = "0".repeat(20);
    el.appendChild(probe);
    const w = probe.getBoundingClientRect().width / 20;
    probe.remove();
    return w || 7.2;
  }
  function shorten() {  // fit each name to its column (cut in the middle); the full name is the title
    const th = scroll.querySelector("thead th.frz");
    if (!th) return;
    const n = Math.floor((th.getBoundingClientRect().width - 12) / charPx());
    if (n <= 0) return;
    scroll.querySelectorAll("tbody td.frz").forEach((td) => { td.textContent = middle(td.title, n); });
  }
  function applyScroll() {
    if (want < 0 || !scroll.clientHeight) return;  // not laid out yet: the ResizeObserver calls again
    const tr = scroll.querySelector(`tbody tr[data-row="${want}"]`);
    want = -1;
    if (tr) {
      const head = scroll.querySelector("thead");
      scroll.scrollTop = Math.max(0, tr.offsetTop - (head ? head.offsetHeight : 0) - 2 * tr.offsetHeight);
    }
  }
  function draw() {
    const p = model.get("payload") || {};
    const cols = p.columns || [], rows = p.rows || [];
    const sort = p.sort, sel = new Set(p.selected || []), mark = new Set(p.marked || []);
    const fi = cols.findIndex((c) => c.frozen);
    el.classList.toggle("frozen-res", fi >= 0 && p.result_col === fi + 1);
    const h = ["<table><thead><tr><th class='pos num' data-col=''>#</th>"];
    cols.forEach((c, j) => {
      const arrow = sort && sort[0] === c.key ? (sort[1] ? " ▲" : " ▼") : "";
      const cls = (c.num ? "num " : "") + (c.frozen ? "frz" : "") + (j === p.result_col ? " res" : "");
      const grip = c.frozen ? "<span class='msnb-rs' title='drag to resize'></span>" : "";
      h.push(`<th class="${cls}" data-col="${esc(c.key)}" title="sort by ${esc(c.key)}">`
        + `${esc(c.key)}${arrow}${grip}</th>`);
    });
    h.push("</tr></thead><tbody>");
    rows.forEach((r, i) => {
      const flags = new Set((p.flags || [])[i] || []);
      const v = (p.verdict || [])[i] || "";
      const cls = (v ? "v-" + v : "") + (sel.has(i) ? " sel" : "") + (mark.has(i) ? " mark" : "");
      h.push(`<tr class="${cls}" data-pos="${p.pos[i]}" data-row="${i}"><td class="pos num">${p.pos[i]}</td>`);
      r.forEach((t, j) => {
        const c = cols[j];
        const k = (c.num ? "num " : "") + (c.frozen ? "frz " : "") + (flags.has(j) ? "flag" : "")
          + (j === p.result_col ? " res" : "");
        h.push(`<td class="${k}" title="${esc(t)}">${esc(t)}</td>`);
      });
      h.push("</tr>");
    });
    h.push("</tbody></table>");
    if (!rows.length) h.push(`<div class="msnb-empty">${esc(p.empty || "no rows")}</div>`);
    scroll.innerHTML = h.join("");
    if (nameW !== null) el.style.setProperty("--msnb-name-w", nameW + "px");
    shorten();
    const to = p.scroll_to;
    if (to !== undefined && to !== null && to >= 0) want = to;
    applyScroll();
  }
  new ResizeObserver(() => { applyScroll(); shorten(); }).observe(scroll);
  scroll.addEventListener("mousedown", (e) => {
    if (!e.target.classList.contains("msnb-rs")) return;
    e.preventDefault();
    const th = e.target.closest("th"), x0 = e.clientX, w0 = th.getBoundingClientRect().width;
    e.target.classList.add("on");
    const move = (m) => {
      nameW = Math.max(60, Math.min(900, w0 + m.clientX - x0));
      el.style.setProperty("--msnb-name-w", nameW + "px");
      shorten();
    };
    const up = () => {
      dragged = true;  // the click this mouseup may fire is no sort; any later one is
      setTimeout(() => { dragged = false; }, 0);
      e.target.classList.remove("on");
      window.removeEventListener("mousemove", move);
      window.removeEventListener("mouseup", up);
    };
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", up);
  });
  scroll.addEventListener("click", (e) => {
    const th = e.target.closest("th");
    if (th) {
      const was = dragged;
      dragged = false;
      if (was || e.target.classList.contains("msnb-rs")) return;
      if (th.dataset.col) model.send({ event: "sort", column: th.dataset.col });
      return;
    }
    const tr = e.target.closest("tbody tr");
    if (tr) {
      scroll.querySelectorAll("tr.sel").forEach((x) => x.classList.remove("sel"));
      tr.classList.add("sel");
      model.send({ event: "row", pos: parseInt(tr.dataset.pos, 10) });
    }
  });
  model.on("change:payload", draw);
  draw();
}
export default { render };
"""

_TEXT_ESM = r"""
function render({ model, el }) {
  el.classList.add("msnb-live");
  const input = document.createElement("input");
  input.type = "text";
  input.placeholder = model.get("placeholder");
  input.value = model.get("value");
  input.spellcheck = false;
  const label = document.createElement("span");
  label.className = "msnb-live-label";
  label.textContent = model.get("description");
  const hint = document.createElement("span");
  hint.className = "msnb-live-hint";
  hint.textContent = model.get("hint");
  el.append(label, input, hint);
  let timer = null;
  function apply() {
    timer = null;
    if (input.value !== model.get("value")) {
      model.set("value", input.value);
      model.save_changes();
    }
  }
  input.addEventListener("input", () => {
    if (timer) clearTimeout(timer);
    timer = setTimeout(apply, model.get("debounce_ms"));
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { if (timer) clearTimeout(timer); apply(); }
  });
  model.on("change:value", () => {
    if (!timer && input.value !== model.get("value")) input.value = model.get("value");
  });
  model.on("change:hint", () => { hint.textContent = model.get("hint"); });
}
export default { render };
"""

_TEXT_CSS = """
.msnb-live{display:flex;align-items:center;gap:6px;min-width:0;flex:1 1 20em;max-width:34em}
.msnb-live-label{font-size:var(--jp-widgets-font-size,13px);color:var(--jp-widgets-label-color,#000)}
.msnb-live input{flex:1 1 auto;min-width:8em;height:26px;box-sizing:border-box;padding:2px 6px;
  border:1px solid var(--jp-border-color1,#bbb);font-size:13px}
.msnb-live-hint{font-size:11px;color:#777;white-space:nowrap}
"""

_TREE_ESM = r"""
function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
function render({ model, el }) {
  el.classList.add("msnb-tree");
  const box = document.createElement("div");
  box.className = "msnb-tree-box";
  el.appendChild(box);
  let open = new Set(model.get("expanded") || []);
  function draw() {
    const nodes = model.get("nodes") || [], selected = model.get("selected");
    const hidden = new Set();
    const h = [];
    nodes.forEach((n) => {
      if (n.parent && (hidden.has(n.parent) || !open.has(n.parent))) { hidden.add(n.id); return; }
      const tw = n.kids ? (open.has(n.id) ? "▾" : "▸") : "·";
      const cls = "v-" + (n.verdict || "none") + (n.id === selected ? " sel" : "") + (n.on_path ? " path" : "")
        + (n.divergence ? " div" : "");
      const count = n.bad ? `${n.bad} bad / ${n.rows}` : `${n.rows}`;
      h.push(`<div class="node ${cls}" data-id="${esc(n.id)}" style="padding-left:${0.3 + n.depth * 1.1}em"`
        + ` title="${esc(n.id)}"><span class="tw" data-tw="1">${tw}</span><span class="dot"></span>`
        + `<span class="lbl">${esc(n.name)} <span class="cls">${esc(n.cls)}</span></span>`
        + `<span class="tag">${esc(n.tag)}</span><span class="cnt">${count}</span></div>`);
    });
    if (!nodes.length) h.push("<div class='empty'>no module calls recorded</div>");
    box.innerHTML = h.join("");
  }
  box.addEventListener("click", (e) => {
    const node = e.target.closest(".node");
    if (!node) return;
    const id = node.dataset.id;
    if (e.target.dataset.tw) {
      if (open.has(id)) open.delete(id); else open.add(id);
      draw();
      return;
    }
    if (!open.has(id)) open.add(id);
    box.querySelectorAll(".node.sel").forEach((x) => x.classList.remove("sel"));
    node.classList.add("sel");
    model.send({ event: "node", id: id });
  });
  model.on("change:nodes", draw);
  model.on("change:selected", draw);
  model.on("change:expanded", () => { (model.get("expanded") || []).forEach((x) => open.add(x)); draw(); });
  draw();
}
export default { render };
"""

_TREE_CSS = """
.msnb-tree{font:12px/1.5 var(--jp-ui-font-family,sans-serif);min-width:0}
.msnb-tree-box{overflow:auto;max-height:30em;border:1px solid #ccc;padding:2px 0}
.msnb-tree .node{display:flex;align-items:center;gap:4px;cursor:pointer;white-space:nowrap;padding-right:6px}
.msnb-tree .node:hover{background:#eef2f5}
.msnb-tree .node.sel{background:#d6e6fa}
.msnb-tree .node.path .lbl{font-weight:bold}
.msnb-tree .node.div .lbl{text-decoration:underline;text-decoration-color:#c0392b}
.msnb-tree .tw{width:1em;text-align:center;color:#555;flex:none}
.msnb-tree .dot{width:.7em;height:.7em;border-radius:50%;flex:none;background:#bbb}
.msnb-tree .v-error .dot{background:#c0392b}
.msnb-tree .v-warning .dot{background:#e0a800}
.msnb-tree .v-nan .dot{background:#e67e22}
.msnb-tree .v-pass .dot{background:#3c9a4a}
.msnb-tree .v-unmatched .dot{background:#6c7fb0}
.msnb-tree .lbl{overflow:hidden;text-overflow:ellipsis}
.msnb-tree .cls{color:#666}
.msnb-tree .tag{font-size:10px;color:#555;background:#e8ebee;border-radius:3px;padding:0 3px;flex:none}
.msnb-tree .cnt{margin-left:auto;padding-left:8px;color:#777;font-size:11px;flex:none}
.msnb-tree .empty{padding:6px;color:#777}
"""


_PANE_ESM = r"""
function render({ model, el }) {
  el.classList.add("msnb-pane");
  const draw = () => { el.innerHTML = model.get("value"); };
  model.on("change:value", draw);
  draw();
}
export default { render };
"""

_PANE_CSS = """
.msnb-pane{font-size:var(--jp-widgets-font-size,13px);overflow:auto;max-width:100%}
.msnb-pane .msnb-t{border-collapse:collapse;font:12px monospace}
.msnb-pane .msnb-t th{background:#eee;text-align:left;padding:2px 6px;border-bottom:1px solid #999}
.msnb-pane .msnb-t td{padding:1px 6px;border-bottom:1px solid #eee;white-space:nowrap;max-width:40em;
  overflow:hidden;text-overflow:ellipsis}
"""


def _load() -> dict[str, Any] | None:
    """The widget classes, defined on first use (None where anywidget is not installed)."""
    global _classes
    if _classes is not None:
        return _classes or None
    try:
        import anywidget
        import traitlets as T
    except ImportError:
        _classes = {}
        return None

    class _Clicks(anywidget.AnyWidget):
        """A widget whose browser events go to Python callables (``handlers[event](content)``)."""

        def __init__(self, **kw: Any):
            super().__init__(**kw)
            self.handlers: dict[str, Callable[[dict], None]] = {}
            self.on_msg(self._on_msg)

        def _on_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
            if isinstance(content, dict):
                fn = self.handlers.get(str(content.get("event")))
                if fn is not None:
                    fn(content)

    class DataGrid(_Clicks):
        """The data grid: one page of rows (``payload``), clickable rows and headers."""

        _esm = _GRID_ESM
        _css = GRID_CSS
        payload = T.Dict().tag(sync=True)

        def click_row(self, pos: int) -> None:
            """As if row ``pos`` (the ``#`` column) were clicked in the browser."""
            self._on_msg(self, {"event": "row", "pos": int(pos)}, [])

        def click_header(self, column: str) -> None:
            """As if the header of ``column`` were clicked in the browser."""
            self._on_msg(self, {"event": "sort", "column": column}, [])

    class LiveText(anywidget.AnyWidget):
        """A text box whose ``value`` follows the typing (after ``debounce_ms`` of quiet, or Enter)."""

        _esm = _TEXT_ESM
        _css = _TEXT_CSS
        value = T.Unicode("").tag(sync=True)
        placeholder = T.Unicode("").tag(sync=True)
        description = T.Unicode("").tag(sync=True)
        hint = T.Unicode("").tag(sync=True)
        debounce_ms = T.Int(250).tag(sync=True)

    class TreeView(_Clicks):
        """The model tree: ``nodes`` (flat, tree order), ``expanded`` ids, the ``selected`` id."""

        _esm = _TREE_ESM
        _css = _TREE_CSS
        nodes: T.List[dict[str, Any]] = T.List().tag(sync=True)
        expanded: T.List[str] = T.List().tag(sync=True)
        selected = T.Unicode("").tag(sync=True)

        def click_node(self, call: str) -> None:
            """As if node ``call`` were clicked in the browser."""
            self._on_msg(self, {"event": "node", "id": call}, [])

    class HtmlPane(anywidget.AnyWidget):
        """HTML drawn as it is (no math typesetting pass, unlike ipywidgets' HTML): the detail pane."""

        _esm = _PANE_ESM
        _css = _PANE_CSS
        value = T.Unicode("").tag(sync=True)

    _classes = {"DataGrid": DataGrid, "LiveText": LiveText, "TreeView": TreeView, "HtmlPane": HtmlPane}
    return _classes


def available() -> bool:
    """Whether anywidget can be imported (the grid, live filter and tree widgets need it)."""
    return _load() is not None


def data_grid(**kw: Any):
    c = _load()
    return c["DataGrid"](**kw) if c else None


def live_text(**kw: Any):
    c = _load()
    return c["LiveText"](**kw) if c else None


def html_pane(**kw: Any):
    c = _load()
    return c["HtmlPane"](**kw) if c else None


def tree_view(**kw: Any):
    c = _load()
    return c["TreeView"](**kw) if c else None
