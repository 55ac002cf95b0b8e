"""Read the kit's HDF5 dumps (``rank*.h5``) back into :class:`~msprobe_nb.store.schema.DumpParts`.

Only committed steps are read (rows below the extents named by the last valid ``/index/steps`` row),
so a dump whose writer was killed, or is still running, reads as its finished steps. Anything that is
not a readable dump of a supported version raises :class:`DumpFormatError` naming the file.
"""
from __future__ import annotations

import ctypes
import errno as errno_codes
import json
import os
import re
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
from h5py import h5f, h5p

from msprobe_nb.store.errors import DumpFormatError  # re-exported: older code imports it from here
from msprobe_nb.store.hdf5_writer import (
    COMMIT_MAGIC,
    ENCODINGS,
    FLAG_DROPPED,
    FLAG_PARTIAL,
    FORMAT_NAME,
    GROUPS,
    INDEX_FIELDS,
    INDEX_FIELDS_V3,
    INDEX_FIELDS_V4,
    INT_NA,
    LAYOUT_VERSION,
    RANK_FILE_RE,
    STORED_COLUMNS,
    TENSOR_WIDTHS,
    attrs_digest,
    plain_attr,
)
from msprobe_nb.store.schema import COLUMNS, SCHEMA_VERSION, DumpParts, coerce_calls

__all__ = ["DumpFormatError", "is_hdf5_dump", "rank_files", "read_hdf5"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_F = {name: i for i, name in enumerate(INDEX_FIELDS)}
#: The ``/index/steps`` column lists a file may have (its ``fields`` attribute): layouts 1-3, 4, and 5.
_KNOWN_FIELDS = (INDEX_FIELDS_V3, INDEX_FIELDS_V4, INDEX_FIELDS)
#: Layouts this reader reads; 1 and 2 differ in their tails, 3 and 4 in their index (no flags / no checksums).
_LAYOUTS = (1, 2, 3, 4, LAYOUT_VERSION)
#: What h5py, numpy and the decoders raise on damaged files; turned into DumpFormatError.
_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError)
_LENGTHS = [_F[g] for g in GROUPS] + [_F[f"u{w}"] for w in TENSOR_WIDTHS]
_SLOTS = [_F[f"{g}_slot"] for g in GROUPS]


# -- files ----------------------------------------------------------------------------------
def rank_files(path: str | Path) -> list[tuple[int, Path]]:
    """``(rank, file)`` for every ``rank<N>.h5`` directly inside the directory ``path``, sorted by rank."""
    found = []
    for p in Path(path).iterdir():
        m = RANK_FILE_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def _open(path: Path) -> h5py.File:
    """Open read-only; a file whose SWMR writer is running or was killed is opened in SWMR-read mode."""
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
        except _READ_ERRORS as e:
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
    except _READ_ERRORS as e:
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


def _attr(v: Any) -> Any:
    return plain_attr(v, "replace")


def _check_header(f: h5py.File, path: Path) -> dict[str, Any]:
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
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


def _index_rows(f: h5py.File, path: Path) -> tuple[np.ndarray, bool]:
    """``/index/steps`` in today's columns (fields an older file lacks are 0), and whether its rows carry
    checksums (layout 5). Read only once its extent is known to fit the file (chunks of fill rows cost no
    disk space, so a damaged extent could otherwise ask for gigabytes of zeros)."""
    ds = _dataset(f, "index/steps")
    try:
        fields = json.loads(_attr(ds.attrs["fields"])) if "fields" in ds.attrs else INDEX_FIELDS_V3
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
        out[:, _F[name]] = rows[:, j]
    return out, False


def _check_row_crcs(index: np.ndarray, path: Path) -> None:
    """Each commit row's ``crc`` is the crc32 of its fields before it (layout 5)."""
    k = _F["crc"]
    data = np.ascontiguousarray(index[:, :k], dtype="<i8")
    for i in range(len(index)):
        got = zlib.crc32(data[i])
        if got != index[i, k]:
            raise DumpFormatError(
                f"{str(path)!r}: /index/steps row {i} (step {int(index[i, 0])}) fails its checksum (crc32 "
                f"{got:#010x}, stored {int(index[i, k]) & 0xFFFFFFFF:#010x}): the commit record is damaged")


def _check_attrs(f: h5py.File, attrs: dict[str, Any], path: Path) -> None:
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


