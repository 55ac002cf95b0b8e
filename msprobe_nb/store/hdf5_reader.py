"""Read the kit's HDF5 dumps (``rank*.h5``) back into :class:`~msprobe_nb.store.schema.DumpParts`.

Only committed steps are read (rows below the extents named by the last valid ``/index/steps`` row),
so a dump whose writer was killed, or is still running, reads as its finished steps. Anything that is
not a readable dump of a supported version raises :class:`DumpFormatError` naming the file.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from msprobe_nb.store.hdf5_writer import (
    COMMIT_MAGIC,
    ENCODINGS,
    FORMAT_NAME,
    GROUPS,
    INDEX_FIELDS,
    INT_NA,
    LAYOUT_VERSION,
    RANK_FILE_RE,
    STORED_COLUMNS,
    TENSOR_WIDTHS,
)
from msprobe_nb.store.schema import COLUMNS, SCHEMA_VERSION, DumpParts, coerce_calls

__all__ = ["DumpFormatError", "is_hdf5_dump", "rank_files", "read_hdf5"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_F = {name: i for i, name in enumerate(INDEX_FIELDS)}
_LENGTHS = [_F[g] for g in GROUPS] + [_F[f"u{w}"] for w in TENSOR_WIDTHS]
_SLOTS = [_F[f"{g}_slot"] for g in GROUPS]


class DumpFormatError(ValueError):
    """A file is not a readable msprobe_nb HDF5 dump (not HDF5, truncated, corrupt, unsupported version)."""


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
    """Open read-only; falls back to SWMR read for files whose writer is running or was killed."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise DumpFormatError(f"{str(path)!r}: cannot be read ({e.strerror or e})") from None
    if not head:
        raise DumpFormatError(f"{str(path)!r}: empty file (0 bytes), not an HDF5 dump")
    if head != HDF5_SIGNATURE and not h5py.is_hdf5(path):
        raise DumpFormatError(f"{str(path)!r}: not an HDF5 file (no HDF5 signature)")
    try:
        return h5py.File(path, "r")
    except OSError as first:
        try:
            return h5py.File(path, "r", swmr=True)
        except OSError:
            pass
        raise DumpFormatError(
            f"{str(path)!r}: HDF5 file cannot be opened, it is truncated or corrupt ({first})"
        ) from None


