"""The viewers' one set of colours: the grid (grid_widget.GRID_CSS), the detail pane and the static HTML
(table.cell_styles) all paint a verdict alike, so a ``warning`` is amber everywhere and an ``error`` red."""
from __future__ import annotations

__all__ = ["DIVERGENCE_CSS", "FLAG_CSS", "RESULT_COLOURS", "VERDICT_COLOURS", "result_css"]

#: a row's background by its verdict...
VERDICT_COLOURS = {"error": "#f8d7da", "warning": "#fff3cd", "pass": "#eef7ee", "unmatched": "#e3e8f3",
                   "nan": "#fde2c8"}
#: ...its ``result`` cell, stronger (background, text colour)
RESULT_COLOURS = {"error": ("#e57373", "#fff"), "warning": ("#ffd54f", ""), "unmatched": ("#9fa8da", "")}
#: a cell beyond its threshold
FLAG_CSS = "background-color:#f1948a;font-weight:bold"
#: the ``#`` cell of the first divergence in static HTML
DIVERGENCE_CSS = "outline:2px solid #c0392b"


def result_css(verdict: str) -> str:
    """The CSS of a ``result`` cell with ``verdict`` (the grid's ``td.res``): amber warning, red error."""
    bg, fg = RESULT_COLOURS.get(verdict, ("", ""))
    return (f"background-color:{bg};" + (f"color:{fg};" if fg else "") + "font-weight:bold") if bg else ""
