"""Write the kit's own HDF5 dump: one append-only, crash-safe file per rank.

Layout and guarantees are documented in ``docs/hdf5_schema.md``. In short: the calls table is stored
column by column (strings interned as integer ids), whole tensors are packed into a few typed byte
buffers, and every ``write_step`` ends by appending one row to ``/index/steps``. That row is the
commit record: readers only trust data below the extents it names, so a kill between steps loses
nothing and a kill inside a step loses only that step.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import suppress
from datetime import datetime, timezone
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from msprobe_nb.store.column_ids import ids_by_row
from msprobe_nb.store.column_values import as_1d, as_list, exact_int, is_missing, json_default, nullable
from msprobe_nb.store.dump_dir import DumpInUseError, DumpLock, claim_dump_dir, resolve_dump_dir
from msprobe_nb.store.hdf5_appends import ColumnGroup, DatasetWriter, write_packed
from msprobe_nb.store.hdf5_filters import table_filter
from msprobe_nb.store.hdf5_layout import (
    COMMIT_MAGIC,
    ENCODINGS,
    FLAG_DROPPED,
    FLAG_PARTIAL,
    FORMAT_NAME,
    GROUPS,
    INDEX_BLOCK,
    INDEX_FIELDS,
    INT_NA,
    LAYOUT_VERSION,
    MEMO_ROWS,
    STORED_COLUMNS,
    TENSOR_CHUNK_BYTES,
    TENSOR_WIDTHS,
    TOOL_NAME,
    attrs_digest,
    commit_row,
    tool_version,
)
from msprobe_nb.store.schema import COLUMNS, SCHEMA_VERSION, Coded
from msprobe_nb.store.tensor_bytes import tensor_bytes

# DumpInUseError, DumpLock, claim_dump_dir and resolve_dump_dir live in store.dump_dir; they are named here too
# because callers have always imported them from the writer.
__all__ = ["DumpInUseError", "DumpLock", "DumpWriteError", "DumpWriter", "claim_dump_dir", "resolve_dump_dir"]


class DumpWriteError(OSError):
    """A step could not be written (a full disk, an I/O error): its rows are dropped and the dump marks it.

    ``errno`` is the failure's (``errno.ENOSPC`` for a full disk), ``step`` the step lost, ``path`` the file.
    Later steps keep their numbers: a step is never written under another step's number.
    """

    def __init__(self, code: int | None, message: str, step: int, path: str) -> None:
        super().__init__(code, message)
        self.step, self.path = step, path


_HDF5_CALLS = attrgetter("hdf5_calls")


class DumpWriter:
    """Append steps of the calls table (plus stacks, module tree and tensors) to ``dump_dir/rank{rank}.h5``.

    ``write_step`` converts and validates everything first, then appends, flushes, and finally
    appends the commit row; after it returns the step is durable. ``swmr=True`` (the default) opens
    the file in HDF5 single-writer/multiple-reader mode, so a notebook can read a running dump and a
    kill inside ``write_step`` leaves the earlier steps readable. ``compression`` (tables and tensors) is
    ``"bitshuffle"`` (bitshuffle + LZ4 through hdf5plugin: the fastest), ``"lzf"`` (h5py's own filter) or a
    gzip level 0-9 (any HDF5 reader), the last two after HDF5's byte shuffle (store/hdf5_filters.py).
    ``tensor_compression`` overrides it for the whole-tensor buffers; ``None`` stores them uncompressed,
    the fastest to write (activations compress only to about 0.8 of their size).
    """

    def __init__(self, dump_dir: str | Path, rank: int = 0, meta: Mapping[str, Any] | None = None, *,
                 swmr: bool = True, compression: str | int = "bitshuffle",
                 tensor_compression: str | int | None = "same", lock: DumpLock | None = None) -> None:
        self.rank = int(rank)
        self.dump_dir = Path(dump_dir)
        self.path = self.dump_dir / f"rank{self.rank}.h5"
        self._file: h5py.File | None = None
        self._own_lock: DumpLock | None = None
        filt = table_filter(compression)
        meta_json = json.dumps(dict(meta or {}), default=json_default, ensure_ascii=False)
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        if lock is None:  # nobody claimed the rank for us: claim it (DumpInUseError if a live process has it)
            lock = self._own_lock = DumpLock.claim(self.dump_dir, self.rank)
        try:
            self._create(meta_json, filt, swmr, tensor_compression)
        except BaseException:
            self._release()
            raise

    def _create(self, meta_json: str, filt: dict[str, Any], swmr: bool, tensor_compression: Any) -> None:
        if self.path.exists():
            raise FileExistsError(f"{str(self.path)!r} already exists; use resolve_dump_dir() to pick a fresh path")
        # Created under a temporary name and renamed once its header is complete, so a kill while it is
        # created never leaves a rank file that cannot be read (which would send the next run to <path>_1).
        # The rank's lock is ours, so a leftover of a killed creation is removed.
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        libver = ("v110", "v110") if swmr else ("earliest", "v110")
        # rdcc_nbytes=0: no per-dataset chunk cache; the writer only appends, and a cache per column
        # would hold memory for every step written until close()
        f = h5py.File(tmp, "x", libver=libver, locking="best-effort", rdcc_nbytes=0)
        try:
            a = f.attrs
            a["format"] = FORMAT_NAME
            a["schema_version"] = SCHEMA_VERSION
            a["layout_version"] = LAYOUT_VERSION
            a["tool"] = TOOL_NAME
            a["tool_version"] = tool_version()
            a["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            a["rank"] = self.rank
            a["meta"] = meta_json
            a["columns"] = json.dumps(STORED_COLUMNS)
            a["h5py_version"] = h5py.version.version
            a["hdf5_version"] = h5py.version.hdf5_version
            self._groups = {g: ColumnGroup(f, g, chunk, cols, filt) for g, (chunk, cols) in GROUPS.items()}
            for col in STORED_COLUMNS:
                enc = ENCODINGS[COLUMNS[col][0]][1]
                f[f"calls/{col}"].attrs["encoding"] = enc
                if enc == "nullable_int64":
                    f[f"calls/{col}"].attrs["na_value"] = INT_NA
            if tensor_compression == "same":
                tfilt = filt
            elif tensor_compression is None:
                tfilt = {"shuffle": False}
            else:
                tfilt = table_filter(tensor_compression, "tensor_compression", ("same", None))
            self._buffers = {
                w: f.create_dataset(f"tensors/u{w}", shape=(0,), maxshape=(None,), dtype=f"uint{8 * w}",
                                    chunks=(TENSOR_CHUNK_BYTES // w,), track_times=False,
                                    **dict(tfilt, shuffle=tfilt["shuffle"] and w > 1))
                for w in TENSOR_WIDTHS
            }
            k = len(INDEX_FIELDS)
            self._index = f.create_dataset("index/steps", shape=(0, k), maxshape=(None, k), dtype="int64",
                                           chunks=(INDEX_BLOCK, k), track_times=False)
            self._index.attrs["fields"] = json.dumps(INDEX_FIELDS)
            self._index.attrs["commit_magic"] = COMMIT_MAGIC
            self._index_writer = DatasetWriter(self._index, in_place=True)
            a["attrs_crc"] = attrs_digest(f)  # last: SWMR allows no attribute changes after this flush
            f.flush()
            if swmr:
                f.swmr_mode = True
            os.rename(tmp, self.path)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
        self._file = f
        # HDF5's flush at a step's end is made only where something called HDF5 to change the file since the last
        # one (_flush): the dataset writers' count of such calls at that flush, and whether the tensor buffers
        # (written through h5py) were written since.
        self._writers = [*(w for g in self._groups.values() for w in (*g.main.values(), g.tail)), self._index_writer]
        self._flushed_calls = 0
        self._unflushed = False
        # Interning state. Ids below the committed counts are on disk; the rest are pending.
        self._strings: dict[str, int] = {"": 0}
        self._new_strings: list[str] = [""]
        # shape -> id; None (no shape) -> -1 too, so a column converts with one map()
        self._shape_ids: dict[tuple[int, ...] | None, int] = {None: -1}
        self._new_shapes: list[tuple[int, ...]] = []
        self._stack_ids: set[int] = set()
        self._buffer_ends = dict.fromkeys(TENSOR_WIDTHS, 0)
        self._rows = 0  # rows of /index/steps written: commits and dropped-step marks
        self._index_alloc = 0  # rows of /index/steps in allocated chunks (a multiple of INDEX_BLOCK)
        self._pending_drops: list[tuple[int, int]] = []  # (step, flags) marks the disk has not taken yet
        # column -> (values, ids) of the last committed step, and this step's, committed with it
        self._memo: dict[str, tuple[Any, np.ndarray]] = {}
        self._memo_new: dict[str, tuple[Any, np.ndarray]] = {}
        self._checked_codes: list[tuple[np.ndarray, int]] = []  # Coded codes arrays checked in this step
        self.steps_written = 0

    # -- interning -------------------------------------------------------------------------
    def _intern(self, s: str) -> int:
        i = self._strings.get(s)
        if i is None:
            i = self._strings[s] = len(self._strings)
            self._new_strings.append(s)
        return i

    def _shape_id(self, s: Any) -> int:
        key = tuple(int(d) for d in s)
        i = self._shape_ids.get(key)
        if i is None:
            if any(d < 0 for d in key):
                raise ValueError(f"shape {key} has a negative dimension")
            i = self._shape_ids[key] = len(self._shape_ids) - 1  # None's entry is not a shape
            self._new_shapes.append(key)
        return i

    def _rollback(self) -> None:
        for s in self._new_strings:
            if self._strings.get(s, -1) >= self._groups["strings"].length:
                del self._strings[s]
        del self._new_strings[:]
        if self._groups["strings"].length == 0:
            self._strings = {"": 0}
            self._new_strings.append("")
        for shape in self._new_shapes:
            if self._shape_ids.get(shape, -1) >= self._groups["shapes"].length:  # not committed after all
                del self._shape_ids[shape]
        del self._new_shapes[:]

    # -- column conversion -----------------------------------------------------------------
    def _recall(self, key: str, values: Any) -> np.ndarray | None:
        """The ids the last committed step's ``key`` column converted to, if ``values`` equals what it held.

        A training loop hands over the same names, arguments, shapes and call fields step after step;
        comparing two tuples of strings costs about a third of looking every string up again."""
        memo = self._memo.get(key)
        if memo is not None and type(values) is type(memo[0]) and memo[0] == values:
            self._memo_new[key] = memo
            return memo[1]
        return None

    def _remember(self, key: str, values: Any, ids: np.ndarray) -> np.ndarray:
        """Keep a conversion where every value was a known string or shape (so equal values mean equal
        ids), for columns short enough that holding them until the next step costs little memory."""
        if type(values) in (tuple, list) and len(values) <= MEMO_ROWS:
            ids.flags.writeable = False
            self._memo_new[key] = (values, ids)
        return ids

    def _string_ids(self, col: str, values: Any, missing: int = 0) -> np.ndarray:
        """Interned ids of a string column; a missing value (None, NaN, pandas' NA) becomes ``missing``
        (``0``, the id of "", in the calls table; ``-1`` where the schema keeps "no value" apart)."""
        got = self._recall(col, values)
        if got is not None:
            return got
        by_row = ids_by_row(values, self._strings, self._memo.get(col))
        if by_row is not None:  # the last step's ids where a row is the same (store/column_ids.py)
            ids, new = by_row
            vals = values
        else:
            vals = as_list(values)
            # known strings without a Python-level loop; -1 marks the rest (new strings and missing values)
            ids = np.fromiter(map(self._strings.get, vals, repeat(-1)), np.int32, count=len(vals))
            new = np.flatnonzero(ids < 0).tolist()
        strings = self._strings
        for i in new:
            v = vals[i]
            k = strings.get(v) if type(v) is str else None  # a new string again (interned at its first row)
            ids[i] = k if k is not None else missing if is_missing(v) else self._intern(v if type(v) is str else str(v))
        if by_row is not None or not new or all(vals[i] is None for i in new):
            # by row: each row's id holds for the same value at that index next step; else every value a known
            # string or None: equal values next step mean equal ids
            return self._remember(col, values, ids)
        return ids

    def _shape_column(self, values: Any) -> np.ndarray:
        got = self._recall("shape", values)
        if got is not None:
            return got
        try:  # the last step's ids where a row is the same (store/column_ids.py)
            by_row = ids_by_row(values, self._shape_ids, self._memo.get("shape"))
        except TypeError:  # unhashable entries (lists): the loop below
            by_row = None
        if by_row is not None:
            ids32, lacking = by_row
            for i in lacking:
                ids32[i] = self._new_shape_id(values[i], i)
            return self._remember("shape", values, ids32)
        vals = as_list(values)
        try:  # known shapes without a Python-level loop
            ids = list(map(self._shape_ids.get, vals))
        except TypeError:  # unhashable entries (lists): all through the loop below
            ids = [None] * len(vals)
        try:  # all known: no scan for None first
            return self._remember("shape", values, np.asarray(ids, dtype=np.int32))
        except TypeError:
            pass
        for i, (s, k) in enumerate(zip(vals, ids)):
            if k is None:
                ids[i] = self._new_shape_id(s, i)
        return np.asarray(ids, dtype=np.int32)

    def _new_shape_id(self, s: Any, row: int) -> int:
        """The id of a shape the table lacks (interned now), -1 for a missing one."""
        if is_missing(s):
            return -1
        try:
            return self._shape_id(s)
        except (TypeError, ValueError) as e:
            raise ValueError(f"column 'shape' row {row}: not a tuple of ints or None: {s!r} ({e})") from None

    def _convert(self, col: str, values: Any, n: int) -> np.ndarray:
        if isinstance(values, Coded):  # convert each distinct value once, then repeat by code
            codes = np.asarray(values.codes)
            m = len(values.values)
            # the call fields of a step share one codes array: checked once per step and number of values
            if not any(c is codes and k == m for c, k in self._checked_codes):
                if codes.dtype.kind not in "iu" or (codes.size and (codes.min() < 0 or codes.max() >= m)):
                    raise ValueError(f"column {col!r}: codes must be integers in [0, {m})")
                self._checked_codes.append((codes, m))
            return self._convert(col, values.values, m)[codes]
        dtype = COLUMNS[col][0]
        try:
            if dtype == "string":
                return self._string_ids(col, values)
            if dtype == "object":
                return self._shape_column(values)
            if dtype in ("int32", "int64"):
                got = self._recall(col, values)
                if got is not None:
                    return got
                arr = np.asarray(values)
                if arr.dtype.kind not in "iub":
                    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
                        arr = arr.astype(np.int64)
                    else:
                        vals = as_list(values)
                        if any(is_missing(v) for v in vals):
                            raise ValueError("missing values in a non-nullable integer column")
                        arr = np.asarray([exact_int(v) for v in vals], dtype=np.int64)
                info = np.iinfo(dtype)
                if arr.size and (arr.min() < info.min or arr.max() > info.max):
                    raise ValueError(f"values out of {dtype} range")
                return self._remember(col, values, arr.astype(dtype, copy=False))
            if dtype == "float64":
                try:
                    return np.asarray(values, dtype=np.float64)
                except (TypeError, ValueError):
                    return np.fromiter((np.nan if is_missing(v) else float(v) for v in as_list(values)),
                                       np.float64, count=n)
            if dtype == "bool":
                arr = np.asarray(values)
                if arr.dtype != bool:
                    arr = np.fromiter((False if is_missing(v) else bool(v) for v in values), bool, count=n)
                return arr.astype(np.uint8)
            if dtype == "Int64":
                ints = np.asarray(values) if isinstance(values, np.ndarray) else None
                if ints is None or ints.dtype.kind not in "iu":
                    return nullable(values, n, INT_NA, np.int64, exact_int)
                ints = ints.astype(np.int64)
                if ints.size and ints.min() == INT_NA:
                    raise ValueError(f"value {INT_NA} is reserved for <NA>")
                return ints
            if dtype == "boolean":
                return nullable(values, n, -1, np.int8, bool)
        except ValueError as e:
            raise ValueError(f"column {col!r}: {e}") from None
        except (TypeError, OverflowError) as e:
            raise ValueError(f"column {col!r}: {e}") from None
        raise ValueError(f"column {col!r}: schema dtype {dtype!r} has no HDF5 encoding")  # pragma: no cover

    def _default(self, col: str, n: int) -> np.ndarray:
        dtype = COLUMNS[col][0]
        disk = ENCODINGS[dtype][0]
        fill = {"object": -1, "Int64": INT_NA, "boolean": -1, "float64": np.nan}.get(dtype, 0)
        if col == "stack_id":
            fill = -1
        return np.full(n, fill, dtype=disk)

    # -- tensors -----------------------------------------------------------------------------
    # -- writing -----------------------------------------------------------------------------
    def write_step(self, step: int, columns: Mapping[str, Any], stacks: Mapping[int, list[str]] | None = None,
                   construct: Mapping[str, str | None] | None = None,
                   tensors: Mapping[str, Any] | None = None, *, partial: bool = False) -> None:
        """Append one step and make it durable; raises ValueError/TypeError before writing on bad input.

        ``tensors`` maps data names to torch tensors, or to numpy arrays of a dtype torch shares (stored as
        that torch dtype; the recorder hands its host copies so).

        ``partial=True`` flags the step as cut short by an exception (``FLAG_PARTIAL``); readers show it."""
        if self._file is None:
            raise ValueError(f"DumpWriter for {str(self.path)!r} is closed")
        step = int(step)
        if not -(2 ** 31) <= step < 2 ** 31:
            raise ValueError(f"step {step} does not fit int32")
        self._memo_new = {}
        try:
            payload = self._prepare(step, dict(columns), stacks or {}, construct or {}, tensors or {})
        except BaseException:
            self._rollback()
            raise
        finally:
            self._checked_codes = []
        try:
            self._write(step, payload, FLAG_PARTIAL if partial else 0)
        except BaseException:
            self._rollback()
            raise
        self._new_strings.clear()
        self._new_shapes.clear()
        self._memo, self._memo_new = self._memo_new, {}  # columns another step did not hand over are dropped
        self.steps_written += 1

    def _prepare(self, step: int, columns: dict[str, Any], stacks: Mapping[int, list[str]],
                 construct: Mapping[str, str | None], tensors: Mapping[str, Any]) -> dict[str, Any]:
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; the schema columns are {list(COLUMNS)}")
        n = None
        for col, values in columns.items():
            as_1d(values, col, n)
            n = len(values)
        n = n or 0
        for col, want in (("step", step), ("rank", self.rank)):
            if col in columns:
                vals = np.asarray(columns.pop(col))
                if vals.size and not np.all(vals == want):
                    raise ValueError(f"column {col!r} disagrees with the writer ({col}={want}); leave it out")
        cols = {c: self._convert(c, columns[c], n) if c in columns else self._default(c, n) for c in STORED_COLUMNS}

        new_stacks: list[tuple[int, list[int]]] = []
        for sid, frames in stacks.items():
            sid = int(sid)
            if sid in self._stack_ids or any(sid == s for s, _ in new_stacks):
                continue
            if not -(2 ** 31) <= sid < 2 ** 31:
                raise ValueError(f"stack id {sid} does not fit int32")
            if isinstance(frames, str):
                frames = [frames]
            new_stacks.append((sid, [self._intern(str(fr)) for fr in frames]))

        parents = list(construct.values())
        con_call = self._string_ids("construct/call", list(construct))
        con_parent = self._string_ids("construct/parent", parents, missing=-1)

        tens = []
        for name, t in tensors.items():
            width, data, dtype, shape = tensor_bytes(str(name), t)
            tens.append((self._intern(str(name)), width, data, self._intern(dtype), self._shape_id(shape)))
        return {"n": n, "cols": cols, "stacks": new_stacks, "construct": (con_call, con_parent), "tensors": tens}

    def _write(self, step: int, p: dict[str, Any], flags: int = 0) -> None:
        g = self._groups
        assert self._file is not None, "append() checks that the writer is open"
        staged = {"calls": g["calls"].stage({f"calls/{c}": a for c, a in p["cols"].items()})}
        if self._new_strings:
            enc = [s.encode("utf-8", "surrogatepass") for s in self._new_strings]
            lens = np.fromiter(map(len, enc), np.int64, count=len(enc))
            base = g["string_bytes"].length
            staged["string_bytes"] = g["string_bytes"].stage({"strings/bytes": np.frombuffer(b"".join(enc), np.uint8)})
            staged["strings"] = g["strings"].stage({"strings/ends": np.cumsum(lens) + base})
        if self._new_shapes:
            lens = np.fromiter(map(len, self._new_shapes), np.int64, count=len(self._new_shapes))
            dims = np.fromiter((d for s in self._new_shapes for d in s), np.int64, count=int(lens.sum()))
            base = g["shape_dims"].length
            staged["shape_dims"] = g["shape_dims"].stage({"shapes/dims": dims})
            staged["shapes"] = g["shapes"].stage({"shapes/ends": np.cumsum(lens) + base})
        if p["stacks"]:
            lens = np.array([len(fr) for _, fr in p["stacks"]], np.int64)
            frames = np.fromiter((x for _, fr in p["stacks"] for x in fr), np.int32, count=int(lens.sum()))
            base = g["stack_frames"].length
            staged["stack_frames"] = g["stack_frames"].stage({"stacks/frames": frames})
            staged["stacks"] = g["stacks"].stage({"stacks/id": np.array([s for s, _ in p["stacks"]], np.int32),
                                                  "stacks/ends": np.cumsum(lens) + base})
        con_call, con_parent = p["construct"]
        if len(con_call):
            staged["construct"] = g["construct"].stage({
                "construct/step": np.full(len(con_call), step, np.int32),
                "construct/call": con_call, "construct/parent": con_parent})
        ends = dict(self._buffer_ends)
        if p["tensors"]:
            rows: dict[str, list[int]] = {k: [] for k in ("name", "buffer", "offset", "count", "dtype", "shape")}
            for w in TENSOR_WIDTHS:
                parts = [(nid, data, did, sid) for nid, width, data, did, sid in p["tensors"] if width == w]
                if not parts:
                    continue
                start = pos = ends[w]
                for nid, data, did, sid in parts:
                    for key, v in (("name", nid), ("buffer", w), ("offset", pos), ("count", len(data)),
                                   ("dtype", did), ("shape", sid)):
                        rows[key].append(v)
                    pos += len(data)
                # The next step starts on a fresh chunk, so a committed compressed chunk is never rewritten.
                chunk = TENSOR_CHUNK_BYTES // w
                ends[w] = -(-pos // chunk) * chunk
                ds = self._buffers[w]
                self._unflushed = True  # before the writes: one that raised may have changed the file as well
                if ends[w] > ds.id.shape[0]:  # only grows: a failed step may have grown it already
                    ds.id.set_extent((ends[w],))
                write_packed(ds, start, [d for _, d, _, _ in parts], chunk)
            k = len(rows["name"])
            cols = {f"tensors/{key}": np.asarray(v, GROUPS["tensors"][1][f"tensors/{key}"]) for key, v in rows.items()}
            cols["tensors/step"] = np.full(k, step, np.int32)
            staged["tensors"] = g["tensors"].stage(cols)
        # The index rows this step writes (its commit, marks of steps dropped before it) land in chunks that
        # exist before the flush, so writing them changes no metadata: the commit row is one in-place write.
        self._reserve_index(len(self._pending_drops) + 1)
        self._flush()
        self._write_drops()  # steps dropped before this one, with the lengths they left (the committed ones)
        # Commit: one index row naming every table's extent; a reader ignores anything beyond it.
        row = commit_row(step, [staged.get(name) or grp.state() for name, grp in g.items()], ends, flags)
        i = self._rows
        try:
            self._append_index(row)
        finally:  # once the row is in the file the step is committed, whatever interrupts us now
            if self._rows > i:
                for name, state in staged.items():
                    g[name].commit(state)
                self._buffer_ends = ends
                self._stack_ids.update(sid for sid, _ in p["stacks"])

    def _flush(self) -> None:
        """HDF5's flush, where anything since the last one called HDF5 to change the file (an extent, a chunk
        allocated or written through HDF5, the tensor buffers).

        A step that fills no chunk writes its tails and its commit row in place (hdf5_chunk_writes): HDF5 holds
        nothing to write then, and its flush would still visit every open dataset to find that out. A flush
        that raised is tried again at the next step, since the counts only move on once it returned."""
        assert self._file is not None, "the writer is open"
        calls = sum(map(_HDF5_CALLS, self._writers))
        if calls != self._flushed_calls or self._unflushed:
            self._file.flush()
            self._flushed_calls, self._unflushed = calls, False

    def _reserve_index(self, n: int) -> None:
        """Make sure the next ``n`` rows of ``/index/steps`` lie in allocated chunks (before the flush).

        The extent grows a whole chunk at a time, and a chunk is allocated by writing a row of fill zeros
        at its start (zeros are not a commit). The rows written after the flush then overwrite fill zeros in
        place, straight to the file (at the chunk's address, hdf5_chunk_writes, or through HDF5, which has no
        chunk cache here): once ``_append_index`` returns, the commit is on disk (for other processes too) with
        no second flush, and a failed row write leaves no metadata half-changed.
        """
        end = self._rows + n
        if end > self._index_writer.length:  # the extent: committed rows plus fill rows of the last chunk
            self._index_writer.set_extent((-(-end // INDEX_BLOCK) * INDEX_BLOCK, len(INDEX_FIELDS)))
        while self._index_alloc < end:
            self._index_writer.write_at((self._index_alloc, 0), np.zeros((1, len(INDEX_FIELDS)), np.int64))
            self._index_alloc += INDEX_BLOCK

    def _append_index(self, row: list[int]) -> None:
        """Write the next row of ``/index/steps`` (in a chunk ``_reserve_index`` allocated). ``_rows`` only moves
        on once the write succeeded, so a row that failed is written again at the same place by the next one."""
        i, k = self._rows, len(INDEX_FIELDS)
        self._index_writer.write_at((i, 0), np.asarray(row, np.int64).reshape(1, k))
        self._rows = i + 1

    def mark_dropped(self, step: int, errno: int | None = 0) -> None:
        """Record in the dump that rows of ``step`` were lost because writing them failed.

        The mark is a row of ``/index/steps`` flagged ``FLAG_DROPPED`` that repeats the committed lengths, so
        readers list the step as dropped and no step is renumbered or merged. It is written now if the file
        takes it, else before the next commit (or at close): a full disk refuses the mark as well.
        """
        step = int(step)
        if not -(2 ** 31) <= step < 2 ** 31:
            raise ValueError(f"step {step} does not fit int32")
        self._pending_drops.append((step, FLAG_DROPPED | ((int(errno or 0) & 0xFFFF) << 8)))
        self._flush_drops()

    def _flush_drops(self) -> None:
        """Write the pending dropped-step marks now, if the file takes them (else they stay pending)."""
        if self._file is None or not self._pending_drops:
            return
        with suppress(OSError, RuntimeError, ValueError):
            self._reserve_index(len(self._pending_drops))
            self._flush()
            self._write_drops()

    def _write_drops(self) -> None:
        """Write the pending dropped-step marks into reserved rows of the index."""
        states = [grp.state() for grp in self._groups.values()]
        while self._pending_drops:
            step, flags = self._pending_drops[0]
            self._append_index(commit_row(step, states, self._buffer_ends, flags))
            del self._pending_drops[0]

    def close(self) -> None:
        """Close the file; safe to call twice or after an exception."""
        self._flush_drops()  # the disk may still be full: then the marks are lost with the process
        f, self._file = self._file, None
        if f is not None:
            with suppress(OSError, RuntimeError, ValueError):  # already invalid after an HDF5 error
                f.close()
        self._release()

    def _release(self) -> None:
        """Give back the rank's lock if this writer claimed it (a lock handed in is its owner's to release)."""
        lock, self._own_lock = self._own_lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._file is None else f"{self.steps_written} step(s)"
        return f"DumpWriter({str(self.path)!r}, {state})"
