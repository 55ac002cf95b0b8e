"""Errors of the store layer, in a module of their own so that raising or catching them imports nothing heavy.

Reading an msprobe dump (JSON and .npy/.pt files) must not import h5py just to name its error class;
``hdf5_reader`` and ``msprobe_reader`` both re-export it, so older imports keep working.
"""
from __future__ import annotations

__all__ = ["DumpFormatError"]


class DumpFormatError(ValueError):
    """A dump cannot be read as what it claims to be (not HDF5, truncated, corrupt, hostile or unsupported input).

    The message names the file and what is wrong with it.
    """
