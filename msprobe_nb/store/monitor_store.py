"""The monitor's HDF5 record: one append-only file per rank, ``<folder>/monitor_rank<N>.h5``.

Each step appends its rows (one per parameter or module and kind: the aggregates in ``rows/values``), its
scalars (loss, grad norm, learning rates, loss scale) and, when recorded, its gradients' sign bitmaps, then
flushes, then writes one row of ``/index/steps`` naming the extent of every table: the commit. A reader trusts
nothing beyond the last commit, so a killed run keeps every finished step and a step cut short is never read.
The file is in HDF5's single-writer / multiple-reader mode, so it can be read while the run goes on.

The data is stored without compression: appending into a chunk that holds committed rows then rewrites
only the new elements, never the committed bytes. docs/monitor.md describes the layout.
"""
from __future__ import annotations

import errno
import json
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import h5py
import numpy as np

from msprobe_nb.store.checksums import crc32
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_appends import DatasetWriter
from msprobe_nb.store.hdf5_open import open_rank_file
from msprobe_nb.store.monitor_schema import KINDS

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # Windows: no lock (one writer per rank is then the user's business)
    fcntl = None

__all__ = ["FORMAT", "KINDS", "LAYOUT_VERSION", "MonitorInUseError", "MonitorWriter", "monitor_files", "read_monitor"]

FORMAT = "msprobe_nb.monitor"
LAYOUT_VERSION = 1
FILE_RE = re.compile(r"^monitor_rank(\d+)\.h5$")
#: fields of an ``/index/steps`` row: the step, the committed length of each table, a crc32 of those, a marker
INDEX_FIELDS = ("step", "rows", "scalars", "signs", "sign_bytes", "names", "name_bytes", "crc", "commit")
COMMIT_MAGIC = 0x6D736D6E  # "msmn"; a row of fill zeros is not a commit
INDEX_BLOCK = 256
#: append-only tables: dataset -> (dtype, rows per chunk, columns or None for one-dimensional). ``rows`` holds
#: (name id, kind, then the file's ``columns``); ``scalars`` (name id, value); ``signs/index`` (row, numel)
_TABLES = {"names/ends": ("int64", 1024, None), "names/bytes": ("uint8", 1 << 16, None),
           "rows": ("float64", 2048, "rows"), "scalars": ("float64", 1024, 2), "signs/index": ("int64", 1024, 2),
           "signs/bytes": ("uint8", 1 << 20, None)}


class MonitorInUseError(FileExistsError):
    """Another live process writes this rank of the monitor folder."""


