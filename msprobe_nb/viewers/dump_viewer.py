"""``DumpViewer(dump)``: browse one recorded run in a notebook (filter, sort, page, call detail, plots).

The viewer's logic lives in plain Python: :attr:`state` (a :class:`ViewerState`), :meth:`set_state`,
:attr:`rows` (the current page), :attr:`selected` (a :class:`Detail`). The ipywidgets shell (``.widget``,
shown by ``display(viewer)``) only mirrors that state, so everything can be tested without a browser.
What both viewers share is :class:`~msprobe_nb.viewers.base.BaseViewer`.
"""
from __future__ import annotations

import html
from typing import Any, ClassVar

import pandas as pd

from . import plots as P
from .base import BaseViewer
from .detail import Detail, frames_html, parse_frames
from .table import cell_styles, render_html
from .view_state import ViewerState

__all__ = ["Detail", "DumpViewer", "ViewerState", "parse_frames"]


# ------------------------------------------------------------------------------------------ DumpViewer
class DumpViewer(BaseViewer):
    """Browse one dump: ``DumpViewer(dump)`` with a ``Dump``, a dump path or a calls DataFrame.

    ``state`` / ``set_state(**kw)`` / ``rows`` / ``selected`` drive it from code; ``display(viewer)`` shows it.
    """

    COLUMNS: list[str] = ["call_index", "call", "io", "arg", "kind", "dtype", "shape", "max", "min",
                          "mean", "norm", "nan_count", "posinf_count", "neginf_count", "value",
                          "requires_grad"]
    METRICS: list[str] = ["norm", "max", "min", "mean", "nan_count"]
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
        what = html.escape(repr(d)) if d is not None else f"{len(self.table):,} rows"
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
        assert self.dump is not None, "a detail lists tensor rows only for a dump"
        return P.tensor_values(self.dump.tensor(name, step=d.step, rank=d.rank), name)
