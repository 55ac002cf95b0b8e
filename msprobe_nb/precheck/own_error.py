"""A call's own error, measured: the call replayed in fp64 on each run's own recorded inputs (issue 30).

The compare's precision model judges a call from statistics: what its inputs' error may propagate to, plus
its own rounding. With tensors the call's own error can be measured instead. The NPU's own error is
``|npu_out - ref(npu_in)|``, the bench's ``|bench_out - ref(bench_in)|``, where ``ref`` is the call replayed on
the CPU in float64 (the pre-check's replay, :func:`~msprobe_nb.precheck.replay.replay_forward` and
:func:`~msprobe_nb.precheck.replay.replay_backward`) on that side's recorded inputs: the error already in the
inputs is no part of it, so a call whose own error is far beyond its precision is anomalous wherever it sits.
Errors are scale-relative (the largest difference over the reference's largest magnitude), like the model's.

A call whose output dtype is coarser than its inputs' (a matmul under bf16 autocast: fp32 inputs, a bf16
output) was computed from inputs rounded to that dtype, so it is also replayed on inputs rounded so; the
smaller of the two errors is its own. :func:`own_errors` returns one row per (call, side, output) and, by
default, refines the result's verdicts by them (:func:`msprobe_nb.analysis.replay_verdicts.refine`).
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import torch

from msprobe_nb.analysis.op_classes import OWN_ROUNDINGS, SHORT, UNIT_ROUNDOFF, op_class
from msprobe_nb.analysis.replay_verdicts import COLUMNS, refine, suspects
from msprobe_nb.precheck.api_classes import ACCUMULATING_BACKWARD, classify
from msprobe_nb.precheck.api_resolver import Unresolvable, resolve
from msprobe_nb.precheck.replay import Inputs, Replay, replay_backward, replay_forward
from msprobe_nb.precheck.rows import Row, api_calls

__all__ = ["own_errors"]

_DTYPES = {"torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16, "torch.float32": torch.float32,
           "torch.float64": torch.float64}
_SHORT_OF_U = {u: SHORT[d] for d, u in UNIT_ROUNDOFF.items()}
#: the roundings an accumulation in float32 may add, per square root of the reduction length
_ACC = 2.0 ** -23


def own_errors(result: Any, calls: Iterable[str] | None = None, *, n: int = 8, around: int = 1,
               device: str = "cpu", refine_verdicts: bool = True) -> pd.DataFrame:
    """Measure the own error of suspect calls of a tensor-task compare ``result`` on both sides.

    ``calls``: NPU call names (``"Functional.softmax.1.forward"``); default: the calls the precision model
    judged anomalous and each pair's first divergence, with ``around`` API calls either side of each, at most
    ``n`` suspects (on a pair with none, the ``n`` calls nearest their bound). Returns one row per (call, side,
    output): ``own_err``, ``own_bound`` (the roundings its class allows in the side's working precision),
    ``own_ratio``, ``ms`` (the replay's time) and a ``note`` where it could not be measured. With
    ``refine_verdicts`` the result's verdicts of the measured calls follow the measurement (in place)."""
    if getattr(result, "mode", None) != "tensor":
        raise ValueError("own_errors needs a tensor-mode compare (both dumps recorded with task='tensor'): "
                         f"this one is in {getattr(result, 'mode', '?')!r} mode")
    ctx = result._ctx
    if ctx.npu.dump is None or ctx.bench.dump is None:
        raise ValueError("own_errors needs the dumps of both sides (a compare of two Dumps or paths)")
    t = pd.DataFrame(result)
    wanted = suspects(t, None if calls is None else list(calls), n=n, around=around)
    floor = getattr(ctx.precision, "floor", "auto")
    rows: list[dict] = []
    sides = {"npu": _Side(ctx.npu.dump), "bench": _Side(ctx.bench.dump)}
    for step, rank, call, b_step, b_rank, b_call in wanted:
        got = {}
        for side, (s, r, c) in (("npu", (step, rank, call)), ("bench", (b_step, b_rank, b_call))):
            u = _working_u(t, side, step, rank, floor)
            got[side] = [{"step": step, "rank": rank, "call": call, "side": side, "side_call": c, **o}
                         for o in sides[side].measure(s, r, c, u, device)]
        # the inherited error: what the difference of the two sides' inputs alone makes of the exact output
        for a, b in zip(got["npu"], got["bench"]):
            ra, rb = a.get("_ref"), b.get("_ref")
            if ra is not None and rb is not None:
                a["inherited_err"] = b["inherited_err"] = _scale_err(ra, rb)
        for o in got["npu"] + got["bench"]:
            o.pop("_ref", None)
            rows.append(o)
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    if refine_verdicts and len(out):
        refine(result, out)
    return out


def _working_u(t: pd.DataFrame, side: str, step: int, rank: int, floor: str) -> float:
    """The side's working precision in the (step, rank) pair: its coarsest floating dtype (``floor="auto"``,
    a run under bf16 autocast rounds like bf16 even where a tensor is fp32), a named dtype, or none."""
    if floor == "none":
        return 0.0
    if floor != "auto":
        name = floor if floor.startswith("torch.") else {v: k for k, v in SHORT.items()}.get(floor, floor)
        return UNIT_ROUNDOFF.get(name, 0.0)
    sel = t[(t["step"] == step) & (t["rank"] == rank) & (t["kind"] == "tensor")]
    return max((UNIT_ROUNDOFF.get(str(d), 0.0) for d in pd.unique(sel[f"{side}_dtype"])), default=0.0)


class _Side:
    """One run's dump: its API calls as replay rows (built once), its tensors read through one loader."""

    def __init__(self, dump: Any):
        self.dump = dump
        self.groups: dict[tuple[int, int, str], list[Row]] | None = None

    def _rows(self, step: int, rank: int, call: str) -> list[Row]:
        if self.groups is None:
            self.groups = api_calls(self.dump.calls)
        return self.groups.get((int(step), int(rank), call), [])

    def measure(self, step: int, rank: int, call: str, u: float, device: str) -> list[dict]:
        """Per tensor output of ``call``: its own error, bound and ratio, or why none."""
        rows = self._rows(step, rank, call) if call else []
        if not rows:
            return [_note(call, "no such call on this side")]
        r0 = rows[0]
        cls = op_class(r0.op, call)
        t0 = time.perf_counter()
        multilinear = _multilinear(cls, r0.op, call)
        try:
            reps = self._replays(rows, step, rank, call, device, multilinear)
        except Unresolvable as exc:
            return [_note(call, str(exc), cls)]
        except Exception as exc:  # noqa: BLE001 - the bench cannot run it: said, never skipped silently
            return [_note(call, f"the replay failed: {type(exc).__name__}: {exc}"[:300], cls)]
        ms = (time.perf_counter() - t0) * 1e3
        out = []
        backward = call.endswith(".backward")
        k_own = OWN_ROUNDINGS.get(cls, OWN_ROUNDINGS["other"])
        if backward and (cls not in ("movement", "cast") or r0.op in ACCUMULATING_BACKWARD):
            k_own = max(k_own, OWN_ROUNDINGS["reduction"])  # a gradient sums over what its forward broadcast
        refs, env = (reps[:-1], reps[-1]) if multilinear else (reps, None)
        for i, o in enumerate(refs[0].outputs):
            rec = {"output": o.name, "dtype": o.dtype, "op_class": cls, "ms": ms, "note": o.note}
            if o.note or o.device is None or o.bench is None:
                out.append({**rec, "note": o.note or "no recorded output"})
                continue
            if any(rep.approximate for rep in reps):
                out.append({**rec, "note": "an input tensor is not in the dump: not measured"})
                continue
            spread = env.outputs[i].bench if env is not None and i < len(env.outputs) else None
            dev = o.device
            errs = [(_scale_err(dev, b, spread), b) for b in (rep.outputs[i].bench for rep in refs) if b is not None]
            err, ref = min(errs, key=lambda e: e[0])
            u_out = max(u, UNIT_ROUNDOFF.get(o.dtype, 0.0))
            k = _reduction_len(rows, o.shape)
            bound = k_own * u_out + np.sqrt(k) * _ACC
            out.append({**rec, "own_err": err, "own_bound": bound, "reduction_len": float(k), "_ref": ref,
                        "own_ratio": err / bound if bound > 0 else (np.inf if err > 0 else 0.0),
                        "precision": _SHORT_OF_U.get(u_out, "")})
        return out or [_note(call, "no tensor output to measure", cls)]

    def _replays(self, rows: list[Row], step: int, rank: int, call: str, device: str,
                 multilinear: bool) -> list[Replay]:
        """The call replayed in float64 on its recorded inputs, and (when its output is coarser than its
        inputs) on its inputs rounded to the output's dtype; for a call multilinear in its inputs, last, on
        their squares (the square root of that is the spread its roundings scale with)."""
        r0 = rows[0]
        fn, _ = resolve(r0.family, r0.op)
        if classify(r0.family, r0.op).standard in ("random", "dropout"):
            raise Unresolvable("a random draw: its values are the generator's, not a kernel's")

        def load(row: Row) -> torch.Tensor | None:
            if not row.data_name:
                return None
            try:
                x = self.dump.load_tensor(row.data_name, step=step, rank=rank)
            except (FileNotFoundError, KeyError):
                return None
            return x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))

        backward = call.endswith(".backward") and getattr(self.dump, "level", "") != "L2"
        fwd_rows = self._rows(step, rank, call[: -len("backward")] + "forward") if backward else rows
        if backward and not fwd_rows:
            raise Unresolvable("its forward call is not in the dump: the backward cannot be replayed")
        out_dt = [_DTYPES.get(r.dtype) for r in rows if r.io == "output" and r.kind == "tensor"]
        coarse = max((d for d in out_dt if d is not None), key=lambda d: UNIT_ROUNDOFF[str(d)], default=None)
        variants: list[Any] = [None]
        if coarse is not None and any(r.kind == "tensor" and _DTYPES.get(r.dtype) is not None
                                      and UNIT_ROUNDOFF[r.dtype] < UNIT_ROUNDOFF[str(coarse)]
                                      for r in fwd_rows if r.io == "input"):
            variants.append(coarse)
        reps = []
        for dt in variants + (["square"] if multilinear else []):
            def as64(row: Row, dt: Any = dt) -> torch.Tensor | None:
                x = load(row)
                if x is None or not x.is_floating_point():
                    return x
                if dt == "square":
                    return x.to(torch.float64).square()
                return (x.to(dt) if dt is not None and UNIT_ROUNDOFF[str(x.dtype)] < UNIT_ROUNDOFF[str(dt)]
                        else x).to(torch.float64)
            ins = Inputs(as64, [])
            fwd_in = [r for r in fwd_rows if r.io == "input"]
            if backward:
                reps.append(replay_backward(fn, r0.op, fwd_in, [r for r in rows if r.io == "input"],
                                            [r for r in rows if r.io == "output"], ins, bench_device=device,
                                            target=None, exact=False, reference=False, recorded=load))
            else:
                reps.append(replay_forward(fn, r0.op, fwd_in, [r for r in rows if r.io == "output"], ins,
                                           bench_device=device, target=None, exact=False, reference=False,
                                           recorded=load))
        return reps


