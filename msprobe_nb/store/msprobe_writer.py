"""Export a Dump to msprobe's on-disk format so that msprobe's own tools (``msprobe compare``) can read it.

Layout: ``out_dir/step{N}/rank{R}/`` with dump.json (records rebuilt from the calls table, msprobe's key
order), stack.json (new ``{id: [[calls], [frames]]}`` format), construct.json and, in tensor mode,
``dump_tensor_data/<data_name>`` holding plain contiguous tensors.
"""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from msprobe_nb.progress import bar, wanted
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.msprobe_reader import MICRO_STEP_KEY, is_plain_file_name
from msprobe_nb.store.schema import DTENSOR_VALUE_TYPE

if TYPE_CHECKING:
    from msprobe_nb.store.dump import Dump

__all__ = ["build_records", "export_msprobe", "msprobe_data_name"]

_MSPROBE_TASKS = {"statistics", "tensor"}
_MSPROBE_LEVELS = {"L0", "L1", "mix", "debug"}
_STATS = (("Max", "max"), ("Min", "min"), ("Mean", "mean"), ("Norm", "norm"))
_FLOAT_WORDS = ("float", "complex", "half", "double")


# ----------------------------------------------------------------------------- leaves

def _is_float_dtype(dtype: str) -> bool:
    return any(w in dtype for w in _FLOAT_WORDS)


def _stat_out(value: float, key: str, row: Any) -> Any:
    """A statistic as msprobe writes it: bool dtypes true/false, integral ints as int, NaN -> NaN or null.

    NaN is ambiguous in the table (not computed vs. the tensor holds NaN); it is written as null where
    it cannot be a NaN element (empty tensor, integer/bool dtype, nan_count == 0), else as NaN.
    """
    dtype = row.dtype
    if math.isnan(value):
        nan_count = row.nan_count
        if (pd.isna(row.numel) or row.numel == 0 or not _is_float_dtype(dtype)
                or (not pd.isna(nan_count) and nan_count == 0)):
            return None
        return value
    if dtype == "torch.bool" and key in ("Max", "Min"):
        return bool(value)
    if not _is_float_dtype(dtype) and key in ("Max", "Min") and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _tensor_out(row: Any) -> dict[str, Any]:
    """One tensor leaf: type, dtype, shape, Max, Min, Mean, Norm, requires_grad, then md5 / data_name."""
    # a DTensor's shard is written as the plain tensor it is (msprobe's readers know no other tensor type)
    kind = "torch.Tensor" if not row.value_type or row.value_type == DTENSOR_VALUE_TYPE else row.value_type
    out: dict[str, Any] = {"type": kind, "dtype": row.dtype,
                           "shape": None if row.shape is None else [int(s) for s in row.shape]}
    stats = [getattr(row, col) for _, col in _STATS]
    xor_like = bool(row.hash) and all(math.isnan(s) for s in stats)
    if not xor_like:
        for (key, _), value in zip(_STATS, stats, strict=True):
            out[key] = _stat_out(float(value), key, row)
    rg = None if pd.isna(row.requires_grad) else bool(row.requires_grad)
    if xor_like:
        out["md5"] = row.hash
        out["requires_grad"] = rg
    else:
        out["requires_grad"] = rg
        if row.hash:
            out["md5"] = row.hash
    if row.data_name:
        out["data_name"] = msprobe_data_name(row.data_name, row.name)
    return out


def msprobe_data_name(data_name: str, name: str) -> str:
    """File name of a row's tensor in dump_tensor_data: msprobe's own names are kept when they are plain file
    names, others (the kit keys tensors as ``step{N}/<row name>``, shared by rows holding the same tensor)
    become ``<row name>.pt``, made safe by :func:`safe_file_name` (a row name is dump content, and may hold
    "/" or "..")."""
    if not data_name:
        return ""
    if data_name.endswith((".pt", ".npy")) and is_plain_file_name(data_name):
        return data_name
    return safe_file_name(name) + ".pt"


