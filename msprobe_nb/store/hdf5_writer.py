"""Write the kit's own HDF5 dump: one append-only, crash-safe file per rank.

Layout and guarantees are documented in ``docs/hdf5_schema.md``. In short: the calls table is stored
column by column (strings interned as integer ids), whole tensors are packed into a few typed byte
buffers, and every ``write_step`` ends by appending one row to ``/index/steps``. That row is the
commit record: readers only trust data below the extents it names, so a kill between steps loses
nothing and a kill inside a step loses only that step.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import socket
import time
import warnings
import zlib
from collections.abc import Mapping
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5s

try:
    import fcntl
except ImportError:  # Windows: locks are O_EXCL files
    fcntl = None

from msprobe_nb.store.schema import COLUMNS, SCHEMA_VERSION, Coded

__all__ = ["DumpInUseError", "DumpLock", "DumpWriteError", "DumpWriter", "claim_dump_dir", "resolve_dump_dir"]

FORMAT_NAME = "msprobe_nb.dump"
#: Version of the HDF5 arrangement (groups, encodings, index). The calls-table columns carry their
#: own version, ``schema.SCHEMA_VERSION``; a reader needs both to match.
LAYOUT_VERSION = 5
TOOL_NAME = "msprobe_nb"

RANK_FILE_RE = re.compile(r"^rank(\d+)\.h5$")

#: Stored in a nullable Int64 column where the value is <NA>.
INT_NA = np.iinfo(np.int64).min
#: Last column of every committed ``/index/steps`` row ("mspb"); a row of fill zeros is not a commit.
COMMIT_MAGIC = 0x6D737062
TENSOR_WIDTHS = (1, 2, 4, 8)

#: Columns the writer derives itself: ``step`` from the index, ``rank`` from the file.
DERIVED_COLUMNS = ("step", "rank")
STORED_COLUMNS = [c for c in COLUMNS if c not in DERIVED_COLUMNS]

#: schema dtype -> (on-disk numpy dtype, encoding name written as the dataset's ``encoding`` attr).
ENCODINGS: dict[str, tuple[str, str]] = {
    "string": ("int32", "string_id"),
    "int32": ("int32", "int32"),
    "int64": ("int64", "int64"),
    "float64": ("float64", "float64"),
    "bool": ("uint8", "bool"),
    "Int64": ("int64", "nullable_int64"),
    "boolean": ("int8", "nullable_bool"),
    "object": ("int32", "shape_id"),
}

#: Append-only tables. Each group's columns grow together: group -> (rows per chunk, {dataset: dtype}).
GROUPS: dict[str, tuple[int, dict[str, str]]] = {
    "calls": (1 << 12, {f"calls/{c}": ENCODINGS[COLUMNS[c][0]][0] for c in STORED_COLUMNS}),
    "strings": (1 << 12, {"strings/ends": "int64"}),
    "string_bytes": (1 << 16, {"strings/bytes": "uint8"}),
    "shapes": (1 << 10, {"shapes/ends": "int64"}),
    "shape_dims": (1 << 10, {"shapes/dims": "int64"}),
    "stacks": (1 << 10, {"stacks/id": "int32", "stacks/ends": "int64"}),
    "stack_frames": (1 << 12, {"stacks/frames": "int32"}),
    "construct": (1 << 12, {"construct/step": "int32", "construct/call": "int32", "construct/parent": "int32"}),
    "tensors": (1 << 10, {"tensors/name": "int32", "tensors/step": "int32", "tensors/buffer": "uint8",
                          "tensors/offset": "int64", "tensors/count": "int64", "tensors/dtype": "int32",
                          "tensors/shape": "int32"}),
}
#: Columns of the ``/index/steps`` rows of layouts 1-3: the step; per group its committed length and tail
#: slot; the committed length of each tensor buffer; the commit marker.
INDEX_FIELDS_V3 = (["step"] + [x for g in GROUPS for x in (g, f"{g}_slot")]
                   + [f"u{w}" for w in TENSOR_WIDTHS] + ["commit"])
#: Layout 4 added ``flags`` (what happened to the step, ``FLAG_*``) before the marker.
INDEX_FIELDS_V4 = INDEX_FIELDS_V3[:-1] + ["flags", "commit"]
#: Layout 5 adds, per group, the crc32 of its committed tail rows (``<group>_crc``), and ``crc``: the crc32 of
#: the row's fields before it (little-endian int64), so readers detect damaged bytes instead of using them.
INDEX_FIELDS = INDEX_FIELDS_V4[:-1] + [f"{g}_crc" for g in GROUPS] + ["crc", "commit"]
#: ``flags`` bit: the row is no data, it marks that rows of its step were lost because writing them failed
#: (the row repeats the previous commit's lengths); bits 8-23 hold the failure's errno (0: not an OSError).
FLAG_DROPPED = 1
#: ``flags`` bit: the step's recording was cut short by an exception in the user's code (``stop()`` called
#: while it was being handled, or ``record()`` left by one): its rows are what was recorded until then.
FLAG_PARTIAL = 2
TENSOR_CHUNK_BYTES = 1 << 20  # bytes per chunk of a tensor buffer; each step starts a fresh chunk
#: Rows per chunk of ``/index/steps``; its extent grows a whole chunk at a time (fill rows are not commits).
INDEX_BLOCK = 256
#: Longest column whose conversion is remembered for the next step (``DumpWriter._recall``).
MEMO_ROWS = 4096


class DumpWriteError(OSError):
    """A step could not be written (a full disk, an I/O error): its rows are dropped and the dump marks it.

    ``errno`` is the failure's (``errno.ENOSPC`` for a full disk), ``step`` the step lost, ``path`` the file.
    Later steps keep their numbers: a step is never written under another step's number.
    """

    def __init__(self, code: int | None, message: str, step: int, path: str) -> None:
        super().__init__(code, message)
        self.step, self.path = step, path


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(TOOL_NAME)
    except PackageNotFoundError:  # running from a checkout
        import msprobe_nb

        return str(getattr(msprobe_nb, "__version__", "0+unknown"))


def _holds_dump(path: Path) -> list[Path]:
    """The kit rank files directly inside ``path`` (empty if none or not a directory)."""
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if RANK_FILE_RE.match(p.name) and p.is_file())


class DumpInUseError(FileExistsError):
    """Another live process writes this rank of the dump folder (it holds ``rank<N>.lock`` there)."""


def _lock_path(dump_dir: Path, rank: int) -> Path:
    return dump_dir / f"rank{rank}.lock"


def _holder(lock: Path) -> str:
    """Who holds ``lock``, from what it wrote into it (``pid 123 on host``)."""
    try:
        info = json.loads(lock.read_text(encoding="utf-8") or "{}")
        return f"pid {int(info['pid'])} on {info.get('host', '?')}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that did not say which (no pid in the lock file yet)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True


class DumpLock:
    """The claim of one rank of a dump folder: ``<folder>/rank<N>.lock``, held while a process writes it.

    With ``fcntl`` the file is held with ``flock``, which the system drops when the holder dies, so the lock
    of a killed run is simply taken over; the file holds the holder's pid and host, for error messages.
    ``release()`` removes it. Without ``fcntl`` (Windows) it is an ``O_EXCL`` file, taken over when its pid
    is dead on this host.
    """

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self._fd = path, fd

    @classmethod
    def claim(cls, dump_dir: str | Path, rank: int = 0) -> DumpLock:
        """Claim rank ``rank`` of ``dump_dir`` (which must exist); DumpInUseError if a live process holds it."""
        path = _lock_path(Path(dump_dir), int(rank))
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        if fcntl is None:
            return cls._claim_excl(path, me)
        busy = 0
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
                busy += 1
                if busy < 5:  # another process may only be checking whether it is held (lock_held)
                    time.sleep(0.01)
                    continue
                raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r} is in use: rank {rank} is "
                                     f"being written by {_holder(path)} (lock {path.name}); pass another "
                                     "dump_path, or on_exists='new' to write beside it") from None
            try:  # its holder may have released (unlinked) it between our open and our flock: retry
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, me)
            return cls(path, fd)

    @classmethod
    def _claim_excl(cls, path: Path, me: bytes) -> DumpLock:
        for _ in range(3):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    info = json.loads(path.read_text(encoding="utf-8"))
                    stale = info.get("host") == socket.gethostname() and not _pid_alive(int(info["pid"]))
                except (OSError, ValueError, KeyError, TypeError):
                    stale = False
                if stale:
                    path.unlink(missing_ok=True)
                    continue
                raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r} is in use: being written by "
                                     f"{_holder(path)} (lock {path.name})") from None
            os.write(fd, me)
            os.close(fd)
            return cls(path, None)
        raise DumpInUseError(errno.EEXIST, f"dump path {str(path.parent)!r}: cannot take over {path.name}")

    def release(self) -> None:
        """Give the rank back (remove the lock file). Safe to call twice."""
        path, self.path = self.path, None
        if path is None:
            return
        with suppress(OSError):
            path.unlink()
        if self._fd is not None:
            with suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __repr__(self) -> str:
        return f"DumpLock({str(self.path)!r})" if self.path else "DumpLock(released)"


def lock_held(dump_dir: Path, rank: int) -> bool:
    """Whether a live process, this one included, holds rank ``rank`` of ``dump_dir``. (``flock`` locks belong
    to an open file, so this process's own lock shows too; the check holds a shared lock for a moment, which
    ``DumpLock.claim`` allows for by trying again.)"""
    path = _lock_path(dump_dir, rank)
    if fcntl is None:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            return info.get("host") != socket.gethostname() or _pid_alive(int(info["pid"]))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError):
            return True
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock at once
    return False


def _unusable(path: Path, e: OSError) -> OSError:
    """The OSError (same errno, so the same subclass) saying why the dump folder ``path`` cannot be used."""
    up = path
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        why = f"{str(up)!r} is a file, not a folder"
    elif e.errno == errno.EROFS:
        why = f"{str(up)!r} is on a read-only file system"
    elif e.errno in (errno.EACCES, errno.EPERM):
        why = f"{str(up)!r} is not writable (permission denied)"
    else:
        why = os.strerror(e.errno) if e.errno else str(e)
    return OSError(e.errno, f"dump path {str(path)!r} cannot be used: {why}")


def claim_dump_dir(path: str | Path, on_exists: str = "new", rank: int = 0) -> tuple[Path, DumpLock, bool]:
    """Pick the directory a new dump goes to, create it and claim rank ``rank`` of it, atomically.

    A path is taken when it holds rank*.h5 files (a dump), or when a live process holds the rank (it is
    writing there and has no file yet). ``on_exists`` says what to do then: ``"new"`` uses the next free
    sibling ``<path>_1``, ``<path>_2``... (with a warning); ``"error"`` raises FileExistsError (DumpInUseError
    when a process holds it); ``"overwrite"`` deletes the old rank files (with a warning) but never one a
    live process writes: DumpInUseError for this rank, other ranks' files are kept. Returns the directory,
    the lock (release it when done) and whether the directory was created.
    """
    if on_exists not in ("new", "error", "overwrite"):
        raise ValueError(f"on_exists must be 'new', 'error' or 'overwrite', not {on_exists!r}")
    base = path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"dump path {str(path)!r} exists and is not a directory")
    i = 0
    while True:
        old = _holds_dump(path)
        if old and on_exists == "error":
            live = (f", rank {rank} being written now by {_holder(_lock_path(path, rank))}"
                    if lock_held(path, rank) else "")
            raise FileExistsError(
                f"dump path {str(path)!r} already holds a dump ({', '.join(p.name for p in old[:4])}"
                f"{', ...' if len(old) > 4 else ''}{live}); pass on_exists='new' or 'overwrite', or another path")
        if not (old and on_exists == "new"):
            created = not path.exists()
            try:
                path.mkdir(parents=True, exist_ok=True)
                lock = DumpLock.claim(path, rank)
            except DumpInUseError:
                if on_exists != "new":
                    raise
            except OSError as e:
                raise _unusable(path, e) from None
            else:
                break
        while True:  # the next sibling that is not a file
            i += 1
            path = base.with_name(f"{base.name}_{i}")
            if not path.exists() or path.is_dir():
                break
    if old and on_exists == "overwrite":
        kept = []
        for p in old:
            r = int(RANK_FILE_RE.match(p.name).group(1))
            if r != rank and lock_held(path, r):
                kept.append(p.name)  # another rank, being written now: not an old dump
            else:
                p.unlink()
        warnings.warn(f"deleted the old dump in {str(path)!r} ({len(old) - len(kept)} rank file(s))"
                      + (f"; kept {', '.join(kept)}, being written by live processes" if kept else ""), stacklevel=2)
    if path != base:
        warnings.warn(f"dump path {str(base)!r} already holds a dump or is in use; writing to {str(path)!r} "
                      "instead", stacklevel=2)
    return path, lock, created


def resolve_dump_dir(path: str | Path, on_exists: str = "new") -> Path:
    """The directory ``claim_dump_dir`` picks for rank 0, created, without keeping the claim.

    Another process may take it before a writer opens it: ``claim_dump_dir`` keeps the claim.
    """
    path, lock, _ = claim_dump_dir(path, on_exists)
    lock.release()
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _as_1d(values: Any, col: str, n: int | None) -> Any:
    """Length check; returns ``values`` unchanged (lists stay lists)."""
    try:
        m = len(values)
    except TypeError:
        raise ValueError(f"column {col!r}: expected a list or 1-D array, got {type(values).__name__}") from None
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise ValueError(f"column {col!r}: expected a 1-D array, got shape {values.shape}")
    if n is not None and m != n:
        raise ValueError(f"column {col!r} has {m} values, other columns have {n}")
    return values


def _as_list(values: Any) -> list:
    """Plain Python values of a column (list, tuple, numpy array, pandas Series/Index/array)."""
    if isinstance(values, list):
        return values
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else list(values)


def _is_missing(v: Any) -> bool:
    """None, NaN or pandas' NA (recognised by type name: the writer does not import pandas)."""
    return v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"


