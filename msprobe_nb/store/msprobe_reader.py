"""Read msprobe dump output (dump.json, stack.json, construct.json, dump_tensor_data/) into DumpParts.

One row per leaf of every record, named like the rows of msprobe's compare CSV, so that a dump made by
msprobe on a real Ascend machine can be analysed and compared exactly like one recorded by msprobe_nb.
Whole tensors are loaded lazily and only through pickle-free loaders (``torch.load(weights_only=True)``,
``numpy.load(allow_pickle=False)``, numeric dtypes only), and only from inside the dump folder unless the
caller passes ``allow_outside=True``. Dump content is untrusted: every malformed or hostile input (deep
nesting, huge numbers, impossible shapes, duplicate keys, path-like data names) is a DumpFormatError
naming the file and what is wrong, never a crash deeper down.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.progress import bar
from msprobe_nb.store.errors import DumpFormatError, show  # one error class for every dump reader, without h5py
from msprobe_nb.store.msprobe_tensors import MsprobeTensorLoader, load_tensor_file
from msprobe_nb.store.msprobe_tree import RankDir, find_rank_dirs, is_plain_file_name
from msprobe_nb.store.schema import DumpParts, coerce_calls

__all__ = ["DumpFormatError", "RankDir", "find_rank_dirs", "is_plain_file_name", "load_tensor_file", "parse_call",
           "read_msprobe"]

DIRECTIONS = ("forward", "backward", "parameters_grad")
#: ``type`` values of leaves that carry tensor statistics.
TENSOR_TYPES = {"torch.Tensor", "numpy.ndarray", "mindspore.Tensor", "mindtorch.Tensor", "jittor.Var"}
#: dump.json stat key -> calls column.
STAT_KEYS = {"Max": "max", "Min": "min", "Mean": "mean", "Norm": "norm"}
#: dump.json record key -> (io, is_kwarg) for forward/backward records.
RECORD_KEYS = {
    "input_args": ("input", False),
    "input_kwargs": ("input", True),
    "input": ("input", False),
    "output": ("output", False),
    "parameters": ("parameters", False),
}
MICRO_STEP_KEY = "megatron_micro_step_number"
# ASCII digits only, and few enough to fit the int32 step/rank/counter columns
MAX_DEPTH = 100
#: largest element count a shape may claim (numel is an int64 column)
_MAX_NUMEL = 2 ** 63 - 1


# ----------------------------------------------------------------------------- JSON helpers

class _DuplicateKey(Exception):
    """Raised inside json.loads by _unique_keys; read_json turns it into a DumpFormatError naming the file."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """object_pairs_hook: refuse a key given twice in one object (json would silently keep the last one)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def read_json(path: Path) -> Any:
    """Parse one JSON file. Corrupt, truncated or hostile text (bad UTF-8, duplicate keys, nesting Python
    cannot parse, integers of more digits than Python converts) is a DumpFormatError naming the file and
    what is wrong. A UTF-8 byte order mark is accepted, as configs accept one."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DumpFormatError(f"{path}: not UTF-8 text (byte {e.start}); is this really a JSON file?") from None
    if not text.strip():
        raise DumpFormatError(f"{path}: the file is empty (msprobe flushes JSON only at stop()/step())")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        hint = " (the file looks truncated)" if e.pos >= len(text.rstrip()) else ""
        raise DumpFormatError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}{hint}") from None
    except _DuplicateKey as e:
        raise DumpFormatError(f"{path}: key {show(e.args[0])} appears twice in one object; refusing to guess "
                              "which one msprobe meant") from None
    except RecursionError:
        raise DumpFormatError(f"{path}: JSON nested too deeply to parse (msprobe nests a few levels)") from None
    except ValueError as e:  # int("<4301+ digits>") inside the decoder
        first = str(e).split(";")[0]
        raise DumpFormatError(f"{path}: a number has too many digits to read ({first})") from None


def _where(call: str, path: tuple) -> str:
    return f'data["{call}"]' + "".join(f"[{k}]" if isinstance(k, int) else f'["{k}"]' for k in path)


# ----------------------------------------------------------------------------- call names

def _is_counter(token: str) -> bool:
    """ASCII digits that fit the int32 counter column ("²".isdigit() is true, int("²") fails)."""
    return 0 < len(token) <= 9 and token.isascii() and token.isdigit()


def parse_call(call: str) -> dict[str, Any]:
    """Split a call name into family, op, module_path, counter, direction.

    ``Module.<path>.<Class>.<forward|backward>.<n>``, ``Module.<path>.<Class>.parameters_grad[.<n>]`` and
    ``<Family>.<op>.<n>.<forward|backward>`` (op may hold dots, e.g. aten overloads); anything else keeps
    its first token as family and the rest as op.
    """
    parts = call.split(".")
    out = {"family": parts[0], "op": "", "module_path": "", "counter": 0, "direction": ""}
    if parts[0] in ("Module", "Cell"):
        idx = next((i for i in range(len(parts) - 1, 1, -1) if parts[i] in DIRECTIONS), None)
        if idx is not None:
            tail = parts[idx + 1:]
            out.update(direction=parts[idx], op=parts[idx - 1], module_path=".".join(parts[1:idx - 1]))
            if len(tail) == 1 and _is_counter(tail[0]):
                out["counter"] = int(tail[0])
            return out
    elif len(parts) >= 4 and parts[-1] in DIRECTIONS and _is_counter(parts[-2]):
        out.update(op=".".join(parts[1:-2]), counter=int(parts[-2]), direction=parts[-1])
        return out
    if len(parts) >= 3 and _is_counter(parts[-2]):  # e.g. debug.json "<name>.<n>.debug"
        out.update(op=".".join(parts[1:-2]), counter=int(parts[-2]), direction=parts[-1])
    else:
        out["op"] = ".".join(parts[1:])
    return out


# ----------------------------------------------------------------------------- leaves -> rows

def _is_leaf(node: Any, file: Path, call: str, path: tuple) -> bool:
    """A record leaf: a tensor/value dict (has a string ``type``/``class_type``), null or a bare scalar.

    A dict whose ``type`` is a number or true/false is neither a leaf nor a container of arguments: refused.
    """
    if isinstance(node, dict):
        typ = node.get("type")
        if typ.__class__ is str:  # the common case, first
            return True
        cls = node.get("class_type")
        if isinstance(typ, str) or isinstance(cls, str):
            return True
        for key, v in (("type", typ), ("class_type", cls)):
            if isinstance(v, (bool, int, float)):
                raise DumpFormatError(f"{file}: {_where(call, path + (key,))} is {show(v)}, expected a type name")
        return False
    return not isinstance(node, list)


def _too_deep(file: Path, call: str, path: tuple) -> DumpFormatError:
    return DumpFormatError(f"{file}: {_where(call, path[:3])}... nests deeper than {MAX_DEPTH} levels "
                           "(msprobe nests a few)")


def _leaves(node: Any, arg: str, path: tuple, file: Path, call: str):
    """Yield ``(arg, json_path, leaf)`` for every leaf below ``node``; lists give '0', '1', dicts their keys."""
    if _is_leaf(node, file, call, path):
        yield arg, path, node
        return
    if len(path) >= MAX_DEPTH:
        raise _too_deep(file, call, path)
    items = enumerate(node) if isinstance(node, list) else node.items()
    for key, child in items:
        yield from _leaves(child, f"{arg}.{key}" if arg else str(key), path + (key,), file, call)


def _check_depth(node: Any, file: Path, call: str, path: tuple) -> None:
    """Refuse a value leaf nested beyond MAX_DEPTH (json.dumps, and whoever reads it back, recurse)."""
    todo = [(node, len(path))]
    while todo:
        n, depth = todo.pop()
        children = n.values() if isinstance(n, dict) else n if isinstance(n, list) else ()
        if children and depth >= MAX_DEPTH:
            raise _too_deep(file, call, path)
        todo.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _stat(value: Any, file: Path, call: str, path: tuple) -> float:
    """A dump.json statistic as float: bool -> 1/0, null -> NaN, "inf"/"nan" strings -> floats."""
    if value is None:
        return math.nan
    if isinstance(value, (bool, int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond 1.8e308
            raise DumpFormatError(f"{file}: {_where(call, path)} is an integer of {len(str(value))} digits, "
                                  "beyond the range of a float") from None
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise DumpFormatError(f"{file}: {_where(call, path)} is {show(value)}, "
                          "expected a number, true/false, null, 'inf' or 'nan'")


def _text(leaf: dict, key: str, file: Path, call: str, path: tuple) -> str:
    """A string field of a tensor leaf (dtype, md5, data_name): a string or null, never a container."""
    v = leaf.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DumpFormatError(f"{file}: {_where(call, path + (key,))} is {show(v)}, expected a string")
    return v


def _shape(shape: Any, file: Path, call: str, path: tuple) -> tuple[tuple[int, ...], int]:
    """(shape, numel) of a tensor leaf: non-negative integers whose product fits the int64 numel column."""
    if shape.__class__ is list:  # one pass for the common case; the checks below only name what is wrong
        numel = 1
        for v in shape:
            if v.__class__ is not int or v < 0:
                break
            numel *= v
        else:
            if numel <= _MAX_NUMEL:
                return tuple(shape), numel
    if not (isinstance(shape, list) and all(type(v) is int for v in shape)):
        raise DumpFormatError(f'{file}: {_where(call, path + ("shape",))} is {show(shape)}, '
                              "expected a list of integers")
    if any(v < 0 for v in shape):
        raise DumpFormatError(f'{file}: {_where(call, path + ("shape",))} is {show(shape)}: '
                              "a dimension is negative")
    numel = 1
    for v in shape:  # stops early: a hostile shape may hold thousands of huge dimensions
        numel *= v
        if numel > _MAX_NUMEL:
            raise DumpFormatError(f'{file}: {_where(call, path + ("shape",))} is {show(shape)}: '
                                  "more elements than any tensor can hold (2**63)")
    return tuple(shape), numel


_BASE_COLS = ("step", "rank", "call_index", "call", "family", "op", "module_path", "counter", "direction",
              "stack_id", "parent")
_ROW_COLS = ("name", "io", "arg", "is_kwarg")
_LEAF_COLS = ("kind", "dtype", "shape", "numel", "requires_grad", "max", "min", "mean", "norm", "hash",
              "value_type", "value", "data_name")
_NAN4 = (math.nan,) * 4
#: columns built straight into typed numpy arrays (the rest go through object arrays and coerce_calls)
_FAST = {"step": np.int64, "rank": np.int64, "call_index": np.int64, "counter": np.int64, "stack_id": np.int64,
         "is_kwarg": bool, "max": np.float64, "min": np.float64, "mean": np.float64, "norm": np.float64}
_NONE_LEAF = ("none", "", None, None, None, *_NAN4, "", "", "", "")


class _RowBuilder:
    """Collects rows cheaply: call-level columns once per call, row tuples per leaf; columns at the end."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.row_call: list[int] = []
        self.rows: list[tuple] = []

    def frame(self) -> pd.DataFrame:
        data: dict[str, Any] = {}
        if self.rows:
            take = np.asarray(self.row_call, dtype=np.int64)
            for col, values in zip(_BASE_COLS, zip(*self.calls, strict=True), strict=True):
                data[col] = np.asarray(values, dtype=_FAST.get(col, object))[take]
            for col, values in zip(_ROW_COLS + _LEAF_COLS, zip(*self.rows, strict=True), strict=True):
                data[col] = _object_array(values) if col == "shape" else np.asarray(values, _FAST.get(col, object))
        else:
            data = {c: [] for c in _BASE_COLS + _ROW_COLS + _LEAF_COLS}
        # object columns stay objects until coerce_calls types them: pandas would infer pyarrow-backed text
        # where pyarrow is installed, which refuses the lone surrogates a hostile dump.json can hold
        as_objects = (None, np.dtype(object))
        return coerce_calls(pd.DataFrame({c: pd.Series(v, dtype=object) if getattr(v, "dtype", None) in as_objects
                                          else v for c, v in data.items()}))


