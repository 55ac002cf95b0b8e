"""Collectives (``torch.distributed``) recorded as msprobe names and lays them out.

The L1 function mode sees ``dist.all_reduce``, ``dist.broadcast``, ``dist.all_gather``, ``send`` / ``recv``,
``isend`` / ``irecv`` (also those ``batch_isend_irecv`` issues) and the functional collectives
(``torch.ops._c10d_functional.*``); :class:`Collectives` turns one such call into one
``Distributed.<op>.<n>.forward`` call:

* inputs before the call, outputs after it: a collective writes its tensors in place, so, as in msprobe,
  the output rows are the arguments again (positional ones, then tensors passed by keyword), read once the
  data is there. Arguments come in the layout a caller usually writes them (required ones by position,
  others by keyword where they differ from their default: ``broadcast(t, 0)`` gives ``input.0`` and
  ``input.1``); an output buffer list (``all_gather``'s ``tensor_list``) is ``None`` before the call, as
  msprobe writes it;
* the process group as the keyword row ``group``: ``torch.ProcessGroup`` with its ranks and msprobe's
  ``group_id`` (also for the default group, which the caller did not pass); point-to-point calls get a
  keyword row ``peer``, the peer's global rank;
* an async call's outputs when its work completes: a callback on ``work.get_future()`` where the backend
  has one (gloo runs it inside ``wait()``), else the first time the kit looks after ``work.is_completed()``
  (the next recorded call, the step's end); a functional collective's output once it has been waited for
  (``wait_tensor``, ``AsyncCollectiveTensor.wait()`` or the first recorded call that consumes it).

No function or object is replaced or wrapped: the user gets back the very ``Work`` or tensor the call
returned. Statistics go through the recorder's summarizer, so they stay on the tensor's device.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import weakref
import zlib
from types import FrameType, ModuleType
from typing import Any

import torch

from msprobe_nb.capture.leaves import RecordedValue, leaves

_dist = torch.distributed
_c10d = _dist.distributed_c10d if _dist.is_available() else None
_Work = getattr(_dist, "Work", None)
_ProcessGroup = getattr(_dist, "ProcessGroup", None)
_RedOpType = getattr(getattr(_dist, "ReduceOp", None), "RedOpType", None)
_ReduceOp = getattr(_dist, "ReduceOp", None)
_ACT = None  # torch.distributed._functional_collectives.AsyncCollectiveTensor, imported when first needed

#: the namespaces of torch's functional collectives (the second one is the legacy spelling)
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "c10d_functional")
#: functional ops that are plumbing, not collectives: the point where the kit sees completion, or a wrapper
_WAIT, _WRAP = "wait_tensor", "_wrap_tensor_autograd"
#: point-to-point calls: (keyword of the global peer rank, keyword of the group-relative one)
P2P = {"send": ("dst", "group_dst"), "isend": ("dst", "group_dst"), "recv": ("src", "group_src"),
       "irecv": ("src", "group_src")}
#: arguments that only receive the result: recorded as None before the call (msprobe's all_gather record)
OUTPUT_BUFFERS = {"all_gather": "tensor_list", "all_gather_coalesced": "output_tensor_lists",
                  "gather": "gather_list", "all_to_all": "output_tensor_list"}
#: torch 2.13 reports these deprecated names as the function they call; the caller used the old name
_ALIASES = {"all_gather_single": ("all_gather_into_tensor", "_all_gather_base"),
            "reduce_scatter_single": ("reduce_scatter_tensor", "_reduce_scatter_base")}
_C10D_FILE = getattr(_c10d, "__file__", "") or ""
#: torch's files between the caller and the mode: the override dispatch and torch.distributed's own layers
_TORCH_DIST_DIR = os.path.dirname(getattr(_dist, "__file__", "") or "") + os.sep
_OVERRIDES_FILE = torch.overrides.__file__
#: parameters recorded as keywords wherever they stand (callers pass them so; the group row is ``group``)
KEYWORDS = frozenset({"op", "group", "async_op", "tag", "group_src", "group_dst"})


def handles(op: str) -> bool:
    """Whether a ``Distributed`` call is a collective of c10d (``all_reduce``) or a functional one, not
    another function of ``torch.distributed`` (its submodules keep their dotted path in the op)."""
    return "." not in op or op.partition(".")[0] in FUNCTIONAL_NAMESPACES


def op_name(func, default: str) -> str:
    """The name the caller used for a ``torch.distributed`` function: ``all_gather_into_tensor`` even
    though torch hands the mode ``all_gather_single``, which the deprecated name calls."""
    aliases = _ALIASES.get(default)
    if aliases is None:
        return default
    f: FrameType | None = sys._getframe(2)
    for _ in range(12):  # the mode's handler, torch's override dispatch, the alias and its decorators
        if f is None:
            break
        if f.f_code.co_filename == _C10D_FILE and f.f_code.co_name in aliases:
            return f.f_code.co_name
        f = f.f_back
    return default


def caller(frame):
    """The first frame outside torch.distributed and torch's override dispatch: the call's own stack starts
    where the user called it (``batch_isend_irecv``'s line for the ``isend`` it makes)."""
    f = frame
    while f is not None and (f.f_code.co_filename == _OVERRIDES_FILE
                             or f.f_code.co_filename.startswith(_TORCH_DIST_DIR)):
        f = f.f_back
    return f if f is not None else frame


def _c10d_module() -> ModuleType:
    """``torch.distributed.distributed_c10d``; raises where this torch build has no distributed support (the
    callers catch it and record no group)."""
    if _c10d is None:
        raise RuntimeError("torch.distributed is not available")
    return _c10d


def group_record(group) -> RecordedValue | None:
    """A process group as msprobe writes it: ``{"type": "torch.ProcessGroup", "group_ranks": [...],
    "group_id": crc32 of the ranks' text}``; None when it cannot be resolved (not initialised)."""
    try:
        if isinstance(group, str):  # a functional collective's group name
            group = _c10d_module()._resolve_process_group(group)
        elif group is None:
            group = _c10d_module()._get_default_group()
        ranks = _dist.get_process_group_ranks(group)
    except Exception:
        return None
    ranks = [int(r) for r in ranks]
    text = json.dumps({"type": "torch.ProcessGroup", "group_ranks": ranks,
                       "group_id": f"{zlib.crc32(str(ranks).encode('utf-8')):08x}"})
    return RecordedValue("torch.ProcessGroup", text)


def _described(value):
    """Arguments the kit describes itself: process groups by their ranks, reduce ops by name."""
    if _ProcessGroup is not None and isinstance(value, _ProcessGroup):
        return group_record(value) or value
    if (_RedOpType is not None and isinstance(value, _RedOpType)) or \
            (_ReduceOp is not None and isinstance(value, _ReduceOp)):
        return RecordedValue("torch.distributed.ReduceOp", json.dumps(str(value)))
    return value


def _is_default(value, default) -> bool:
    if value is default or default is inspect.Parameter.empty:
        return value is default
    if isinstance(value, (torch.Tensor, list, tuple, dict)):
        return False
    try:
        return bool(value == default)
    except Exception:
        return False


_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature(func) -> inspect.Signature | None:
    try:
        return _SIGNATURES[func]
    except KeyError:
        pass
    sig: inspect.Signature | None
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        sig = None
    _SIGNATURES[func] = sig
    return sig


def layout(func, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """(positional, keyword) arguments as a caller usually writes them: torch passes a ``torch.distributed``
    function's arguments after the first tensor as keywords, every default included. Leading arguments up
    to the first one left at its default are positional (never those in :data:`KEYWORDS`); the rest are
    keywords, only where not defaults."""
    sig = _signature(func)
    if sig is None or not kwargs:
        return list(args), dict(kwargs)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return list(args), dict(kwargs)
    pos: list = []
    kw: dict = {}
    leading = True
    for name, p in sig.parameters.items():
        if name not in bound.arguments:
            leading = False
            continue
        v = bound.arguments[name]
        default = _is_default(v, p.default)
        if leading and not default and name not in KEYWORDS \
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos.append(v)
            continue
        leading = False
        if not default:
            kw[name] = v
    return pos, kw


class _Pending:
    """A call whose outputs are read when its work (or functional output) is known to be complete."""

    __slots__ = ("call", "pos", "kw", "work", "tensor", "act", "epoch")

    def __init__(self, call, pos, kw, epoch, work=None, tensor=None):
        self.call, self.pos, self.kw, self.epoch = call, pos, kw, epoch
        self.work, self.tensor, self.act = work, tensor, None


class Collectives:
    """The recorder's part for ``torch.distributed`` calls (one per recorder)."""

    def __init__(self, recorder):
        self.rec = recorder
        self.pending: list[_Pending] = []  # async works without a future, functional outputs not yet waited
        self.epoch = 0  # moves on each time the step's rows are handed over: late completions are dropped

    # ------------------------------------------------------------------ the mode's entry point
    def call(self, func, op: str, args: tuple, kwargs: dict, frame):
        """Run ``func`` for the function mode, recording it as ``Distributed.<op>``."""
        rec = self.rec
        functional = op.partition(".")[0] in FUNCTIONAL_NAMESPACES
        if functional and op.endswith((f".{_WAIT}", f".{_WRAP}")):
            return self._plumbing(func, op, args, kwargs)
        if not functional:
            op = op_name(func, op)
        with rec.working():
            try:
                if self.pending:
                    self.poll()
                c = rec.open_api("Distributed", op, caller(frame))
                if functional:
                    pos, kw = list(args), dict(kwargs)
                    group = group_record(pos[-1] if pos and isinstance(pos[-1], str) else None)
                else:
                    pos, kw = layout(func, args, kwargs)
                    pos = [_described(v) for v in pos]
                    kw = {k: _described(v) for k, v in kw.items()}
                    group = kw.get("group") if isinstance(kw.get("group"), RecordedValue) else group_record(None)
                extra: dict[str, Any] = {} if "group" in kw or group is None else {"group": group}
                peer = self._peer(op, kwargs)
                if peer is not None:
                    extra["peer"] = peer
                if c.dump:
                    rec.add_rows(c, "forward", "input", self._before(func, op, pos))
                    if kw or extra:
                        rec.add_rows(c, "forward", "input", {**kw, **extra}, is_kwarg=True)
            except Exception as exc:
                rec.note_error(f"inputs of Distributed.{op}", exc)
                c = None
        if c is None:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if not c.dump:
            return out
        with rec.working():
            try:
                if functional:
                    self.pending.append(_Pending(c, [out], {}, self.epoch, tensor=out))
                elif _Work is not None and isinstance(out, _Work):
                    self._when_done(out, _Pending(c, pos, kw, self.epoch, work=out))
                else:
                    self._outputs(c, pos, kw)
            except Exception as exc:
                rec.note_error(f"outputs of Distributed.{op}", exc)
        return out

    # ------------------------------------------------------------------ rows
    @staticmethod
    def _before(func, op: str, pos: list) -> tuple:
        """The positional inputs, an output buffer as None (it holds no input)."""
        buffer = OUTPUT_BUFFERS.get(op)
        if buffer is None:
            return tuple(pos)
        sig = _signature(func)
        names = list(sig.parameters) if sig is not None else []
        return tuple(None if i < len(names) and names[i] == buffer else v for i, v in enumerate(pos))

    @staticmethod
    def _peer(op: str, kwargs: dict) -> int | None:
        keys = P2P.get(op)
        if keys is None:
            return None
        peer = kwargs.get(keys[0])
        if peer is None and kwargs.get(keys[1]) is not None:
            try:
                peer = _dist.get_global_rank(kwargs.get("group") or _c10d_module()._get_default_group(),
                                             kwargs[keys[1]])
            except Exception:
                return None
        return peer if isinstance(peer, int) else None

    def _outputs(self, c, pos: list, kw: dict) -> None:
        """The arguments again, as they are after the call, as one list (msprobe's ``output``): the
        positional ones, then those passed by keyword that hold tensors (options such as ``group`` or
        ``async_op`` do not change). Every tensor is summarised anew: a collective writes in place without
        moving the version counter the recorder caches summaries by."""
        rec = self.rec
        written = [v for v in kw.values() if any(isinstance(x, torch.Tensor) for _, x in leaves([v]))]
        out = tuple(pos) + tuple(written)
        for _, leaf in leaves(out):
            if isinstance(leaf, torch.Tensor):
                rec.rewritten(leaf)
        rec.add_rows(c, "forward", "output", out, set_producer=True)

    def _done(self, p: _Pending) -> None:
        if p.epoch != self.epoch:
            return  # completed after its step was written: its rows would land in another step
        self._outputs(p.call, p.pos, p.kw)

    # ------------------------------------------------------------------ completion
    def _when_done(self, work, p: _Pending) -> None:
        try:
            future = work.get_future()
        except RuntimeError:  # gloo's send / recv works have none: looked at later (poll)
            self.pending.append(p)
            return
        rec = self.rec

        def completed(_fut):
            # runs where the backend completes the work (gloo: inside wait()), maybe on another thread;
            # it only reads the tensors, with the modes off
            with rec.working():
                try:
                    self._done(p)
                except Exception as exc:
                    rec.note_error(f"outputs of {p.call.call}", exc)

        future.then(completed)

    def poll(self) -> None:
        """Record what has completed since the last look: works without a future, functional outputs that
        were consumed (their ``AsyncCollectiveTensor`` waited)."""
        still = []
        for p in self.pending:
            if p.epoch != self.epoch:
                continue
            if p.work is not None:
                done = p.work.is_completed()
            else:
                act = p.act() if p.act is not None else None
                done = act is not None and act.completed
            if done:
                self._done(p)
            else:
                still.append(p)
        self.pending = still

    def _plumbing(self, func, op: str, args: tuple, kwargs: dict):
        """``wait_tensor`` (the functional output is ready once it returns) and the wrapper that makes an
        ``AsyncCollectiveTensor``: run, never recorded as calls."""
        out = func(*args, **kwargs)
        if not self.pending or not args:
            return out
        rec = self.rec
        with rec.working():
            try:
                t = args[0]
                for p in self.pending:
                    if p.tensor is t:
                        if op.endswith(_WAIT):
                            self.pending.remove(p)
                            self._done(p)
                        elif _is_act(out):
                            p.act = weakref.ref(out)
                        break
            except Exception as exc:
                rec.note_error(f"Distributed.{op}", exc)
        return out

    def step_ends(self) -> None:
        """The step's rows are about to be handed over: record what completed, forget the rest."""
        if self.pending:
            self.poll()
        self.pending = []
        self.epoch += 1


def _is_act(t) -> bool:
    global _ACT
    if _ACT is None:
        try:
            from torch.distributed._functional_collectives import AsyncCollectiveTensor
        except ImportError:
            return False
        _ACT = AsyncCollectiveTensor
    return isinstance(t, _ACT)
