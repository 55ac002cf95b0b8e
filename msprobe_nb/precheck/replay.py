"""One recorded API call run again on the bench: in higher precision, and in the device's own dtype.

The bench runs the call on ``bench_device`` with every floating input raised one step (fp16 and bf16 to
fp32, fp32 to fp64; fp64 stays), except for ops graded exactly (binary, cast), which run in the recorded
dtype. For the benchmark method the same call also runs in the recorded dtype on the bench device: that
is the reference kernel whose error the device's is measured against. The device's output is the recorded
tensor (task tensor); a statistics dump has none, so the call is run on ``target`` in the recorded dtype
from generated inputs (approximate). A backward whose gradients are recorded is replayed the same way:
the bench forward with gradients on, then ``torch.autograd.grad`` with the recorded output gradients.
In-place ops run on copies of their recorded (pre-call) inputs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import torch

from msprobe_nb.capture.leaves import leaves
from msprobe_nb.precheck.api_resolver import Unresolvable, build_arguments
from msprobe_nb.precheck.generated_inputs import generate

__all__ = ["Output", "Replay", "bench_dtype", "replay_backward", "replay_forward"]

_UP = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64}


def bench_dtype(dtype: torch.dtype) -> torch.dtype:
    """The bench's precision for ``dtype``: one step higher, fp64 staying fp64."""
    return _UP.get(dtype, dtype)


@dataclass
class Output:
    """One output leaf to grade: the device's values, the bench's, the reference kernel's (or why none)."""

    path: str
    name: str
    dtype: str
    shape: tuple
    device: np.ndarray | None = None
    bench: np.ndarray | None = None
    ref: np.ndarray | None = None
    note: str = ""  # why this output is not compared (empty: it is)


@dataclass
class Replay:
    """What replaying one call (its forward or its backward) gave."""

    outputs: list[Output] = field(default_factory=list)
    approximate: bool = False
    notes: list[str] = field(default_factory=list)
    ref_error: str = ""


@overload
def as_array(t: torch.Tensor) -> np.ndarray: ...
@overload
def as_array(t: Any) -> np.ndarray | None: ...
def as_array(t: Any) -> np.ndarray | None:
    """A tensor's values as numpy (floats as float64, ints as int64, bools as uint8)."""
    if not isinstance(t, torch.Tensor):
        return None
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.to("cpu", torch.uint8).numpy()
    if t.is_floating_point():
        return t.to("cpu", torch.float64).numpy()
    return t.to("cpu", torch.int64).numpy()


class Inputs:
    """The call's input tensors by row: the recorded ones (tensor task) or generated ones, loaded once."""

    def __init__(self, load: Callable[[Any], torch.Tensor | None], notes: list[str]):
        self.load = load
        self.notes = notes
        self.generated = False
        self.cache: dict[str, torch.Tensor] = {}

    def get(self, row: Any) -> torch.Tensor:
        key = str(row.name)
        t = self.cache.get(key)
        if t is None:
            t = self.load(row)
            if t is None:
                t = generate(row, self.notes)
                self.generated = True
            self.cache[key] = t
        return t


def _convert(args: Any, device: torch.device | str, up: bool, grads: set[int] | None = None) -> Any:
    """Every tensor of ``args`` on ``device``, raised to the bench dtype when ``up``; ``torch.dtype`` values
    raised alike (``softmax(x, dtype=torch.float32)``). Tensors whose id is in ``grads`` require grad."""
    if isinstance(args, torch.Tensor):
        t = args.to(device, bench_dtype(args.dtype) if up else args.dtype, copy=True)
        if grads is not None and id(args) in grads and t.is_floating_point():
            t.requires_grad_(True)
        return t
    if isinstance(args, torch.dtype):
        return bench_dtype(args) if up else args
    if isinstance(args, tuple):
        return tuple(_convert(a, device, up, grads) for a in args)
    if isinstance(args, list):
        return [_convert(a, device, up, grads) for a in args]
    if isinstance(args, dict):
        return {k: _convert(v, device, up, grads) for k, v in args.items()}
    return args


def _flatten(out: Any) -> dict[str, Any]:
    return dict(leaves(out if isinstance(out, (tuple, list, dict)) else (out,)))


def _call(fn: Callable, args: list, kwargs: dict, device: Any, up: bool) -> dict[str, Any]:
    """``fn`` on copies of the arguments on ``device`` (raised to the bench dtype when ``up``), its outputs by
    row path."""
    return _flatten(fn(*_convert(args, device, up), **_convert(kwargs, device, up)))


def _leaf_at(args: list, kwargs: dict, path: str) -> Any:
    parts = path.split(".")
    obj: Any = kwargs if not parts[0].isdigit() else args
    for p in parts:
        try:
            obj = obj[int(p)] if isinstance(obj, (list, tuple)) else obj[p]
        except (IndexError, KeyError, TypeError):
            return None
    return obj


def _add_outputs(rep: Replay, rows: list, rec: dict, device_out: dict | None, bench: dict, ref: dict | None,
                 no_bench: str, no_device: str | None = None) -> None:
    """One ``Output`` per tensor row: the device's values (recorded, else those run here), the bench's and the
    reference kernel's, with a note where a side has none."""
    for r in rows:
        if r.kind != "tensor":
            continue
        path = str(r.arg)
        o = Output(path, str(r.name), str(r.dtype), tuple(r.shape or ()))
        dev = rec.get(path)
        if dev is None and device_out is not None:
            dev = device_out.get(path)
        o.device, o.bench = as_array(dev), as_array(bench.get(path))
        if ref is not None:
            o.ref = as_array(ref.get(path))
        if o.bench is None:
            o.note = no_bench
        elif o.device is None and no_device is not None:
            o.note = no_device
        rep.outputs.append(o)