def _object_array(values: tuple) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _leaf_values(leaf: Any, file: Path, call: str, path: tuple) -> tuple:
    """The _LEAF_COLS values of one leaf (kind, dtype, shape, stats, value...)."""
    if leaf is None:
        return _NONE_LEAF
    if not isinstance(leaf, dict):  # bare scalar, e.g. "..." for Ellipsis
        return ("value", "", None, None, None, *_NAN4, "", "", json.dumps(leaf, ensure_ascii=False), "")
    typ = leaf.get("type") if isinstance(leaf.get("type"), str) else leaf.get("class_type")
    if typ in TENSOR_TYPES or ("dtype" in leaf and "shape" in leaf and "value" not in leaf):
        shape, numel = (None, None) if leaf.get("shape") is None else _shape(leaf["shape"], file, call, path)
        rg = leaf.get("requires_grad")
        if rg is not None and not isinstance(rg, bool):
            raise DumpFormatError(f'{file}: {_where(call, path + ("requires_grad",))} is {show(rg)}, '
                                  "expected true/false")
        stats = []
        for key in STAT_KEYS:
            v = leaf.get(key)
            if type(v) is float:
                stats.append(v)
            else:
                stats.append(_stat(v, file, call, path + (key,)))
        dtype, md5, data_name = leaf.get("dtype", ""), leaf.get("md5", ""), leaf.get("data_name", "")
        if not (dtype.__class__ is md5.__class__ is data_name.__class__ is str):
            dtype, md5, data_name = (_text(leaf, k, file, call, path) for k in ("dtype", "md5", "data_name"))
        if data_name and not is_plain_file_name(data_name):
            raise DumpFormatError(f'{file}: {_where(call, path + ("data_name",))} is {show(data_name)}, expected '
                                  'a plain file name in dump_tensor_data (no folders, no "..")')
        return ("tensor", dtype, shape, numel, rg, *stats, md5, "" if typ == "torch.Tensor" else typ, "", data_name)
    if any(v.__class__ is list or v.__class__ is dict for v in leaf.values()):
        _check_depth(leaf, file, call, path)
    if len(leaf) == 2 and "value" in leaf and "type" in leaf:
        value = json.dumps(leaf["value"], ensure_ascii=False)
    else:  # torch.memory_format, P2POp...: keep the whole record so the writer can give it back verbatim
        value = json.dumps(leaf, ensure_ascii=False)
    return ("value", "", None, None, None, *_NAN4, "", typ, value, "")


