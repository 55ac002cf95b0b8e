"""Walk call arguments and results of any nesting into leaves: (path, value) pairs.

Paths follow msprobe's row names: ``0``, ``1.0`` (element 0 of a list in argument 1), ``weight``
(a keyword argument, a dict key or a namedtuple field). Non-tensor leaves are described by a type name
and a JSON text, so they can be stored in a column and compared as text.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any, Protocol, TypeGuard

import torch

MAX_DEPTH = 64
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


class _NamedTuple(Protocol):
    _fields: tuple[str, ...]


def is_namedtuple(x: Any) -> TypeGuard[_NamedTuple]:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def walk(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Yield (path, leaf) for every leaf of ``value``; tensors, None and scalars are leaves."""
    if isinstance(value, torch.Tensor) or value is None or depth >= MAX_DEPTH:
        yield path, value
    elif isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        if is_namedtuple(value):
            for field in value._fields:
                yield from walk(getattr(value, field), f"{path}.{field}" if path else field, depth + 1)
        else:
            for i, item in enumerate(value):
                yield from walk(item, f"{path}.{i}" if path else str(i), depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, f"{path}.{key}" if path else str(key), depth + 1)
    else:
        yield path, value


_SEQ = (list, tuple)
_TENSOR = torch.Tensor
POSITIONS = tuple(str(i) for i in range(256))  # argument positions as path strings, made once


def leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``list(walk(value, prefix))``, with fast paths for flat argument tuples and keyword dicts (the
    common cases: a generator per level costs more than the rows it yields)."""
    kind = type(value)
    if kind in _SEQ:  # exactly list or tuple: a namedtuple is a subclass
        out = []
        for i, item in enumerate(value):
            p = f"{prefix}.{i}" if prefix else (POSITIONS[i] if i < 256 else str(i))
            if type(item) is _TENSOR or item is None:
                out.append((p, item))
            elif isinstance(item, (list, tuple, dict)) and not isinstance(item, torch.Size):
                out.extend(walk(item, p, 1))
            else:
                out.append((p, item))
        return out
    if kind is dict:
        out = []
        for key, item in value.items():
            p = f"{prefix}.{key}" if prefix else (key if type(key) is str else str(key))
            if isinstance(item, (list, tuple, dict)) and not isinstance(item, torch.Size):
                out.extend(walk(item, p, 1))
            else:
                out.append((p, item))
        return out
    return list(walk(value, prefix))


class RecordedValue:
    """A non-tensor argument described by the capture module that understands it (a process group by its
    ranks, a reduce op by name): :func:`describe_value` gives its type name and JSON text as they are."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text


#: (type, value) -> (type name, JSON text) of the plain scalars calls pass again and again (an optimizer's lr
#: and betas, a dim, an eps): a dict lookup instead of a rendering per row. Zero floats are left out (-0.0
#: equals 0.0 but renders apart), and NaN.
SCALAR_TEXT: dict[tuple[type, Any], tuple[str, str]] = {}
_SCALAR_TYPES = (bool, int, float, str)


def describe_value(x: Any) -> tuple[str, str]:
    """(type name, JSON text) for a non-tensor leaf, in msprobe's vocabulary (torch.dtype, slice, ...)."""
    kind = type(x)
    if kind in _SCALAR_TYPES:
        key = (kind, x)
        got = SCALAR_TEXT.get(key)
        if got is None:
            got = _describe(x)
            # not 0.0 / -0.0, nor NaN (each NaN object would be a new key), nor long strings
            if (kind is not float or (x and x == x)) and (kind is not str or len(x) <= 64):
                if len(SCALAR_TEXT) >= 4096:
                    SCALAR_TEXT.clear()
                SCALAR_TEXT[key] = got
        return got
    return _describe(x)


def _describe(x: Any) -> tuple[str, str]:
    if type(x) is RecordedValue:
        return x.type_name, x.text
    if isinstance(x, bool):
        return "bool", "true" if x else "false"
    if isinstance(x, int):
        return "int", str(x)
    if isinstance(x, float):
        return "float", _float_json(x)
    if isinstance(x, str):
        return "str", json.dumps(x, ensure_ascii=False)
    if isinstance(x, torch.dtype):
        return "torch.dtype", json.dumps(str(x))
    if isinstance(x, torch.device):
        return "torch.device", json.dumps(str(x))
    if isinstance(x, torch.Size):
        return "torch.Size", json.dumps(list(x))
    if isinstance(x, slice):
        return "slice", json.dumps([_plain(x.start), _plain(x.stop), _plain(x.step)])
    if x is Ellipsis:
        return "ellipsis", json.dumps("...")
    if isinstance(x, torch.memory_format):
        return "torch.memory_format", json.dumps(str(x).replace("torch.", ""))
    if isinstance(x, torch.layout):
        return "torch.layout", json.dumps(str(x))
    if isinstance(x, torch.Generator):
        return "torch.Generator", json.dumps(str(x.device))
    item = getattr(x, "item", None)
    if item is not None and type(x).__module__ == "numpy":
        try:
            return type(x).__name__, json.dumps(_plain(item()))
        except (TypeError, ValueError):
            pass
    if isinstance(x, complex):
        return "complex", json.dumps([x.real, x.imag])
    # a default repr names the object's address, which changes from run to run: two identical runs
    # would differ in every such argument (a ProcessGroup, a user's config object)
    return type(x).__qualname__, json.dumps(_ADDRESS.sub("", repr(x))[:200], ensure_ascii=False)


def _float_json(x: float) -> str:
    if math.isnan(x):
        return '"nan"'
    if math.isinf(x):
        return '"inf"' if x > 0 else '"-inf"'
    return repr(x)


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    return repr(v)
