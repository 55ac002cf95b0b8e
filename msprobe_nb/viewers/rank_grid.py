"""Ranks side by side: a rank x step grid of verdicts; a click on a cell opens that rank's calls of that step.

Pure DataFrame functions (:func:`rank_cells`, :func:`rank_grid`, :func:`rank_calls`, :func:`grid_html`)
work on an in-process compare result or a Dask :class:`~msprobe_nb.analysis.dask_compare.RankCompare`;
:class:`RankGrid` is their ipywidgets shell inside :class:`~msprobe_nb.viewers.compare_viewer.CompareViewer`
(its "Ranks" tab), where a click filters the table to the cell's step and rank.
"""
from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import pandas as pd

from msprobe_nb.analysis.ranks import rank_step_summary, verdict_grid

__all__ = ["CELL_COLUMNS", "RankGrid", "grid_html", "rank_calls", "rank_cells", "rank_grid"]

#: columns of :func:`rank_cells`: one row per compared (step, rank)
CELL_COLUMNS = ["step", "rank", "verdict", "role", "first_call", "error", "warning", "diverging", "rows", "title"]
_COLOURS = {"pass": "#d5f5e3", "warning": "#fcf3cf", "error": "#f5b7b1", "unmatched": "#e5e7e9", "": "#ffffff"}
_ROLE_MARK = {"origin": "●", "spread": "↳", "": ""}


def _summary(result: Any) -> pd.DataFrame:
    s = getattr(result, "summary", None)
    if isinstance(s, pd.DataFrame):  # a RankCompare holds it already
        return s
    return rank_step_summary(pd.DataFrame(result), result.pairs, result.divergences())


def rank_cells(result: Any) -> pd.DataFrame:
    """``CELL_COLUMNS``: each (step, rank)'s verdict and its role in the first divergence across ranks
    ("origin": where the runs part; "spread": a rank the difference reached through a collective)."""
    s = _summary(result)
    first = result.first_divergence() if len(s) else None
    role = {}
    if first is not None:
        role[(first.step, first.rank)] = "origin"
        for q in getattr(first, "spread_to", {}) or {}:
            role.setdefault((first.step, int(q)), "spread")
    cells = s[["step", "rank", "verdict", "first_call", "error", "warning", "diverging", "rows"]].copy()
    cells["role"] = [role.get((int(a), int(b)), "") for a, b in zip(cells["step"], cells["rank"])]
    cells["title"] = [
        f"step {st}, rank {rk}: {v}, {e} error(s), {w} warning(s), {d} diverging row(s) of {n}"
        + (f"; first divergence {fc}" if fc else "") + (f" ({ro})" if ro else "")
        for st, rk, v, e, w, d, n, fc, ro in zip(cells["step"], cells["rank"], cells["verdict"], cells["error"],
                                                  cells["warning"], cells["diverging"], cells["rows"],
                                                  cells["first_call"], cells["role"])]
    return cells[CELL_COLUMNS].reset_index(drop=True)


def rank_grid(result: Any) -> pd.DataFrame:
    """Rank x step table of verdicts ("" where a (step, rank) was not compared)."""
    return verdict_grid(_summary(result))


def rank_calls(result: Any, rank: int, step: int) -> pd.DataFrame:
    """That rank's calls in that step, one row per call (``calls_summary``: worst result, reasons, errors)."""
    rows = result[(result["rank"] == rank) & (result["step"] == step)]
    if hasattr(rows, "calls_summary"):
        return rows.calls_summary()
    from msprobe_nb.analysis.grading import summarize_calls
    return summarize_calls(pd.DataFrame(rows))


def grid_html(cells: pd.DataFrame) -> str:
    """The grid as an HTML table (ranks down, steps across; colour by verdict, the origin marked)."""
    if cells.empty:
        return "<p>no ranks compared</p>"
    steps = sorted(cells["step"].unique())
    by = {(int(s), int(r)): row for s, r, row in zip(cells["step"], cells["rank"], cells.itertuples(index=False))}
    head = "".join(f"<th>step {int(s)}</th>" for s in steps)
    body = []
    for r in sorted(cells["rank"].unique()):
        tds = []
        for s in steps:
            c = by.get((int(s), int(r)))
            if c is None:
                tds.append("<td></td>")
                continue
            tds.append(f"<td title='{html.escape(c.title, quote=True)}' style='background:{_COLOURS.get(c.verdict)};"
                       f"padding:2px 8px;text-align:center'>{_ROLE_MARK[c.role]} {html.escape(c.verdict)}</td>")
        body.append(f"<tr><th>rank {int(r)}</th>{''.join(tds)}</tr>")
    return (f"<table style='border-collapse:collapse;font-size:12px'><tr><th></th>{head}</tr>{''.join(body)}</table>"
            "<p style='font-size:11px'>● where the runs part first · ↳ reached through a collective</p>")


class RankGrid:
    """The grid as buttons: ``on_pick(rank, step)`` runs on a click (the viewer filters its table)."""

    def __init__(self, result: Any, on_pick: Callable[[int, int], object]):
        self.cells = rank_cells(result)
        self.on_pick = on_pick
        self.widget = self._build()

    def _build(self) -> Any:
        import ipywidgets as W

        if self.cells.empty:
            return W.HTML("<p>no ranks compared</p>")
        steps = sorted(int(s) for s in self.cells["step"].unique())
        ranks = sorted(int(r) for r in self.cells["rank"].unique())
        by = {(int(s), int(r)): c for s, r, c in zip(self.cells["step"], self.cells["rank"],
                                                       self.cells.itertuples(index=False))}
        items = [W.HTML("")] + [W.HTML(f"<b>step {s}</b>") for s in steps]
        self.buttons: dict[tuple[int, int], Any] = {}
        for r in ranks:
            items.append(W.HTML(f"<b>rank {r}</b>"))
            for s in steps:
                c = by.get((s, r))
                if c is None:
                    items.append(W.HTML(""))
                    continue
                b = W.Button(description=f"{_ROLE_MARK[c.role]} {c.verdict}".strip(), tooltip=c.title,
                             layout=W.Layout(width="auto"))
                b.style.button_color = _COLOURS.get(c.verdict, "#ffffff")
                b.on_click(lambda _b, r=r, s=s: self.on_pick(r, s))
                self.buttons[(s, r)] = b
                items.append(b)
        grid = W.GridBox(items, layout=W.Layout(grid_template_columns=f"6em repeat({len(steps)}, 8em)",
                                                grid_gap="2px"))
        legend = W.HTML("<span style='font-size:11px'>click a cell to open that rank's calls of that step · "
                        "● where the runs part first · ↳ reached through a collective</span>")
        return W.VBox([grid, legend])
