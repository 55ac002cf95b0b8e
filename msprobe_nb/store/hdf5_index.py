"""The commit index of a kit HDF5 rank file, checked: header, ``/index/steps`` rows, their checksums, extents.

A reader trusts only data below the extents the last valid commit row names; everything here turns a file
that does not hold to that into a DumpFormatError naming the file and what is wrong.
"""
from __future__ import annotations

import errno as errno_codes
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from msprobe_nb.store.checksums import crc32
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_layout import (
    COMMIT_MAGIC,
    FLAG_DROPPED,
    FORMAT_NAME,
    GROUPS,
    INDEX_FIELDS,
    INDEX_FIELDS_V3,
    INDEX_FIELDS_V4,
    INDEX_POS,
    LAYOUT_VERSION,
    TENSOR_WIDTHS,
    attrs_digest,
    plain_attr,
)
from msprobe_nb.store.hdf5_tails import Tails, dataset
from msprobe_nb.store.schema import SCHEMA_VERSION

__all__ = ["attr_text", "check_attrs", "check_extents", "check_header", "check_row_crcs", "commit_ends",
           "committed_rows", "drop_reason", "index_rows"]



#: The ``/index/steps`` column lists a file may have (its ``fields`` attribute): layouts 1-3, 4, and 5.
_KNOWN_FIELDS = (INDEX_FIELDS_V3, INDEX_FIELDS_V4, INDEX_FIELDS)
#: Layouts this reader reads; 1 and 2 differ in their tails, 3 and 4 in their index (no flags / no checksums).
_LAYOUTS = (1, 2, 3, 4, LAYOUT_VERSION)
_LENGTHS = [INDEX_POS[g] for g in GROUPS] + [INDEX_POS[f"u{w}"] for w in TENSOR_WIDTHS]
_SLOTS = [INDEX_POS[f"{g}_slot"] for g in GROUPS]


def attr_text(v: Any) -> Any:
    return plain_attr(v, "replace")


def check_header(f: h5py.File, path: Path) -> dict[str, Any]:
    attrs = {k: attr_text(v) for k, v in f.attrs.items()}
    if attrs.get("format") != FORMAT_NAME:
        raise DumpFormatError(
            f"{str(path)!r}: HDF5 file is not a msprobe_nb dump (root attribute format={attrs.get('format')!r}, "
            f"expected {FORMAT_NAME!r})"
        )
    if attrs.get("schema_version") != SCHEMA_VERSION:
        raise DumpFormatError(f"{str(path)!r}: schema_version {attrs.get('schema_version')!r} is not supported "
                              f"(this msprobe_nb reads schema_version {SCHEMA_VERSION})")
    if attrs.get("layout_version") not in _LAYOUTS:
        raise DumpFormatError(f"{str(path)!r}: layout_version {attrs.get('layout_version')!r} is not supported "
                              f"(this msprobe_nb reads layout_version {', '.join(map(str, _LAYOUTS))})")
    return attrs