def _attr(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def _check_header(f: h5py.File, path: Path) -> dict[str, Any]:
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
    if attrs.get("format") != FORMAT_NAME:
        raise DumpFormatError(
            f"{str(path)!r}: HDF5 file is not a msprobe_nb dump (root attribute format={attrs.get('format')!r}, "
            f"expected {FORMAT_NAME!r})"
        )
    for key, want in (("schema_version", SCHEMA_VERSION), ("layout_version", LAYOUT_VERSION)):
        if attrs.get(key) != want:
            raise DumpFormatError(
                f"{str(path)!r}: {key} {attrs.get(key)!r} is not supported (this msprobe_nb reads {key} {want})"
            )
    return attrs


def _committed(index: np.ndarray) -> np.ndarray:
    """The prefix of ``/index/steps`` rows that are real commits (marker set, extents never shrinking)."""
    if index.ndim != 2 or index.shape[1] != len(INDEX_FIELDS):
        raise ValueError(f"/index/steps has shape {index.shape}, expected (n, {len(INDEX_FIELDS)})")
    ok = index[:, _F["commit"]] == COMMIT_MAGIC
    ok &= np.all((index[:, _SLOTS] == 0) | (index[:, _SLOTS] == 1), axis=1)
    ends = index[:, _LENGTHS]
    prev = np.vstack([np.zeros((1, ends.shape[1]), np.int64), ends[:-1]])
    ok &= np.all(ends >= prev, axis=1)
    bad = np.flatnonzero(~ok)
    return index[: bad[0]] if len(bad) else index


# -- per-file decoding ----------------------------------------------------------------------
def _decode_strings(buf: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The interned string table as an object array (UTF-8 bytes + cumulative end offsets)."""
    n = len(ends)
    out = np.empty(n, dtype=object)
    if n == 0:
        return out
    if np.any(np.diff(ends) < 0) or ends[0] < 0 or ends[-1] > len(buf):
        raise ValueError("string table offsets are not increasing or run past the byte buffer")
    starts = np.concatenate(([0], ends[:-1]))
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


def _read_rows(f: h5py.File, path: str, length: int, slot: int, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Rows ``ranges`` of one group column: whole chunks from ``/path``, the rest from ``/tail/path``."""
    main, tail = f[path], f[f"tail/{path}"]
    if main.ndim != 1 or tail.ndim != 2 or tail.shape[0] != 2:
        raise ValueError(f"dataset {path} or tail/{path} has an unexpected shape")
    m = length // tail.shape[1] * tail.shape[1]
    if main.shape[0] < m:
        raise ValueError(f"dataset {path} has {main.shape[0]} entries but the commit index says {m}")
    parts = []
    for a, b in ranges:
        if a < m:
            parts.append(main[a:min(b, m)])
        if b > m:
            parts.append(tail[slot, max(a, m) - m:b - m])
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


class _File:
    """Everything read from one rank file, still as numpy arrays (strings as ids into ``vocab``)."""

    def __init__(self, path: Path, steps: set[int] | None) -> None:
        self.path = path
        with _open(path) as f:
            self.attrs = _check_header(f, path)
            try:
                self._read(f, steps)
            except DumpFormatError:
                raise
            except (OSError, KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
                raise DumpFormatError(
                    f"{str(path)!r}: corrupt or incomplete dump ({type(e).__name__}: {e})"
                ) from None

    def _read(self, f: h5py.File, steps: set[int] | None) -> None:
        index = _committed(f["index/steps"][()])
        last = index[-1] if len(index) else np.zeros(len(INDEX_FIELDS), np.int64)
        end = {k: int(last[_F[k]]) for k in INDEX_FIELDS[1:-1]}
        group_of = {path: g for g, (_, cols) in GROUPS.items() for path in cols}
        self.rank = int(self.attrs.get("rank", 0))
        row_end = index[:, _F["calls"]]
        row_start = np.concatenate(([0], row_end[:-1]))
        commit_steps = index[:, _F["step"]]
        keep = np.ones(len(index), bool) if steps is None else np.isin(commit_steps, list(steps))
        ranges = _merge_ranges(zip(row_start[keep].tolist(), row_end[keep].tolist(), strict=True))
        self.step = np.repeat(commit_steps[keep], (row_end - row_start)[keep]).astype(np.int32)
        self.steps = sorted(set(commit_steps[keep].tolist()))
        self.n = len(self.step)
        ncalls, slot = end["calls"], end["calls_slot"]
        self.cols = {c: _read_rows(f, f"calls/{c}", ncalls, slot, ranges) for c in STORED_COLUMNS}

        def whole(path: str) -> np.ndarray:
            g = group_of[path]
            return _read_rows(f, path, end[g], end[f"{g}_slot"], [(0, end[g])])

        self.vocab = _decode_strings(whole("strings/bytes"), whole("strings/ends"))
        dims = whole("shapes/dims")
        s_end = whole("shapes/ends")
        s_start = np.concatenate(([0], s_end[:-1]))
        self.shapes = [tuple(dims[a:b].tolist()) for a, b in zip(s_start.tolist(), s_end.tolist(), strict=True)]
        ids = whole("stacks/id")
        k_end = whole("stacks/ends")
        frames = whole("stacks/frames")
        self._check_ids(frames, "stacks/frames")
        k_start = np.concatenate(([0], k_end[:-1]))
        self.stacks = {
            int(i): self.vocab[frames[a:b]].tolist()
            for i, a, b in zip(ids.tolist(), k_start.tolist(), k_end.tolist(), strict=True)
        }
        self.con_step = whole("construct/step")
        self.con_call = whole("construct/call")
        self.con_parent = whole("construct/parent")
        self._check_ids(self.con_call, "construct/call")
        self._check_ids(self.con_parent, "construct/parent", allow_missing=True)
        if steps is not None:
            m = np.isin(self.con_step, list(steps))
            self.con_step, self.con_call, self.con_parent = self.con_step[m], self.con_call[m], self.con_parent[m]
        self.tensors = {k: whole(f"tensors/{k}") for k in ("name", "step", "buffer", "offset", "count",
                                                                 "dtype", "shape")}
        self._check_ids(self.tensors["name"], "tensors/name")
        for w in TENSOR_WIDTHS:  # every committed tensor byte must be present
            have = f[f"tensors/u{w}"].shape[0]
            if have < end[f"u{w}"]:
                raise ValueError(f"dataset tensors/u{w} has {have} entries but the commit index says {end[f'u{w}']}")

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
class ConstructByStep(Mapping):
    """``{(rank, step): {call: parent}}``, built per key on first access (the merged tree is eager)."""

    def __init__(self, files: list[_File]) -> None:
        self._src: dict[tuple[int, int], tuple[_File, np.ndarray]] = {}
        for fl in files:
            if not len(fl.con_step):
                continue
            order = np.argsort(fl.con_step, kind="stable")
            steps, starts = np.unique(fl.con_step[order], return_index=True)
            bounds = np.append(starts, len(order))
            for s, a, b in zip(steps.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                self._src[(fl.rank, int(s))] = (fl, order[a:b])
        self._cache: dict[tuple[int, int], dict[str, str | None]] = {}

    def __getitem__(self, key: tuple[int, int]) -> dict[str, str | None]:
        if key not in self._cache:
            fl, rows = self._src[key]
            self._cache[key] = _pairs(fl, rows)
        return self._cache[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)

    def __repr__(self) -> str:
        return f"ConstructByStep({len(self)} (rank, step) keys)"


def _pairs(fl: _File, rows: np.ndarray) -> dict[str, str | None]:
    calls = fl.vocab[fl.con_call[rows]].tolist()
    parents = fl.con_parent[rows]
    names = fl.vocab[np.maximum(parents, 0)].tolist()
    return {c: (p if q >= 0 else None) for c, p, q in zip(calls, names, parents.tolist(), strict=True)}


def _merged_construct(files: list[_File]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for fl in files:
        if not len(fl.con_call):
            continue
        key = fl.con_call.astype(np.int64) * (len(fl.vocab) + 1) + fl.con_parent + 1
        _, first_rev = np.unique(key[::-1], return_index=True)
        rows = np.sort(len(key) - 1 - first_rev)  # last occurrence of each pair, in write order
        out.update(_pairs(fl, rows))
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
        p = Path(path)
        with _open(p) as f:
            try:
                arr = f[f"tensors/u{width}"][offset:offset + count]
            except (OSError, KeyError, ValueError) as e:
                raise DumpFormatError(f"{path!r}: tensor {data_name!r} cannot be read ({e})") from None
        if len(arr) != count:
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} runs past the end of tensors/u{width}")
        raw = torch.from_numpy(arr.view(np.uint8))
        return raw.view(dtype).reshape(shape)


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
    except (OSError, DumpFormatError):
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
            col = fl.cols["stack_id"].copy()
            for old, new in remap.T.tolist():
                col[fl.cols["stack_id"] == old] = new
            fl.cols["stack_id"] = col

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
    meta["files"] = [str(fl.path) for fl in files]
    meta["rank_attrs"] = {fl.rank: fl.attrs for fl in files}
    meta["construct_by_step"] = ConstructByStep(files)
    loader = TensorLoader(_tensor_entries(files), str(path))
    meta["tensors"] = len(loader.names())
    return DumpParts(
        calls=calls,
        stacks=stacks,
        construct=_merged_construct(files),
        meta=meta,
        tensor_loader=loader,
        source=str(path),
    )
