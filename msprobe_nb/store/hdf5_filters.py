"""The compression filters of the kit's HDF5 dumps: what the writer asks HDF5 for, and what a reader needs loaded.

The default is bitshuffle + LZ4 (HDF5 filter 32008), from ``hdf5plugin``'s build of it, registered with the HDF5
library h5py loaded. A recording writes a whole chunk of every calls-table column each 4096 rows, and with lzf + shuffle
that compression was the largest single cost of a recorded step on models with a few thousand rows a step;
bitshuffle + LZ4 compresses the same columns several times faster, to the same size or smaller, and decodes
them faster too (benchmarks/README.md). lzf (h5py's own filter) and gzip stay available, and dumps written
with them read as before.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import h5py

__all__ = ["BITSHUFFLE_ID", "CODECS", "bitshuffle_library", "filter_pipeline", "load_plugins", "missing_filter",
           "table_filter"]

#: HDF5's registered id of the bitshuffle filter
BITSHUFFLE_ID = 32008
#: the named codecs ``DumpWriter(compression=...)`` takes (a gzip level 0-9 is the other choice)
CODECS = ("bitshuffle", "lzf")

_loaded: bool | None = None  # None: not tried yet; False: bitshuffle cannot be registered (no hdf5plugin)


def load_plugins() -> bool:
    """Make bitshuffle available to h5py's HDF5 (once per process); False where hdf5plugin is not installed.

    Only that one filter is registered, from hdf5plugin's build of it: importing hdf5plugin registers all twelve
    of its filters, whose libraries add about 6 MB of resident memory to a recording process. Should its
    plugin not load that way, the package is imported instead."""
    global _loaded
    if _loaded is None:
        _loaded = bool(h5py.h5z.filter_avail(BITSHUFFLE_ID)) or _register_bitshuffle() or _import_hdf5plugin()
    return _loaded


def bitshuffle_library() -> Path | None:
    """hdf5plugin's bitshuffle library (the filter's plugin), found without importing hdf5plugin; None if absent."""
    try:
        spec = importlib.util.find_spec("hdf5plugin")  # found, not imported
    except (ImportError, ValueError):
        return None
    where = spec.submodule_search_locations if spec is not None else None
    found = [lib for folder in where or () for lib in sorted(Path(folder, "plugins").glob("libh5bshuf.*"))]
    return found[0] if found else None


def _register_bitshuffle() -> bool:
    """Register hdf5plugin's bitshuffle library alone: it binds the HDF5 library h5py loaded (``init_filter``,
    which hdf5plugin's builds export outside Windows), then hands HDF5 its filter class (the plugin entry point
    every HDF5 filter plugin exports)."""
    found = bitshuffle_library()
    if found is None:
        return False
    try:
        lib = ctypes.CDLL(str(found))
        init = getattr(lib, "init_filter", None) if not sys.platform.startswith("win") else None  # as hdf5plugin
        if init is not None:
            init.argtypes, init.restype = [ctypes.c_char_p], ctypes.c_int
            if init(os.fsencode(h5py.h5z.__file__)) < 0:
                return False
        lib.H5PLget_plugin_info.restype = ctypes.c_void_p
        h5py.h5z.register_filter(lib.H5PLget_plugin_info())
    except (OSError, AttributeError, RuntimeError, ValueError, TypeError):
        return False
    return bool(h5py.h5z.filter_avail(BITSHUFFLE_ID))


def _import_hdf5plugin() -> bool:
    try:
        import hdf5plugin  # noqa: F401  # importing it registers its filters
    except (ImportError, OSError):  # not installed, or its libraries do not load: lzf and gzip still work
        return False
    return bool(h5py.h5z.filter_avail(BITSHUFFLE_ID))


def table_filter(compression: Any, key: str = "compression", also: tuple = ()) -> dict[str, Any]:
    """``create_dataset`` keywords of a codec: ``"bitshuffle"`` (bitshuffle + LZ4, which shuffles the bits itself),
    ``"lzf"`` or a gzip level 0-9 (both after HDF5's byte shuffle). A ValueError names the option ``key`` and its
    choices (``also``: the caller's other values)."""
    if compression == "bitshuffle":
        if not load_plugins() or not h5py.h5z.filter_avail(BITSHUFFLE_ID):
            raise ValueError(f"{key} 'bitshuffle' needs the hdf5plugin package (pip install hdf5plugin); "
                             "'lzf' or a gzip level 0-9 work without it")
        # block size 0: the filter's own choice; 2: LZ4 after the bit transpose
        return {"compression": BITSHUFFLE_ID, "compression_opts": (0, 2), "shuffle": False}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    if isinstance(compression, int) and not isinstance(compression, bool) and 0 <= compression <= 9:
        return {"compression": "gzip", "compression_opts": compression, "shuffle": True}
    raise ValueError(f"{key} must be one of {[*also, *CODECS]} or a gzip level 0-9, not {compression!r}")


def filter_pipeline(ds: h5py.Dataset) -> list[tuple] | None:
    """``ds``'s filters in the order HDF5 applies them on writing, each (id, flags, options, name) as h5py gives
    them; None where its creation properties cannot be read."""
    try:
        plist = ds.id.get_create_plist()
        return [plist.get_filter(i) for i in range(plist.get_nfilters())]
    except (OSError, RuntimeError, ValueError):
        return None


def missing_filter(ds: h5py.Dataset) -> str | None:
    """What a reader lacks to decode ``ds``: a sentence naming the first filter of its pipeline that this
    process's HDF5 does not have, and how to get it; None when every filter is available."""
    for code, _flags, _opts, name in filter_pipeline(ds) or ():
        if h5py.h5z.filter_avail(code):
            continue
        label = name.decode("utf-8", "replace").split(";")[0] if isinstance(name, bytes) else str(name)
        hint = "install hdf5plugin (pip install hdf5plugin), which msprobe_nb depends on" \
            if code == BITSHUFFLE_ID else "msprobe_nb writes no dataset with it"
        return f"it was written with the HDF5 filter {label!r} (id {code}), which this Python cannot decode: {hint}"
    return None
