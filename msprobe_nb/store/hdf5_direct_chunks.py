"""Whole chunks of the tables' main datasets, encoded by the writer and handed to HDF5 finished.

A recording writes a whole chunk of every calls-table column each 4096 rows. Through ``H5Dwrite`` each chunk
also goes through HDF5's selection, chunk buffer (allocated and cleared) and filter pipeline, which cost about as
much as the compression itself. ``_chunk_codec`` encodes the chunk as the dataset's own filter pipeline
(bitshuffle + LZ4, then fletcher32) would, from bitshuffle's library that HDF5 runs as the filter, and the writer
stores it with ``H5Dwrite_chunk``: the file holds the same bytes (tests/test_hdf5_chunk_codec.py compares them)
and readers see no difference. Where the codec is not built, the library is not found, or a dataset's pipeline
is any other, :func:`chunk_encoder` answers None and the writer goes through ``H5Dwrite`` as before.
"""
from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from types import ModuleType

import h5py
import numpy as np

from msprobe_nb.store.hdf5_filters import BITSHUFFLE_ID, bitshuffle_library, filter_pipeline


def _load_codec() -> ModuleType | None:
    try:
        return importlib.import_module("msprobe_nb.store._chunk_codec")
    except ImportError:  # no C compiler at install: every chunk through HDF5's filters
        return None


_chunk_codec = _load_codec()

__all__ = ["chunk_encoder"]

#: the layout of _chunk_codec this Python expects (CHUNK_CODEC_ABI in _chunk_codec.c)
CHUNK_CODEC_ABI = 1
#: bitshuffle's functions the codec calls, as its library exports them
_FUNCTIONS = ("bshuf_compress_lz4", "bshuf_compress_lz4_bound", "bshuf_default_block_size")
#: bitshuffle's filter options for LZ4 after the bit transpose (its set_local callback's cd_values[4])
_LZ4 = 2

_bound: bool | None = None  # None: not tried yet


def _bind() -> bool:
    """Hand the codec bitshuffle's functions (once per process); False where either is missing."""
    global _bound
    if _bound is None:
        _bound = False
        if _chunk_codec is not None and getattr(_chunk_codec, "ABI", None) == CHUNK_CODEC_ABI:
            path = bitshuffle_library()
            try:
                lib = ctypes.CDLL(str(path)) if path is not None else None
                found = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _FUNCTIONS] if lib else []
                if found and all(found):
                    _chunk_codec.bind(*found)
                    _bound = True
            except (OSError, AttributeError, TypeError, ValueError):
                pass
    return _bound


def chunk_encoder(ds: h5py.Dataset) -> Callable[[np.ndarray], bytes] | None:
    """A function giving a whole chunk of ``ds`` as its filters would store it, where ``ds`` is a 1-D chunked
    dataset of plain numbers whose pipeline is exactly bitshuffle + LZ4 at the library's block size, then
    fletcher32; otherwise None. The chunk is handed over as a contiguous array of ``ds.dtype``: the file type's
    bytes, which HDF5 would filter."""
    dt = ds.dtype
    if ds.chunks is None or len(ds.chunks) != 1 or dt.kind not in "biuf" or not _bind():
        return None
    filters = filter_pipeline(ds)
    if filters is None or [f[0] for f in filters] != [BITSHUFFLE_ID, h5py.h5z.FILTER_FLETCHER32]:
        return None
    opts = filters[0][2]
    if len(opts) < 5 or opts[2] != dt.itemsize or opts[3] != 0 or opts[4] != _LZ4:
        return None
    assert _chunk_codec is not None, "_bind() found the codec"
    encode, size = _chunk_codec.encode, dt.itemsize
    return lambda block: encode(block, size)