def _committed(index: np.ndarray, path: Path, checked: bool = False) -> np.ndarray:
    """The rows of ``/index/steps`` that are commits, checked before anything they size is allocated.

    Commits come first and end at the first row without the marker (a half-written commit, or fill
    zeros); a marked row after that, a tail slot other than 0/1, a negative or shrinking length, or a
    step outside int32 means the index is damaged: DumpFormatError naming the row and what is wrong.
    With row checksums (``checked``, layout 5), a first unmarked row whose checksum matches is a whole
    commit whose marker was damaged, not a half-written one: the last steps would silently go missing.
    """
    where = f"{str(path)!r}: /index/steps row"
    marked = index[:, _F["commit"]] == COMMIT_MAGIC
    n = len(index) if marked.all() else int(np.argmin(marked))
    later = np.flatnonzero(marked[n:])
    if len(later):
        raise DumpFormatError(f"{where} {n + int(later[0])} is a commit after row {n}, which is not one; "
                              "a writer never commits past an unfinished row, so the index is damaged")
    if checked and n < len(index) and index[n].any():
        k = _F["crc"]
        if zlib.crc32(np.ascontiguousarray(index[n, :k], dtype="<i8")) == index[n, k]:
            raise DumpFormatError(f"{where} {n} (step {int(index[n, 0])}) is a whole commit record whose commit "
                                  f"marker is damaged ({int(index[n, _F['commit']]):#x})")
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
    step = rows[:, _F["step"]]
    bad = np.flatnonzero((step < -(2 ** 31)) | (step >= 2 ** 31))
    if len(bad):
        raise DumpFormatError(f"{where} {int(bad[0])}: step {int(step[bad[0]])} does not fit int32")
    dropped = (rows[:, _F["flags"]] & FLAG_DROPPED) != 0
    bad = np.flatnonzero(dropped & np.any(ends != prev, axis=1))
    if len(bad):  # a mark holds no rows: lengths that moved would hand rows to a step that has none
        raise DumpFormatError(f"{where} {int(bad[0])} marks step {int(step[bad[0]])} as dropped but changes "
                              "the committed lengths; a dropped step's mark repeats them")
    return rows


def _drop_reason(flags: int) -> str:
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


def _check_extents(f: h5py.File, tails: _Tails, end: dict[str, int], path: Path) -> None:
    """Every length the last commit names fits its datasets: the rows in whole chunks (main) are present
    and stored, the rest fit the group's tail. Checked before reading, so that a damaged length (calls =
    10**9) is refused at once instead of allocating gigabytes."""
    for g, (_, cols) in GROUPS.items():
        length = end[g]
        for col in cols:
            main = _dataset(f, col)
            chunk = tails.chunk(col)
            if chunk < 1 or main.ndim != 1:
                raise DumpFormatError(f"{str(path)!r}: /{col} or its tail has an unexpected shape")
            whole = tails.main_rows(g, length, chunk)
            if main.shape[0] < whole or _allocated(main) < whole:
                raise DumpFormatError(
                    f"{str(path)!r}: the commit index says {g} has {length} rows, so /{col} needs {whole} in whole "
                    f"chunks, but it holds {min(main.shape[0], _allocated(main))}")
    for w in TENSOR_WIDTHS:
        ds = _dataset(f, f"tensors/u{w}")
        need = end[f"u{w}"]
        if ds.ndim != 1 or ds.shape[0] < need or _allocated(ds) < need:
            raise DumpFormatError(f"{str(path)!r}: the commit index says tensors/u{w} has {need} entries, but it "
                                  f"holds {min(ds.shape[0], _allocated(ds)) if ds.ndim == 1 else 0}")


# -- per-file decoding ----------------------------------------------------------------------
def _starts(ends: np.ndarray) -> np.ndarray:
    """Start offsets from cumulative end offsets."""
    out = np.zeros(len(ends), dtype=np.int64)
    out[1:] = ends[:-1]
    return out