def _check_record_value(key: str, value: Any, file: Path, call: str) -> None:
    """A record's top-level values: input_args a list, input_kwargs an object, anything else a list, an object
    or null (bare values such as "..." only occur inside them)."""
    want = {"input_args": (list,), "input_kwargs": (dict,)}.get(key, (list, dict, type(None)))
    if not isinstance(value, want):
        names = {list: "a list", dict: "an object", type(None): "null"}
        raise DumpFormatError(f"{file}: {_where(call, (key,))} is {show(value)}, expected "
                              f"{' or '.join(names[t] for t in want)}")


def _read_records(rd: RankDir, data: dict, builder: _RowBuilder, call_stack: dict, construct: dict) -> None:
    file = rd.dump_json
    for index, (call, record) in enumerate(data.items()):
        if not isinstance(record, dict):
            raise DumpFormatError(f'{file}: data["{call}"] is {type(record).__name__}, expected an object')
        p = parse_call(call)
        builder.calls.append((rd.step, rd.rank, index, call, p["family"], p["op"], p["module_path"], p["counter"],
                              p["direction"], call_stack.get(call, -1), construct.get(call, "")))
        ordinal = len(builder.calls) - 1
        grads = p["direction"] == "parameters_grad"
        for key, value in record.items():
            kind = value.__class__
            if not ((kind is list and key != "input_kwargs") or (kind is dict and key != "input_args")):
                _check_record_value(key, value, file, call)  # null is fine for keys other than these two
            if grads:  # {param: [stats]}: the row is named <call>.<param>
                io, is_kwarg, prefix = "parameters_grad", False, str(key)
                if isinstance(value, list) and len(value) == 1:
                    value = value[0]
            else:
                (io, is_kwarg), prefix = RECORD_KEYS.get(key, (key, False)), ""
            for arg, path, leaf in _leaves(value, prefix, (key,), file, call):
                name = f"{call}.{arg}" if grads else (f"{call}.{io}.{arg}" if arg else f"{call}.{io}")
                builder.row_call.append(ordinal)
                builder.rows.append((name, io, arg, is_kwarg, *_leaf_values(leaf, file, call, path)))


