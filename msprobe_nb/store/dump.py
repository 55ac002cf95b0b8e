"""The ``Dump`` object: one recorded run (the kit's HDF5 dump or an msprobe dump) behind one API.

``load(path)`` picks the reader; ``Dump`` exposes the calls table, the side tables (stacks, module
tree), lazy whole tensors, step/rank subsets, a summary for ``info`` and export to msprobe's format.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.store.hdf5_layout import RANK_FILE_RE  # h5py-free: finding rank files loads no h5py
from msprobe_nb.store.schema import DumpParts, coerce_calls

__all__ = ["Dump", "load"]

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_KINDS = ("auto", "hdf5", "msprobe")


def _as_set(value: int | Iterable[int] | None) -> set[int] | None:
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return {int(value)}
    return {int(v) for v in value}


class Dump:
    """One dump: ``calls`` (schema table) plus stacks, module tree, meta and a lazy tensor loader."""

    def __init__(self, parts: DumpParts):
        self._parts = parts
        self.calls: pd.DataFrame = coerce_calls(parts.calls).reset_index(drop=True)
        self.meta: dict[str, Any] = dict(parts.meta)
        self.source: str = parts.source
        self._tree: dict[str, str] | None = None
        self._stack_of: dict[str, int] | None = None

    # ------------------------------------------------------------------ descriptors
    @property
    def task(self) -> str:
        """msprobe task of the dump: "statistics", "tensor", ... ("" when unknown)."""
        return str(self.meta.get("task") or "")

    @property
    def level(self) -> str:
        """msprobe level: "L0", "L1", "mix" ("" when unknown)."""
        return str(self.meta.get("level") or "")

    @property
    def steps(self) -> list[int]:
        return sorted(int(s) for s in self.calls["step"].unique())

    @property
    def dropped_steps(self) -> list[int]:
        """Steps some or all of whose rows were lost because writing them failed (a full disk); the reasons
        are in ``meta["dropped"]``. Other steps keep their numbers: nothing was renumbered or merged."""
        return list(self.meta.get("dropped_steps") or [])

    @property
    def partial_steps(self) -> list[int]:
        """Steps cut short by an exception in the recorded code (``stop()`` called while it was being handled,
        or ``record()`` left by one): their rows are only what was recorded until then."""
        return list(self.meta.get("partial_steps") or [])

    @property
    def ranks(self) -> list[int]:
        return sorted(int(r) for r in self.calls["rank"].unique())

    # ------------------------------------------------------------------ stacks
    @property
    def stack_frames(self) -> dict[int, list[str]]:
        """stack_id -> frames (the raw side table)."""
        return self._parts.stacks

    @property
    def stacks(self) -> pd.DataFrame:
        """Table of call stacks: ``stack_id`` (int32), ``frames`` (list of str)."""
        ids = sorted(self._parts.stacks)
        return pd.DataFrame({"stack_id": pd.Series(ids, dtype="int32"),
                             "frames": pd.Series([self._parts.stacks[i] for i in ids], dtype=object)})

    def stack(self, call: str) -> list[str]:
        """Frames of ``call`` (outermost last, as msprobe writes them); [] when none was recorded."""
        if self._stack_of is None:
            firsts = self.calls.drop_duplicates("call")
            self._stack_of = dict(zip(firsts["call"], firsts["stack_id"].astype(int), strict=True))
        if call not in self._stack_of:
            raise KeyError(f"no call {call!r} in this dump")
        return list(self._parts.stacks.get(self._stack_of[call], []))

    # ------------------------------------------------------------------ module tree
    @property
    def tree(self) -> dict[str, str]:
        """call -> enclosing module call ("" at top level), in execution order."""
        if self._tree is None:
            firsts = self.calls.drop_duplicates("call")
            out = dict(zip(firsts["call"], firsts["parent"], strict=True))
            for call, parent in self._parts.construct.items():
                out.setdefault(call, parent or "")
            self._tree = out
        return dict(self._tree)

    construct = tree

    def children(self, call: str) -> list[str]:
        """Calls whose parent is ``call``, in execution order."""
        return [c for c, p in self.tree.items() if p == call]

    def ancestors(self, call: str) -> list[str]:
        """Enclosing module calls of ``call``, innermost first."""
        tree, out, seen = self.tree, [], {call}
        parent = tree.get(call, "")
        while parent and parent not in seen:
            out.append(parent)
            seen.add(parent)
            parent = tree.get(parent, "")
        return out

    # ------------------------------------------------------------------ tensors
    def tensor(self, key: str, step: int | None = None, rank: int | None = None) -> Any:
        """Whole tensor of a row, by row name or data_name, loaded lazily (tensor-mode dumps only)."""
        c = self.calls
        mask = (c["name"] == key) | (c["data_name"] == key)
        if step is not None:
            mask &= c["step"] == step
        if rank is not None:
            mask &= c["rank"] == rank
        hits = c.loc[mask]
        if hits.empty:
            raise KeyError(f"no row or data_name {key!r} in this dump"
                           + (f" (step {step}, rank {rank})" if step is not None or rank is not None else ""))
        where = hits[["step", "rank"]].drop_duplicates()
        if len(where) > 1:
            raise ValueError(f"{key!r} exists in {len(where)} step/rank pairs; pass step= and rank=")
        row = hits.iloc[0]
        if not row["data_name"]:
            raise KeyError(f"{key!r} has no saved tensor (task {self.task or 'unknown'!r}); "
                           "only tensor-mode dumps keep whole tensors")
        return self.load_tensor(str(row["data_name"]), step=int(row["step"]), rank=int(row["rank"]))

    def load_array(self, data_name: str, step: int, rank: int) -> Any:
        """The tensor as the analysis reads it: a numpy array where the loader gives one without torch (the
        HDF5 loader: bfloat16 and float8 as float32, docs/compare.md), else what ``load_tensor`` gives."""
        loader: Any = self._parts.tensor_loader  # duck-typed, as in load_tensor (``in``, ``array``)
        array = getattr(loader, "array", None)
        if array is not None and f"rank{rank}/{data_name}" in loader:
            return array(f"rank{rank}/{data_name}")
        return self.load_tensor(data_name, step=step, rank=rank)

    def load_tensor(self, data_name: str, step: int, rank: int) -> Any:
        """Whole tensor by its data_name in (step, rank), straight from the loader (no table lookup)."""
        loader: Any = self._parts.tensor_loader  # a callable; some take step/rank, some know their keys (``in``)
        if loader is None:
            raise KeyError(f"{self.source}: this dump has no tensor data")
        if _takes_step_rank(loader):
            return loader(data_name, step=step, rank=rank)
        try:  # the HDF5 loader keys tensors of rank r as "rank{r}/<data_name>"
            qualified = f"rank{rank}/{data_name}" in loader
        except TypeError:
            qualified = False
        return loader(f"rank{rank}/{data_name}" if qualified else data_name)

    # ------------------------------------------------------------------ subsets and summaries
    def select(self, step: int | Iterable[int] | None = None, rank: int | Iterable[int] | None = None) -> Dump:
        """A Dump holding only the given step(s) and rank(s)."""
        steps, ranks = _as_set(step), _as_set(rank)
        mask = pd.Series(True, index=self.calls.index)
        if steps is not None:
            mask &= self.calls["step"].isin(steps)
        if ranks is not None:
            mask &= self.calls["rank"].isin(ranks)
        calls = self.calls.loc[mask].reset_index(drop=True)
        kept = set(calls["call"])
        meta = dict(self.meta)
        if isinstance(meta.get("ranks"), list):
            meta["ranks"] = [r for r in meta["ranks"] if _keep_rank_entry(r, steps, ranks)]
        used = set(calls.loc[calls["stack_id"] >= 0, "stack_id"].astype(int))
        return Dump(DumpParts(
            calls=calls,
            stacks={k: v for k, v in self._parts.stacks.items() if k in used},
            construct={k: v for k, v in self._parts.construct.items() if k in kept},
            meta=meta, tensor_loader=self._parts.tensor_loader, source=self.source))

    def summary(self) -> pd.DataFrame:
        """Per family and direction: calls, rows, tensors, values, nones, NaN rows and inf rows."""
        c = self.calls
        tensor = c["kind"] == "tensor"
        has_stats = bool(c.loc[tensor, "max"].notna().any())
        counted = c["nan_count"].notna()
        nan_stat = (c["max"].isna() | c["min"].isna()) & (c["numel"].fillna(0) > 0) & has_stats
        nan_rows = tensor & ((counted & (c["nan_count"].fillna(0) > 0)) | (~counted & nan_stat))
        inf_stat = np.isinf(c["max"]) | np.isinf(c["min"])
        inf_rows = tensor & (inf_stat | (c["posinf_count"].fillna(0) > 0) | (c["neginf_count"].fillna(0) > 0))
        frame = pd.DataFrame({
            "family": c["family"], "direction": c["direction"],
            "call_key": c["step"].astype(str) + "/" + c["rank"].astype(str) + "/" + c["call"],
            "tensor": tensor, "value": c["kind"] == "value", "none": c["kind"] == "none",
            "nan": nan_rows.astype(bool), "inf": inf_rows.astype(bool)})
        out = frame.groupby(["family", "direction"], sort=True).agg(
            calls=("call_key", "nunique"), rows=("tensor", "size"), tensors=("tensor", "sum"),
            values=("value", "sum"), nones=("none", "sum"), nan_rows=("nan", "sum"), inf_rows=("inf", "sum"))
        return out.reset_index().astype({k: "int64" for k in
                                         ("calls", "rows", "tensors", "values", "nones", "nan_rows", "inf_rows")})

    def export_msprobe(self, out_dir: str | Path, *, tensors: bool = True) -> Path:
        """Write this dump in msprobe's format (out_dir/step{N}/rank{R}/...); returns out_dir."""
        from msprobe_nb.store.msprobe_writer import export_msprobe

        return export_msprobe(self, out_dir, tensors=tensors, _stacklevel=3)  # its warning names the caller

    def __len__(self) -> int:
        return len(self.calls)

    def __repr__(self) -> str:
        n_calls = len(self.calls.drop_duplicates(["step", "rank", "call"]))
        what = " ".join(x for x in (self.meta.get("format", ""), self.task, self.level) if x)
        lost = f", dropped steps {_span(self.dropped_steps)}" if self.dropped_steps else ""
        lost += f", partial steps {_span(self.partial_steps)}" if self.partial_steps else ""
        return (f"<Dump {what or 'dump'}: steps {_span(self.steps)}, ranks {_span(self.ranks)}, "
                f"{n_calls} calls, {len(self.calls)} rows{lost}, from {self.source!r}>")