def _nullable(values: Any, n: int, na: int, dtype: Any, cast: Any) -> np.ndarray:
    """A nullable column as numpy: missing values become ``na``."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        missing = np.isnan(values)
        return np.where(missing, na, np.where(missing, 0, values)).astype(dtype)
    return np.fromiter((na if _is_missing(v) else cast(v) for v in _as_list(values)), dtype, count=n)


def _exact_int(v: Any) -> int:
    """An integer value; a float must be whole (1.0 is 1, 1.5 is an error)."""
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


class _Group:
    """Columns that grow together, stored so that committed bytes are never rewritten.

    Whole chunks go to the compressed main dataset of each column (``/calls/max``), each written exactly
    once. The last, partial chunk lives in one uncompressed two-slot tail per group (``/tail/calls``, bytes
    of shape (2, chunk, record size)): each row there is one packed little-endian record of all the group's
    columns, laid out as the tail's ``columns`` attribute says. New rows are written after the committed
    ones in the current slot, and when a chunk fills up the leftover rows go to the other slot. A kill
    therefore never damages what the last commit points to, and a step costs one tail write per group
    (a record row is contiguous in the chunk: one write of one piece, where a tail per dtype took five).
    """

    def __init__(self, f: h5py.File, name: str, chunk: int, columns: dict[str, str], filt: dict[str, Any]) -> None:
        self.name, self.chunk = name, chunk
        self.main: dict[str, h5py.Dataset] = {}
        for path, dtype in columns.items():
            self.main[path] = f.create_dataset(  # fletcher32: HDF5 checks every (compressed) chunk it reads
                path, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(chunk,), shuffle=True, **filt,
                fletcher32=True, track_times=False)
        self.record = np.dtype([(path, np.dtype(dtype).newbyteorder("<")) for path, dtype in columns.items()])
        size = self.record.itemsize
        self.tail = f.create_dataset(f"tail/{name}", shape=(2, chunk, size), dtype="uint8", chunks=(1, chunk, size),
                                     track_times=False)
        self.tail.attrs["columns"] = json.dumps([[p, self.record[p].str] for p in columns])
        # committed length, tail slot, and crc32 of the committed rows of that slot (their record bytes)
        self.length, self.slot, self.crc = 0, 0, 0
        # the rows of each tail slot, as records: appended in place, so a step never copies the older rows
        self.bufs = (np.empty(chunk, self.record), np.empty(chunk, self.record))

    def state(self) -> tuple[int, int, int]:
        return self.length, self.slot, self.crc

    def stage(self, data: dict[str, np.ndarray]) -> tuple[int, int, int]:
        """Write ``data`` beyond the committed rows; returns the state to commit.

        Only rows past the committed ones are touched, in the file and in ``bufs``, so a step that fails
        after staging leaves the committed state as it was. The tail's crc32 goes on from the committed
        rows' (only the new bytes are summed).
        """
        n = len(next(iter(data.values())))
        c, t = self.chunk, self.length % self.chunk
        if t + n < c:
            rec = self.bufs[self.slot][t:t + n]
            for p in self.record.names:
                rec[p] = data[p]
            if not n:
                return self.length, self.slot, self.crc
            raw = rec.view(np.uint8).reshape(n, self.record.itemsize)
            _write_tail(self.tail, self.slot, t, raw)
            return self.length + n, self.slot, zlib.crc32(raw, self.crc)
        # Whole chunks go to the main datasets one column at a time (a large step never holds a second copy
        # of all its columns); only the leftover rows are packed, into the other slot.
        full = (t + n) // c * c
        prev, rest = self.bufs[self.slot][:t], self.bufs[1 - self.slot][:t + n - full]
        base = self.length - t
        for p, ds in self.main.items():
            col = np.concatenate([prev[p], np.asarray(data[p], ds.dtype)])
            _append_main(ds, base, col[:full])
            rest[p] = col[full:]
        raw = rest.view(np.uint8).reshape(len(rest), self.record.itemsize)
        if len(rest):
            _write_tail(self.tail, 1 - self.slot, 0, raw)
        return self.length + n, 1 - self.slot, zlib.crc32(raw)

    def commit(self, state: tuple[int, int, int]) -> None:
        self.length, self.slot, self.crc = state


def _write_at(ds: h5py.Dataset, start: tuple[int, ...], block: np.ndarray) -> None:
    """``ds[start : start + block.shape] = block`` through h5py's low-level API: the per-step path, about
    3x cheaper than a high-level slice assignment (which rebuilds a selection per call)."""
    fspace = ds.id.get_space()
    fspace.select_hyperslab(start, block.shape)
    ds.id.write(h5s.create_simple(block.shape), fspace, np.ascontiguousarray(block, dtype=ds.dtype))


def _append_main(ds: h5py.Dataset, base: int, arr: np.ndarray) -> None:
    """``ds.resize(base + n); ds[base:] = arr`` (whole chunks, each written once).

    The extent only grows: a step that failed may have grown it further, and its rows are simply
    written again (nothing past the committed length is trusted by readers)."""
    if base + len(arr) > ds.id.shape[0]:
        ds.id.set_extent((base + len(arr),))
    _write_at(ds, (base,), arr)


def _write_tail(ds: h5py.Dataset, slot: int, start: int, raw: np.ndarray) -> None:
    """``ds[slot, start:start + n] = raw``, the records' bytes ``(n, record size)`` (one contiguous piece of the
    slot's chunk)."""
    _write_at(ds, (slot, start, 0), raw.reshape(1, *raw.shape))


