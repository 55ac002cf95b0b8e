"""Progress bars for long work (tensor compares, many-rank loads, exports): tqdm's notebook bar in Jupyter,
its text bar on a terminal, nothing where neither would be seen (a log file, the test suite).

tqdm's own default shows a bar only on a terminal, so a 55 s tensor compare in a notebook sat in a blank
cell. This module imports nothing of the package, so every layer may use it.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sized
from typing import Any


def in_notebook() -> bool:
    """Running in a Jupyter kernel (IPython over ZMQ), where tqdm.auto draws a widget."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython is not None else None
    shell = get() if get is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def wanted(count: int, minimum: int, explicit: bool | None = None) -> bool:
    """Show a bar for ``count`` items? ``explicit`` decides when given; otherwise only for at least
    ``minimum`` items, in a notebook or on a terminal, and never under pytest."""
    if explicit is not None:
        return bool(explicit)
    if count < minimum or "PYTEST_CURRENT_TEST" in os.environ:
        return False
    return in_notebook() or sys.stderr.isatty()


def bar(items: Iterable[Any], *, total: int | None = None, desc: str, unit: str, minimum: int = 100,
        explicit: bool | None = None) -> Iterable[Any]:
    """``items``, with a progress bar where :func:`wanted` says so."""
    n = total if total is not None else (len(items) if isinstance(items, Sized) else 0)
    if not wanted(n, minimum, explicit):
        return items
    from tqdm.auto import tqdm
    return tqdm(items, total=n, desc=desc, unit=unit)