def _decode_strings(buf: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The interned string table as an object array (UTF-8 bytes + cumulative end offsets)."""
    n = len(ends)
    out = np.empty(n, dtype=object)
    if n == 0:
        return out
    if np.any(np.diff(ends) < 0) or ends[0] < 0 or ends[-1] > len(buf):
        raise ValueError("string table offsets are not increasing or run past the byte buffer")
    starts = _starts(ends)
    raw = buf.tobytes()
    if raw.isascii():
        text = raw.decode("ascii")
    else:
        text = raw.decode("utf-8", "surrogatepass")
        # character index of every byte position: count of non-continuation bytes before it
        lead = np.concatenate(([0], np.cumsum((buf & 0xC0) != 0x80)))
        starts, ends = lead[starts], lead[ends]
    out[:] = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    return out


def _dataset(f: h5py.File, path: str) -> h5py.Dataset:
    try:
        ds = f[path]
    except KeyError:
        raise ValueError(f"dataset /{path} is missing") from None
    if not isinstance(ds, h5py.Dataset):
        raise ValueError(f"/{path} is not a dataset")
    return ds


#: dataset path -> (group, dtype), to find a column's tail
_COLUMN_GROUP = {path: (g, dtype) for g, (_, cols) in GROUPS.items() for path, dtype in cols.items()}
#: A record field's numpy type in a tail's ``columns`` attribute: a plain little-endian number.
_NUMBER_TYPE = re.compile(r"[<|]?(?:[iuf][1248]|b1)")
#: tail dataset name (layout 3 and later) -> its group
_TAIL_GROUP = {f"/tail/{g}": g for g in GROUPS}


@dataclass
class _Taken:
    """A live file's commit index as first read, the tail rows taken right after it, and the groups whose
    writer moved on to a later chunk meanwhile: read again from a fresh open, these name the same steps."""

    index: np.ndarray
    slots: dict[tuple[str, int], Any]
    moved: list[str]


class _Tails:
    """The committed tail rows of one file, read once per (tail, slot) and shared by the columns in it.

    Layout 3 keeps one tail per group (``/tail/<group>``: bytes (2, chunk, record size), a row per record);
    layout 2 one per dtype of a group (``/tail/<group>/<dtype>``: (2, columns, chunk)); layout 1 one per
    column (``/tail/<path>``: (2, chunk)).
    """

    def __init__(self, f: h5py.File, taken: _Taken | None = None) -> None:
        self.f = f
        self.layout = f.attrs.get("layout_version")
        self.records = self.layout not in (1, 2)  # layouts 3 and later: one tail of packed records per group
        # (tail, slot) -> its rows as records; groups whose rows are all read from main (see _File.__init__)
        self._slots: dict[tuple[str, int], Any] = dict(taken.slots) if taken else {}
        self.from_main: set[str] = set(taken.moved) if taken else set()
        self._located: dict[str, tuple[h5py.Dataset, Any]] = {}  # path -> _locate(path)
        self._records: dict[str, tuple[h5py.Dataset, np.dtype]] = {}  # group -> its tail and record type

    def main_rows(self, group: str, length: int, chunk: int) -> int:
        """How many of a group's first ``length`` rows are read from its main datasets: the whole chunks, or
        all of them once the writer has moved past their chunk (main then holds it whole)."""
        return length if group in self.from_main else length // chunk * chunk

    def chunk(self, path: str) -> int:
        """Rows per chunk of ``path``'s group, from its tail."""
        tail, _ = self._locate(path)
        return tail.shape[1] if self.records else tail.shape[-1]

    def rows(self, path: str, slot: int, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of ``path`` in tail slot ``slot``."""
        tail, where = self._locate(path)
        if self.records:
            key = (tail.name, slot)
            if key not in self._slots or len(self._slots[key]) < hi:
                raw = np.ascontiguousarray(tail[slot, :hi])
                self._slots[key] = raw.view(where[1]).reshape(-1)
            return self._slots[key][where[0]][lo:hi].copy()
        return tail[slot, lo:hi] if where is None else tail[slot, where, lo:hi]

    def preload(self, end: dict[str, int]) -> None:
        """Read the committed rows of every group's tail now (layouts 3 and later).

        A tail slot is written again once the writer has filled two more chunks of its group, so a reader
        of a live dump takes its tails right after the commit index, then checks how far the index moved
        meanwhile (``_File._read``); main chunks are never written again once committed.
        """
        if not self.records:
            return
        for g, (_, cols) in GROUPS.items():
            tail, where = self._locate(next(iter(cols)))
            n, slot = end[g] % tail.shape[1], end[f"{g}_slot"]
            if n:
                self._slots[(tail.name, slot)] = np.ascontiguousarray(tail[slot, :n]).view(where[1]).reshape(-1)

    def moved_on(self, end: dict[str, int], later: dict[str, int]) -> list[str]:
        """The groups in which a later commit lies in a later chunk than ``end``: the writer may have written
        the tail slot ``end`` names since (it does once it fills the next chunk), but main holds the chunk
        ``end`` ends in, whole and for good."""
        moved = []
        for g, (_, cols) in GROUPS.items():
            chunk = self.chunk(next(iter(cols)))
            if later[g] // chunk > end[g] // chunk:
                moved.append(g)
        return moved

    def verify(self, index: np.ndarray, end: dict[str, int], skip: list[str]) -> None:
        """The preloaded tail rows of each group (but ``skip``) match the crc32 the last commit stores for
        them (layout 5). On a mismatch, name the step whose rows hold the damage: the commits in the same
        chunk store the crc of each prefix of the slot."""
        for g, (_, cols) in GROUPS.items():
            if g in skip:
                continue
            tail, _ = self._locate(next(iter(cols)))
            chunk, slot = tail.shape[1], end[f"{g}_slot"]
            n = end[g] % chunk
            raw = self._slots[(tail.name, slot)].view(np.uint8).reshape(-1) if n else np.empty(0, np.uint8)
            if zlib.crc32(raw) == end[f"{g}_crc"]:
                continue
            base, width = end[g] - n, tail.shape[2]
            lengths, crcs, steps = (index[:, _F[k]] for k in (g, f"{g}_crc", "step"))
            where, crc, at = len(index) - 1, 0, 0
            for i in np.flatnonzero(lengths >= base).tolist():  # the commits of this chunk, in order
                stop = (int(lengths[i]) - base) * width
                crc, at = zlib.crc32(raw[at:stop], crc), stop
                if crc != crcs[i]:
                    where = i
                    break
            raise DumpFormatError(
                f"{str(self.f.filename)!r}: /tail/{g} fails its checksum in the rows of step {int(steps[where])} "
                f"(commit row {where}): the bytes on disk are not those written")

    def taken(self, index: np.ndarray, moved: list[str]) -> _Taken:
        """What a second read of the same commit needs: the index, the tails of the groups that did not
        move on, and the groups that did."""
        keep = {k: v for k, v in self._slots.items() if _TAIL_GROUP.get(k[0]) not in moved}
        return _Taken(index, keep, moved)

    def _locate(self, path: str) -> tuple[h5py.Dataset, Any]:
        """``path``'s tail and where in it the column is, found and checked once per path (``chunk`` and
        every ``rows`` call of the column need it)."""
        got = self._located.get(path)
        if got is None:
            got = self._located[path] = self._find(path)
        return got

    def _find(self, path: str) -> tuple[h5py.Dataset, Any]:
        if self.layout == 1:
            tail = _dataset(self.f, f"tail/{path}")
            if tail.ndim != 2 or tail.shape[0] != 2:
                raise ValueError(f"dataset tail/{path} has an unexpected shape {tail.shape}")
            return tail, None
        group, dtype = _COLUMN_GROUP[path]
        if self.layout == 2:
            tail = _dataset(self.f, f"tail/{group}/{dtype}")
            try:
                j = json.loads(tail.attrs["columns"]).index(path)
            except (KeyError, ValueError, TypeError):
                raise ValueError(f"dataset tail/{group}/{dtype} does not list the column {path}") from None
            if tail.ndim != 3 or tail.shape[0] != 2 or j >= tail.shape[1]:
                raise ValueError(f"dataset tail/{group}/{dtype} has an unexpected shape {tail.shape}")
            return tail, j
        tail, record = self._record_tail(group)
        if path not in record.names:
            raise ValueError(f"dataset tail/{group} does not list the column {path}")
        return tail, (path, record)

    def _record_tail(self, group: str) -> tuple[h5py.Dataset, np.dtype]:
        """A group's tail of records and its record type, parsed and checked once per file read (each of the
        group's columns needs them: 34 for calls)."""
        got = self._records.get(group)
        if got is None:
            got = self._records[group] = self._parse_record_tail(group)
        return got

    def _parse_record_tail(self, group: str) -> tuple[h5py.Dataset, np.dtype]:
        tail = _dataset(self.f, f"tail/{group}")
        try:
            pairs = [(str(p), str(t)) for p, t in json.loads(tail.attrs["columns"])]
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"dataset tail/{group}: its columns attribute is not a record layout ({e})") from None
        # raw bytes only ever become plain numbers; anything else never reaches np.dtype (whose parser
        # raises SyntaxError on some strings)
        if not all(_NUMBER_TYPE.fullmatch(t) for _, t in pairs):
            raise ValueError(f"dataset tail/{group}: its columns attribute names a non-numeric type")
        try:
            record = np.dtype(pairs)
        except (ValueError, TypeError) as e:
            raise ValueError(f"dataset tail/{group}: its columns attribute is not a record layout ({e})") from None
        if tail.ndim != 3 or tail.shape[0] != 2 or tail.shape[2] != record.itemsize:
            raise ValueError(f"dataset tail/{group} has shape {tail.shape}, expected (2, chunk, {record.itemsize})")
        return tail, record


