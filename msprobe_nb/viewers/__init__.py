"""Widget viewers over the DataFrame API: ``DumpViewer(dump)`` and ``CompareViewer(result)``.

The model layer (:mod:`msprobe_nb.viewers.table`) and the figures (:mod:`msprobe_nb.viewers.plots`) work
without widgets; the viewers keep a plain ``state`` that their ipywidgets shell mirrors. Modules by job:
``view_state`` (the state and its transitions over a table), ``detail`` (a selected call), ``base`` (what
both viewers share), ``viewer_widgets`` (the ipywidgets shell), ``dump_viewer`` and ``compare_viewer``.
"""
from __future__ import annotations

from msprobe_nb.viewers.compare_viewer import CompareViewer
from msprobe_nb.viewers.dump_viewer import Detail, DumpViewer, ViewerState
from msprobe_nb.viewers.table import filter_rows, sort_rows

__all__ = ["CompareViewer", "Detail", "DumpViewer", "ViewerState", "filter_rows", "sort_rows"]
