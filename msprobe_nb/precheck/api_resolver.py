"""From a recorded call back to something to run: the torch function of an msprobe name, and its arguments
rebuilt from the call's input rows.

``Functional.linear`` is ``torch.nn.functional.linear``, ``Torch.matmul`` ``torch.matmul``, ``Tensor.__add__``
the method of ``torch.Tensor`` (called with the tensor first), ``VF.lstm`` ``torch._VF.lstm``, ``Aten.add``
and ``mylib.op`` the ``torch.ops`` packets, ``NPU.npu_rms_norm`` a reference implementation when torch_npu is
absent (``references``). Whatever cannot be resolved raises :class:`Unresolvable` with the reason.

Arguments come from the rows' ``arg`` paths (``0``, ``1.0`` for element 0 of argument 1, ``weight`` for a
keyword), ``is_kwarg``, ``kind`` and the ``value_type`` / ``value`` JSON of non-tensor leaves. The record
keeps leaves only, so a nested argument comes back as a list (a tuple for an index of ``__getitem__``), and
an empty list or tuple argument, which has no leaf, is not recorded at all.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from msprobe_nb.precheck import references

__all__ = ["Unresolvable", "build_arguments", "decode_value", "resolve"]


class Unresolvable(Exception):
    """A call the bench cannot rebuild; the message says why."""


_FAMILY_ROOTS = {"Functional": ("torch.nn.functional", "torch._C._nn"),
                 "Torch": ("torch", "torch._C._VariableFunctions"), "VF": ("torch._VF",), "Init": ("torch.nn.init",)}
_NOT_REPLAYED = {"Distributed": "a collective needs the other ranks: it is not replayed alone",
                 "Module": "a module call, not an API", "Function": "a custom autograd.Function: its class is not "
                 "in the dump (register_reference() one)", "Python": "not a torch API"}


def _dotted(root: Any, path: str) -> Any:
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(family: str, op: str) -> tuple[Callable, bool]:
    """(function, is_method) for ``family.op``: ``is_method`` when the first argument is the tensor the
    method is called on. Raises :class:`Unresolvable`."""
    ref = references.lookup(family, op)
    if ref is not None:
        return ref, False
    if family in _NOT_REPLAYED:
        raise Unresolvable(f"{family}.{op}: {_NOT_REPLAYED[family]}")
    if family == "Tensor":
        fn = getattr(torch.Tensor, op, None)
        if fn is None:
            raise Unresolvable(f"Tensor.{op}: torch.Tensor has no method {op!r} in torch {torch.__version__}")
        if not callable(fn):  # a property the mode reports as a call (x.T, x.mT, x.real)
            return (lambda self: getattr(self, op)), True
        return fn, True
    if family in _FAMILY_ROOTS:
        import importlib
        for root in _FAMILY_ROOTS[family]:
            try:
                return _dotted(importlib.import_module(root), op), False
            except (AttributeError, ImportError):
                continue
        raise Unresolvable(f"{family}.{op}: no such function in {' or '.join(_FAMILY_ROOTS[family])} "
                           f"(torch {torch.__version__})")
    if family == "NPU":
        raise Unresolvable(f"NPU.{op}: torch_npu is absent and no reference implementation is registered "
                           "(register_reference())")
    ns = "aten" if family == "Aten" else family
    packet = getattr(torch.ops, ns, None)
    fn = getattr(packet, op, None) if packet is not None else None
    if fn is None:
        raise Unresolvable(f"{family}.{op}: no torch.ops.{ns}.{op} in this process (load the library that defines "
                           "it, or register_reference())")
    return fn, False


def decode_value(vtype: str, text: str) -> Any:
    """A non-tensor leaf from its recorded type and JSON text. Raises :class:`Unresolvable` for values that
    were recorded as a description only (an object's repr, a generator)."""
    try:
        v: Any = json.loads(text) if text else None  # any JSON value; each type below says which it expects
    except json.JSONDecodeError as exc:
        raise Unresolvable(f"value {text!r} of type {vtype} is not JSON: {exc}") from None
    if vtype in ("int", "bool", "str"):
        return v
    if vtype == "float":
        return float(v) if not isinstance(v, str) else float(v)  # "nan", "inf", "-inf"
    if vtype == "torch.dtype":
        dt = getattr(torch, str(v).replace("torch.", ""), None)
        if not isinstance(dt, torch.dtype):
            raise Unresolvable(f"unknown dtype {v!r}")
        return dt
    if vtype == "torch.device":
        return torch.device(v)
    if vtype == "torch.Size":
        return torch.Size(v)
    if vtype == "slice":
        return slice(*v)
    if vtype == "ellipsis":
        return Ellipsis
    if vtype == "torch.memory_format":
        return getattr(torch, v)
    if vtype == "torch.layout":
        return getattr(torch, str(v).replace("torch.", ""))
    if vtype == "complex":
        return complex(v[0], v[1])
    if vtype.startswith(("float", "int", "uint", "bool")):  # numpy scalars: float32, int64, bool_
        return v if not isinstance(v, float) or math.isfinite(v) else float(v)
    raise Unresolvable(f"an argument of type {vtype} was recorded as its description {v!r}, not its value")


def _insert(tree: Any, parts: list[str], leaf: Any) -> Any:
    """Put ``leaf`` at ``parts`` into nested lists (numeric keys) / dicts (named keys)."""
    if not parts:
        return leaf
    head, rest = parts[0], parts[1:]
    if head.isdigit():
        i = int(head)
        tree = tree if isinstance(tree, list) else []
        while len(tree) <= i:
            tree.append(None)
        tree[i] = _insert(tree[i], rest, leaf)
        return tree
    tree = tree if isinstance(tree, dict) else {}
    tree[head] = _insert(tree.get(head), rest, leaf)
    return tree


def build_arguments(rows: Iterable[Any], tensor: Callable[[Any], torch.Tensor], op: str = "") -> tuple[list, dict]:
    """(args, kwargs) of a call from its forward input rows (``rows.Row``); ``tensor(row)`` gives each tensor leaf (the
    recorded one, or one generated from its statistics). Nested positional arguments come back as lists,
    the index of ``__getitem__`` / ``__setitem__`` as a tuple (Python's ``x[a, b]``)."""
    args: list = []
    kwargs: dict = {}
    positions: set[int] = set()
    for row in rows:
        kind = row.kind
        if kind == "tensor":
            leaf = tensor(row)
        elif kind == "none":
            leaf = None
        else:
            leaf = decode_value(str(row.value_type), str(row.value))
        parts = str(row.arg).split(".")
        if bool(row.is_kwarg):
            kwargs[parts[0]] = _insert(kwargs.get(parts[0]), parts[1:], leaf)
        else:
            if not parts[0].isdigit():
                raise Unresolvable(f"positional row {row.name!r} has a non-numeric path {row.arg!r}")
            positions.add(int(parts[0]))
            args = _insert(args, parts, leaf)
    missing = sorted(set(range(len(args))) - positions)
    if missing:
        raise Unresolvable(f"positional argument {missing[0]} has no row (an empty list or tuple leaves none), "
                           "so the call cannot be rebuilt")
    if op in ("__getitem__", "__setitem__") and len(args) > 1 and isinstance(args[1], list):
        args[1] = tuple(args[1])
    return args, kwargs