def _read_rows(f: h5py.File, tails: _Tails, path: str, length: int, slot: int,
               ranges: list[tuple[int, int]]) -> np.ndarray:
    """Rows ``ranges`` of one group column: whole chunks from ``/path``, the rest from its tail."""
    main = _dataset(f, path)
    if main.ndim != 1:
        raise ValueError(f"dataset {path} has an unexpected shape {main.shape}")
    m = tails.main_rows(_COLUMN_GROUP[path][0], length, tails.chunk(path))
    if main.shape[0] < m:
        raise ValueError(f"dataset {path} has {main.shape[0]} entries but the commit index says {m}")
    parts = []
    for a, b in ranges:
        if a < m:
            try:
                parts.append(main[a:min(b, m)])
            except _READ_ERRORS as e:  # fletcher32 (layout 5) or the decompressor refused a chunk
                raise DumpFormatError(f"{str(f.filename)!r}: /{path} rows {a}..{min(b, m) - 1} are corrupt: a chunk "
                                      f"fails its checksum or does not decompress ({e})") from None
        if b > m:
            parts.append(tails.rows(path, slot, max(a, m) - m, b - m))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, main.dtype)


def _merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _ends(index: np.ndarray) -> dict[str, int]:
    """The lengths, slots and tensor buffer ends the last commit of ``index`` names (zeros: none)."""
    last = index[-1] if len(index) else np.zeros(len(INDEX_FIELDS), np.int64)
    return {k: int(last[_F[k]]) for k in INDEX_FIELDS[1:-1]}


