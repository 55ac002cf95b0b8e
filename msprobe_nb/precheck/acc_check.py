"""``acc_check(dump)``: replay every recorded forward API (and its backward, where the gradients are recorded)
on a high-precision bench and grade each output by its API's standard.

A tensor dump is checked on its real inputs against its real outputs; a statistics dump on inputs generated
from its statistics, with the device's output made by running the call on ``target`` (approximate, and only
a check of ``target``'s kernels). No bench machine is needed: the bench is this one. Calls the bench cannot
rebuild or run are listed as ``unchecked`` with why; random draws are not compared; dropouts get the
zero-ratio check.
"""
from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from msprobe_nb.capture.random_apis import ATTENTION_DROPOUTS
from msprobe_nb.precheck import standards as S
from msprobe_nb.precheck.api_classes import ApiClass, backward_class, classify
from msprobe_nb.precheck.api_resolver import Unresolvable, build_arguments, resolve
from msprobe_nb.precheck.replay import Inputs, Output, Replay, as_array, bench_dtype, replay_backward, replay_forward
from msprobe_nb.precheck.result import AccCheckResult
from msprobe_nb.precheck.rows import Row, api_calls
from msprobe_nb.progress import bar

__all__ = ["acc_check", "check_calls"]

#: ops that write into their first argument and return nothing to compare
_NO_RESULT = frozenset({"__setitem__"})
#: ops whose output is uninitialised memory: nothing to compare
_UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                            "empty_with_format", "empty_permuted"})
#: recorded tensors kept after reading (most recent last)
_RECENT = 64
_DTYPES = {"torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16, "torch.float32": torch.float32,
           "torch.float64": torch.float64}


def _is_inplace(op: str) -> bool:
    return (op.endswith("_") and not op.endswith("__")) or op.startswith("__i")


def _bench_dtype_name(dtype: str, exact: bool) -> str:
    dt = _DTYPES.get(dtype)
    return str(bench_dtype(dt) if dt is not None and not exact else dtype)


def _grade(cls: ApiClass, o: Output, ref_error: str) -> S.Grade:
    """The grade of one output by its class's standard (the benchmark method falls back to thousandths
    when there is no reference kernel)."""
    assert o.device is not None and o.bench is not None, "an output without a note has both sides' values"
    dev, bench = o.device, S.saturate(o.bench, o.dtype)
    if cls.standard in ("binary", "cast") or dev.dtype.kind in "iub" or bench.dtype.kind in "iub":
        g = S.binary(dev.astype(np.float64), bench.astype(np.float64), o.dtype)
        if cls.standard == "cast":
            g.standard = "binary (cast)"
            if g.verdict == "error":
                g.verdict = "warning"
                g.reasons = [r.replace("error: ", "warning: ", 1) for r in g.reasons]
            g.reasons.append("note: a cast is of limited value as a check (the pre-check FAQ)")
        return g
    if cls.standard == "ulp":
        return S.ulp(dev, bench, o.dtype)
    if cls.standard == "absolute":
        return S.absolute(dev, bench, o.dtype)
    if o.ref is not None:
        return S.benchmark(dev, bench, o.ref.astype(np.float64), o.dtype, cls.level)
    g = S.thousandths(dev, bench, o.dtype)
    g.reasons.insert(0, f"note: {ref_error or 'no reference kernel output'}; graded by thousandths instead")
    return g


def _row(base: dict[str, Any], o: Output | None, **kw: Any) -> dict[str, Any]:
    r = dict(base)
    if o is not None:
        r.update(name=o.name, output=o.path, dtype=o.dtype, shape=o.shape)
    r.update(kw)
    return r


