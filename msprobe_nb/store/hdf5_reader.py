"""Read the kit's HDF5 dumps (``rank*.h5``) back into :class:`~msprobe_nb.store.schema.DumpParts`.

Only committed steps are read (rows below the extents named by the last valid ``/index/steps`` row),
so a dump whose writer was killed, or is still running, reads as its finished steps. Anything that is
not a readable dump of a supported version raises :class:`DumpFormatError` naming the file.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from msprobe_nb.store.errors import DumpFormatError  # re-exported: older code imports it from here
from msprobe_nb.store.hdf5_index import (
    attr_text,
    check_attrs,
    check_extents,
    check_header,
    check_row_crcs,
    commit_ends,
    committed_rows,
    drop_reason,
    index_rows,
)
from msprobe_nb.store.hdf5_layout import (
    ENCODINGS,
    FLAG_DROPPED,
    FLAG_PARTIAL,
    FORMAT_NAME,
    GROUPS,
    INDEX_POS,
    INT_NA,
    RANK_FILE_RE,
    STORED_COLUMNS,
    TENSOR_WIDTHS,
)
from msprobe_nb.store.hdf5_open import HDF5_SIGNATURE, READ_ERRORS, open_rank_file
from msprobe_nb.store.hdf5_tails import Tails, Taken, dataset, merge_ranges, read_rows
from msprobe_nb.store.hdf5_tensors import TensorLoader
from msprobe_nb.store.schema import COLUMNS, DumpParts, coerce_calls, pandas_dtype

__all__ = ["DumpFormatError", "is_hdf5_dump", "rank_files", "read_hdf5"]

# -- files ----------------------------------------------------------------------------------
def rank_files(path: str | Path) -> list[tuple[int, Path]]:
    """``(rank, file)`` for every ``rank<N>.h5`` directly inside the directory ``path``, sorted by rank."""
    found = []
    for p in Path(path).iterdir():
        m = RANK_FILE_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


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


class _File:
    """Everything read from one rank file, still as numpy arrays (strings as ids into ``vocab``)."""

    def __init__(self, path: Path, steps: set[int] | None) -> None:
        self.path = path
        taken = None
        for _ in range(2):  # a second time only for a live file whose writer moved on while it was read
            with open_rank_file(path) as f:
                try:
                    self.attrs = check_header(f, path)
                    taken = self._read(f, steps, taken)
                except DumpFormatError:
                    raise
                except READ_ERRORS as e:
                    raise DumpFormatError(
                        f"{str(path)!r}: corrupt or incomplete dump ({type(e).__name__}: {e})"
                    ) from None
            if taken is None:
                return
        raise AssertionError("a second read never asks for a third")  # pragma: no cover

    def _read(self, f: h5py.File, steps: set[int] | None, taken: Taken | None) -> Taken | None:
        """Read the file's committed steps. For a live file whose writer filled a chunk of some group while
        its tails were taken, return what a second read, from a fresh open, needs instead (this open's
        extents are older than the commit that shows it): that read names the same commit, takes those
        groups' rows from main, the other tails as taken here."""
        if taken is None:
            rows, checked = index_rows(f, self.path)
            index = committed_rows(rows, self.path, checked)
        else:
            index, checked = taken.index, False  # checked by the first read
        end = commit_ends(index)
        tails = Tails(f, taken)
        check_extents(f, tails, end, self.path)
        if checked:
            check_attrs(f, self.attrs, self.path)
            check_row_crcs(index, self.path)
        if taken is None and tails.records:
            tails.preload(end)  # the tails now, right after the index
            moved: list[str] = []
            if f.swmr_mode:
                # a live (or killed) writer's file: see whether the writer went on to a later chunk meanwhile
                # (it writes a tail slot again once it fills the next chunk)
                f["index/steps"].refresh()  # its extent may have grown; nothing else holds it open now
                moved = tails.moved_on(end, commit_ends(committed_rows(index_rows(f, self.path)[0], self.path)))
            if checked:
                tails.verify(index, end, moved)
            if moved:
                return tails.taken(index, moved)
        group_of = {path: g for g, (_, cols) in GROUPS.items() for path in cols}
        self.rank = int(self.attrs.get("rank", 0))
        row_end = index[:, INDEX_POS["calls"]]
        row_start = _starts(row_end)
        commit_steps = index[:, INDEX_POS["step"]]
        keep = np.ones(len(index), bool) if steps is None else np.isin(commit_steps, list(steps))
        flags = index[:, INDEX_POS["flags"]]
        drop = (flags & FLAG_DROPPED) != 0
        self.dropped = [(int(s), drop_reason(int(fl))) for s, fl in zip(commit_steps[keep & drop].tolist(),
                                                                        flags[keep & drop].tolist(), strict=True)]
        ranges = merge_ranges(zip(row_start[keep].tolist(), row_end[keep].tolist(), strict=True))
        self.step = np.repeat(commit_steps[keep], (row_end - row_start)[keep]).astype(np.int32)
        self.steps = sorted(set(commit_steps[keep & ~drop].tolist()))
        self.partial = sorted(set(commit_steps[keep & ~drop & ((flags & FLAG_PARTIAL) != 0)].tolist()))
        self.n = len(self.step)
        ncalls, slot = end["calls"], end["calls_slot"]
        self.cols = {c: read_rows(f, tails, f"calls/{c}", ncalls, slot, ranges) for c in STORED_COLUMNS}

        def whole(path: str) -> np.ndarray:
            g = group_of[path]
            return read_rows(f, tails, path, end[g], end[f"{g}_slot"], [(0, end[g])])

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
        self._check_tensor_index(f, end)
        return None

    def _check_tensor_index(self, f: h5py.File, end: dict[str, int]) -> None:
        """The tensor index names strings, shapes and buffer bytes that exist (ValueError otherwise: a damaged
        or hostile file, reported by ``__init__`` as a DumpFormatError naming it)."""
        t = self.tensors
        self._check_ids(t["name"], "tensors/name")
        self._check_ids(t["dtype"], "tensors/dtype")
        if len(t["shape"]) and (t["shape"].min() < 0 or t["shape"].max() >= len(self.shapes)):
            raise ValueError("tensors/shape refers to shapes outside the shape table")
        for w in TENSOR_WIDTHS:  # every committed tensor byte must be present
            have = dataset(f, f"tensors/u{w}").shape[0]
            mine = t["buffer"] == w
            stop = int((t["offset"][mine] + t["count"][mine]).max()) if mine.any() else 0
            if have < end[f"u{w}"] or end[f"u{w}"] < stop or (mine.any() and t["offset"][mine].min() < 0):
                raise ValueError(f"tensors/u{w} has {have} entries; the commit index says {end[f'u{w}']} and the "
                                 f"tensor index needs {stop}")
        if not np.isin(t["buffer"], TENSOR_WIDTHS).all():
            raise ValueError("tensors/buffer holds an unknown buffer width")

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
            sa = self._vocab_sa = pd.array(self.vocab, dtype=pandas_dtype("string")) if len(self.vocab) else pd.array(
                [""], dtype=pandas_dtype("string"))
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
        with open_rank_file(files[0]) as f:
            return attr_text(f.attrs.get("format")) == FORMAT_NAME
    except (*READ_ERRORS, DumpFormatError):
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