def safe_file_name(name: str, limit: int = 200) -> str:
    """``name`` as one file name that stays in its folder: path separators, NUL, control characters and lone
    surrogates become "_"; a name over ``limit`` UTF-8 bytes is cut and ends in a hash of the whole name, so
    that long names stay distinct (file systems refuse names over 255 bytes)."""
    safe = "".join("_" if c in "/\\" or ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF else c
                   for c in name)
    raw = safe.encode("utf-8")
    if len(raw) > limit:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        safe = raw[: limit - 17].decode("utf-8", "ignore") + "-" + digest
    return safe


def _value_out(row: Any) -> Any:
    """A non-tensor leaf: ``{"type": t, "value": v}``, a verbatim record (memory_format, P2POp) or a bare value."""
    value = json.loads(row.value) if row.value else None
    if not row.value_type:
        return value
    if isinstance(value, dict) and row.value_type in (value.get("type"), value.get("class_type")):
        return value
    return {"type": row.value_type, "value": value}


def _leaf_out(row: Any) -> Any:
    if row.kind == "tensor":
        return _tensor_out(row)
    if row.kind == "value":
        return _value_out(row)
    return None


# ----------------------------------------------------------------------------- nesting

def _is_index(segment: str) -> bool:
    """A list position as _leaves writes it: ASCII digits without a leading zero ("²" and "01" are dict keys)."""
    return segment.isascii() and segment.isdigit() and (segment == "0" or segment[0] != "0")


def _assemble(items: list[tuple[list[str], Any]]) -> Any:
    """Rebuild nested lists/dicts from (arg path segments, leaf); numeric segments give lists.

    Gaps in a list are filled with ``[]`` (an empty container yields no rows, so reading it back is exact);
    digit keys far beyond the number of items make a dict, since filling such gaps would cost unbounded memory.
    """
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    groups: dict[str, list] = {}
    for segs, leaf in items:
        if not segs:
            raise ValueError("a leaf and a container share the same arg path")
        groups.setdefault(segs[0], []).append((segs[1:], leaf))
    if all(_is_index(k) for k in groups) and max(map(len, groups)) <= 9 \
            and max(int(k) for k in groups) < 16 * len(groups) + 1024:  # not a 10**9-long list for one "999999999"
        out: list[Any] = [[] for _ in range(max(int(k) for k in groups) + 1)]
        for k, sub in groups.items():
            out[int(k)] = _assemble(sub)
        return out
    return {k: _assemble(sub) for k, sub in groups.items()}


def _as_list(items: list[tuple[list[str], Any]], what: str) -> list:
    if not items:
        return []
    built = _assemble(items)
    if not isinstance(built, list):
        raise ValueError(f"{what}: args are not positions 0, 1, ...")
    return built


def _record(call: str, direction: str, rows: list[Any]) -> dict[str, Any]:
    """The dump.json record of one call from its rows (in row order)."""
    by_io: dict[tuple[str, bool], list] = {}
    for r in rows:
        by_io.setdefault((r.io, bool(r.is_kwarg)), []).append((r.arg.split(".") if r.arg else [], _leaf_out(r)))
    if direction == "parameters_grad":  # {param: [leaf]}; args are "<param>" or "<param>.<i>"
        params: dict[str, list] = {}
        for r in rows:
            head, _, rest = r.arg.partition(".")
            params.setdefault(head, []).append((rest.split(".") if rest else [], _leaf_out(r)))
        return {k: [v[0][1]] if len(v) == 1 and not v[0][0] else _as_list(v, f"{call} {k}")
                for k, v in params.items()}
    def take(io: str, kwarg: bool = False, empty: Any = ()) -> Any:
        items = by_io.pop((io, kwarg), None)
        return _assemble(items) if items else (list(empty) if isinstance(empty, tuple) else empty)

    if direction == "forward":
        rec = {"input_args": _as_list(by_io.pop(("input", False), []), f"{call} input_args"),
               "input_kwargs": take("input", True, {}), "output": take("output")}
        if ("parameters", False) in by_io:
            rec["parameters"] = take("parameters")
    elif direction == "backward":
        rec = {"input": take("input"), "output": take("output")}
    else:
        rec = {}
    for (io, _), items in by_io.items():  # anything else (debug.json entries...) keeps its key
        rec[io] = _assemble(items)
    return rec


