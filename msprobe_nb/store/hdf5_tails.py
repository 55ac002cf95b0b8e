"""Reading committed rows of a kit HDF5 rank file: whole chunks from the main datasets, the rest from the tails.

The writer's two-slot tails (store/hdf5_appends.py) hold each group's partial chunk; ``Tails`` reads each
(tail, slot) once, checks its crc32 against the commit row and shares it by the columns in it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from msprobe_nb.store.checksums import crc32
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_filters import missing_filter
from msprobe_nb.store.hdf5_layout import (
    GROUPS,
    INDEX_POS,
)
from msprobe_nb.store.hdf5_open import READ_ERRORS

__all__ = ["Taken", "Tails", "dataset", "merge_ranges", "read_rows"]


def dataset(f: h5py.File, path: str) -> h5py.Dataset:
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
class Taken:
    """A live file's commit index as first read, the tail rows taken right after it, and the groups whose
    writer moved on to a later chunk meanwhile: read again from a fresh open, these name the same steps."""

    index: np.ndarray
    slots: dict[tuple[str, int], Any]
    moved: list[str]


class Tails:
    """The committed tail rows of one file, read once per (tail, slot) and shared by the columns in it.

    Layout 3 keeps one tail per group (``/tail/<group>``: bytes (2, chunk, record size), a row per record);
    layout 2 one per dtype of a group (``/tail/<group>/<dtype>``: (2, columns, chunk)); layout 1 one per
    column (``/tail/<path>``: (2, chunk)).
    """

    def __init__(self, f: h5py.File, taken: Taken | None = None) -> None:
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
            if crc32(raw) == end[f"{g}_crc"]:
                continue
            base, width = end[g] - n, tail.shape[2]
            lengths, crcs, steps = (index[:, INDEX_POS[k]] for k in (g, f"{g}_crc", "step"))
            where, crc, at = len(index) - 1, 0, 0
            for i in np.flatnonzero(lengths >= base).tolist():  # the commits of this chunk, in order
                stop = (int(lengths[i]) - base) * width
                crc, at = crc32(raw[at:stop], crc), stop
                if crc != crcs[i]:
                    where = i
                    break
            raise DumpFormatError(
                f"{str(self.f.filename)!r}: /tail/{g} fails its checksum in the rows of step {int(steps[where])} "
                f"(commit row {where}): the bytes on disk are not those written")

    def taken(self, index: np.ndarray, moved: list[str]) -> Taken:
        """What a second read of the same commit needs: the index, the tails of the groups that did not
        move on, and the groups that did."""
        keep = {k: v for k, v in self._slots.items() if _TAIL_GROUP.get(k[0]) not in moved}
        return Taken(index, keep, moved)

    def _locate(self, path: str) -> tuple[h5py.Dataset, Any]:
        """``path``'s tail and where in it the column is, found and checked once per path (``chunk`` and
        every ``rows`` call of the column need it)."""
        got = self._located.get(path)
        if got is None:
            got = self._located[path] = self._find(path)
        return got

    def _find(self, path: str) -> tuple[h5py.Dataset, Any]:
        if self.layout == 1:
            tail = dataset(self.f, f"tail/{path}")
            if tail.ndim != 2 or tail.shape[0] != 2:
                raise ValueError(f"dataset tail/{path} has an unexpected shape {tail.shape}")
            return tail, None
        group, dtype = _COLUMN_GROUP[path]
        if self.layout == 2:
            tail = dataset(self.f, f"tail/{group}/{dtype}")
            try:
                j = json.loads(tail.attrs["columns"]).index(path)
            except (KeyError, ValueError, TypeError):
                raise ValueError(f"dataset tail/{group}/{dtype} does not list the column {path}") from None
            if tail.ndim != 3 or tail.shape[0] != 2 or j >= tail.shape[1]:
                raise ValueError(f"dataset tail/{group}/{dtype} has an unexpected shape {tail.shape}")
            return tail, j
        tail, record = self._record_tail(group)
        if path not in (record.names or ()):
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
        tail = dataset(self.f, f"tail/{group}")
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


def read_rows(f: h5py.File, tails: Tails, path: str, length: int, slot: int,
               ranges: list[tuple[int, int]]) -> np.ndarray:
    """Rows ``ranges`` of one group column: whole chunks from ``/path``, the rest from its tail."""
    main = dataset(f, path)
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
            except READ_ERRORS as e:  # fletcher32 (layout 5) or the decompressor refused a chunk
                lacking = missing_filter(main)  # or this process has no decompressor for it
                if lacking is not None:
                    raise DumpFormatError(f"{str(f.filename)!r}: /{path} cannot be read: {lacking}") from None
                raise DumpFormatError(f"{str(f.filename)!r}: /{path} rows {a}..{min(b, m) - 1} are corrupt: a chunk "
                                      f"fails its checksum or does not decompress ({e})") from None
        if b > m:
            parts.append(tails.rows(path, slot, max(a, m) - m, b - m))
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, main.dtype)


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b <= a:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