def _keep_rank_entry(entry: Any, steps: set[int] | None, ranks: set[int] | None) -> bool:
    """meta["ranks"] holds ints (HDF5) or {step, rank, ...} dicts (msprobe)."""
    if isinstance(entry, dict):
        return ((steps is None or entry.get("step") in steps)
                and (ranks is None or entry.get("rank") in ranks))
    return ranks is None or entry in ranks


def _span(values: list[int]) -> str:
    if not values:
        return "[]"
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}..{values[-1]}"
    return ",".join(map(str, values))


def _takes_step_rank(loader: Any) -> bool:
    try:
        params = inspect.signature(loader).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return "step" in params and "rank" in params


def _is_kit_hdf5(path: Path) -> bool:
    """Whether ``path`` is for the HDF5 reader, judged by signature and name only (no h5py import, no parse).

    A file starting with the HDF5 signature, or named like a kit rank file (``rank<N>.h5``, ``*.h5``,
    ``*.hdf5``), or a folder holding ``rank<N>.h5`` files: a damaged one then gets the HDF5 reader's
    diagnosis (truncated, empty, not a kit dump) instead of being read as JSON.
    """
    if path.is_dir():
        try:
            return any(RANK_FILE_RE.match(p.name) for p in path.iterdir())
        except OSError:
            return False
    if path.suffix.lower() in (".h5", ".hdf5"):
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