def _note(call: str, why: str, cls: str = "") -> dict:
    return {"output": call, "op_class": cls, "note": why}


def _multilinear(cls: str, op: str, call: str) -> bool:
    """Whether the call is a sum of products of its inputs (a matmul, a product, a sum, most gradients of
    those): its roundings then scale with the terms' spread, not with the result, which may cancel."""
    if cls in ("matmul", "multiplicative") or op in ("sum", "mean", "cumsum"):
        return True
    return call.endswith(".backward") and (cls == "additive" or op in ACCUMULATING_BACKWARD)


def _scale_err(dev: np.ndarray, ref: np.ndarray, square: np.ndarray | None = None) -> float:
    """max |dev - ref| over max |ref| (inf where their shapes or their non-finite values differ); with the
    call replayed on its inputs' squares, over the larger of that and the terms' spread (its square root)."""
    dev, ref = np.asarray(dev, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if dev.shape != ref.shape:
        return float("inf")
    fin = np.isfinite(ref)
    if not np.array_equal(fin, np.isfinite(dev)) or not np.array_equal(dev[~fin], ref[~fin]):
        return float("inf")
    if not fin.any():
        return 0.0
    scale = float(np.abs(ref[fin]).max())
    if square is not None and np.shape(square) == ref.shape:
        sq = np.sqrt(np.abs(np.asarray(square, dtype=np.float64)))
        scale = max(scale, float(np.nanmax(np.where(np.isfinite(sq), sq, 0.0), initial=0.0)))
    diff = float(np.abs(dev[fin] - ref[fin]).max())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _reduction_len(rows: list[Row], out_shape: tuple) -> float:
    """How many elements one output element sums (the inputs' largest size over the output's, at least the
    first input's last dimension for a matmul-like call): the accumulation's share of the bound."""
    sizes = [float(np.prod(r.shape)) for r in rows if r.io == "input" and r.kind == "tensor" and r.shape]
    last = [float(r.shape[-1]) for r in rows if r.io == "input" and r.kind == "tensor" and r.shape]
    n_out = float(np.prod(out_shape)) if out_shape else 1.0
    return max(1.0, max(sizes, default=1.0) / max(n_out, 1.0), last[0] if last else 1.0)
