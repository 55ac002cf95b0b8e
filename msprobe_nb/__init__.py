"""msprobe_nb: find why a PyTorch training run on an NPU drifts from its reference run.

Record (``Debugger``, ``record``, or ``%msprobe_start`` in Jupyter), load (``load``), compare
(``compare``), trace randomness (``seed_all``, ``trace_randomness``) and browse (``DumpViewer``,
``CompareViewer``). Everything else in the package is private.
"""
from __future__ import annotations

__version__ = "0.1.0"

from msprobe_nb.analysis.compare import CompareError, CompareResult, compare
from msprobe_nb.analysis.determinism import check_determinism
from msprobe_nb.analysis.grading import Thresholds
from msprobe_nb.analysis.provenance import RandomTrace, trace_randomness
from msprobe_nb.config import ConfigError, DumpConfig, load_config
from msprobe_nb.debugger import Debugger, record
from msprobe_nb.seeding import seed_all
from msprobe_nb.store.dump import Dump, load
from msprobe_nb.store.hdf5_reader import DumpFormatError

__all__ = [
    "CompareError", "CompareResult", "CompareViewer", "ConfigError", "Debugger", "Dump", "DumpConfig",
    "DumpFormatError", "DumpViewer", "RandomTrace", "Thresholds", "check_determinism", "compare", "load",
    "load_config", "record", "seed_all", "trace_randomness", "__version__",
]


def __getattr__(name):
    """The viewers import ipywidgets and matplotlib: load them only when asked for."""
    if name in ("DumpViewer", "CompareViewer"):
        from msprobe_nb import viewers
        return getattr(viewers, name)
    raise AttributeError(f"module 'msprobe_nb' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext msprobe_nb``: register the recording magics."""
    from msprobe_nb.magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext msprobe_nb``: stop recording and remove every hook the extension installed."""
    from msprobe_nb.magics import unload_ipython_extension as _unload
    _unload(ipython)
