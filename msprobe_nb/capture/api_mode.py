"""L1 capture: a torch function mode sees every torch, Tensor, functional and torch.ops call.

No function object is replaced, so ``from torch import relu`` is recorded and ``F.gelu`` keeps its
identity. Inside the handler the mode is off, which gives msprobe's "outermost API only" semantics and
lets the statistics run on torch without recording themselves. Under ``torch.compile`` tracing the
handler steps aside, so dynamo neither guards on the recorder nor recompiles per call.
"""
from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode

from msprobe_nb.capture.api_backward import grad_inputs
from msprobe_nb.capture.naming import resolve_api, tensor_operator
from msprobe_nb.capture.random_apis import RANDOM_APIS
from msprobe_nb.capture.recorder import SAME_ELEMENTS, Call, Recorder

_is_compiling = torch.compiler.is_compiling
_sequence_nr = torch._C._autograd._get_sequence_nr

class ApiMode(TorchFunctionMode):
    """Records API calls into a :class:`Recorder` (forward now, backward through autograd node hooks)."""

    def __init__(self, recorder: Recorder, randomness=None, record: bool = True):
        super().__init__()
        self.recorder = recorder
        self.randomness = randomness  # msprobe_nb.capture.randomness.RandomPolicy or None
        self.record = record  # False: only apply dropout-off / host-random (levels L0 and L2)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        rec = self.recorder
        if not rec.active or rec.busy or _is_compiling():  # compiling first: dynamo must not trace the rest
            return func(*args, **kwargs)
        try:
            resolved = resolve_api(func)  # cached: unrecorded calls (attribute reads...) leave here
        except Exception as exc:  # naming must never break the model
            rec.note_error("naming", exc)
            resolved = None
        if resolved is None:
            return func(*args, **kwargs)
        frame = sys._getframe(1)
        if resolved[0] == "Tensor":
            try:
                resolved = tensor_operator(resolved, frame)
            except Exception as exc:
                rec.note_error("naming", exc)
        family, op = resolved
        policy = self.randomness
        if not self.record:
            if policy is None or (family, op) not in RANDOM_APIS:
                return func(*args, **kwargs)
            run, args, kwargs = policy.before(Call("", family, op, -1, "forward", dump=False), func, args, kwargs)
            return run(*args, **kwargs)
        # rec.working(), inlined on this hottest path; inside the handler the mode is already off, so the
        # __torch_function__ switch that working() also flips is not needed here
        lock = rec.lock
        lock.acquire()
        rec.busy += 1
        try:
            c = rec.open_api(family, op, frame)
            run = func
            if policy is not None and (family, op) in RANDOM_APIS:
                run, args, kwargs = policy.before(c, func, args, kwargs)
            rec.add_rows(c, "forward", "input", args)
            if kwargs:
                rec.add_rows(c, "forward", "input", kwargs, is_kwarg=True)
            grads = c.dump and torch.is_grad_enabled()
            inputs = grad_inputs(args, kwargs) if grads else None
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
                rec.attach_api_backward(c, out, inputs, seq0)
        except Exception as exc:
            rec.note_error(f"outputs of {family}.{op}", exc)
        finally:
            rec.busy -= 1
            lock.release()
        return out
