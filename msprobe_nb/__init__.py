"""msprobe_nb: find why a PyTorch training run on an NPU drifts from its reference run.

The public names (everything else in the package is private):

- record: ``Debugger``, ``record`` (or ``%msprobe_start`` in Jupyter), set up by ``DumpConfig`` /
  ``load_config`` (``ConfigError`` on a bad config); ``seed_all``; ``snapshot_setup``; ``compile_check``;
- load: ``load`` gives a ``Dump`` (``DumpFormatError`` on a damaged one);
- compare: ``compare`` gives a ``CompareResult`` (``CompareError``; graded by ``Thresholds``), rank by rank on
  Dask with ``compare_on_dask``; ``find_overflow``, ``check_determinism``, ``trace_randomness`` (a
  ``RandomTrace``), ``compare_setups``; ``own_errors`` (a tensor compare's suspect calls replayed in fp64);
- pre-check: ``acc_check`` gives an ``AccCheckResult``; ``compare_prechecks``, ``register_reference``;
- monitor: ``Monitor``; ``load_monitor``, ``compare_monitors``, ``export_tensorboard``;
- browse: ``DumpViewer``, ``CompareViewer``, ``AccCheckViewer``, ``MonitorViewer``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

from msprobe_nb.config import ConfigError, DumpConfig, load_config

__all__ = [
    "AccCheckResult", "AccCheckViewer", "acc_check", "compare_prechecks", "register_reference",
    "CompareError", "CompareResult", "CompareViewer", "ConfigError", "Debugger", "Dump", "DumpConfig",
    "DumpFormatError", "DumpViewer", "RandomTrace", "Thresholds", "check_determinism", "compare", "compare_on_dask",
    "find_overflow", "load", "load_config", "record", "seed_all", "trace_randomness", "__version__",
    "Monitor", "MonitorViewer", "compare_monitors", "load_monitor", "compile_check", "snapshot_setup", "compare_setups",
    "export_tensorboard", "own_errors",
]

# Everything heavy loads on first use: recording (torch) is not needed to compare, the analysis side
# (pandas) is not needed to record, and the viewers (ipywidgets, matplotlib) are needed by neither.
_LAZY = {
    "acc_check": "msprobe_nb.precheck.acc_check", "AccCheckResult": "msprobe_nb.precheck.result",
    "compare_prechecks": "msprobe_nb.precheck.compare_prechecks",
    "register_reference": "msprobe_nb.precheck.references", "AccCheckViewer": "msprobe_nb.viewers.acc_check_viewer",
    "Debugger": "msprobe_nb.debugger", "record": "msprobe_nb.debugger", "seed_all": "msprobe_nb.seeding",
    "CompareError": "msprobe_nb.analysis.compare", "CompareResult": "msprobe_nb.analysis.compare",
    "compare": "msprobe_nb.analysis.compare", "check_determinism": "msprobe_nb.analysis.determinism",
    "Thresholds": "msprobe_nb.analysis.grading", "find_overflow": "msprobe_nb.analysis.overflow",
    "compare_on_dask": "msprobe_nb.analysis.dask_compare", "RandomTrace": "msprobe_nb.analysis.provenance",
    "trace_randomness": "msprobe_nb.analysis.provenance", "Dump": "msprobe_nb.store.dump",
    "load": "msprobe_nb.store.dump", "DumpFormatError": "msprobe_nb.store.errors",
    "DumpViewer": "msprobe_nb.viewers", "CompareViewer": "msprobe_nb.viewers",
    "Monitor": "msprobe_nb.monitor", "load_monitor": "msprobe_nb.analysis.monitor_frame",
    "compile_check": "msprobe_nb.compile_check", "snapshot_setup": "msprobe_nb.setup_snapshot",
    "compare_setups": "msprobe_nb.analysis.setup_compare",
    "compare_monitors": "msprobe_nb.analysis.monitor_compare", "MonitorViewer": "msprobe_nb.viewers.monitor_viewer",
    "export_tensorboard": "msprobe_nb.analysis.monitor_tensorboard",
    "own_errors": "msprobe_nb.precheck.own_error",
}

if TYPE_CHECKING:  # the lazy names, for type checkers (they cannot run __getattr__); tests/test_public_api.py
    from msprobe_nb.analysis.compare import CompareError, CompareResult, compare
    from msprobe_nb.analysis.dask_compare import compare_on_dask
    from msprobe_nb.analysis.determinism import check_determinism
    from msprobe_nb.analysis.grading import Thresholds
    from msprobe_nb.analysis.monitor_compare import compare_monitors
    from msprobe_nb.analysis.monitor_frame import load_monitor
    from msprobe_nb.analysis.monitor_tensorboard import export_tensorboard
    from msprobe_nb.analysis.overflow import find_overflow
    from msprobe_nb.analysis.provenance import RandomTrace, trace_randomness
    from msprobe_nb.analysis.setup_compare import compare_setups
    from msprobe_nb.compile_check import compile_check
    from msprobe_nb.debugger import Debugger, record
    from msprobe_nb.monitor import Monitor
    from msprobe_nb.precheck.acc_check import acc_check
    from msprobe_nb.precheck.compare_prechecks import compare_prechecks
    from msprobe_nb.precheck.own_error import own_errors
    from msprobe_nb.precheck.references import register_reference
    from msprobe_nb.precheck.result import AccCheckResult
    from msprobe_nb.seeding import seed_all
    from msprobe_nb.setup_snapshot import snapshot_setup
    from msprobe_nb.store.dump import Dump, load
    from msprobe_nb.store.errors import DumpFormatError
    from msprobe_nb.viewers import CompareViewer, DumpViewer
    from msprobe_nb.viewers.acc_check_viewer import AccCheckViewer
    from msprobe_nb.viewers.monitor_viewer import MonitorViewer


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'msprobe_nb' has no attribute {name!r}")
    import importlib
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        extra = _EXTRA_OF.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        raise ImportError(f"msprobe_nb.{name} needs {e.name}, which is not installed: "
                          f"pip install 'msprobe_nb[{extra}]' (the core install only loads, compares and "
                          f"exports dumps)", name=e.name) from e
    globals()[name] = value
    return value


#: the optional package a lazy name may miss -> the extra that installs it (pyproject.toml)
_EXTRA_OF = {"torch": "record", "ipywidgets": "viewers", "anywidget": "viewers", "matplotlib": "viewers",
             "IPython": "viewers", "dask": "dask", "distributed": "dask"}


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """``%load_ext msprobe_nb``: register the recording magics."""
    from msprobe_nb.magics import load_ipython_extension as _load
    _load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext msprobe_nb``: stop recording and remove every hook the extension installed."""
    from msprobe_nb.magics import unload_ipython_extension as _unload
    _unload(ipython)