class _Checker:
    """Grades the calls of one (step, rank) of a dump."""

    def __init__(self, dump: Any, step: int, rank: int, bench_device: str, target: str | None, backward: bool,
                 tensor_mode: bool):
        self.dump, self.step, self.rank = dump, step, rank
        self.bench_device, self.target, self.backward = bench_device, target, backward
        self.tensor_mode = tensor_mode
        self._recent: dict[str, torch.Tensor] = {}
        self.missing: dict[str, str] = {}  # data_name -> why its tensor could not be read

    def load(self, row: Row) -> torch.Tensor | None:
        """The recorded tensor of ``row`` (None without one). One output is the next call's input, under the
        same data_name: the last tensors read are kept (the replay never writes into them, it copies)."""
        if not row.data_name:
            return None
        cache = self._recent
        t = cache.pop(row.data_name, None)
        if t is None:
            if row.data_name in self.missing:
                return None
            try:
                t = self.dump.load_tensor(row.data_name, step=self.step, rank=self.rank)
            except (FileNotFoundError, KeyError) as exc:  # a partly copied msprobe dump: generate instead
                self.missing[row.data_name] = str(exc)
                return None
            t = t if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
            if len(cache) >= _RECENT:
                del cache[next(iter(cache))]
        cache[row.data_name] = t
        return t

    def check(self, fwd: list[Row], bwd: list[Row] | None) -> list[dict[str, Any]]:
        r0 = fwd[0]
        family, op, call = r0.family, r0.op, r0.call
        base = {"step": self.step, "rank": self.rank, "call_index": r0.call_index, "api": call,
                "family": family, "op": op, "direction": r0.direction, "approximate": not self.tensor_mode,
                "name": call, "output": "", "dtype": "", "shape": None}
        inputs = [r for r in fwd if r.io == "input"]
        outputs = [r for r in fwd if r.io == "output"]
        tensor_out = [r for r in outputs if r.kind == "tensor"]
        out_dtype = tensor_out[0].dtype if tensor_out else ""
        scaled = any(r.arg == "alpha" and r.kind == "value" and r.value not in ("1", "1.0") for r in inputs)
        cls = classify(family, op, out_dtype, scaled)
        rows: list[dict[str, Any]] = []

        def unchecked(why: str) -> dict[str, Any]:
            return _row(base, None, api_class=cls.standard, standard="", verdict="unchecked", reasons=why)

        if cls.standard == "random":
            return [unchecked("a random draw: the bench cannot draw the device's numbers, so it is not compared")]
        if (family, op) in ATTENTION_DROPOUTS and _draws_in_attention(inputs):
            return [unchecked("attention with dropout_p > 0 draws its mask inside the kernel: not compared")]
        if op in _UNINITIALISED:
            return [unchecked(f"{op} returns uninitialised memory: its values mean nothing")]
        if op in _NO_RESULT:
            return [unchecked(f"{op} writes into its input and returns nothing: the result is not in the dump")]
        if not tensor_out:
            return [unchecked("no tensor output recorded (data_mode, or the op returns none)")]
        try:
            fn, _ = resolve(family, op)
        except Unresolvable as exc:
            return [unchecked(str(exc))]
        if cls.standard == "dropout":
            return self._dropout(base, inputs, tensor_out, fn, cls)
        notes: list[str] = []
        ins = Inputs(self.load, notes)
        exact = cls.standard in ("binary", "cast")
        try:
            rep = replay_forward(fn, op, inputs, outputs, ins, bench_device=self.bench_device, target=self.target,
                                 exact=exact, reference=cls.standard == "benchmark", recorded=self.load)
        except Unresolvable as exc:
            return [unchecked(str(exc))]
        except Exception as exc:  # the bench cannot run it: say so, never skip silently
            return [unchecked(f"the bench could not run it: {type(exc).__name__}: {exc}".strip()[:500])]
        rows += self._grade_all(base, rep, lambda o: classify(family, op, o.dtype, scaled), exact)
        if self.backward and bwd:
            rows += self._backward(base, fn, op, cls, inputs, bwd, ins)
        return rows

    def _grade_all(self, base: dict, rep: Replay, cls_of, exact: bool, direction: str = "") -> list[dict]:
        rows = []
        for o in rep.outputs:
            cls = cls_of(o)
            b = {**base, "direction": direction or base["direction"], "approximate": rep.approximate}
            if o.note:
                rows.append(_row(b, o, api_class=cls.standard, standard="", verdict="unchecked", reasons=o.note))
                continue
            g = _grade(cls, o, rep.ref_error)
            reasons = list(g.reasons)
            if o.dtype == "torch.float64":
                reasons.append("note: the device ran in float64: the bench has no higher precision")
            if rep.approximate:
                reasons.append("note: approximate: inputs generated from statistics" + (
                    f" ({'; '.join(rep.notes[:2])})" if rep.notes else ""))
            rows.append(_row(b, o, api_class=cls.standard, standard=g.standard, level=cls.level
                             if g.standard == "benchmark" else "", verdict=g.verdict, reasons=" | ".join(reasons),
                             bench_dtype=_bench_dtype_name(o.dtype, exact), **S.metrics_row(g)))
        return rows

    def _backward(self, base: dict, fn, op: str, fcls: ApiClass, inputs: list[Row], bwd: list[Row],
                  ins: Inputs) -> list:
        call = bwd[0].call
        b = {**base, "api": call, "direction": "backward", "name": call, "call_index": min(r.call_index for r in bwd)}
        cls = backward_class(base["family"], op, fcls)
        if _is_inplace(op):
            return [_row(b, None, api_class=cls.standard, standard="", verdict="unchecked",
                         reasons="an in-place op: its backward is not replayed")]
        try:
            rep = replay_backward(fn, op, inputs, [r for r in bwd if r.io == "input"],
                                  [r for r in bwd if r.io == "output"], ins,
                                  bench_device=self.bench_device, target=self.target, exact=cls.standard == "binary",
                                  reference=cls.standard == "benchmark", recorded=self.load)
        except Exception as exc:
            return [_row(b, None, api_class=cls.standard, standard="", verdict="unchecked",
                         reasons=f"the bench could not run its backward: {type(exc).__name__}: {exc}"[:500])]
        return self._grade_all(b, rep, lambda o: cls, cls.standard == "binary", "backward")

    def _dropout(self, base: dict, inputs: list[Row], outputs: list[Row], fn, cls: ApiClass) -> list:
        o_row = outputs[0]
        o = Output(o_row.arg, o_row.name, o_row.dtype, tuple(o_row.shape or ()))
        if not self.tensor_mode:
            return [_row(base, o, api_class="dropout", standard="", verdict="unchecked",
                         reasons="a dropout in a statistics dump: its mask is in no statistic")]
        ins = Inputs(self.load, [])
        args, kwargs = build_arguments(inputs, ins.get, str(base["op"]))
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        training = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
        x, out = args[0] if args else kwargs.get("input"), self.load(o_row)
        if not isinstance(x, torch.Tensor) or out is None:
            return [_row(base, o, api_class="dropout", standard="", verdict="unchecked",
                         reasons="the dropout's input or output tensor is not in the dump")]
        if not training or not p:
            g = S.binary(as_array(out), as_array(x), o.dtype)
            g.standard = "binary (dropout off)"
        else:
            g = S.dropout(as_array(out), as_array(x), float(p), o.dtype)
        return [_row(base, o, api_class="dropout", standard=g.standard, verdict=g.verdict,
                     reasons=" | ".join(g.reasons), bench_dtype=o.dtype, **S.metrics_row(g))]


