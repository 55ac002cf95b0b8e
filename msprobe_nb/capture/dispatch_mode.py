"""L2 capture: a torch dispatch mode sees aten operators, forward and backward alike.

Ops that run inside the autograd engine (``loss.backward()``) are recorded with direction ``backward``
and their own counters, e.g. ``Aten.mm.3.backward``; at this level "backward" means "executed by
autograd", not "gradient of forward call n" as at L1. (msprobe's L2 is an NPU kernel dump of one API;
the kit's L2 is the aten trace that works on any device.)
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe_nb.capture.recorder import Call, Recorder, caller_frame

_is_compiling = torch.compiler.is_compiling
_graph_task_id = torch._C._current_graph_task_id
# bookkeeping ops that carry no numerics of their own
_SKIP = frozenset({"detach", "alias", "lift_fresh", "_to_copy_noop", "_local_scalar_dense", "is_same_size",
                   "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"})


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
                counter = rec.next_counter(f"Aten.{op}.{direction}")
                name = f"Aten.{op}.{counter}.{direction}"
                c = Call(name, "Aten", op, counter, direction, parent=rec.current_parent())
                c.dump = rec.selected(name, "Aten", op)
                if c.dump:
                    c.stack_id = rec.stack_id(caller_frame(2)) if direction == "forward" else -1
                    c.index = rec._take_index()
                    rec.add_rows(c, direction, "input", args)
                    if kwargs:
                        rec.add_rows(c, direction, "input", kwargs, is_kwarg=True)
            except Exception as exc:
                rec.note_error(f"inputs of aten.{op}", exc)
                return func(*args, **kwargs)
        out = func(*args, **kwargs)
        with rec.working():
            try:
                rec.add_rows(c, direction, "output", out if isinstance(out, (tuple, list)) else [out],
                             set_producer=True)
            except Exception as exc:
                rec.note_error(f"outputs of aten.{op}", exc)
        return out
