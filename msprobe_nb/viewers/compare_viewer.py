"""``CompareViewer(result)``: browse a comparison (verdicts, metrics, call detail, plots, randomness trace).

Same plain-Python core as :class:`~msprobe_nb.viewers.dump_viewer.DumpViewer` (both are a
:class:`~msprobe_nb.viewers.base.BaseViewer`: ``state``, ``set_state``, ``rows``, ``selected``), plus the
verdict filter, the first divergence and a trace pane that shows the chain from the first divergence back
to its random source (from ``msprobe_nb.analysis.provenance`` when available, or a trace passed in).
"""
from __future__ import annotations

import dataclasses
import html
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from . import plots as P
from . import precision_plot as PP
from .base import BaseViewer
from .detail import Detail, frames_html, parse_frames
from .table import VERDICTS, cell_styles, reason_rank, render_html
from .viewer_widgets import ViewerWidgets, fixed, opt, toggles_layout

if TYPE_CHECKING:
    from msprobe_nb.store.dump import Dump

__all__ = ["TRACE_COLUMNS", "CompareViewer", "trace_frame", "trace_html"]

#: columns of a randomness trace, in display order (others are shown after them)
TRACE_COLUMNS = ["call", "role", "kind", "rng", "file", "line", "code", "note"]
_SOURCE = "random|rng|source|seed"

_STATS_COLUMNS = ["call_index", "name", "result", "err", "norm_rel", "max_rel", "min_rel", "mean_rel", "npu_max",
                  "bench_max", "npu_min", "bench_min", "npu_mean", "bench_mean", "npu_norm", "bench_norm",
                  "npu_dtype", "npu_shape", "near_zero"]
_TENSOR_COLUMNS = ["call_index", "name", "result", "err", "cosine", "max_abs_err", "max_rel_err", "one_thousandth",
                   "five_thousandths", "rel_l2_err", "npu_norm", "bench_norm", "npu_dtype", "npu_shape"]
_MD5_COLUMNS = ["call_index", "name", "result", "npu_hash", "bench_hash", "npu_dtype", "npu_shape", "npu_norm",
                "bench_norm"]
_TENSOR_METRICS = ["cosine", "max_abs_err", "max_rel_err", "one_thousandth", "five_thousandths", "rel_l2_err",
                   "rmse", "mean_abs_err"]
_DETAIL = ["io", "arg", "kind", "match", "result", "err", "verdict", "bound_ratio", "own_err", "inherited_err",
           "bound", "npu_dtype", "bench_dtype", "npu_shape", "bench_shape",
           "npu_max", "bench_max", "npu_min", "bench_min", "npu_mean", "bench_mean", "npu_norm", "bench_norm",
           "npu_value", "bench_value", "norm_rel", "cosine", "max_abs_err", "one_thousandth", "npu_hash",
           "bench_hash", "producer"]


# ------------------------------------------------------------------------------------------ trace
def _as_records(items: Any) -> list[dict]:
    out = []
    for x in items:
        if isinstance(x, dict):
            out.append(dict(x))
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            out.append(dataclasses.asdict(x))
        elif hasattr(x, "_asdict"):
            out.append(dict(x._asdict()))
        else:
            out.append({k: getattr(x, k, None) for k in TRACE_COLUMNS})
    return out