class _File:
    """Everything read from one rank file, still as numpy arrays (strings as ids into ``vocab``)."""

    def __init__(self, path: Path, steps: set[int] | None) -> None:
        self.path = path
        taken = None
        for _ in range(2):  # a second time only for a live file whose writer moved on while it was read
            with _open(path) as f:
                try:
                    self.attrs = _check_header(f, path)
                    taken = self._read(f, steps, taken)
                except DumpFormatError:
                    raise
                except _READ_ERRORS as e:
                    raise DumpFormatError(
                        f"{str(path)!r}: corrupt or incomplete dump ({type(e).__name__}: {e})"
                    ) from None
            if taken is None:
                return
        raise AssertionError("a second read never asks for a third")  # pragma: no cover

    def _read(self, f: h5py.File, steps: set[int] | None, taken: _Taken | None) -> _Taken | None:
        """Read the file's committed steps. For a live file whose writer filled a chunk of some group while
        its tails were taken, return what a second read, from a fresh open, needs instead (this open's
        extents are older than the commit that shows it): that read names the same commit, takes those
        groups' rows from main, the other tails as taken here."""
        if taken is None:
            rows, checked = _index_rows(f, self.path)
            index = _committed(rows, self.path, checked)
        else:
            index, checked = taken.index, False  # checked by the first read
        end = _ends(index)
        tails = _Tails(f, taken)
        _check_extents(f, tails, end, self.path)
        if checked:
            _check_attrs(f, self.attrs, self.path)
            _check_row_crcs(index, self.path)
        if taken is None and tails.records:
            tails.preload(end)  # the tails now, right after the index
            moved: list[str] = []
            if f.swmr_mode:
                # a live (or killed) writer's file: see whether the writer went on to a later chunk meanwhile
                # (it writes a tail slot again once it fills the next chunk)
                f["index/steps"].refresh()  # its extent may have grown; nothing else holds it open now
                moved = tails.moved_on(end, _ends(_committed(_index_rows(f, self.path)[0], self.path)))
            if checked:
                tails.verify(index, end, moved)
            if moved:
                return tails.taken(index, moved)
        group_of = {path: g for g, (_, cols) in GROUPS.items() for path in cols}
        self.rank = int(self.attrs.get("rank", 0))
        row_end = index[:, _F["calls"]]
        row_start = _starts(row_end)
        commit_steps = index[:, _F["step"]]
        keep = np.ones(len(index), bool) if steps is None else np.isin(commit_steps, list(steps))
        flags = index[:, _F["flags"]]
        drop = (flags & FLAG_DROPPED) != 0
        self.dropped = [(int(s), _drop_reason(int(fl))) for s, fl in zip(commit_steps[keep & drop].tolist(),
                                                                        flags[keep & drop].tolist(), strict=True)]
        ranges = _merge_ranges(zip(row_start[keep].tolist(), row_end[keep].tolist(), strict=True))
        self.step = np.repeat(commit_steps[keep], (row_end - row_start)[keep]).astype(np.int32)
        self.steps = sorted(set(commit_steps[keep & ~drop].tolist()))
        self.partial = sorted(set(commit_steps[keep & ~drop & ((flags & FLAG_PARTIAL) != 0)].tolist()))
        self.n = len(self.step)
        ncalls, slot = end["calls"], end["calls_slot"]
        self.cols = {c: _read_rows(f, tails, f"calls/{c}", ncalls, slot, ranges) for c in STORED_COLUMNS}

        def whole(path: str) -> np.ndarray:
            g = group_of[path]
            return _read_rows(f, tails, path, end[g], end[f"{g}_slot"], [(0, end[g])])

        self.vocab = _decode_strings(whole("strings/bytes"), whole("strings/ends"))
        dims = whole("shapes/dims")
        s_end = whole("shapes/ends")
        s_start = _starts(s_end)
        self.shapes = [tuple(dims[a:b].tolist()) for a, b in zip(s_start.tolist(), s_end.tolist(), strict=True)]
        ids = whole("stacks/id")
        k_end = whole("stacks/ends")
        frames = whole("stacks/frames")
        self._check_ids(frames, "stacks/frames")
        k_start = _starts(k_end)
        self.stacks = {
            int(i): self.vocab[frames[a:b]].tolist()
            for i, a, b in zip(ids.tolist(), k_start.tolist(), k_end.tolist(), strict=True)
        }
        con_step, con_call, con_parent = (whole(f"construct/{k}") for k in ("step", "call", "parent"))
        self._check_ids(con_call, "construct/call")
        self._check_ids(con_parent, "construct/parent", allow_missing=True)
        if steps is not None:
            m = np.isin(con_step, list(steps))
            con_step, con_call, con_parent = con_step[m], con_call[m], con_parent[m]
        self.tree = _Tree(self.rank, self.vocab, con_step, con_call, con_parent)
        self.tensors = {k: whole(f"tensors/{k}") for k in ("name", "step", "buffer", "offset", "count",
                                                                 "dtype", "shape")}
        t = self.tensors
        self._check_ids(t["name"], "tensors/name")
        self._check_ids(t["dtype"], "tensors/dtype")
        if len(t["shape"]) and (t["shape"].min() < 0 or t["shape"].max() >= len(self.shapes)):
            raise ValueError("tensors/shape refers to shapes outside the shape table")
        for w in TENSOR_WIDTHS:  # every committed tensor byte must be present
            have = _dataset(f, f"tensors/u{w}").shape[0]
            mine = t["buffer"] == w
            stop = int((t["offset"][mine] + t["count"][mine]).max()) if mine.any() else 0
            if have < end[f"u{w}"] or end[f"u{w}"] < stop or (mine.any() and t["offset"][mine].min() < 0):
                raise ValueError(f"tensors/u{w} has {have} entries; the commit index says {end[f'u{w}']} and the "
                                 f"tensor index needs {stop}")
        if not np.isin(t["buffer"], TENSOR_WIDTHS).all():
            raise ValueError("tensors/buffer holds an unknown buffer width")
        return None

    def _check_ids(self, ids: np.ndarray, name: str, allow_missing: bool = False) -> None:
        if len(ids) and (ids.max() >= len(self.vocab) or ids.min() < (-1 if allow_missing else 0)):
            raise DumpFormatError(f"{str(self.path)!r}: {name} refers to strings outside the string table")

    def column(self, col: str) -> Any:
        """One calls column as the array the schema dtype wants."""
        dtype = COLUMNS[col][0]
        if col == "step":
            return self.step
        if col == "rank":
            return np.full(self.n, self.rank, np.int32)
        raw = self.cols[col]
        enc = ENCODINGS[dtype][1]
        if enc == "string_id":
            self._check_ids(raw, f"calls/{col}")
            return self.vocab_sa.take(raw)
        if enc == "shape_id":
            if len(raw) and (raw.max() >= len(self.shapes) or raw.min() < -1):
                raise DumpFormatError(f"{str(self.path)!r}: calls/shape refers to shapes outside the shape table")
            table = np.empty(len(self.shapes) + 1, dtype=object)
            for i, s in enumerate(self.shapes):  # one by one: numpy would turn equal-length tuples into 2-D
                table[i] = s
            return table[raw]
        if enc == "nullable_int64":
            return pd.arrays.IntegerArray(raw.astype(np.int64, copy=False), mask=raw == INT_NA)
        if enc == "nullable_bool":
            return pd.arrays.BooleanArray(raw == 1, mask=raw < 0)
        if enc == "bool":
            return raw.astype(bool)
        return raw

    @property
    def vocab_sa(self) -> pd.api.extensions.ExtensionArray:
        sa = getattr(self, "_vocab_sa", None)
        if sa is None:
            sa = self._vocab_sa = pd.array(self.vocab, dtype="string") if len(self.vocab) else pd.array(
                [""], dtype="string")
        return sa


