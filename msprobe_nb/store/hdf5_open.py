"""Opening a kit HDF5 rank file for reading, whether its writer finished, is running or was killed.

A file its SWMR writer left open is opened in SWMR-read mode with few metadata retries; a file shorter than its
superblock says is an error naming the file, unless its writer is still growing it.
"""
from __future__ import annotations

import ctypes
import os
import struct
import time
from pathlib import Path
from typing import Any

import h5py
from h5py import h5f, h5p

from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_filters import load_plugins

__all__ = ["HDF5_SIGNATURE", "READ_ERRORS", "open_rank_file"]



HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: What h5py, numpy and the decoders raise on damaged files; turned into DumpFormatError.
READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError)


def open_rank_file(path: Path) -> h5py.File:
    """Open read-only; a file whose SWMR writer is running or was killed is opened in SWMR-read mode. The
    compression filters are loaded first (store/hdf5_filters.py): a read that then fails for want of one
    says so where it fails. Nothing is checked here: on a live file, reading a dataset's header before the
    commit index would pin an extent older than the index."""
    load_plugins()
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise DumpFormatError(f"{str(path)!r}: cannot be read ({e.strerror or e})") from None
    if not head:
        raise DumpFormatError(f"{str(path)!r}: empty file (0 bytes), not an HDF5 dump")
    if head != HDF5_SIGNATURE and not h5py.is_hdf5(path):
        raise DumpFormatError(f"{str(path)!r}: not an HDF5 file (no HDF5 signature)")
    for attempt in range(OPEN_ATTEMPTS):
        try:
            return h5py.File(path, "r", locking="best-effort")
        except READ_ERRORS as e:
            if "already open for write" in str(e):
                break
            # A running writer may have moved the end-of-file address in its superblock a moment before the
            # bytes it allocated reach the file: "truncated" then only lasts milliseconds
            if not ("truncated" in str(e) and _open_for_write(path)) or attempt == OPEN_ATTEMPTS - 1:
                raise DumpFormatError(
                    f"{str(path)!r}: HDF5 file cannot be opened, it is truncated, corrupt or locked by a writer ({e})"
                ) from None
        time.sleep(0.02)
    for attempt in range(OPEN_ATTEMPTS):  # the same, in the check done for SWMR reads
        try:
            _check_size(path)
            break
        except DumpFormatError:
            if attempt == OPEN_ATTEMPTS - 1:
                raise
        time.sleep(0.02)
    try:
        return h5py.File(h5f.open(os.fsencode(path), h5f.ACC_RDONLY | h5f.ACC_SWMR_READ, fapl=_swmr_fapl()))
    except READ_ERRORS as e:
        raise DumpFormatError(f"{str(path)!r}: HDF5 file (left open by its writer) cannot be opened ({e})") from None


#: Opens of a file whose superblock says it is open for write, tried while its size lags behind that superblock.
OPEN_ATTEMPTS = 4


def _open_for_write(path: Path) -> bool:
    """Whether the superblock (version 2 or 3) of ``path`` carries HDF5's "open for write" (or SWMR) flag."""
    try:
        with open(path, "rb") as fh:
            sb = fh.read(12)
    except OSError:
        return False
    return len(sb) == 12 and sb[8] in (2, 3) and bool(sb[11] & 0x05)


def _check_size(path: Path) -> None:
    """Refuse a file shorter than the end-of-file address its superblock (version 2 or 3) records.

    A plain open does this check itself; SWMR-read mode skips it, and reading a truncated file in that
    mode retries for minutes.
    """
    with open(path, "rb") as fh:
        sb = fh.read(48)
    if len(sb) < 12 or sb[8] not in (2, 3):
        return
    size = sb[9]
    if size not in (4, 8) or len(sb) < 12 + 4 * size:
        return
    fmt = "<" + ("I" if size == 4 else "Q") * 4
    base, _, eoa, _ = struct.unpack(fmt, sb[12:12 + 4 * size])
    actual = path.stat().st_size
    if actual < base + eoa:
        raise DumpFormatError(
            f"{str(path)!r}: truncated file ({actual} bytes, its HDF5 superblock says {base + eoa})"
        )


_READ_ATTEMPTS: Any = None


def _swmr_fapl() -> h5p.PropFAID:
    """File access list for SWMR reads with few metadata read retries (HDF5's default retries for minutes)."""
    global _READ_ATTEMPTS
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_file_locking(True, True)  # best effort, like the plain open
    # no chunk cache: the writer rewrites tail chunks and index rows in place, and a cached chunk would hide
    # that from a second read of them in the same open (the check of _File._read)
    mdc, slots, _, w0 = fapl.get_cache()
    fapl.set_cache(mdc, slots, 0, w0)
    if _READ_ATTEMPTS is None:
        _READ_ATTEMPTS = False
        try:  # h5py does not wrap H5Pset_metadata_read_attempts; call it in the libhdf5 h5py has loaded
            with open("/proc/self/maps") as fh:
                libs = sorted({line.split()[-1] for line in fh if "libhdf5" in line and "_hl" not in line
                               and "libhdf5" in line.split()[-1]})
            if libs:
                fn = ctypes.CDLL(libs[0]).H5Pset_metadata_read_attempts
                fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_uint], ctypes.c_int
                _READ_ATTEMPTS = fn
        except (OSError, AttributeError):
            pass
    if _READ_ATTEMPTS:
        _READ_ATTEMPTS(fapl.id, 20)
    return fapl