def index_rows(f: h5py.File, path: Path) -> tuple[np.ndarray, bool]:
    """``/index/steps`` in today's columns (fields an older file lacks are 0), and whether its rows carry
    checksums (layout 5). Read only once its extent is known to fit the file (chunks of fill rows cost no
    disk space, so a damaged extent could otherwise ask for gigabytes of zeros)."""
    ds = dataset(f, "index/steps")
    try:
        fields = json.loads(attr_text(ds.attrs["fields"])) if "fields" in ds.attrs else INDEX_FIELDS_V3
    except (TypeError, ValueError):
        fields = None
    if fields not in _KNOWN_FIELDS:
        raise DumpFormatError(f"{str(path)!r}: /index/steps lists fields {fields!r}, which is none of the "
                              "layouts this msprobe_nb reads")
    if ds.ndim != 2 or ds.shape[1] != len(fields) or ds.dtype != np.int64:
        raise DumpFormatError(f"{str(path)!r}: /index/steps is {ds.dtype}{list(ds.shape)}, expected int64 "
                              f"[n, {len(fields)}]")
    block = ds.chunks[0] if ds.chunks else 1
    size = path.stat().st_size
    most = (size // (block * ds.shape[1] * 8) + 2) * block  # every allocated chunk, plus the growing one
    if ds.shape[0] > most:
        raise DumpFormatError(f"{str(path)!r}: /index/steps claims {ds.shape[0]} rows; a file of {size} bytes "
                              f"holds at most {most}")
    rows = ds[()]
    if fields == INDEX_FIELDS:
        return rows, True
    out = np.zeros((len(rows), len(INDEX_FIELDS)), np.int64)  # older rows in today's columns (flags 0)
    for j, name in enumerate(fields):
        out[:, INDEX_POS[name]] = rows[:, j]
    return out, False


def check_row_crcs(index: np.ndarray, path: Path) -> None:
    """Each commit row's ``crc`` is the crc32 of its fields before it (layout 5)."""
    k = INDEX_POS["crc"]
    data = np.ascontiguousarray(index[:, :k], dtype="<i8")
    for i in range(len(index)):
        got = crc32(data[i])
        if got != index[i, k]:
            raise DumpFormatError(
                f"{str(path)!r}: /index/steps row {i} (step {int(index[i, 0])}) fails its checksum (crc32 "
                f"{got:#010x}, stored {int(index[i, k]) & 0xFFFFFFFF:#010x}): the commit record is damaged")


def check_attrs(f: h5py.File, attrs: dict[str, Any], path: Path) -> None:
    """The attributes readers use match their checksum ``attrs_crc`` (layout 5, whose index rows carry
    checksums; older files have none, and ``layout_version`` itself is in HDF5's checksummed object header)."""
    if attrs.get("layout_version") != LAYOUT_VERSION:
        return
    if "attrs_crc" not in attrs:
        raise DumpFormatError(f"{str(path)!r}: layout {LAYOUT_VERSION} file without its attrs_crc attribute")
    got = attrs_digest(f)
    if got != attrs["attrs_crc"]:
        raise DumpFormatError(f"{str(path)!r}: its attributes (meta, record layouts, index fields) fail their "
                              f"checksum (crc32 {got:#010x}, attrs_crc {attrs['attrs_crc']!r}): the header is damaged")


def committed_rows(index: np.ndarray, path: Path, checked: bool = False) -> np.ndarray:
    """The rows of ``/index/steps`` that are commits, checked before anything they size is allocated.

    Commits come first and end at the first row without the marker (a half-written commit, or fill
    zeros); a marked row after that, a tail slot other than 0/1, a negative or shrinking length, or a
    step outside int32 means the index is damaged: DumpFormatError naming the row and what is wrong.
    With row checksums (``checked``, layout 5), a first unmarked row whose checksum matches is a whole
    commit whose marker was damaged, not a half-written one: the last steps would silently go missing.
    """
    where = f"{str(path)!r}: /index/steps row"
    marked = index[:, INDEX_POS["commit"]] == COMMIT_MAGIC
    n = len(index) if marked.all() else int(np.argmin(marked))
    later = np.flatnonzero(marked[n:])
    if len(later):
        raise DumpFormatError(f"{where} {n + int(later[0])} is a commit after row {n}, which is not one; "
                              "a writer never commits past an unfinished row, so the index is damaged")
    if checked and n < len(index) and index[n].any():
        k = INDEX_POS["crc"]
        if crc32(np.ascontiguousarray(index[n, :k], dtype="<i8")) == index[n, k]:
            raise DumpFormatError(f"{where} {n} (step {int(index[n, 0])}) is a whole commit record whose commit "
                                  f"marker is damaged ({int(index[n, INDEX_POS['commit']]):#x})")
    rows = index[:n]
    slots = rows[:, _SLOTS]
    bad = np.flatnonzero(~np.all((slots == 0) | (slots == 1), axis=1))
    if len(bad):
        i = int(bad[0])
        raise DumpFormatError(f"{where} {i} names tail slots {slots[i].tolist()}; each must be 0 or 1")
    ends = rows[:, _LENGTHS]
    prev = np.vstack([np.zeros((1, ends.shape[1]), np.int64), ends[:-1]])
    bad = np.flatnonzero(np.any(ends < prev, axis=1))
    if len(bad):
        i = int(bad[0])
        j = int(np.flatnonzero(ends[i] < prev[i])[0])
        field = INDEX_FIELDS[_LENGTHS[j]]
        raise DumpFormatError(f"{where} {i}: the length of {field} goes from {int(prev[i, j])} to "
                              f"{int(ends[i, j])}; committed lengths never shrink")
    step = rows[:, INDEX_POS["step"]]
    bad = np.flatnonzero((step < -(2 ** 31)) | (step >= 2 ** 31))
    if len(bad):
        raise DumpFormatError(f"{where} {int(bad[0])}: step {int(step[bad[0]])} does not fit int32")
    dropped = (rows[:, INDEX_POS["flags"]] & FLAG_DROPPED) != 0
    bad = np.flatnonzero(dropped & np.any(ends != prev, axis=1))
    if len(bad):  # a mark holds no rows: lengths that moved would hand rows to a step that has none
        raise DumpFormatError(f"{where} {int(bad[0])} marks step {int(step[bad[0]])} as dropped but changes "
                              "the committed lengths; a dropped step's mark repeats them")
    return rows


def drop_reason(flags: int) -> str:
    """What a dropped-step mark says: the errno of the failure, when it was an OSError."""
    code = (flags >> 8) & 0xFFFF
    if not code:
        return "writing it failed"
    return f"writing it failed with errno {code} ({errno_codes.errorcode.get(code, '?')}: {os.strerror(code)})"


def _allocated(ds: h5py.Dataset) -> int:
    """Elements of a 1-D dataset backed by storage in the file (reading beyond them would read fill values)."""
    if ds.chunks is None:
        return ds.id.get_storage_size() // max(ds.dtype.itemsize, 1)
    return ds.id.get_num_chunks() * ds.chunks[0]


def check_extents(f: h5py.File, tails: Tails, end: dict[str, int], path: Path) -> None:
    """Every length the last commit names fits its datasets: the rows in whole chunks (main) are present
    and stored, the rest fit the group's tail. Checked before reading, so that a damaged length (calls =
    10**9) is refused at once instead of allocating gigabytes."""
    for g, (_, cols) in GROUPS.items():
        length = end[g]
        for col in cols:
            main = dataset(f, col)
            chunk = tails.chunk(col)
            if chunk < 1 or main.ndim != 1:
                raise DumpFormatError(f"{str(path)!r}: /{col} or its tail has an unexpected shape")
            whole = tails.main_rows(g, length, chunk)
            if main.shape[0] < whole or _allocated(main) < whole:
                raise DumpFormatError(
                    f"{str(path)!r}: the commit index says {g} has {length} rows, so /{col} needs {whole} in whole "
                    f"chunks, but it holds {min(main.shape[0], _allocated(main))}")
    for w in TENSOR_WIDTHS:
        ds = dataset(f, f"tensors/u{w}")
        need = end[f"u{w}"]
        if ds.ndim != 1 or ds.shape[0] < need or _allocated(ds) < need:
            raise DumpFormatError(f"{str(path)!r}: the commit index says tensors/u{w} has {need} entries, but it "
                                  f"holds {min(ds.shape[0], _allocated(ds)) if ds.ndim == 1 else 0}")


def commit_ends(index: np.ndarray) -> dict[str, int]:
    """The lengths, slots and tensor buffer ends the last commit of ``index`` names (zeros: none)."""
    last = index[-1] if len(index) else np.zeros(len(INDEX_FIELDS), np.int64)
    return {k: int(last[INDEX_POS[k]]) for k in INDEX_FIELDS[1:-1]}