def _draws_in_attention(inputs: list[Row]) -> bool:
    """Whether a scaled_dot_product_attention call had ``dropout_p > 0`` (argument 4 or the keyword)."""
    for r in inputs:
        if r.kind == "value" and (r.arg == "dropout_p" or (r.arg == "4" and not r.is_kwarg)):
            try:
                return float(r.value) > 0
            except ValueError:
                return True
    return False


def _backward_name(call: str) -> str:
    return call[: -len("forward")] + "backward" if call.endswith(".forward") else ""


def check_calls(dump: Any, *, device: str = "cpu", target: str | None = None, backward: bool = True,
                apis: Iterable[str] | None = None, skip: Iterable[str] | None = None,
                progress: bool | None = False) -> tuple[list[dict[str, Any]], list[str]]:
    """(result rows, notes) for every API call of ``dump`` (the work of :func:`acc_check`)."""
    c = dump.calls
    notes: list[str] = []
    n_modules = int(c.loc[c["family"] == "Module", "call"].nunique())
    if n_modules:
        notes.append(f"{n_modules} module calls are not APIs and are not replayed (their APIs are, at level mix)")
    groups = api_calls(c)
    if not groups:
        notes.append("no API calls in this dump: record at level L1 or mix to pre-check")
        return [], notes
    wanted, unwanted = list(apis or []), list(skip or [])
    left_out = 0
    tensor_mode = dump.task == "tensor" or bool((c["data_name"].astype(object).fillna("") != "").any())
    rows: list[dict[str, Any]] = []
    checkers: dict[tuple[int, int], _Checker] = {}
    # at L2 a "backward" call is an aten op that autograd ran (Aten.mm.3.backward), not the gradient of a
    # forward call: each is replayed as an op of its own
    aten = dump.level == "L2"
    for (step, rank, call), fwd in bar(groups.items(), total=len(groups), desc="acc_check", unit="call",
                                       explicit=progress):
        own = call.endswith(".forward") or (aten and call.endswith(".backward"))
        if not own:
            continue
        if (wanted and not any(w in call for w in wanted)) or any(w in call for w in unwanted):
            left_out += 1
            continue
        chk = checkers.get((step, rank))
        if chk is None:
            chk = checkers[(step, rank)] = _Checker(dump, step, rank, device, target, backward, tensor_mode)
        bwd = None if aten else groups.get((step, rank, _backward_name(call)))
        try:
            rows += chk.check(fwd, bwd)
        except Exception as exc:  # a failure of the checker itself: listed, the others go on
            rows.append({"step": step, "rank": rank, "call_index": fwd[0].call_index, "api": call, "name": call,
                         "family": fwd[0].family, "op": fwd[0].op, "direction": "forward", "verdict": "unchecked",
                         "reasons": f"pre-check failed: {type(exc).__name__}: {exc} "
                                    f"({traceback.format_exc(limit=-1).strip().splitlines()[-1]})"})
    if left_out:
        notes.append(f"{left_out} calls left out by the apis / skip filters")
    missing = [m for chk in checkers.values() for m in chk.missing.values()]
    if missing:
        notes.append(f"{len(missing)} tensors of this dump could not be read (first: {missing[0]}); the calls "
                     "that needed them were graded on inputs generated from their statistics (approximate)")
    if not tensor_mode:
        notes.append(f"statistics dump: inputs are generated from the recorded statistics and the device output "
                     f"is {target or device}'s kernel run on them; approximate, and a check of {target or device} "
                     "only")
    return rows, notes