def monitor_files(folder: str | Path) -> list[tuple[int, Path]]:
    """(rank, path) of every monitor file directly in ``folder``, by rank."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := FILE_RE.match(p.name)) and p.is_file()]
    return sorted(found)


def _crc(row: Sequence[int]) -> int:
    return crc32(np.asarray(row, "<i8").tobytes())


class _Lock:
    """``monitor_rank<N>.lock``, held with ``flock`` while a process writes the rank (the system drops it
    when the process dies, so a killed run's folder is simply taken over)."""

    def __init__(self, folder: Path, rank: int) -> None:
        self.path, self._fd = folder / f"monitor_rank{rank}.lock", None
        if fcntl is None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise MonitorInUseError(errno.EEXIST, f"monitor folder {str(folder)!r}: rank {rank} is being "
                                        "written by another live process; pass another dump_path") from None
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with suppress(OSError):
                self.path.unlink()
            os.close(fd)


def _claim(folder: Path, rank: int, on_exists: str) -> tuple[Path, _Lock]:
    """The folder this rank writes to (created) and its lock, after ``on_exists`` ('new', 'error', 'overwrite')."""
    if on_exists not in ("new", "error", "overwrite"):
        raise ValueError(f"on_exists must be 'new', 'error' or 'overwrite', not {on_exists!r}")
    base, i = folder, 0
    while True:
        if folder.exists() and not folder.is_dir():
            raise FileExistsError(f"monitor path {str(folder)!r} exists and is not a folder")
        target = folder / f"monitor_rank{rank}.h5"
        if target.exists() and on_exists == "error":
            raise FileExistsError(f"monitor folder {str(folder)!r} already holds {target.name}; pass "
                                  "on_exists='new' or 'overwrite', or another dump_path")
        if not (target.exists() and on_exists == "new"):
            folder.mkdir(parents=True, exist_ok=True)
            try:
                lock = _Lock(folder, rank)
            except MonitorInUseError:
                if on_exists != "new":
                    raise
            else:
                if target.exists():
                    target.unlink()
                    warnings.warn(f"deleted the old monitor record {str(target)!r}", stacklevel=3)
                break
        i += 1
        folder = base.with_name(f"{base.name}_{i}")
    if folder != base:
        warnings.warn(f"monitor path {str(base)!r} already holds rank {rank}'s record or is in use; writing to "
                      f"{str(folder)!r} instead", stacklevel=3)
    return folder, lock


class MonitorWriter:
    """Append monitor steps to ``<folder>/monitor_rank<rank>.h5``; ``write_step`` returns once the step is
    committed. ``columns`` names the columns of ``rows/values`` (fixed for the file); ``meta`` is kept as JSON."""

    def __init__(self, folder: str | Path, rank: int, columns: Sequence[str], meta: Mapping[str, Any] | None = None,
                 on_exists: str = "new") -> None:
        self.rank, self.columns = int(rank), list(columns)
        self.folder, self._lock = _claim(Path(folder).expanduser(), self.rank, on_exists)
        self.path = self.folder / f"monitor_rank{self.rank}.h5"
        self._f = None
        try:
            self._create(dict(meta or {}))
        except BaseException:
            self._lock.release()
            raise
        self._names: dict[str, int] = {}
        self._kind = {k: i for i, k in enumerate(KINDS)}
        self._len = dict.fromkeys(_TABLES, 0)
        self._last: tuple | None = None  # (names, ids, kinds, ids) of the last step: most steps repeat them
        self._last_scalars: tuple | None = None  # (scalar names, their ids) of the last step
        self._index_alloc = self._commits = 0
        self.steps_written = 0

    def _create(self, meta: dict) -> None:
        from msprobe_nb import __version__

        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        f = h5py.File(tmp, "x", libver=("v110", "v110"), locking="best-effort", rdcc_nbytes=0)
        try:
            a = f.attrs
            a["format"], a["layout_version"], a["rank"] = FORMAT, LAYOUT_VERSION, self.rank
            a["tool_version"] = __version__
            a["created"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            a["columns"], a["kinds"] = json.dumps(self.columns), json.dumps(KINDS)
            a["meta"] = json.dumps(meta, default=str)
            for name, (dtype, chunk, cols) in _TABLES.items():
                cols = 2 + len(self.columns) if cols == "rows" else cols
                shape = (0,) if cols is None else (0, cols)
                f.create_dataset(name, shape, maxshape=(None, *shape[1:]), dtype=dtype,
                                 chunks=(chunk, *shape[1:]), track_times=False)
            k = len(INDEX_FIELDS)
            f.create_dataset("index/steps", (0, k), maxshape=(None, k), dtype="int64", chunks=(INDEX_BLOCK, k),
                             track_times=False)
            f["index/steps"].attrs["fields"] = json.dumps(INDEX_FIELDS)
            f.flush()
            f.swmr_mode = True
            os.rename(tmp, self.path)  # complete header first, so a kill here leaves no unreadable rank file
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
        self._f = f
        self._ds = {name: DatasetWriter(f[name]) for name in [*_TABLES, "index/steps"]}

    def _append(self, name: str, arr: np.ndarray) -> None:
        """Write ``arr`` after the committed rows of ``name`` (a failed step's leftovers are overwritten). The
        extent grows by at least half at a time (readers go by the commits, not by the extent)."""
        table, start = self._ds[name], self._len[name]
        end = start + len(arr)
        if end > table.length:
            ds = table.ds
            table.set_extent((max(end, table.length * 3 // 2, ds.chunks[0]), *ds.shape[1:]))
        if len(arr):
            table.write_at((start, *(0,) * (arr.ndim - 1)), arr)
        self._pending[name] = end

    def write_step(self, step: int, names: Sequence[str], kinds: Sequence[str], values: np.ndarray,
                   scalars: Mapping[str, float], signs: tuple[Sequence[int], Sequence[int], np.ndarray] | None = None,
                   ) -> None:
        """Append one step: row i is ``(names[i], kinds[i], values[i])``; ``scalars`` by name; ``signs`` is
        (row position in this step, number of signs, packed bytes) per bitmap plus the bytes of all of them."""
        if self._f is None:
            raise ValueError(f"monitor file {str(self.path)!r} is closed")
        values = np.asarray(values, np.float64).reshape(len(names), len(self.columns))
        new: list[str] = []

        def intern(s: str) -> int:
            i = self._names.get(s)
            if i is None:
                i = self._names[s] = len(self._names)
                new.append(s)
            return i

        last = self._last
        if last is not None and last[0] == names:
            name_ids = last[1]
        else:
            name_ids = np.fromiter((intern(n) for n in names), np.float64, len(names))
        if last is not None and last[2] == kinds:
            kind_ids = last[3]
        else:
            kind_ids = np.fromiter((self._kind[k] for k in kinds), np.float64, len(kinds))
        rows = np.empty((len(names), 2 + len(self.columns)))
        rows[:, 0] = name_ids
        rows[:, 1] = kind_ids
        rows[:, 2:] = values
        sc = np.empty((len(scalars), 2))
        keys = list(scalars)
        if self._last_scalars is not None and self._last_scalars[0] == keys:  # most steps: the same scalars
            sc[:, 0] = self._last_scalars[1]
        else:
            sc[:, 0] = np.fromiter((intern(n) for n in keys), np.float64, len(keys))
        sc[:, 1] = np.fromiter(scalars.values(), np.float64, len(scalars))
        self._pending: dict[str, int] = {}
        try:
            if new:
                enc = [s.encode("utf-8", "surrogatepass") for s in new]
                self._append("names/ends", np.cumsum([len(e) for e in enc]) + self._len["names/bytes"])
                self._append("names/bytes", np.frombuffer(b"".join(enc), np.uint8))
            self._append("rows", rows)
            self._append("scalars", sc)
            if signs is not None:
                pos, numel, blob = signs
                index = np.empty((len(pos), 2), np.int64)
                index[:, 0] = np.asarray(pos, np.int64) + self._len["rows"]
                index[:, 1] = numel
                self._append("signs/index", index)
                self._append("signs/bytes", np.asarray(blob, np.uint8))
            self._reserve_index()
            self._f.flush()
            lens = {**self._len, **self._pending}
            row = [int(step), lens["rows"], lens["scalars"], lens["signs/index"], lens["signs/bytes"],
                   lens["names/ends"], lens["names/bytes"]]
            row += [_crc(row), COMMIT_MAGIC]
            self._ds["index/steps"].write_at((self._commits, 0), np.asarray([row], np.int64))  # the commit
        except BaseException:
            for s in new:  # not committed: the names are interned again by the next step
                del self._names[s]
            raise
        self._commits += 1
        self._len.update(self._pending)
        self._last = (list(names), name_ids, list(kinds), kind_ids)
        self._last_scalars = (keys, sc[:, 0].copy())
        self.steps_written += 1

    def _reserve_index(self) -> None:
        """Allocate (before the flush) the chunk the next commit row lands in, so writing it changes no metadata."""
        table = self._ds["index/steps"]
        if self._commits + 1 > table.length:
            table.set_extent((-(-(self._commits + 1) // INDEX_BLOCK) * INDEX_BLOCK, len(INDEX_FIELDS)))
        if self._index_alloc <= self._commits:
            table.write_at((self._index_alloc, 0), np.zeros((1, len(INDEX_FIELDS)), np.int64))
            self._index_alloc += INDEX_BLOCK

    def close(self) -> None:
        """Close the file and release the rank; safe to call twice."""
        f, self._f = self._f, None
        if f is not None:
            with suppress(OSError, RuntimeError, ValueError):
                f.close()
            self._lock.release()

    def __repr__(self) -> str:
        return f"MonitorWriter({str(self.path)!r}, {self.steps_written} step(s))"


# ------------------------------------------------------------------------------------------ reading
def _bad(path: Path, why: str) -> DumpFormatError:
    return DumpFormatError(f"monitor file {str(path)!r}: {why}")


def _read_file(path: Path) -> dict[str, Any]:
    f = open_rank_file(path)  # a finished, running or killed writer's file; DumpFormatError naming it
    try:
        a = f.attrs
        if a.get("format") != FORMAT:
            raise _bad(path, f"not a monitor record (format {a.get('format')!r}, expected {FORMAT!r})")
        if int(a.get("layout_version", -1)) != LAYOUT_VERSION:
            raise _bad(path, f"layout version {a.get('layout_version')!r}; this reader reads {LAYOUT_VERSION}")
        try:
            columns, kinds, meta = json.loads(a["columns"]), json.loads(a["kinds"]), json.loads(a["meta"])
            index = f["index/steps"][()]
            if index.ndim != 2 or index.shape[1] != len(INDEX_FIELDS):
                raise ValueError(f"index/steps has shape {index.shape}, expected (n, {len(INDEX_FIELDS)})")
        except (KeyError, ValueError, OSError, TypeError, AttributeError) as e:
            raise _bad(path, f"damaged header or index ({e})") from None
        rank = int(a["rank"])
        committed: list[np.ndarray] = []
        for i, row in enumerate(index):
            if row[-1] != COMMIT_MAGIC:
                if row.any():
                    raise _bad(path, f"index row {i} is damaged (no commit marker)")
                break
            if int(row[-2]) != _crc(row[:-2]):
                raise _bad(path, f"index row {i} (step {int(row[0])}) fails its checksum")
            committed.append(row)
        commits = np.asarray(committed, np.int64).reshape(-1, len(INDEX_FIELDS))
        last = commits[-1] if len(commits) else np.zeros(len(INDEX_FIELDS), np.int64)
        ext = dict(zip(INDEX_FIELDS, (int(x) for x in last), strict=True))
        want = {"names/ends": ext["names"], "names/bytes": ext["name_bytes"], "rows": ext["rows"],
                "scalars": ext["scalars"], "signs/index": ext["signs"], "signs/bytes": ext["sign_bytes"]}
        data = {}
        for name, n in want.items():
            ds = f.get(name)
            if not isinstance(ds, h5py.Dataset):
                raise _bad(path, f"{name} is missing or not a dataset")
            if ds.shape[0] < n:
                raise _bad(path, f"{name} holds {ds.shape[0]} rows, its last commit names {n}")
            try:
                data[name] = ds[:n]
            except (OSError, ValueError, RuntimeError) as e:
                raise _bad(path, f"{name} cannot be read ({e})") from None
    finally:
        f.close()
    ends = data["names/ends"]
    blob = data["names/bytes"].tobytes()
    starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
    names = [blob[s:e].decode("utf-8", "surrogatepass") for s, e in zip(starts, ends, strict=True)]
    steps = commits[:, 0]
    per_rows = np.diff(np.concatenate([[0], commits[:, 1]]))
    per_scalars = np.diff(np.concatenate([[0], commits[:, 2]]))
    if (per_rows < 0).any() or (per_scalars < 0).any():
        raise _bad(path, "index rows go backwards")
    rows = data["rows"]
    ids = rows[:, 0]
    if len(ids) and (ids.min() < 0 or ids.max() >= len(names)):
        raise _bad(path, "a row names a string id the file does not hold")
    return {"path": str(path), "rank": rank, "columns": columns, "kinds": kinds, "meta": meta,
            "steps": steps, "names": names, "row_step": np.repeat(steps, per_rows),
            "row_name": rows[:, 0].astype(np.int64), "row_kind": rows[:, 1].astype(np.int64), "values": rows[:, 2:],
            "scalar_step": np.repeat(steps, per_scalars), "scalar_name": data["scalars"][:, 0].astype(np.int64),
            "scalar_value": data["scalars"][:, 1], "sign_row": data["signs/index"][:, 0],
            "sign_numel": data["signs/index"][:, 1], "sign_bytes": data["signs/bytes"]}


def read_monitor(path: str | Path) -> list[dict[str, Any]]:
    """The committed steps of every rank file in the folder ``path`` (or of the one file ``path``), as plain
    numpy arrays per rank. A missing folder is FileNotFoundError; a damaged file a DumpFormatError naming it."""
    path = Path(path).expanduser()
    if path.is_file():
        return [_read_file(path)]
    if not path.exists():
        raise FileNotFoundError(f"monitor path {str(path)!r} does not exist")
    files = monitor_files(path)
    if not files:
        raise DumpFormatError(f"monitor path {str(path)!r} holds no monitor_rank<N>.h5 file")
    return [_read_file(p) for _, p in files]