def _side_file(rd: RankDir, name: str) -> tuple[Path, dict]:
    """(path, JSON object) of an optional file beside dump.json; an empty object when it is absent."""
    file = rd.folder / name
    if not file.is_file():
        return file, {}
    obj = read_json(file)
    if not isinstance(obj, dict):
        raise DumpFormatError(f"{file}: top level is {type(obj).__name__}, expected an object")
    return file, obj


def _read_stack(rd: RankDir, stacks: dict[int, list[str]], ids: dict[tuple, int]) -> dict[str, int]:
    """call -> global stack id from stack.json (new ``{id: [[calls], [frames]]}`` or old ``{call: [frames]}``)."""
    file, obj = _side_file(rd, "stack.json")
    out: dict[str, int] = {}
    for key, entry in obj.items():
        if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                and isinstance(entry[1], list)):
            calls, frames = entry
        elif isinstance(entry, list) and all(isinstance(f, str) for f in entry):
            calls, frames = [key], entry
        else:
            raise DumpFormatError(f"{file}: [{show(key)}] is neither [[calls], [frames]] nor a list of frames")
        if not all(isinstance(x, str) for x in (*calls, *frames)):
            raise DumpFormatError(f"{file}: [{show(key)}] holds a call or frame that is not a string")
        sid = ids.setdefault(tuple(frames), len(ids))
        stacks.setdefault(sid, list(frames))
        for call in calls:
            out[call] = sid
    return out


