"""Errors of the store layer, and the bounded repr their messages quote, in a module that imports nothing heavy.

Reading an msprobe dump (JSON and .npy/.pt files) must not import h5py just to name its error class;
``hdf5_reader`` and ``msprobe_reader`` both re-export it, so older imports keep working.
"""
from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["DumpFormatError", "show"]

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 3, 300, 80, 6, 4


class DumpFormatError(ValueError):
    """A dump cannot be read as what it claims to be (not HDF5, truncated, corrupt, hostile or unsupported input).

    The message names the file and what is wrong with it.
    """


def show(value: Any) -> str:
    """A short repr for error messages: bounded in depth and length, so hostile values cannot blow it up."""
    return _SHOW.repr(value)