def build_records(calls: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """dump.json ``data`` of one (step, rank): call -> record, in call_index order."""
    data: dict[str, dict[str, Any]] = {}
    ordered = calls.sort_values("call_index", kind="stable")
    rows: list[Any] = []
    for row in ordered.itertuples(index=False):
        if rows and row.call_index != rows[0].call_index:
            data[rows[0].call] = _record(rows[0].call, rows[0].direction, rows)
            rows = []
        rows.append(row)
    if rows:
        data[rows[0].call] = _record(rows[0].call, rows[0].direction, rows)
    return data


# ----------------------------------------------------------------------------- files

def _write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as UTF-8 JSON in one go (a value that cannot be written leaves no half file); text that is
    not valid UTF-8 (lone surrogates, which kit dumps may hold) is written as \\u escapes instead."""
    text = json.dumps(obj, indent=1, ensure_ascii=False)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(obj, indent=1).encode("ascii")
    path.write_bytes(data)


def _task(dump: Dump) -> str:
    if dump.task in _MSPROBE_TASKS:
        return dump.task
    return "tensor" if (dump.calls["data_name"] != "").any() else "statistics"


def _level(dump: Dump) -> str:
    if dump.level in _MSPROBE_LEVELS:
        return dump.level
    fam = dump.calls["family"]
    modules, apis = (fam == "Module").any(), (fam != "Module").any()
    return "mix" if modules and apis else ("L0" if modules else "L1")


def _stack_json(calls: pd.DataFrame, stacks: dict[int, list[str]]) -> dict[str, list]:
    """New-format stack.json, ids renumbered from "0" (msprobe detects the new format by key "0")."""
    firsts = calls.drop_duplicates("call").sort_values("call_index", kind="stable")
    groups: dict[int, list[str]] = {}
    for call, sid in zip(firsts["call"], firsts["stack_id"], strict=True):
        if sid >= 0 and int(sid) in stacks:
            groups.setdefault(int(sid), []).append(call)
    return {str(i): [groups[sid], list(stacks[sid])] for i, sid in enumerate(sorted(groups))}


def _construct_json(calls: pd.DataFrame, level: str, extra: dict[str, Any]) -> dict[str, Any]:
    """call -> parent (null at top level); empty for L1, like msprobe; Megatron micro steps given back."""
    if level == "L1" and not (calls["parent"] != "").any():
        return {}
    firsts = calls.drop_duplicates("call").sort_values("call_index", kind="stable")
    micro = extra.get("micro_step") or {}
    out: dict[str, Any] = {}
    if MICRO_STEP_KEY in extra:
        out[MICRO_STEP_KEY] = extra[MICRO_STEP_KEY]
    for call, parent in zip(firsts["call"], firsts["parent"], strict=True):
        out[call] = [parent or None, micro[call]] if call in micro else (parent or None)
    return out


def _save_tensor(value: Any, path: Path) -> None:
    if path.suffix == ".npy":
        import numpy as np

        np.save(path, value.numpy() if hasattr(value, "numpy") else value, allow_pickle=False)
        return
    import torch

    torch.save(value.detach().cpu().contiguous().clone(), path)


def _inside(path: Path, root: Path, what: str) -> Path:
    """``path`` if it stays under ``root`` once symlinks already on disk are followed, else a DumpFormatError."""
    real = path.resolve()
    if not real.is_relative_to(root):
        raise DumpFormatError(f"{what}: {path} would be written at {real}, outside the output folder {root}; "
                              "nothing was exported")
    return path


def _plan(dump: Dump, out: Path, task: str) -> list[tuple[int, int, Any, Path, list[tuple[str, str, Path]]]]:
    """Every (step, rank, calls, rank folder, [(tensor key, row name, target file)]) to write, checked before
    anything is written: each file stays under ``out``, and no two tensors share a file name."""
    root = out.resolve()
    plan = []
    for (step, rank), calls in dump.calls.groupby(["step", "rank"], sort=True):
        rank_dir = out / f"step{int(step)}" / f"rank{int(rank)}"
        for name in ("dump.json", "stack.json", "construct.json"):
            _inside(rank_dir / name, root, f"step {int(step)} rank {int(rank)}")
        files: list[tuple[str, str, Path]] = []
        if task == "tensor" and (calls["data_name"] != "").any():
            rows = calls.loc[calls["data_name"] != "", ["data_name", "name"]].drop_duplicates()
            owner: dict[str, tuple[str, str]] = {}  # file name -> (tensor key, row name) that claimed it
            for key, name in zip(rows["data_name"], rows["name"], strict=True):
                file_name = msprobe_data_name(key, name)
                first = owner.setdefault(file_name, (key, name))
                if first[0] != key:
                    raise DumpFormatError(f"records {first[1]!r} and {name!r} (step {int(step)}, rank {int(rank)}) "
                                          f"would both be saved as dump_tensor_data/{file_name}; nothing was exported")
                target = _inside(rank_dir / "dump_tensor_data" / file_name, root, f"record {name!r}")
                files.append((key, name, target))
        plan.append((int(step), int(rank), calls, rank_dir, files))
    return plan


def export_msprobe(dump: Dump, out_dir: str | Path, *, tensors: bool = True, _stacklevel: int = 2) -> Path:
    """Write ``dump`` under ``out_dir/step{N}/rank{R}/`` in msprobe's format; returns ``out_dir``.

    Nothing is written outside ``out_dir``: file names made from dump content are sanitised, and every path
    is checked (symlinks followed) before the first file is written. Tensors that cannot be found in the
    source (a partial dump_tensor_data) are skipped with a warning (``_stacklevel``: Dump.export_msprobe's).
    """
    out = Path(out_dir)
    task, level = _task(dump), _level(dump)
    extras = {(r.get("step"), r.get("rank")): r for r in dump.meta.get("ranks", []) if isinstance(r, dict)}
    plan = _plan(dump, out, task)
    missing: list[str] = []
    # a bar for 8 ranks or more, or 200 tensor files or more
    show = wanted(max(len(plan), sum(len(p[4]) for p in plan) // 25), minimum=8)
    for step, rank, calls, rank_dir, files in bar(plan, desc="exporting ranks", unit="rank", explicit=show):
        rank_dir.mkdir(parents=True, exist_ok=True)
        tensor_dir = rank_dir / "dump_tensor_data"
        _write_json(rank_dir / "dump.json", {
            "task": task, "level": level, "framework": "pytorch",
            "dump_data_dir": str(tensor_dir.resolve()) if files else None,
            "data": build_records(calls),
        })
        _write_json(rank_dir / "stack.json", _stack_json(calls, dump.stack_frames))
        _write_json(rank_dir / "construct.json", _construct_json(calls, level, extras.get((step, rank), {})))
        if files and tensors:
            tensor_dir.mkdir(exist_ok=True)
            written: dict[str, Path | None] = {}  # source key -> first file written (shared tensors are copied)
            for key, _, target in files:
                if key in written:
                    first = written[key]
                    if first is None:
                        missing.append(str(target.relative_to(out)))
                    elif first != target:
                        shutil.copyfile(first, target)
                    continue
                try:
                    value = dump.load_tensor(key, step=step, rank=rank)
                except FileNotFoundError:
                    written[key] = None
                    missing.append(str(target.relative_to(out)))
                    continue
                _save_tensor(value, target)
                written[key] = target
    if missing:
        warnings.warn(f"{len(missing)} tensor file(s) absent from the source were not exported, "
                      f"e.g. {missing[0]}", stacklevel=_stacklevel)
    return out
