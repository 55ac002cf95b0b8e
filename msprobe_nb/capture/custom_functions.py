"""Custom ``torch.autograd.Function`` calls, recorded as calls of their own (family ``Function``).

``MyFn.apply(...)`` does not go through the function mode, so without help a custom Function shows up only
as the torch calls its forward makes. Nothing of torch is replaced to see it:

* its forward is recognised from inside: when the mode sees a call made directly by a ``forward`` whose
  caller is ``Function.apply``, the kit opens ``Function.MyFn.<n>.forward`` with the arguments ``apply``
  received (read once from that frame), before the inner call's own row;
* its outputs are recorded when a recorded call consumes them (their ``grad_fn`` is the Function's node,
  which is also the forward's ``ctx``), and a post-hook on that node records ``Function.MyFn.<n>.backward``:
  the gradients of its outputs in, the gradients its backward returns for each tensor input out.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction, Function

_APPLY_CODE = Function.apply.__func__.__code__  # type: ignore[attr-defined]  # torch's stubs: a classmethod
_Tensor = torch.Tensor


def is_custom_forward(frame) -> bool:
    """``frame`` runs the ``forward`` of a custom Function, called by ``Function.apply``."""
    up = frame.f_back
    return up is not None and up.f_code is _APPLY_CODE


def is_custom_node(node: Any) -> bool:
    """An autograd node made by a custom Function (the ``ctx`` its forward received)."""
    return isinstance(node, BackwardCFunction)


class CustomFunctions:
    """The custom Function calls of one step: forward opened from inside, outputs and backward from the node."""

    def __init__(self, recorder: Any):
        self.recorder = recorder
        self.calls: dict[int, tuple[Any, Any, list[str], set[int]]] = {}  # id(ctx) -> (ref, Call, paths, outs)
        self.pending: dict[str, list] = {}  # Function name -> calls opened without a ctx, oldest first
        self._frame = None

    def reset(self) -> None:
        self.calls.clear()
        self.pending.clear()
        self._frame = None

    def forward_frame(self, frame) -> None:
        """Open the Function's forward call, once per invocation (``frame`` is its ``forward``)."""
        if frame is self._frame:  # another call of the same forward: already open
            return
        self._frame = frame  # held while it runs (a dead frame's id could be reused); dropped at the step's end
        code = frame.f_code
        if not code.co_argcount:
            return
        local = frame.f_locals  # read once per invocation
        ctx = local.get(code.co_varnames[0])
        if isinstance(ctx, BackwardCFunction):
            hit = self.calls.get(id(ctx))
            if hit is not None and hit[0]() is ctx:  # opened already (not a dead ctx whose id this one took)
                return
        else:  # setup_context style: the node is made after forward returns; matched by name when consumed
            ctx = None
        up = frame.f_back.f_locals
        cls = up.get("cls")
        args = up.get("args") or ()
        name = cls.__name__ if cls is not None else code.co_qualname.split(".")[0]
        self._open(ctx, name, args, frame.f_back.f_back)

    def _open(self, ctx, name: str, args: tuple, caller) -> Any:
        from msprobe_nb.capture.recorder import Call

        rec = self.recorder
        key = ("Function", name)
        counter = rec.api_counters.get(key, 0)
        rec.api_counters[key] = counter + 1
        parent = rec.current_parent()
        c = Call(f"Function.{name}.{counter}.forward", "Function", name, counter, "forward", "", parent)
        c.dump = rec._select_all or rec.selected(c.call, "Function", name)
        paths = [str(i) for i, a in enumerate(args) if isinstance(a, _Tensor)]  # the node's edges, in order
        for a in args:  # a Function fed by another one's output: inside forward no recorded call sees it
            if isinstance(a, _Tensor) and is_custom_node(a.grad_fn):
                self.consumed(a.grad_fn, a)
        if c.dump:
            c.stack_id = rec.stack_id(caller)
            c.index = rec._take_index()
            if parent:
                rec.construct[c.call] = parent
            rec.add_rows(c, "forward", "input", tuple(args))
        outs: set[int] = set()
        entry = (None, c, paths, outs)
        if ctx is None:
            self.pending.setdefault(name, []).append(entry)
        else:
            self.calls[id(ctx)] = (weakref.ref(ctx), c, paths, set())
        return c

    def consumed(self, node: Any, t: _Tensor) -> None:
        """A recorded call takes ``t``, an output of a custom Function: record it, and hook its backward."""
        hit = self.calls.get(id(node))
        if hit is None or hit[0]() is not node:
            name = type(node).__name__.removesuffix("Backward") or "Function"
            waiting = self.pending.get(name)
            if waiting:  # opened from its forward (setup_context style): this node is its ctx
                _, c, paths, outs = waiting.pop(0)
                hit = self.calls[id(node)] = (weakref.ref(node), c, paths, outs)
            else:  # its forward made no recorded call: open it now, its inputs unknown
                self._open(node, name, (), None)
                hit = self.calls[id(node)]
                hit[2][:] = [str(i) for i in range(len(node.next_functions))]
        _, c, paths, outs = hit
        nr = t.output_nr
        if nr in outs:
            return
        first = not outs
        outs.add(nr)
        rec = self.recorder
        rec.add_rows(c, "forward", "output", t, prefix=str(nr), set_producer=True)
        if first and c.dump:
            rec.grads.keep(node.register_hook(self._backward_hook(c, paths)))

    def _backward_hook(self, c, paths: list[str]):
        from msprobe_nb.capture.recorder import Call

        rec = self.recorder
        bname = f"Function.{c.op}.{c.counter}.backward"
        parent = rec.grads.backward_of(c.parent) if c.parent else ""

        def hook(grad_inputs, grad_outputs):
            if not rec.active:
                return
            with rec.working():
                try:
                    b = Call(bname, "Function", c.op, c.counter, "backward", "", parent, c.stack_id,
                             rec._take_index())
                    if parent:
                        rec.construct[bname] = parent
                    rec.add_rows(b, "backward", "input", tuple(grad_outputs))
                    for i, g in enumerate(grad_inputs):
                        rec.add_rows(b, "backward", "output", g, prefix=paths[i] if i < len(paths) else str(i))
                except Exception as exc:  # never break the user's backward
                    rec.note_error(f"backward of {c.call}", exc)
        return hook