def replay_forward(fn: Callable, op: str, inputs: list, outputs: list, ins: Inputs, *,
                   bench_device: str, target: str | None, exact: bool, reference: bool,
                   recorded: Callable[[Any], torch.Tensor | None]) -> Replay:
    """Replay one forward call. ``exact``: run the bench in the recorded dtype (binary, cast);
    ``reference``: also run the reference kernel (benchmark method); ``recorded(row)`` gives the recorded
    output tensor (None in a statistics dump: the call then runs on ``target``)."""
    rep = Replay(notes=ins.notes)
    args, kwargs = build_arguments(inputs, ins.get, op)
    with torch.no_grad():
        bench = _call(fn, args, kwargs, bench_device, not exact)
        ref_out: dict[str, Any] | None = None
        if reference:
            try:
                ref_out = _call(fn, args, kwargs, bench_device, False)
            except Exception as exc:  # a kernel the bench device lacks for this dtype (bf16 on some CPUs)
                rep.ref_error = f"no {op} kernel in the recorded dtype on {bench_device}: {type(exc).__name__}: {exc}"
        device_out: dict[str, Any] | None = None
        rec = {str(r.arg): recorded(r) for r in outputs if r.kind == "tensor"}
        if any(v is None for v in rec.values()):
            rep.approximate = True
            if target is None or str(target) == str(bench_device):
                device_out = ref_out if ref_out is not None else _call(fn, args, kwargs, bench_device, False)
            else:
                device_out = _call(fn, args, kwargs, target, False)
    rep.approximate = rep.approximate or ins.generated
    _add_outputs(rep, outputs, rec, device_out, bench, ref_out, "the bench's call gives no tensor at this output",
                 "no device values for this output")
    return rep


def _gradient_targets(args: list, kwargs: dict, inputs: list, grad_rows: list) -> dict[str, str]:
    """Which forward input each backward output row is the gradient of. The kit names it by the input's path
    (``backward.output.1`` is the gradient of ``forward.input.1``); msprobe numbers the gradients of the
    floating tensor inputs in order (``embedding``'s ``output.0`` is the weight's). A row whose shape matches
    neither is a gradient the bench cannot name (msprobe can record an internal node's)."""
    def fits(row: Any, path: str) -> bool:
        t = _leaf_at(args, kwargs, path)
        return isinstance(t, torch.Tensor) and t.is_floating_point() and tuple(t.shape) == tuple(row.shape or ())

    if all(fits(r, str(r.arg)) for r in grad_rows):
        return {str(r.arg): str(r.arg) for r in grad_rows}
    floats = [str(r.arg) for r in inputs if r.kind == "tensor" and fits(r, str(r.arg))]
    if all(str(r.arg).isdigit() and int(r.arg) < len(floats) and fits(r, floats[int(r.arg)]) for r in grad_rows):
        return {str(r.arg): floats[int(r.arg)] for r in grad_rows}
    bad = next(r for r in grad_rows if not fits(r, str(r.arg)))
    raise Unresolvable(f"backward output {bad.arg} (shape {tuple(bad.shape or ())}) is the gradient of no "
                       "floating tensor input of the forward (msprobe dumps can record an internal node's)")


def replay_backward(fn: Callable, op: str, inputs: list, grad_in: list, grad_out: list,
                    ins: Inputs, *, bench_device: str, target: str | None, exact: bool, reference: bool,
                    recorded: Callable[[Any], torch.Tensor | None]) -> Replay:
    """Replay one call's backward: ``grad_in`` are the backward's input rows (gradients of the forward's
    outputs, same paths), ``grad_out`` its output rows (gradients of the forward's inputs, same paths)."""
    rep = Replay(notes=ins.notes)
    args, kwargs = build_arguments(inputs, ins.get, op)
    grad_rows = [r for r in grad_out if r.kind == "tensor"]
    path_of = _gradient_targets(args, kwargs, inputs, grad_rows)  # backward output path -> forward input path
    wanted = list(path_of)
    leaves_at = {p: _leaf_at(args, kwargs, path_of[p]) for p in wanted}
    seeds = {str(r.arg): ins.get(r) for r in grad_in if r.kind == "tensor"}

    def grads_on(device: str, up: bool) -> dict[str, Any]:
        ids = {id(t) for t in leaves_at.values()}
        a, k = _convert(args, device, up, ids), _convert(kwargs, device, up, ids)
        with torch.enable_grad():
            out = _flatten(fn(*a, **k))
            outs, gos = [], []
            for p, g in seeds.items():
                t = out.get(p)
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    outs.append(t)
                    gos.append(g.to(device, t.dtype))
            if not outs:
                raise Unresolvable("no recorded output gradient reaches an output that requires grad")
            targets = [_leaf_at(a, k, path_of[p]) for p in wanted]
            got = torch.autograd.grad(outs, targets, gos, allow_unused=True)
        return dict(zip(wanted, got, strict=True))

    bench = grads_on(bench_device, not exact)
    ref: dict[str, Any] | None = None
    if reference:
        try:
            ref = grads_on(bench_device, False)
        except Exception as exc:
            rep.ref_error = f"no {op} backward in the recorded dtype on {bench_device}: {type(exc).__name__}: {exc}"
    rec = {str(r.arg): recorded(r) for r in grad_out if r.kind == "tensor"}
    device_out = None
    if any(v is None for v in rec.values()):
        rep.approximate = True
        device_out = ref if (target is None or str(target) == str(bench_device)) and ref is not None \
            else grads_on(target or bench_device, False)
    rep.approximate = rep.approximate or ins.generated
    _add_outputs(rep, grad_out, rec, device_out, bench, ref, "the bench's backward gives no gradient for this input")
    return rep