# -- side tables -----------------------------------------------------------------------------
@dataclass
class _Tree:
    """One rank's construct rows (string ids into ``vocab``; parent -1 = top level)."""

    rank: int
    vocab: np.ndarray
    step: np.ndarray
    call: np.ndarray
    parent: np.ndarray


class ConstructByStep(Mapping):
    """``{(rank, step): {call: parent}}``, built per key on first access (the merged tree is eager)."""

    def __init__(self, trees: list[_Tree]) -> None:
        self._src: dict[tuple[int, int], tuple[_Tree, np.ndarray]] = {}
        for tr in trees:
            if not len(tr.step):
                continue
            order = np.argsort(tr.step, kind="stable")
            steps, starts = np.unique(tr.step[order], return_index=True)
            bounds = np.append(starts, len(order))
            for s, a, b in zip(steps.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                self._src[(tr.rank, int(s))] = (tr, order[a:b])
        self._cache: dict[tuple[int, int], dict[str, str | None]] = {}

    def __getitem__(self, key: tuple[int, int]) -> dict[str, str | None]:
        if key not in self._cache:
            tr, rows = self._src[key]
            self._cache[key] = _pairs(tr, rows)
        return self._cache[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)

    def __repr__(self) -> str:
        return f"ConstructByStep({len(self)} (rank, step) keys)"


def _pairs(tr: _Tree, rows: np.ndarray) -> dict[str, str | None]:
    calls = tr.vocab[tr.call[rows]].tolist()
    parents = tr.parent[rows]
    names = tr.vocab[np.maximum(parents, 0)].tolist()
    return {c: (p if q >= 0 else None) for c, p, q in zip(calls, names, parents.tolist(), strict=True)}


def _merged_construct(trees: list[_Tree]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for tr in trees:
        if not len(tr.call):
            continue
        key = tr.call.astype(np.int64) * (len(tr.vocab) + 1) + tr.parent + 1
        _, first_rev = np.unique(key[::-1], return_index=True)
        rows = np.sort(len(key) - 1 - first_rev)  # last occurrence of each pair, in write order
        out.update(_pairs(tr, rows))
    return out


def _merge_stacks(files: list[_File]) -> tuple[dict[int, list[str]], list[np.ndarray | None]]:
    """Union of the stacks; ids that mean different stacks on different ranks are renumbered."""
    merged: dict[int, list[str]] = {}
    next_id = max((max(fl.stacks, default=-1) for fl in files), default=-1) + 1
    remaps: list[np.ndarray | None] = []
    for fl in files:
        remap: dict[int, int] = {}
        for sid, frames in fl.stacks.items():
            have = merged.get(sid)
            if have is None:
                merged[sid] = frames
            elif have != frames:
                remap[sid] = next_id
                merged[next_id] = frames
                next_id += 1
        if remap:
            old = np.fromiter(remap, np.int64, count=len(remap))
            new = np.fromiter(remap.values(), np.int64, count=len(remap))
            remaps.append(np.stack([old, new]))
        else:
            remaps.append(None)
    return merged, remaps


class TensorLoader:
    """``loader(data_name) -> torch.Tensor``: reads one tensor from its rank file on each call.

    Names are ``"rank{r}/" + data_name``, or the bare ``data_name`` (the lowest rank that has it).
    Picklable (holds paths, not open files), so it can travel to worker processes.
    """

    def __init__(self, entries: dict[str, tuple[str, int, int, int, str, tuple[int, ...]]], source: str) -> None:
        self.entries = entries
        self.source = source
        self._files: dict[str, h5py.File] = {}  # opened once per rank file: opening costs ~1 ms a tensor

    def __getstate__(self) -> dict:
        return {"entries": self.entries, "source": self.source}  # open files do not travel

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._files = {}

    def close(self) -> None:
        """Close the rank files this loader opened (they are reopened on the next read)."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.__dict__.pop("_blocks", None)

    BLOCK_BYTES = 1 << 24  # tensors are read through 16 MiB blocks: one HDF5 read serves many small tensors
    MAX_BLOCKS = 4

    @contextmanager
    def _buffer(self, path: str, width: int) -> Iterator[h5py.Dataset]:
        """The tensor buffer ``u<width>`` of a rank file. A finished file stays open for the next read (opening
        costs ~1 ms); a live one (its writer running, or killed) is closed again at once. Why: HDF5 shares one
        open file, and its metadata cache, between every handle of this process, so a handle kept open would
        pin the extents it saw, and the next read of the growing dump (``load`` again) would find them older
        than the commit index it reads."""
        f = self._files.get(path)
        if f is None or not f.id.valid:
            f = _open(Path(path))
            if f.swmr_mode:
                try:
                    yield _dataset(f, f"tensors/u{width}")
                finally:
                    f.close()
                return
            self._files[path] = f
        yield _dataset(f, f"tensors/u{width}")

    def _read(self, path: str, width: int, offset: int, count: int) -> np.ndarray:
        """Elements [offset, offset + count) of a tensor buffer, through a small cache of whole blocks."""
        per_block = self.BLOCK_BYTES // width
        first, last = offset // per_block, (offset + count - 1) // per_block
        if first != last:  # spans blocks (or is larger than one): read it directly
            with self._buffer(path, width) as ds:
                return ds[offset:offset + count]
        blocks = self.__dict__.setdefault("_blocks", {})
        key = (path, width, first)
        block = blocks.pop(key, None)
        if block is None or len(block) < offset - first * per_block + count:  # read while the file was shorter
            with self._buffer(path, width) as ds:
                block = ds[first * per_block:min((first + 1) * per_block, ds.shape[0])]
        blocks[key] = block  # most recently used last
        while len(blocks) > self.MAX_BLOCKS:
            blocks.pop(next(iter(blocks)))
        start = offset - first * per_block
        return block[start:start + count].copy()  # callers may modify the tensor: never share the block

    def __contains__(self, data_name: str) -> bool:
        return data_name in self.entries

    def names(self) -> list[str]:
        """Every ``rank{r}/name`` key."""
        return [k for k in self.entries if k.startswith("rank") and "/" in k]

    def __call__(self, data_name: str) -> Any:
        import torch

        try:
            path, width, offset, count, dtype_name, shape = self.entries[data_name]
        except KeyError:
            raise KeyError(f"no tensor named {data_name!r} in {self.source!r}") from None
        dtype = getattr(torch, dtype_name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} has unknown dtype {dtype_name!r}")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        try:
            arr = self._read(path, width, offset, count)
        except _READ_ERRORS as e:
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} cannot be read ({e})") from None
        if len(arr) != count:
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} runs past the end of tensors/u{width}")
        try:
            return torch.from_numpy(arr.view(np.uint8)).view(dtype).reshape(shape)
        except RuntimeError as e:
            raise DumpFormatError(
                f"{path!r}: tensor {data_name!r} does not fit {dtype_name}{list(shape)} ({e})") from None


def _tensor_entries(files: list[_File]) -> dict[str, tuple[str, int, int, int, str, tuple[int, ...]]]:
    entries: dict[str, tuple[str, int, int, int, str, tuple[int, ...]]] = {}
    bare: dict[str, tuple[str, int, int, int, str, tuple[int, ...]]] = {}
    for fl in files:  # files are in rank order: the first rank that has a bare name keeps it
        t = fl.tensors
        mine: dict[str, tuple[str, int, int, int, str, tuple[int, ...]]] = {}
        for nid, w, off, cnt, did, sid in zip(t["name"].tolist(), t["buffer"].tolist(), t["offset"].tolist(),
                                              t["count"].tolist(), t["dtype"].tolist(), t["shape"].tolist(),
                                              strict=True):
            mine[fl.vocab[nid]] = (str(fl.path), int(w), int(off), int(cnt), fl.vocab[did], fl.shapes[sid])
        for name, e in mine.items():
            entries[f"rank{fl.rank}/{name}"] = e
            bare.setdefault(name, e)
    for name, e in bare.items():
        entries.setdefault(name, e)
    return entries


# -- public ----------------------------------------------------------------------------------
def _files_of(path: Path) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"no such dump: {str(path)!r}")
    if path.is_dir():
        files = [p for _, p in rank_files(path)]
        if not files:
            raise DumpFormatError(f"{str(path)!r}: directory holds no msprobe_nb dump files (rank<N>.h5)")
        return files
    return [path]


def is_hdf5_dump(path: str | Path) -> bool:
    """Whether ``path`` is a kit dump: a ``.h5`` file with the kit's format attribute, or a directory of them."""
    path = Path(path)
    try:
        files = [p for _, p in rank_files(path)] if path.is_dir() else [path]
        if not files or not files[0].is_file():
            return False
        with open(files[0], "rb") as fh:
            if fh.read(8) != HDF5_SIGNATURE:
                return False
        with _open(files[0]) as f:
            return _attr(f.attrs.get("format")) == FORMAT_NAME
    except (*_READ_ERRORS, DumpFormatError):
        return False


def read_hdf5(path: str | Path, *, steps: Iterable[int] | None = None) -> DumpParts:
    """Read a dump directory (every ``rank*.h5``, concatenated) or one ``.h5`` file.

    Rows are sorted by rank, step and call_index. ``steps`` limits the read to those steps (via the
    step index, without touching other rows). Raises FileNotFoundError for a missing path and
    DumpFormatError for anything unreadable.
    """
    path = Path(path)
    step_set = None if steps is None else {int(s) for s in steps}
    files = [_File(p, step_set) for p in _files_of(path)]
    files.sort(key=lambda fl: fl.rank)
    ranks = [fl.rank for fl in files]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise DumpFormatError(f"{str(path)!r}: several files claim rank(s) {dup}")

    stacks, remaps = _merge_stacks(files)
    for fl, remap in zip(files, remaps, strict=True):
        if remap is not None:
            sid = fl.cols["stack_id"]
            order = np.argsort(remap[0])
            old, new = remap[0][order], remap[1][order]
            pos = np.minimum(np.searchsorted(old, sid), len(old) - 1)
            fl.cols["stack_id"] = np.where(old[pos] == sid, new[pos], sid).astype(np.int32)

    data: dict[str, Any] = {}
    for col in COLUMNS:
        parts = [fl.column(col) for fl in files]
        if len(parts) == 1:
            data[col] = parts[0]
        elif isinstance(parts[0], np.ndarray):
            data[col] = np.concatenate(parts)
        else:
            data[col] = type(parts[0])._concat_same_type(parts)
    step, cidx = data["step"], data["call_index"]
    rank = data["rank"]
    if len(step) > 1:
        same_rank = rank[1:] == rank[:-1]
        ds = np.diff(step)
        unsorted = same_rank & ((ds < 0) | ((ds == 0) & (np.diff(cidx) < 0)))
        if unsorted.any():
            order = np.lexsort((cidx, step, rank))
            data = {c: (v[order] if isinstance(v, np.ndarray) else v.take(order)) for c, v in data.items()}
    calls = coerce_calls(pd.DataFrame(data, copy=False))

    first = files[0].attrs
    meta: dict[str, Any] = {}
    try:
        user = json.loads(first.get("meta", "{}"))
    except (TypeError, ValueError):
        user = {}
    if isinstance(user, dict):
        meta.update(user)
    for k in ("format", "schema_version", "layout_version", "tool", "tool_version", "created",
              "h5py_version", "hdf5_version"):
        if k in first:
            meta[k] = first[k]
    meta["ranks"] = ranks
    meta["steps"] = sorted(set().union(*(fl.steps for fl in files)))
    # steps some or all of whose rows were lost when writing them failed (a full disk): never renumbered
    meta["dropped"] = [{"rank": fl.rank, "step": s, "reason": why} for fl in files for s, why in fl.dropped]
    meta["dropped_steps"] = sorted({d["step"] for d in meta["dropped"]})
    # steps cut short by an exception in the user's code: their rows are what was recorded until then
    meta["partial"] = [{"rank": fl.rank, "step": s} for fl in files for s in fl.partial]
    meta["partial_steps"] = sorted({d["step"] for d in meta["partial"]})
    meta["files"] = [str(fl.path) for fl in files]
    meta["rank_attrs"] = {fl.rank: fl.attrs for fl in files}
    meta["construct_by_step"] = ConstructByStep([fl.tree for fl in files])
    loader = TensorLoader(_tensor_entries(files), str(path))
    meta["tensors"] = len(loader.names())
    return DumpParts(
        calls=calls,
        stacks=stacks,
        construct=_merged_construct([fl.tree for fl in files]),
        meta=meta,
        tensor_loader=loader,
        source=str(path),
    )