def _read_construct(rd: RankDir, meta_extra: dict) -> dict[str, str]:
    """call -> parent from construct.json; Megatron ``[parent, micro_step]`` values keep their micro step."""
    file, obj = _side_file(rd, "construct.json")
    out: dict[str, str] = {}
    micro: dict[str, Any] = {}
    for call, value in obj.items():
        if call == MICRO_STEP_KEY:
            if isinstance(value, (list, dict)):
                raise DumpFormatError(f"{file}: [{show(call)}] is {show(value)}, expected a number")
            meta_extra[MICRO_STEP_KEY] = value
            continue
        if (isinstance(value, list) and len(value) == 2 and (value[0] is None or isinstance(value[0], str))
                and not isinstance(value[1], (list, dict))):
            value, micro[call] = value
        if value is not None and not isinstance(value, str):
            raise DumpFormatError(f"{file}: [{show(call)}] is {show(value)}, expected a parent call name, null "
                                  f"or [parent, micro_step]")
        out[call] = value or ""
    if micro:
        meta_extra["micro_step"] = micro
    return out


# ----------------------------------------------------------------------------- entry point

def read_msprobe(path: str | Path, *, allow_outside: bool = False) -> DumpParts:
    """Read an msprobe dump (dump.json file, rank dir, step dir or dump root) into DumpParts.

    Tensor files are read only from inside the dump folder (``path``, or the folder of a dump.json given
    directly); ``allow_outside=True`` also follows symlinks and a ``dump_data_dir`` that lead elsewhere.
    """
    rank_dirs = find_rank_dirs(path)
    src = Path(path)
    root = (src if src.is_dir() else src.parent).resolve()
    builder = _RowBuilder()
    stacks: dict[int, list[str]] = {}
    stack_ids: dict[tuple, int] = {}
    construct_all: dict[str, str] = {}
    folders: dict[tuple[int, int], list[Path]] = {}
    meta: dict[str, Any] = {"format": "msprobe", "task": "", "level": "", "framework": "", "ranks": [],
                            "notes": []}
    seen: set[tuple[int, int]] = set()
    for rd in bar(rank_dirs, desc="reading msprobe ranks", unit="rank", minimum=8):
        if (rd.step, rd.rank) in seen:
            raise DumpFormatError(f"{rd.dump_json}: step {rd.step} rank {rd.rank} appears twice")
        seen.add((rd.step, rd.rank))
        head = read_json(rd.dump_json)
        if not isinstance(head, dict) or not isinstance(head.get("data"), dict):
            raise DumpFormatError(f'{rd.dump_json}: expected an object with a "data" object (msprobe dump.json)')
        for key in ("task", "level", "framework", "dump_data_dir"):
            if head.get(key) is not None and not isinstance(head[key], str):
                raise DumpFormatError(f'{rd.dump_json}: "{key}" is {show(head[key])}, expected a string or null')
        extra: dict[str, Any] = {}
        call_stack = _read_stack(rd, stacks, stack_ids)
        construct = _read_construct(rd, extra)
        for k, v in construct.items():
            construct_all.setdefault(k, v)
        _read_records(rd, head["data"], builder, call_stack, construct)
        tensor_dirs = [rd.folder / "dump_tensor_data"]
        if head.get("dump_data_dir") and (rd.folder / head["dump_data_dir"]).is_dir():  # relative: to the rank
            tensor_dirs.append(rd.folder / head["dump_data_dir"])
        folders[(rd.step, rd.rank)] = tensor_dirs
        for key in ("task", "level", "framework"):
            value = str(head.get(key) or "")
            if meta[key] and value != meta[key]:
                meta["notes"].append(f"{rd.dump_json}: {key} {value!r} differs from {meta[key]!r}")
            meta[key] = meta[key] or value
        meta["ranks"].append({"step": rd.step, "rank": rd.rank, "path": str(rd.folder),
                              "dump_data_dir": head.get("dump_data_dir"), **extra})
        meta["notes"].extend(rd.notes)
    return DumpParts(calls=builder.frame(), stacks=stacks, construct=construct_all, meta=meta,
                     tensor_loader=MsprobeTensorLoader(folders, root, allow_outside), source=str(src.resolve()))
