"""msprobe_nb: find why a PyTorch training run on an NPU drifts from its reference run.

Record (``Debugger``, ``record``, or ``%msprobe_start`` in Jupyter), load (``load``), compare
(``compare``), trace randomness (``seed_all``, ``trace_randomness``) and browse (``DumpViewer``,
``CompareViewer``). Everything else in the package is private.
"""
from __future__ import annotations

__version__ = "0.1.0"

from msprobe_nb.config import ConfigError, DumpConfig, load_config
from msprobe_nb.debugger import Debugger, record
from msprobe_nb.seeding import seed_all

__all__ = [
    "ConfigError", "Debugger", "DumpConfig", "load_config", "record", "seed_all",
    "__version__",
]


def load_ipython_extension(ipython):
    """``%load_ext msprobe_nb``: register the recording magics."""
    from msprobe_nb.magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext msprobe_nb``: stop recording and remove every hook the extension installed."""
    from msprobe_nb.magics import unload_ipython_extension as _unload
    _unload(ipython)
