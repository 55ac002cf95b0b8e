"""L1 capture: a torch function mode sees every torch, Tensor, functional and torch.ops call.

No function object is replaced, so ``from torch import relu`` is recorded and ``F.gelu`` keeps its
identity. Inside the handler the mode is off, which gives msprobe's "outermost API only" semantics and
lets the statistics run on torch without recording themselves. Under ``torch.compile`` tracing the
handler steps aside, so dynamo neither guards on the recorder nor recompiles per call.

Autograd runs its nodes without any function mode: a call's backward is read from its own nodes
(``grad_hooks`` / ``api_backward``), and a reentrant checkpoint's recompute is recorded by pushing this mode
for that one node's backward. Custom ``autograd.Function`` calls are seen from inside their forward
(``custom_functions``).

Where the optional C extension ``_api_handler`` is built, the common recorded call runs in C (the handler past
the compile check, with the rows through the C row builder) and reaches :meth:`ApiMode._recorded` for the rare
ones; without it, or with ``_api_handler`` set to None before the mode is made, the Python handler below gives
the same rows (tests/test_api_handler.py holds them equal).
"""
from __future__ import annotations

import os
import sys

import torch
import torch.utils.checkpoint
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

from msprobe_nb.capture import c_contract
from msprobe_nb.capture.api_backward import grad_inputs
from msprobe_nb.capture.collectives import handles
from msprobe_nb.capture.custom_functions import is_custom_forward, is_custom_node
from msprobe_nb.capture.leaves import POSITIONS
from msprobe_nb.capture.naming import OPERATOR_AT, OPERATOR_METHODS, resolve_api, tensor_operator
from msprobe_nb.capture.random_apis import DRAWING_APIS
from msprobe_nb.capture.recorder import SAME_ELEMENTS, Call, Recorder

# optional C handler (setup.py, CPython 3.11+); None where it is not built or was built for another layout
_api_handler = c_contract.api_handler()

_is_compiling = torch.compiler.is_compiling
_sequence_nr = torch._C._autograd._get_sequence_nr
#: the node of torch.utils.checkpoint's reentrant variant, whose backward recomputes the forward
_CHECKPOINT_NODE = getattr(torch.utils.checkpoint.CheckpointFunction, "_backward_cls", None)
#: where checkpoint's own calls come from while it replays (its detach, the RNG fork's device lookups)
_CHECKPOINT_FILES = frozenset({torch.utils.checkpoint.__file__, torch.random.__file__})
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TORCH_NN_DIR = os.path.join(_TORCH_DIR, "nn") + os.sep  # a checkpointed module's forward lives there


def _checkpoint_plumbing(func, frame) -> bool:
    """A call that reentrant checkpointing makes itself while it replays (its detach, the RNG fork's device
    lookups, the nested backward), not one of the model's: made from its files, directly or through one of
    torch's own functions (the checkpointed function's calls come from the user's code or from modules)."""
    if func is torch.autograd.backward:
        return True
    name = frame.f_code.co_filename
    if name in _CHECKPOINT_FILES:
        return True
    up = frame.f_back
    return up is not None and up.f_code.co_filename in _CHECKPOINT_FILES and name.startswith(_TORCH_DIR) \
        and not name.startswith(_TORCH_NN_DIR)