def plain_attr(v: Any, errors: str = "surrogateescape") -> Any:
    """An attribute value as plain JSON: text, numbers, lists. The digest decodes losslessly (a damaged byte
    must change it); the reader decodes with ``errors="replace"`` to show text."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors)
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def attrs_digest(f: h5py.File) -> int:
    """crc32 of the attributes readers rely on: every root attribute but ``attrs_crc`` itself, the record layout
    of each tail and the index's fields. Text attributes live in HDF5's global heap, which carries no checksum
    of its own; ``attrs_crc`` (root, layout 5) lets a reader tell a damaged one from what was written."""
    items = [["/", k, plain_attr(f.attrs[k])] for k in sorted(f.attrs) if k != "attrs_crc"]
    items += [[f"tail/{g}", "columns", plain_attr(f[f"tail/{g}"].attrs["columns"])] for g in GROUPS]
    items.append(["index/steps", "fields", plain_attr(f["index/steps"].attrs["fields"])])
    return zlib.crc32(json.dumps(items, sort_keys=True, ensure_ascii=True, default=str).encode())


def _commit_row(step: int, states: list[tuple[int, int, int]], ends: Mapping[int, int], flags: int) -> list[int]:
    """A row of ``/index/steps`` (``INDEX_FIELDS``): the groups' states, tensor buffer ends, flags, tail crcs,
    then the crc32 of all that and the commit marker."""
    row = [step]
    for length, slot, _ in states:
        row += (length, slot)
    row += [ends[w] for w in TENSOR_WIDTHS]
    row.append(flags)
    row += [crc for _, _, crc in states]
    row.append(zlib.crc32(np.asarray(row, "<i8").tobytes()))
    row.append(COMMIT_MAGIC)
    return row


def _write_packed(ds: h5py.Dataset, start: int, arrays: list[np.ndarray], chunk: int) -> None:
    """Write ``arrays`` back to back from ``start`` (a chunk boundary), one whole chunk per write.

    Small arrays are gathered until they fill a chunk; large ones are written from views. No chunk is
    written twice and at most one chunk is copied at a time.
    """
    pos, pieces, filled = start, [], 0
    for a in arrays:
        if filled and filled + len(a) >= chunk:
            need = chunk - filled
            ds[pos:pos + chunk] = np.concatenate([*pieces, a[:need]])
            pos, pieces, filled, a = pos + chunk, [], 0, a[need:]
        if not filled:
            cut = len(a) // chunk * chunk
            if cut:
                ds[pos:pos + cut] = a[:cut]
                pos, a = pos + cut, a[cut:]
        if len(a):
            pieces.append(a)
            filled += len(a)
    if filled:
        ds[pos:pos + filled] = np.concatenate(pieces)


class DumpWriter:
    """Append steps of the calls table (plus stacks, module tree and tensors) to ``dump_dir/rank{rank}.h5``.

    ``write_step`` converts and validates everything first, then appends, flushes, and finally
    appends the commit row; after it returns the step is durable. ``swmr=True`` (the default) opens
    the file in HDF5 single-writer/multiple-reader mode, so a notebook can read a running dump and a
    kill inside ``write_step`` leaves the earlier steps readable. ``compression`` (tables and tensors,
    always with the shuffle filter) is ``"lzf"`` (fast, h5py only) or a gzip level 0-9 (any HDF5 reader).
    ``tensor_compression`` overrides it for the whole-tensor buffers; ``None`` stores them uncompressed,
    several times faster to write (activations compress only to about 0.8 of their size).
    """

    def __init__(self, dump_dir: str | Path, rank: int = 0, meta: Mapping[str, Any] | None = None, *,
                 swmr: bool = True, compression: str | int = "lzf",
                 tensor_compression: str | int | None = "same", lock: DumpLock | None = None) -> None:
        self.rank = int(rank)
        self.dump_dir = Path(dump_dir)
        self.path = self.dump_dir / f"rank{self.rank}.h5"
        self._file: h5py.File | None = None
        self._own_lock: DumpLock | None = None
        if compression == "lzf":
            filt: dict[str, Any] = {"compression": "lzf"}
        elif isinstance(compression, int) and not isinstance(compression, bool) and 0 <= compression <= 9:
            filt = {"compression": "gzip", "compression_opts": compression}
        else:
            raise ValueError(f"compression must be 'lzf' or a gzip level 0-9, not {compression!r}")
        meta_json = json.dumps(dict(meta or {}), default=_json_default, ensure_ascii=False)
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
            a["tool_version"] = _tool_version()
            a["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            a["rank"] = self.rank
            a["meta"] = meta_json
            a["columns"] = json.dumps(STORED_COLUMNS)
            a["h5py_version"] = h5py.version.version
            a["hdf5_version"] = h5py.version.hdf5_version
            self._groups = {g: _Group(f, g, chunk, cols, filt) for g, (chunk, cols) in GROUPS.items()}
            for col in STORED_COLUMNS:
                enc = ENCODINGS[COLUMNS[col][0]][1]
                f[f"calls/{col}"].attrs["encoding"] = enc
                if enc == "nullable_int64":
                    f[f"calls/{col}"].attrs["na_value"] = INT_NA
            if tensor_compression == "same":
                tfilt = dict(filt, shuffle=True)
            elif tensor_compression is None:
                tfilt = {"shuffle": False}
            elif tensor_compression == "lzf":
                tfilt = {"compression": "lzf", "shuffle": True}
            elif isinstance(tensor_compression, int) and 0 <= tensor_compression <= 9:
                tfilt = {"compression": "gzip", "compression_opts": tensor_compression, "shuffle": True}
            else:
                raise ValueError("tensor_compression must be 'same', None, 'lzf' or a gzip level 0-9, "
                                 f"not {tensor_compression!r}")
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
        # Interning state. Ids below the committed counts are on disk; the rest are pending.
        self._strings: dict[str, int] = {"": 0}
        self._new_strings: list[str] = [""]
        # shape -> id; None (no shape) -> -1 too, so a column converts with one map()
        self._shape_ids: dict[tuple[int, ...] | None, int] = {None: -1}
        self._new_shapes: list[tuple[int, ...]] = []
        self._stack_ids: set[int] = set()
        self._buffer_ends = dict.fromkeys(TENSOR_WIDTHS, 0)
        self._index_rows = 0  # extent of /index/steps: committed rows plus fill rows of the last chunk
        self._rows = 0  # rows of /index/steps written: commits and dropped-step marks
        self._index_alloc = 0  # rows of /index/steps in allocated chunks (a multiple of INDEX_BLOCK)
        self._pending_drops: list[tuple[int, int]] = []  # (step, flags) marks the disk has not taken yet
        # column -> (values, ids) of the last committed step, and this step's, committed with it
        self._memo: dict[str, tuple[Any, np.ndarray]] = {}
        self._memo_new: dict[str, tuple[Any, np.ndarray]] = {}
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
        for s in self._new_shapes:
            if self._shape_ids.get(s, -1) >= self._groups["shapes"].length:  # not committed after all
                del self._shape_ids[s]
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

    def _string_ids(self, col: str, values: Any) -> np.ndarray:
        got = self._recall(col, values)
        if got is not None:
            return got
        vals = _as_list(values)
        ids = list(map(self._strings.get, vals))  # known strings without a Python-level loop
        try:  # all known: no scan for None first (a scan costs as much as the conversion)
            return self._remember(col, values, np.asarray(ids, dtype=np.int32))
        except TypeError:  # new strings, or missing values (stored as "")
            pass
        for i in [i for i, k in enumerate(ids) if k is None]:
            v = vals[i]
            ids[i] = 0 if _is_missing(v) else self._intern(v if type(v) is str else str(v))
        return np.asarray(ids, dtype=np.int32)

    def _shape_column(self, values: Any) -> np.ndarray:
        got = self._recall("shape", values)
        if got is not None:
            return got
        vals = _as_list(values)
        try:  # known shapes without a Python-level loop
            ids = list(map(self._shape_ids.get, vals))
        except TypeError:  # unhashable entries (lists): all through the loop below
            ids = [None] * len(vals)
        try:  # all known: no scan for None first
            return self._remember("shape", values, np.asarray(ids, dtype=np.int32))
        except TypeError:
            pass
        for i, (s, k) in enumerate(zip(vals, ids)):
            if k is not None:
                continue
            if _is_missing(s):
                ids[i] = -1
            else:
                try:
                    ids[i] = self._shape_id(s)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"column 'shape' row {i}: not a tuple of ints or None: {s!r} ({e})") from None
        return np.asarray(ids, dtype=np.int32)

    def _convert(self, col: str, values: Any, n: int) -> np.ndarray:
        if isinstance(values, Coded):  # convert each distinct value once, then repeat by code
            codes = np.asarray(values.codes)
            m = len(values.values)
            if codes.dtype.kind not in "iu" or (codes.size and (codes.min() < 0 or codes.max() >= m)):
                raise ValueError(f"column {col!r}: codes must be integers in [0, {m})")
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
                        vals = _as_list(values)
                        if any(_is_missing(v) for v in vals):
                            raise ValueError("missing values in a non-nullable integer column")
                        arr = np.asarray([int(v) for v in vals], dtype=np.int64)
                info = np.iinfo(dtype)
                if arr.size and (arr.min() < info.min or arr.max() > info.max):
                    raise ValueError(f"values out of {dtype} range")
                return self._remember(col, values, arr.astype(dtype, copy=False))
            if dtype == "float64":
                try:
                    return np.asarray(values, dtype=np.float64)
                except (TypeError, ValueError):
                    return np.fromiter((np.nan if _is_missing(v) else float(v) for v in _as_list(values)),
                                       np.float64, count=n)
            if dtype == "bool":
                arr = np.asarray(values)
                if arr.dtype != bool:
                    arr = np.fromiter((False if _is_missing(v) else bool(v) for v in values), bool, count=n)
                return arr.astype(np.uint8)
            if dtype == "Int64":
                arr = np.asarray(values) if isinstance(values, np.ndarray) else None
                if arr is None or arr.dtype.kind not in "iu":
                    return _nullable(values, n, INT_NA, np.int64, _exact_int)
                arr = arr.astype(np.int64)
                if arr.size and arr.min() == INT_NA:
                    raise ValueError(f"value {INT_NA} is reserved for <NA>")
                return arr
            if dtype == "boolean":
                return _nullable(values, n, -1, np.int8, bool)
        except ValueError as e:
            raise ValueError(f"column {col!r}: {e}") from None
        except TypeError as e:
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
    def _tensor_bytes(self, name: str, t: Any) -> tuple[int, np.ndarray, str, tuple[int, ...]]:
        import torch

        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"tensor {name!r}: layout {t.layout} is not supported (convert to dense first)")
        if t.is_quantized:
            raise TypeError(f"tensor {name!r}: quantized tensors are not supported (dequantize first)")
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()
        width = min(t.element_size(), 8)
        raw = t.reshape(-1).view(torch.uint8).numpy()
        return width, raw.view(f"uint{8 * width}"), str(t.dtype), tuple(t.shape)

    # -- writing -----------------------------------------------------------------------------
    def write_step(self, step: int, columns: Mapping[str, Any], stacks: Mapping[int, list[str]] | None = None,
                   construct: Mapping[str, str | None] | None = None,
                   tensors: Mapping[str, Any] | None = None, *, partial: bool = False) -> None:
        """Append one step and make it durable; raises ValueError/TypeError before writing on bad input.

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
            _as_1d(values, col, n)
            n = len(values)
        n = n or 0
        for col, want in (("step", step), ("rank", self.rank)):
            if col in columns:
                vals = np.asarray(columns.pop(col))
                if vals.size and not np.all(vals == want):
                    raise ValueError(f"column {col!r} disagrees with the writer ({col}={want}); leave it out")
        cols = {c: self._convert(c, columns[c], n) if c in columns else self._default(c, n) for c in STORED_COLUMNS}

        new_stacks = []
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
        con_parent = np.where(np.fromiter(map(_is_missing, parents), bool, len(parents)), -1,
                              self._string_ids("construct/parent", parents)).astype(np.int32)

        tens = []
        for name, t in tensors.items():
            width, data, dtype, shape = self._tensor_bytes(str(name), t)
            tens.append((self._intern(str(name)), width, data, self._intern(dtype), self._shape_id(shape)))
        return {"n": n, "cols": cols, "stacks": new_stacks, "construct": (con_call, con_parent), "tensors": tens}

    def _write(self, step: int, p: dict[str, Any], flags: int = 0) -> None:
        f, g = self._file, self._groups
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
                if ends[w] > ds.id.shape[0]:  # only grows: a failed step may have grown it already
                    ds.id.set_extent((ends[w],))
                _write_packed(ds, start, [d for _, d, _, _ in parts], chunk)
            k = len(rows["name"])
            cols = {f"tensors/{key}": np.asarray(v, GROUPS["tensors"][1][f"tensors/{key}"]) for key, v in rows.items()}
            cols["tensors/step"] = np.full(k, step, np.int32)
            staged["tensors"] = g["tensors"].stage(cols)
        # The index rows this step writes (its commit, marks of steps dropped before it) land in chunks that
        # exist before the flush, so writing them changes no metadata: the commit row is one in-place write.
        self._reserve_index(len(self._pending_drops) + 1)
        f.flush()
        self._write_drops()  # steps dropped before this one, with the lengths they left (the committed ones)
        # Commit: one index row naming every table's extent; a reader ignores anything beyond it.
        row = _commit_row(step, [staged.get(name) or grp.state() for name, grp in g.items()], ends, flags)
        i = self._rows
        try:
            self._append_index(row)
        finally:  # once the row is in the file the step is committed, whatever interrupts us now
            if self._rows > i:
                for name, state in staged.items():
                    g[name].commit(state)
                self._buffer_ends = ends
                self._stack_ids.update(sid for sid, _ in p["stacks"])

    def _reserve_index(self, n: int) -> None:
        """Make sure the next ``n`` rows of ``/index/steps`` lie in allocated chunks (before the flush).

        The extent grows a whole chunk at a time, and a chunk is allocated by writing a row of fill zeros
        at its start (zeros are not a commit). The rows written after the flush then overwrite fill zeros in
        place, and with no chunk cache HDF5 hands them straight to the file: once ``_append_index`` returns,
        the commit is on disk (for other processes too) with no second flush, and a failed row write leaves
        no metadata half-changed.
        """
        end = self._rows + n
        if end > self._index_rows:
            rows = -(-end // INDEX_BLOCK) * INDEX_BLOCK
            self._index.id.set_extent((rows, len(INDEX_FIELDS)))
            self._index_rows = rows
        while self._index_alloc < end:
            _write_at(self._index, (self._index_alloc, 0), np.zeros((1, len(INDEX_FIELDS)), np.int64))
            self._index_alloc += INDEX_BLOCK

    def _append_index(self, row: list[int]) -> None:
        """Write the next row of ``/index/steps`` (in a chunk ``_reserve_index`` allocated). ``_rows`` only moves
        on once the write succeeded, so a row that failed is written again at the same place by the next one."""
        i, k = self._rows, len(INDEX_FIELDS)
        _write_at(self._index, (i, 0), np.asarray(row, np.int64).reshape(1, k))
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
            self._file.flush()
            self._write_drops()

    def _write_drops(self) -> None:
        """Write the pending dropped-step marks into reserved rows of the index."""
        states = [grp.state() for grp in self._groups.values()]
        while self._pending_drops:
            step, flags = self._pending_drops[0]
            self._append_index(_commit_row(step, states, self._buffer_ends, flags))
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
