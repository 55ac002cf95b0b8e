"""L2 capture: a torch dispatch mode sees aten operators, forward and backward alike.

Ops that run inside the autograd engine (``loss.backward()``) are recorded with direction ``backward``
and their own counters, e.g. ``Aten.mm.3.backward``; at this level "backward" means "executed by
autograd", not "gradient of forward call n" as at L1. (msprobe's L2 is an NPU kernel dump of one API;
the kit's L2 is the aten trace that works on any device.)
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe_nb.capture.recorder import Call, Recorder
from msprobe_nb.capture.stacks import caller_frame

_is_compiling = torch.compiler.is_compiling
_graph_task_id = torch._C._current_graph_task_id
# bookkeeping ops that carry no numerics of their own; the profiler's record-function ops (the optimizer
# step, the DataLoader and DDP open one) pass an opaque handle whose identity changes every run
_SKIP = frozenset({"detach", "alias", "lift_fresh", "_to_copy_noop", "_local_scalar_dense", "is_same_size",
                   "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
                   "_record_function_enter", "_record_function_enter_new", "_record_function_exit"})
#: schema type kinds whose values are opaque objects (ScriptObjects such as a c10d ProcessGroup or Work,
#: futures, capsules): their repr holds an address, which differs from run to run
_OPAQUE_KINDS = frozenset({"ClassType", "AnyClassType", "AnyType", "CapsuleType", "FutureType", "AwaitType",
                           "RRefType", "VarType", "InterfaceType"})
#: leaves recorded as they are (describe_value renders them without addresses)
_PLAIN = (torch.Tensor, bool, int, float, complex, str, torch.dtype, torch.device, torch.Size, torch.layout,
          torch.memory_format, torch.Generator, torch.SymInt, torch.SymFloat, torch.SymBool, slice, type(None),
          type(Ellipsis))


class _OpInfo:
    """What the schema of one op says, worked out once per op: the arguments it writes to (``Tensor(a!)``:
    in-place and out= variants) and whether its arguments or results may hold opaque objects."""

    __slots__ = ("written", "opaque")

    def __init__(self, func):
        schema = func._schema
        self.written = tuple((i, a.name, a.kwarg_only) for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.opaque = any(_may_be_opaque(a.type) for a in (*schema.arguments, *schema.returns))


def _may_be_opaque(t) -> bool:
    kind = t.kind()
    return kind in _OPAQUE_KINDS or any(_may_be_opaque(c) for c in t.containedTypes())


_INFO: dict = {}  # op overload -> _OpInfo


class _Opaque:
    """Stands in for an opaque argument or result in the rows: its class, never its repr (an address)."""

    __slots__ = ("name",)

    def __init__(self, x):
        try:
            self.name = x._type().qualified_name() if isinstance(x, torch.ScriptObject) else type(x).__qualname__
        except Exception:  # a ScriptObject without a TorchScript type
            self.name = type(x).__qualname__

    def __repr__(self) -> str:
        return self.name


_Opaque.__qualname__ = "ScriptObject"  # the value type of its rows, as describe_value names it


def _without_opaque(value):
    """``value`` with every leaf that is not a plain value (tensor, number, dtype...) replaced by an
    :class:`_Opaque`; aten arguments nest lists, tuples and dicts only."""
    if isinstance(value, _PLAIN):
        return value
    if type(value) in (list, tuple):
        return type(value)(_without_opaque(v) for v in value)
    if type(value) is dict:
        return {k: _without_opaque(v) for k, v in value.items()}
    return _Opaque(value)


def _forget_written(rec: Recorder, info: _OpInfo, args, kwargs) -> None:
    """Make the recorder summarise the tensors the op wrote to afresh when it meets them next (its outputs
    at once). At the Python dispatch key their version counters are not bumped yet (ADInplaceOrView does
    that after the kernel returns), so the recorder would reuse their summaries from before the op."""
    seen = rec._seen
    for i, name, kwarg_only in info.written:
        v = args[i] if not kwarg_only and i < len(args) else kwargs.get(name)
        for t in v if isinstance(v, (list, tuple)) else (v,):
            e = seen.get(id(t))
            if e is not None:
                e[1] = -1  # no version matches (as in Recorder.resume): the tensor id and producer stay


class AtenMode(TorchDispatchMode):
    """Records aten operators into a :class:`Recorder`."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        op = func._opname
        if not rec.active or rec.busy or op in _SKIP or _is_compiling():
            return func(*args, **kwargs)
        direction = "backward" if _graph_task_id() != -1 else "forward"
        with rec.working():
            try:
                info = _INFO.get(func)
                if info is None:
                    info = _INFO[func] = _OpInfo(func)
                counter = rec.next_counter(f"Aten.{op}.{direction}")
                name = f"Aten.{op}.{counter}.{direction}"
                c = Call(name, "Aten", op, counter, direction, parent=rec.current_parent())
                c.dump = rec.selected(name, "Aten", op)
                if c.dump:
                    c.stack_id = rec.stack_id(caller_frame(2)) if direction == "forward" else -1
                    c.index = rec._take_index()
                    rec.add_rows(c, direction, "input", _without_opaque(args) if info.opaque else args)
                    if kwargs:
                        rec.add_rows(c, direction, "input", _without_opaque(kwargs) if info.opaque else kwargs,
                                     is_kwarg=True)
            except Exception as exc:
                rec.note_error(f"inputs of aten.{op}", exc)
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        with rec.working():
            try:
                if info.written and c.dump:
                    _forget_written(rec, info, args, kwargs)
                outs = out if isinstance(out, (tuple, list)) else [out]
                rec.add_rows(c, direction, "output", _without_opaque(outs) if info.opaque else outs,
                             set_producer=True)
            except Exception as exc:
                rec.note_error(f"outputs of aten.{op}", exc)
        return out