class ApiMode(TorchFunctionMode):
    """Records API calls into a :class:`Recorder` (forward now, backward through autograd node hooks)."""

    def __init__(self, recorder: Recorder, randomness=None, record: bool = True):
        super().__init__()
        self.recorder = recorder
        self.randomness = randomness  # msprobe_nb.capture.randomness.RandomPolicy or None
        if randomness is not None and record:
            randomness.replays_reentrant = True  # replay_in_backward pushes this mode for the recompute
        self.record = record  # False: only apply dropout-off / host-random (levels L0 and L2)
        self.replaying = 0  # > 0 while a reentrant checkpoint's backward runs under this mode
        # the C handler, made for this mode and recorder; None: the Python handler. torch's lookups of the mode's
        # __torch_function__ by a C string give the handler itself (string_lookups, at the end of this file), which
        # torch then calls in place of the Python __torch_function__ below; getattr, and so dynamo, finds that one
        self._handler = _api_handler.Handler(c_contract.context(_api_handler, self._handler_parts())) \
            if _api_handler is not None else None
        self._handle = self._handler.handle if self._handler is not None else None

    def _handler_parts(self) -> dict:
        """What the C handler reads and calls, by c_contract.HANDLER_FIELDS name: the recorder's parts it
        calls back (bound once: they live as long as the recorder) and the tables it shares with Python."""
        rec = self.recorder
        return {
            **rec.c_parts(), "mode": self, "collectives": rec.collectives, "resolve": resolve_api,
            "operators": OPERATOR_AT, "operator_methods": OPERATOR_METHODS, "slow": self._recorded,
            "drawing": DRAWING_APIS, "same_elements": SAME_ELEMENTS,
            "graph_task_id": torch._C._current_graph_task_id, "stack_id": rec.stack_id, "selected": rec.selected,
            "is_custom_forward": is_custom_forward, "forward_frame": rec.functions.forward_frame,
            "grad_enabled": torch.is_grad_enabled, "sequence_nr": _sequence_nr, "positions": POSITIONS,
            "grad_inputs": grad_inputs, "checkpoint_node": _CHECKPOINT_NODE,
            "replay_in_backward": self.replay_in_backward, "custom_node": BackwardCFunction,
            "consumed": rec.functions.consumed, "mark_written": rec.mark_written,
            "attach_api_backward": rec.grads.handler_attach(),
            # torch.compiler.is_compiling() outside TorchScript reads this module's flag; the C handler reads it
            # when torch calls the handler directly
            "compiler_globals": vars(torch.compiler),
        }

    def replay_in_backward(self, node) -> None:
        """Record what a reentrant checkpoint recomputes: autograd runs a node without any function mode, so
        the mode is pushed for the node's own backward (its recompute and the nested backward it starts) and
        popped after it. Node hooks only, removed at the step's end with the others."""
        rec = self.recorder
        todo = [node]
        while todo:  # checkpointed layers feeding each other directly: no recorded call sees the earlier ones
            n = todo.pop()
            if id(n) not in rec.grads.replays:
                rec.grads.replays.add(id(n))
                self._replay(n)
                todo.extend(nxt for nxt, _ in n.next_functions if type(nxt) is _CHECKPOINT_NODE)

    def _replay(self, node) -> None:
        rec = self.recorder
        pushed: list = []
        mode = self

        policy = self.randomness

        def pre(grad_outputs):
            if rec.active and not pushed:
                mode.__enter__()
                mode.replaying += 1
                # host draws of the region repeat from where its forward drew (capture/checkpoint_draws.py)
                pushed.append(policy is not None and policy.host_states.enter(node, policy.host_generator))

        def post(grad_inputs, grad_outputs):
            if pushed:
                if pushed.pop():
                    policy.host_states.leave(policy.host_generator)
                mode.replaying -= 1
                mode.__exit__(None, None, None)

        rec.grads.keep(node.register_prehook(pre), node.register_hook(post))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # compiling first: dynamo inlines this function and must not trace the rest (nor the C handler, which
        # it cannot inline: the graph would break at every op)
        if _is_compiling():
            return func(*args, **(kwargs or {}))
        handle = self._handle
        if handle is not None:
            return handle(func, args, kwargs)
        rec = self.recorder
        if not rec.active or rec.busy:
            return func(*args, **(kwargs or {}))
        try:
            resolved = resolve_api(func)  # cached: unrecorded calls (attribute reads...) leave here
        except Exception as exc:  # naming must never break the model
            rec.note_error("naming", exc)
            resolved = None
        if resolved is None:
            return func(*args, **(kwargs or {}))
        return self._recorded(func, resolved, sys._getframe(1), args, kwargs)

    def _recorded(self, func, resolved: tuple[str, str], frame, args: tuple, kwargs: dict | None):
        """A call to record, named ``resolved`` (before the caller's operator is read), made from ``frame``.
        The C handler comes here for the calls it does not record itself (a checkpoint's replay, collectives,
        the randomness-only mode). A call that draws runs in C too, which calls the randomness policy itself."""
        if kwargs is None:
            kwargs = {}
        rec = self.recorder
        if self.replaying and _checkpoint_plumbing(func, frame):
            return func(*args, **kwargs)
        if resolved[0] == "Tensor":
            try:
                resolved = tensor_operator(resolved, frame)
            except Exception as exc:
                rec.note_error("naming", exc)
        family, op = resolved
        if family == "Distributed" and self.record and handles(op):  # collectives: own layout and completion
            return rec.collectives.call(func, op, args, kwargs, frame)
        policy = self.randomness
        if not self.record:
            if policy is None or (family, op) not in DRAWING_APIS:
                return func(*args, **kwargs)
            run, args, kwargs = policy.before(Call("", family, op, -1, "forward", dump=False), func, args, kwargs)
            return run(*args, **kwargs)
        # rec.working(), inlined on this hottest path; inside the handler the mode is already off, so the
        # __torch_function__ switch that working() also flips is not needed here
        lock = rec.lock
        lock.acquire()
        rec.busy += 1
        try:
            if rec.collectives.pending:  # an async collective may have completed: read it before it changes
                rec.collectives.poll()
            if frame.f_code.co_name == "forward" and is_custom_forward(frame):
                rec.functions.forward_frame(frame)
            c = rec.open_api(family, op, frame)
            run = func
            if policy is not None and (family, op) in DRAWING_APIS:
                run, args, kwargs = policy.before(c, func, args, kwargs)
            grads = c.dump and torch.is_grad_enabled()
            inputs = grad_inputs(args, kwargs) if grads else None
            if inputs:  # before the input rows: a custom Function's output gets its producer first
                for _, key in inputs:
                    node = key[2]
                    if type(node) is _CHECKPOINT_NODE:
                        self.replay_in_backward(node)
                    elif is_custom_node(node):
                        rec.functions.consumed(node, key[3])
            rec.add_rows(c, "forward", "input", args)
            if kwargs:
                rec.add_rows(c, "forward", "input", kwargs, is_kwarg=True)
            seq0 = _sequence_nr()
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            version = first._version if first is not None else 0
        except Exception as exc:
            rec.note_error(f"inputs of {family}.{op}", exc)
            c = None
        finally:
            rec.busy -= 1
            lock.release()
        if c is None:
            return func(*args, **kwargs)
        out = run(*args, **kwargs)
        lock.acquire()
        rec.busy += 1
        try:
            if (family, op) in SAME_ELEMENTS and isinstance(out, torch.Tensor) and args \
                    and isinstance(args[0], torch.Tensor):
                rec.share_summary(out, args[0])
            rec.add_rows(c, "forward", "output", out if isinstance(out, (tuple, list, dict)) else (out,),
                         set_producer=True)
            if first is not None and out is not first and first._version != version:
                rec.mark_written(first, c.call)
            if grads:
                rec.grads.attach_api_backward(c, out, inputs, seq0)
        except Exception as exc:
            rec.note_error(f"outputs of {family}.{op}", exc)
        finally:
            rec.busy -= 1
            lock.release()
        return out


# torch finds a mode's __torch_function__ by a C string on every call it hands the mode: the C extension answers
# that lookup on ApiMode's instances with their C handler (capture/_api_handler.c, string_lookups), which steps
# aside while compiling as the function above does: by the flag torch.compiler.is_compiling() reads, so only where
# this torch has it
if _api_handler is not None and hasattr(_api_handler, "string_lookups") \
        and isinstance(vars(torch.compiler).get("_is_compiling_flag"), bool):
    _api_handler.string_lookups(ApiMode)