_MONITOR_FILE = "monitor_rank"  # the Monitor's files: monitor_rank<N>.h5 (store/monitor_store.py)


def _monitor_hint(path: Path) -> str | None:
    """A pointer to the monitor readers when ``path`` is the kit's training-monitor record, not a dump."""
    try:
        names = [p.name for p in path.iterdir()] if path.is_dir() else [path.name]
    except OSError:
        return None
    if not any(n.startswith(_MONITOR_FILE) and n.endswith(".h5") for n in names):
        return None
    folder = path if path.is_dir() else path.parent
    return (f"{path}: a training monitor record (monitor_rank<N>.h5), not a dump: read it with "
            f"msprobe_nb.load_monitor({str(folder)!r}), or `msprobe-nb monitor {folder}`")


def load(path: str | os.PathLike[str], kind: str = "auto", *, allow_outside: bool = False) -> Dump:
    """Open a dump: the kit's HDF5 dump or an msprobe dump (dump.json, rank dir, step dir or dump root).

    ``kind`` forces the reader: "hdf5" or "msprobe"; "auto" decides by file signature and name (HDF5
    signature, ``rank<N>.h5``), so a damaged kit file gets the HDF5 reader's diagnosis. For msprobe dumps,
    tensor files are only read from inside the dump folder; ``allow_outside=True`` also follows an
    absolute ``dump_data_dir`` and symlinks that lead outside it (only for dumps you trust).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if kind == "auto":
        if not any(p.glob("rank*.h5") if p.is_dir() else ()) and (hint := _monitor_hint(p)):
            raise FileNotFoundError(hint)
        kind = "hdf5" if _is_kit_hdf5(p) else "msprobe"
    if kind == "hdf5":
        from msprobe_nb.store.hdf5_reader import read_hdf5

        return Dump(read_hdf5(p))
    from msprobe_nb.store.msprobe_reader import read_msprobe

    return Dump(read_msprobe(p, allow_outside=allow_outside))