def trace_frame(trace: Any) -> pd.DataFrame | None:
    """A randomness trace as a DataFrame (``call, kind, file, line, code, note`` first), or None.

    Accepts a DataFrame, an object with ``to_frame()`` / ``frame`` / ``table`` / ``steps`` / ``chain``, or a
    list of dicts, dataclasses or named tuples.
    """
    if trace is None:
        return None
    if isinstance(trace, pd.DataFrame):
        df = trace
    elif callable(getattr(trace, "to_frame", None)):
        df = trace.to_frame()
    else:
        df = None
        for attr in ("frame", "table", "steps", "chain", "links"):
            v = getattr(trace, attr, None)
            if isinstance(v, pd.DataFrame):
                df = v
                break
            if isinstance(v, (list, tuple)) and v:
                df = pd.DataFrame(_as_records(v))
                break
        if df is None and isinstance(trace, (list, tuple)):
            df = pd.DataFrame(_as_records(trace))
        if df is None:
            return None
    df = df.reset_index(drop=True)
    first = [c for c in TRACE_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def _trace_text(trace: Any) -> str:
    for attr in ("message", "summary"):
        v = getattr(trace, attr, None)
        v = v() if callable(v) else v
        if v:
            return str(v)
    return ""


def trace_html(trace: Any, message: str = "") -> str:
    """HTML of a trace: text (``message``, else the trace's ``message``/``summary``), the chain as a table
    (random sources highlighted, file and line of each call) and the trace's ``advice``."""
    df = trace_frame(trace)
    text = message or _trace_text(trace)
    head = f"<pre style='font-size:12px;white-space:pre-wrap'>{html.escape(text)}</pre>" if text else ""
    advice = [str(a) for a in (getattr(trace, "advice", None) or [])]
    tail = ("<ul style='font-size:12px'>" + "".join(f"<li>fix: {html.escape(a)}</li>" for a in advice) + "</ul>"
            if advice else "")
    if df is None or df.empty:
        return head + "<p>no trace</p>" + tail
    styles = pd.DataFrame("", index=df.index, columns=df.columns)
    src = np.zeros(len(df), dtype=bool)
    for col in ("role", "kind"):
        if col in df.columns:
            src |= df[col].astype(str).str.contains(_SOURCE, case=False, regex=True).to_numpy(dtype=bool)
    for c in df.columns:
        styles.loc[src, c] = "background-color:#fdebd0;font-weight:bold"
    return head + render_html(df, list(df.columns), styles) + tail


# ------------------------------------------------------------------------------------------ viewer
class CompareViewer(BaseViewer):
    """Browse ``compare(npu, bench)``: ``CompareViewer(result)``; ``display(viewer)`` in Jupyter.

    ``npu`` / ``bench``: the dumps (default: those the result was computed from) for stacks and tensor plots.
    ``trace``: a randomness trace (DataFrame or trace object); by default ``trace_randomness(result)`` when
    ``msprobe_nb.analysis.provenance`` exists.
    ``open_at_divergence``: start on the answer: the first divergence selected and its page shown (the
    header then says where it is, what it flows into and the trace's suggested fix).
    """

    METRICS: list[str] = ["err", "norm_rel", "max_rel", "min_rel", "mean_rel"]

    def __init__(self, result: pd.DataFrame, *, npu: Dump | None = None, bench: Dump | None = None, trace: Any = None,
                 columns: list[str] | None = None, page_size: int = 50, open_at_divergence: bool = True):
        self.result = result
        ctx = getattr(result, "_ctx", None)
        self.npu = npu if npu is not None else getattr(getattr(ctx, "npu", None), "dump", None)
        self.bench = bench if bench is not None else getattr(getattr(ctx, "bench", None), "dump", None)
        self.mode = str(getattr(result, "mode", "") or ("tensor" if "cosine" in result.columns else
                                                         "md5" if "npu_hash" in result.columns else "statistics"))
        self._trace_in = trace
        self._trace_done = trace is not None
        self._trace_msg = ""
        self._div_done = False
        self._div: Any = None
        table = pd.DataFrame(result) if type(result) is not pd.DataFrame else result
        base = {"tensor": _TENSOR_COLUMNS, "md5": _MD5_COLUMNS}.get(self.mode, _STATS_COLUMNS)
        if "match" in table.columns and (table["match"] != "matched").any():
            base = [*base, "match"]
        self.COLUMNS = base
        self.METRICS = [*type(self).METRICS, *(_TENSOR_METRICS if self.mode == "tensor" else [])]
        super().__init__(table, thresholds=getattr(result, "thresholds", None), columns=columns,
                         page_size=page_size)
        if open_at_divergence and self.divergence is not None:
            self.goto_divergence()

    # ------------------------------------------------------------------ divergence and trace
    @property
    def divergence(self) -> Any:
        """The result's first divergence (None when every row agrees or the result cannot tell)."""
        if not self._div_done:
            fd = getattr(self.result, "first_divergence", None)
            try:
                self._div = fd() if callable(fd) else None
            except Exception:  # noqa: BLE001 - the table is still worth showing
                self._div = None
            self._div_done = True
        return self._div

    def _divergence(self) -> Any:
        return self.divergence

    def _mark_call(self) -> str | None:
        d = self.divergence
        return getattr(d, "call", None) if d is not None else None

    def goto_divergence(self) -> CompareViewer:
        """Select the first divergence and turn to its page."""
        d = self.divergence
        if d is None:
            self.messages = [*self.messages, "no divergence: every matched row agrees within tolerance"]
            return self
        self.goto(d.call, d.step, d.rank)
        return self

    @property
    def trace(self) -> pd.DataFrame | None:
        """The randomness trace as a DataFrame (None when there is none)."""
        return trace_frame(self._trace_obj())

    def _trace_obj(self) -> Any:
        if not self._trace_done:
            self._trace_done = True
            try:
                from msprobe_nb.analysis.provenance import trace_randomness
            except ImportError:
                self._trace_msg = "no trace: msprobe_nb.analysis.provenance is not available"
                return None
            try:
                self._trace_in = trace_randomness(self.result)
            except Exception as e:  # noqa: BLE001 - show why in the pane
                self._trace_msg = f"no trace: trace_randomness failed ({type(e).__name__}: {e})"
                self._trace_in = None
        return self._trace_in

    def trace_html(self) -> str:
        """HTML of the trace pane."""
        obj = self._trace_obj()
        if obj is None:
            return f"<p>{html.escape(self._trace_msg or 'no trace')}</p>"
        d = self.divergence
        head = f"first divergence: {d.call} (step {d.step}, rank {d.rank})\n" if d is not None else ""
        text = _trace_text(obj)
        return trace_html(obj, head + text if text else head.strip())

    # ------------------------------------------------------------------ detail
    def _stack(self, call: str, step: int, rank: int) -> list[str]:
        so = getattr(self.result, "_stack_of", None)
        if callable(so):
            try:
                return list(so(call, step, rank) or [])
            except Exception:  # noqa: BLE001 - stacks are a nicety
                pass
        if self.npu is not None:
            try:
                return list(self.npu.stack(call))
            except (KeyError, AttributeError):
                return []
        return []

    def _build_detail(self, rows: pd.DataFrame) -> Detail:
        r0 = rows.iloc[0]
        call, step, rank = str(r0["call"]), int(r0["step"]), int(r0["rank"])
        stack = self._stack(call, step, rank)
        bench_stack: list[str] = []
        bcall = str(r0.get("bench_call", "") or "")
        if self.bench is not None and bcall:
            try:
                bench_stack = list(self.bench.stack(bcall))
            except (KeyError, AttributeError):
                bench_stack = []
        reasons = []
        for name, rs in zip(rows["name"].astype(object), rows.get("reasons", pd.Series([[]] * len(rows)))):
            tag = str(name)[len(call) + 1:] if str(name).startswith(call) else str(name)
            reasons += [f"{tag}: {x}" for x in (rs if isinstance(rs, (list, tuple, np.ndarray)) else [])]
        reasons.sort(key=reason_rank)  # the reasons that set the verdicts first: errors, warnings, then notes
        tensor_rows: list[str] = []
        if "npu_data_name" in rows.columns and self.npu is not None and self.bench is not None:
            ok = ((rows["match"].astype(object) == "matched") & (rows["kind"].astype(object) == "tensor")
                  & (rows["npu_data_name"].astype(object).fillna("") != "")
                  & (rows["bench_data_name"].astype(object).fillna("") != "")).to_numpy(dtype=bool)
            cand = rows.loc[ok]
            if len(cand):  # worst row first: outputs before inputs, then by error
                out = cand["io"].astype(object).isin(["output", "parameters_grad"]).to_numpy()
                err = (pd.to_numeric(cand["err"], errors="coerce").fillna(-1).to_numpy(dtype=float)
                       if "err" in cand.columns else np.zeros(len(cand)))
                order = np.lexsort((-err, ~out))
                tensor_rows = [str(n) for n in cand["name"].to_numpy(dtype=object)[order]]
        cols = [c for c in _DETAIL if c in rows.columns]
        verdict = "pass"
        if "result" in rows.columns:
            levels = set(rows["result"].astype(object))
            verdict = next((v for v in reversed(VERDICTS) if v in levels), "pass")
        frames = parse_frames(stack)
        parent = str(r0.get("parent", "") or "")
        d = self.divergence
        is_div = d is not None and d.call == call and d.step == step and d.rank == rank
        head = (f"<h4 style='margin:4px 0'>{html.escape(call)} <span style='font-size:12px'>[{verdict}]"
                + (" · first divergence" if is_div else "") + "</span></h4>"
                f"<p style='font-size:12px'>step {step}, rank {rank}, call #{int(r0['call_index'])}"
                + (f", inside {html.escape(parent)}" if parent else "")
                + (f"; bench call {html.escape(bcall)}" if bcall and bcall != call else "") + "</p>")
        body = self._verdict_html(rows) + render_html(rows, cols, cell_styles(rows[cols], self.thresholds))
        why = ("<ul style='font-size:12px'>" + "".join(f"<li>{html.escape(x)}</li>" for x in reasons) + "</ul>"
               if reasons else "")
        stk = frames_html(frames, "NPU stack")
        if bench_stack and bench_stack != stack:
            stk += frames_html(parse_frames(bench_stack), "bench stack")
        return Detail(call=call, step=step, rank=rank, rows=rows, stack=stack, frames=frames,
                      bench_stack=bench_stack, reasons=reasons, tensor_rows=tensor_rows,
                      html=head + body + why + stk)

    @property
    def tolerance(self) -> float:
        """The precision model's tolerance the result was computed with (3 when it does not say)."""
        p = getattr(getattr(self.result, "_ctx", None), "precision", None)
        return float(getattr(p, "tolerance", 3.0) or 3.0)

    def verdict_text(self, rows: pd.DataFrame) -> str:
        """The precision model's verdict of a call in words, with its figures (``describe`` of its judged
        output row with the largest ``bound_ratio``); '' when the call was not judged."""
        if "verdict" not in rows.columns or "bound_ratio" not in rows.columns:
            return ""
        judged = rows[rows["verdict"].astype(object).fillna("") != ""]
        if judged.empty:
            return ""
        from msprobe_nb.analysis.precision_model import describe
        worst = judged.loc[pd.to_numeric(judged["bound_ratio"], errors="coerce").fillna(-1.0).idxmax()]
        try:
            text = describe(worst, self.tolerance)
        except (KeyError, TypeError, ValueError):  # a table without every figure: the verdict alone
            text = str(worst["verdict"])
        tag = str(worst["name"])[len(str(worst["call"])) + 1:] if "name" in worst else ""
        return f"{text} [{tag}]" if tag else text

    def _verdict_html(self, rows: pd.DataFrame) -> str:
        text = self.verdict_text(rows)
        if not text:
            return ""
        bad = text.startswith("anomalous")
        return (f"<p class='msnb-verdict' style='font-size:12px;margin:2px 0 4px 0;padding:3px 6px;"
                f"border-left:3px solid {'#c0392b' if bad else '#3c9a4a'};"
                f"background:{'#fdf2f1' if bad else '#eef7ee'}'><b>precision:</b> {html.escape(text)}</p>")

    def precision_figure(self):
        """Own and inherited error per call along execution order, the bound and the first anomaly marked
        (:func:`~msprobe_nb.viewers.precision_plot.precision_along_order`), in the first anomaly's step and rank."""
        d = self.divergence
        step = getattr(d, "step", None) if d is not None else None
        rank = getattr(d, "rank", None) if d is not None else None
        return PP.precision_along_order(self.table, step, rank, summary=self._precision_line())

    def _precision_line(self) -> str:
        ps = getattr(self.result, "precision_summary", None)
        try:
            return str(ps()) if callable(ps) else ""
        except Exception:  # noqa: BLE001 - a result without verdict columns
            return ""

    def _tensor_figure(self, d: Detail, name: str):
        assert self.npu is not None and self.bench is not None, "a detail lists tensor rows only with both dumps"
        r = d.rows.loc[d.rows["name"].astype(object) == name].iloc[0]
        a = self.npu.tensor(str(r["npu_data_name"]), step=int(r["step"]), rank=int(r["rank"]))
        b = self.bench.tensor(str(r["bench_data_name"]), step=int(r["bench_step"]), rank=int(r["bench_rank"]))
        return P.tensor_diff(a, b, name)

    # ------------------------------------------------------------------ widgets
    def _header_html(self) -> str:
        counts = self.result.counts() if callable(getattr(self.result, "counts", None)) else None
        parts = [f"<b>CompareViewer</b> <span style='font-size:12px'>mode {html.escape(self.mode)}"]
        if counts:
            parts.append(" · " + ", ".join(f"{v:,} {k}" for k, v in counts.items()))
        parts.append("</span>")
        ctx = getattr(self.result, "_ctx", None)
        loud = str(getattr(ctx, "unmatched_warning", "") or "")  # the dumps may not be of one model: said first
        if loud:
            parts.append(f"<br><span style='font-size:12px;color:#b03a2e;font-weight:bold'>warning: "
                         f"{html.escape(loud)}</span>")
        for n in getattr(self.result, "notes", []) or []:
            if str(n) != loud:
                parts.append(f"<br><span style='font-size:12px;color:#7d6608'>note: {html.escape(str(n))}</span>")
        return "".join(parts) + self.answer_html()

    def answer(self) -> dict[str, Any]:
        """The answer the viewer opens on: the first divergence (``call``, ``step``, ``rank``, ``kind``,
        ``message``, ``frame``), its enclosing ``modules`` (outermost first), the later calls it flows into
        (``chain``) and what to do (``advice``: the trace's fixes, else its ``verdict`` message)."""
        d = self.divergence
        if d is None:
            return {}
        out: dict[str, Any] = {"call": d.call, "step": d.step, "rank": d.rank, "kind": getattr(d, "kind", ""),
                               "message": str(getattr(d, "message", "") or ""),
                               "frame": getattr(d, "frame", None), "frame_source": getattr(d, "frame_source", None),
                               "modules": list(reversed(list(getattr(d, "modules", []) or []))),
                               "chain": list(getattr(d, "chain", []) or [])}
        obj = self._trace_obj()
        out["advice"] = [str(a) for a in (getattr(obj, "advice", None) or [])] if obj is not None else []
        out["verdict"] = str(getattr(obj, "message", "") or "") if obj is not None else self._trace_msg
        return out

    def _quiet_text(self) -> str:
        """Why nothing diverges: the precision model's summary when the runs differ by noise."""
        ps = getattr(self.result, "precision_summary", None)
        try:
            text = ps() if callable(ps) else ""
        except Exception:  # noqa: BLE001 - a result without verdict columns
            text = ""
        return text if text.startswith("every call within") else "every matched row agrees within tolerance"

    def answer_html(self) -> str:
        """The answer box at the top: the first divergence, its chain and the suggested fix."""
        a = self.answer()
        box = ("<div class='msnb-answer' style='border-left:4px solid {c};background:{bg};padding:6px 10px;"
               "margin:4px 0;font-size:12px;line-height:1.45;max-width:100%;overflow-wrap:anywhere'>")
        if not a:
            return (box.format(c="#3c9a4a", bg="#eef7ee")
                    + f"<b>no divergence</b>: {html.escape(self._quiet_text())}</div>")
        e = html.escape
        mods = " › ".join(e(m) for m in a["modules"])
        where = e(a["frame"]) + (f": <code>{e(a['frame_source'])}</code>" if a["frame_source"] else "") \
            if a["frame"] else ""
        chain = a["chain"]
        flows = (", ".join(e(c) for c in chain[:4]) + (f" … (+{len(chain) - 4} more)" if len(chain) > 4 else "")
                 if chain else "")
        lines = [f"<b style='font-size:13px'>first divergence: {e(a['call'])}</b> "
                 f"<span style='color:#555'>(step {a['step']}, rank {a['rank']})</span>"]
        if a["message"]:
            lines.append(e(a["message"]))
        prec = self._precision_line()
        if " beyond " in prec:  # the precision model's count of anomalous calls (docs/compare.md)
            lines.append(f"<b>precision model:</b> {e(prec)}")
        if mods:
            lines.append(f"<b>inside</b> {mods}")
        if where:
            lines.append(f"<b>at</b> {where}")
        if flows:
            lines.append(f"<b>flows into</b> {len(chain)} later call(s): {flows}")
        for fix in a["advice"]:
            lines.append(f"<b style='color:#1b5e20'>fix:</b> {e(fix)}")
        if not a["advice"] and a["verdict"]:
            lines.append(f"<b>cause:</b> {e(a['verdict'])}")
        return box.format(c="#c0392b", bg="#fdf2f1") + "<br>".join(lines) + "</div>"

    def _extra_filter_widgets(self, shell: ViewerWidgets) -> list:
        import ipywidgets as W

        w, ix = shell.w, shell.table_view.ix
        levels = [v for v in VERDICTS if v in ix.uniques("result")] if ix.has("result") else []
        w["verdict"] = W.ToggleButtons(options=["all", *levels], value="all", description="verdict",
                                       style={"button_width": "auto", "description_width": "auto"},
                                       layout=toggles_layout())
        matches = ix.uniques("match") if ix.has("match") else []
        w["match"] = W.Dropdown(options=["all", *matches], value="all", description="match",
                                style={"description_width": "auto"},
                                layout=fixed("13em", display="" if len(matches) > 1 else "none"))
        w["diverges"] = W.Checkbox(value=bool(self.state.diverges), description="diverging rows only",
                                   indent=False, layout=fixed("11.5em"))
        w["goto_div"] = W.Button(description="first divergence ▶", disabled=self.divergence is None,
                                 button_style="danger" if self.divergence is not None else "",
                                 layout=fixed())

        shell.bind("verdict", opt)
        shell.bind("match", opt)
        shell.bind("diverges", lambda x: True if x else None)

        def goto(_):
            self.goto_divergence()
            shell.select_tab("Table")

        w["goto_div"].on_click(goto)
        return [w["verdict"], w["match"], w["diverges"], w["goto_div"]]

    def _extra_state_widgets(self) -> tuple[str, ...]:
        return ("verdict", "match")

    def _sync_extra(self, shell: ViewerWidgets) -> None:
        shell.w["diverges"].value = bool(self.state.diverges)

    def _extra_tabs(self, shell: ViewerWidgets) -> list[tuple[str, Any]]:
        import ipywidgets as W

        w = shell.w
        w["trace"] = W.HTML("<p>open this tab to trace the first divergence to its random source</p>")
        tabs = [("Trace", w["trace"])]
        if PP.has_verdicts(self.table):  # the precision model's verdicts (docs/compare.md): own vs inherited error
            w["precision_img"] = W.Image(format="png", layout=W.Layout(max_width="100%"))
            note = ("<p style='font-size:12px'>own and inherited error per call along execution order, the bound "
                    "its class and dtype allow, the anomalous calls ringed (docs/compare.md)</p>")
            w["precision"] = W.VBox([W.HTML(note), w["precision_img"]])
            w["precision"].add_class("msnb-precision")
            tabs.append(("Precision", w["precision"]))
        if "rank" in self.table.columns and self.table["rank"].nunique() > 1:
            w["ranks"] = W.VBox([W.HTML("<p>open this tab for the rank x step grid of verdicts</p>")])
            tabs.append(("Ranks", w["ranks"]))
        return tabs

    def _leading_tabs(self, shell: ViewerWidgets) -> list[tuple[str, Any]]:
        """The runs' set-up differences (docs/setup_check.md), the first tab when there are any; the viewer still
        opens on the table scrolled to the answer (a set-up difference is a lead, not the answer)."""
        import ipywidgets as W

        if self.setup is None or not len(self.setup):
            return []
        t = self.setup.sort_values("expected", kind="stable").rename(columns={"a": "NPU run", "b": "bench run"})
        note = ("<p style='font-size:12px'>what differs between the two runs' set-ups: the possible causes first, "
                "then the differences expected between two machines (docs/setup_check.md)</p>")
        shell.w["setup"] = W.HTML(note + t.to_html(index=False, escape=True, justify="left"))
        shell.w["setup"].add_class("msnb-setup")
        return [("Set-up", shell.w["setup"])]

    @property
    def setup(self) -> pd.DataFrame | None:
        """The two runs' set-up differences (``compare_setups``), None when either dump has no set-up record."""
        if not hasattr(self, "_setup"):
            from msprobe_nb.analysis.setup_compare import setup_differences
            ctx = getattr(self.result, "_ctx", None)
            sides = [getattr(getattr(ctx, side, None), "source", "") for side in ("npu", "bench")]
            self._setup = setup_differences(*sides) if all(sides) else None
        return self._setup

    def open_rank(self, rank: int, step: int) -> CompareViewer:
        """Show that rank's calls of that step, the detail on that rank's first divergence there (what a click
        on the Ranks grid does): the detail never stays on another rank's call."""
        self.set_state(rank=int(rank), step=int(step), page=0)
        if self._shell is not None:  # the table first, so that the grid can scroll to the call
            self._shell.select_tab("Table")
        first = getattr(self.result, "first_divergence", None)
        d = first(step=int(step), rank=int(rank)) if callable(first) else None
        if d is not None:
            self.goto(d.call, d.step, d.rank)
        else:
            self.set_state(selected=None, selected_step=None, selected_rank=None)
        return self

    def _on_tab(self, title: str) -> None:
        if title == "Precision" and self._w is not None:
            self._w["precision_img"].value = P.figure_png(self.precision_figure())
        if title == "Trace" and self._w is not None:
            self._w["trace"].value = self.trace_html()
        if title == "Ranks" and self._w is not None and "ranks" in self._w:
            from .rank_grid import RankGrid
            self.rank_grid = RankGrid(self.result, self.open_rank)
            self._w["ranks"].children = [self.rank_grid.widget]