def acc_check(dump: Any, device: str = "cpu", *, target: str | None = None, step: int | Iterable[int] | None = None,
              rank: int | Iterable[int] | None = None, backward: bool = True,
              apis: Iterable[str] | None = None, skip: Iterable[str] | None = None,
              progress: bool | None = None) -> AccCheckResult:
    """Pre-check the APIs of ``dump`` (a path or a :class:`~msprobe_nb.Dump`, level L1 or mix) on the bench
    ``device`` (CPU by default; any torch device). ``target``: where a statistics dump's calls run to stand
    for the device (default: the bench device). ``step`` / ``rank`` select; ``apis`` keeps calls whose name
    contains one of the given strings, ``skip`` leaves those out (msprobe's white_list / black_list);
    ``backward=False`` skips the backward replays; ``progress``: a bar
    over the calls (default: in a notebook or on a terminal, for 100 calls or more)."""
    if isinstance(dump, (str, bytes)) or hasattr(dump, "__fspath__"):
        from msprobe_nb.store.dump import load

        dump = load(dump)
    if step is not None or rank is not None:
        dump = dump.select(step=step, rank=rank)
    torch.device(device)  # a bad device name fails here, naming it
    rows, notes = check_calls(dump, device=str(device), target=target, backward=backward, apis=apis, skip=skip,
                              progress=progress)
    return AccCheckResult.from_rows(rows, notes=notes, bench_device=str(device))
