"""The recording state of one dump: counters, the step's buffered rows, provenance, module paths.

The modes and hooks (api_mode, module_hooks, dispatch_mode) only call into a :class:`Recorder`; it turns
what they saw into rows of the schema's calls table and hands a whole step to the store at once. Rows
are buffered in memory and written, then flushed, at each step boundary, so a crash mid-step loses only
the step in progress. Stacks (``stacks``), gradient hooks (``grad_hooks``) and custom Functions
(``custom_functions``) are the recorder's parts, each in its own module.
"""
from __future__ import annotations

import threading
import warnings
import weakref
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from msprobe_nb.capture import c_contract
from msprobe_nb.capture.calls import SAME_ELEMENTS, Call  # noqa: F401 - the modes import them from here
from msprobe_nb.capture.collectives import Collectives
from msprobe_nb.capture.custom_functions import CustomFunctions
from msprobe_nb.capture.dtensors import DTENSOR_TYPE, local_shard, placement_text
from msprobe_nb.capture.grad_hooks import GradientHooks
from msprobe_nb.capture.leaves import POSITIONS, SCALAR_TEXT, describe_value, leaves, walk
from msprobe_nb.capture.naming import module_call_name
from msprobe_nb.capture.overflow_watch import OverflowWatch
from msprobe_nb.capture.stacks import StackTable
from msprobe_nb.capture.stats import (  # NAN: numel, requires_grad, tensor_id of non-tensor rows
    HALF_WIDEN_MAX_NUMEL,
    INT_DTYPES,
    NAN,
    PLAIN_TENSORS,
    Summarizer,
)
from msprobe_nb.store.schema import Coded

_graph_task_id = torch._C._current_graph_task_id  # != -1 inside autograd's backward (a recompute)
#: the attribute torch.compile's OptimizedModule keeps its module under, as a segment of a module path
_ORIG_MOD = "_orig_mod"
# Order of the fields of one buffered row; ``_call`` is the row's call in ``Recorder.calls`` (the call's
# own fields are stored once per call), stats and hashes are looked up by index at flush time.
ROW_FIELDS = (
    "_call", "name", "io", "arg", "is_kwarg", "kind", "dtype", "shape", "numel", "device", "requires_grad",
    "_stat", "value_type", "value", "tensor_id", "producer",
)
_F = {f: i for i, f in enumerate(ROW_FIELDS)}

# optional C extension (setup.py): the rows of plain tensors, None and values without a Python loop; None where it
# is not built or was built for another layout (capture/c_contract.py): add_rows' own loop gives the same rows
_row_builder = c_contract.row_builder(len(ROW_FIELDS))
_build_rows = _row_builder.build_rows if _row_builder is not None else None
# the same extension's one-pass split of the rows into columns (None: zip(*rows) and numpy's conversions)
_split_rows = getattr(_row_builder, "split_rows", None)
_attr_columns = getattr(_row_builder, "attr_columns", None)
# optional C extension: the recorder's reentrant lock, taken twice a recorded call; threading.RLock without it
_recorder_lock = c_contract.recorder_lock()
_RecorderLock = _recorder_lock.RecorderLock if _recorder_lock is not None else threading.RLock
#: the row fields materialize turns into numbers: small codes, the nullable numbers, the keyword flag, the call
#: and summary slots
_NUMERIC = ("kind", "io", "dtype", "device", "numel", "tensor_id", "requires_grad", "is_kwarg", "_call", "_stat")
_NUMERIC_AT = tuple(_F[f] for f in _NUMERIC)

#: columns that are fields of the call, not of the row: (column, Call attribute)
CALL_FIELDS = (("call_index", "index"), ("call", "call"), ("family", "family"), ("op", "op"),
               ("module_path", "module_path"), ("counter", "counter"), ("direction", "direction"),
               ("stack_id", "stack_id"), ("parent", "parent"), ("rng", "rng"), ("rng_state", "rng_state"))


class Recorder:
    """Turns observed calls into rows; one instance per dump and rank."""

    # What the C recording paths read or write on every recorded call: as slots, _slot_attrs.h reads them at
    # their offsets instead of looking each up by name. Everything else lives in the instance dict.
    __slots__ = ("active", "thread", "busy", "_all_data", "build_rows", "_row_ctx", "calls", "rows", "_seen",
                 "call_index", "api_counters", "counters", "grad_counters", "module_stack", "_select_all", "construct",
                 "_next_tensor_id", "backward_epoch", "__dict__", "__weakref__")

    def __init__(self, cfg, rank: int = 0):
        self.cfg = cfg
        self.rank = rank
        self.step = 0
        self.active = False
        self.thread = 0  # the thread that started recording (threading.get_ident()): module hooks record it alone
        # the API backward hooks of this step hold it; a new one at the step's end retires them (GradientHooks)
        self.backward_epoch = object()
        self.busy = 0  # > 0 while the kit itself runs torch ops (statistics): the modes ignore those
        self.lock = _RecorderLock()
        self._working = _Working(self)
        hashes = cfg.summary_mode in ("md5", "crc32", "xor")
        self.summarizer = Summarizer(stats=cfg.summary_mode != "xor", hashes=hashes,
                                     keep_tensors=cfg.task == "tensor")
        self.module_stack: list[tuple[torch.nn.Module, Call]] = []
        self.module_paths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._registered: tuple = ()
        self.stacks = StackTable(bool(cfg.stack))
        self.stack_id = self.stacks.stack_id  # bound once: it runs on every recorded call
        self._wanted: dict[tuple[str, str], bool] = {}
        self.grads = GradientHooks(self)  # API and module backward, parameter gradients
        self.functions = CustomFunctions(self)  # custom autograd.Function calls of this step
        self.collectives = Collectives(self)  # torch.distributed calls, async completions
        self.overflow = OverflowWatch() if cfg.task == "overflow_check" else None
        self.scope_on = not cfg.scope
        self._all_data = not cfg.data_mode or "all" in cfg.data_mode  # no data_mode filter to apply
        self._select_all = not cfg.scope and not cfg.list  # no scope / list filter to apply
        self.errors: list[str] = []
        self._ios = _Vocab(("input", "output", "parameters", "parameters_grad"))
        self._dtypes = _Vocab(("",))  # code 0: no dtype (values, None); torch dtypes added as they are met
        self._devices = _Vocab(("", "cpu"))
        self.build_rows = _build_rows  # None: the Python loop (also what tests compare the C rows with)
        # what build_rows calls back and the constants of its rows, by name, in the order the C side was built with
        summ = self.summarizer
        self._row_ctx = c_contract.context(_row_builder, {
            "recorder": self, "summarizer": summ, "summarize": summ.summarize, "kernel": summ.uses_kernel(),
            "dtype_codes": self._dtypes.codes, "dtype_code": self._dtypes.code, "device_code": self._device_code,
            "describe": describe_value, "row_of": self._row_of, "nan": NAN, "device_cpu": DEVICE_CPU,
            "tensor_types": PLAIN_TENSORS, "tensor": torch.Tensor, "float32": torch.float32,
            "strided": torch.strided, "leaves": leaves, "walk": walk, "positions": POSITIONS,
            "size_type": torch.Size, "scalar_text": SCALAR_TEXT, "host_copy": summ.host_copies_in_c(),
            "float16": torch.float16, "bfloat16": torch.bfloat16, "half_max": HALF_WIDEN_MAX_NUMEL,
            "int_dtypes": INT_DTYPES})
        self.reset_step()

    def c_parts(self) -> dict[str, Any]:
        """What the C recording paths (``_api_calls.h``: the handler, the API backward, the module hooks) call back
        and compare with, by their context fields' names; each takes the ones it names and adds its own."""
        return {"recorder": self, "lock_acquire": self.lock.acquire, "lock_release": self.lock.release,
                "note_error": self.note_error, "add_rows": self.add_rows, "io_input": self._ios.codes["input"],
                "io_output": self._ios.codes["output"], "call_type": Call, "share_summary": self.share_summary,
                "tensor": torch.Tensor, "no_torch_function": torch._C.DisableTorchFunction, "leaves": leaves}

    def working(self) -> _Working:
        """Hold the lock and mark the kit busy, so its own torch calls are not recorded."""
        return self._working

    # ------------------------------------------------------------------ step state
    def reset_step(self) -> None:
        self.rows: list[tuple] = []
        self.calls: list[Call] = []  # calls with rows this step, in order of their first row
        self.counters: dict[str, int] = {}
        self.api_counters: dict[tuple[str, str], int] = {}  # API calls: keyed by (family, op)
        self.grad_counters: dict[str, int] = {}
        self.construct: dict[str, str | None] = {}
        self.call_index = 0
        self.summarizer.reset()
        self._seen: dict[int, list] = {}  # id(tensor) -> [weakref, version, summary, tensor_id, producer]
        self._next_tensor_id = 0
        self._stale = False  # a flush happened mid-step: summary indices in _seen point to written buffers

    def flushed(self) -> None:
        """The step's rows so far are written: drop them, their calls, construct entries, new stacks and
        summaries. The step may go on (stop() then start() without step()), so tensors seen before are
        summarised again when met (see :meth:`resume`), while their tensor ids and producers stay."""
        self.rows = []
        self.calls = []
        self.construct = {}
        self.stacks.flushed()
        self.summarizer.reset()
        self._stale = True

    def resume(self) -> None:
        """Before recording resumes: after a mid-step flush, every tensor seen is summarised again."""
        if self._stale:
            for e in self._seen.values():
                e[1] = -1  # no version matches: the next sighting summarises it into the new buffers
            self._stale = False

    def wants_step(self) -> bool:
        if self.overflow is not None and self.overflow.found:
            return False  # overflow_check: the first overflow is written, nothing more to record
        return not self.cfg.step or self.step in self.cfg.step

    # ------------------------------------------------------------------ naming and filters
    def next_counter(self, key: str) -> int:
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return n

    def selected(self, call: str, family: str, op: str) -> bool:
        """msprobe's scope ([first, last] by call name) and list (full names or substrings) filters."""
        cfg = self.cfg
        if cfg.scope:
            if not self.scope_on:
                if call.startswith(cfg.scope[0]) or cfg.scope[0] == call:
                    self.scope_on = True
                else:
                    return False
            elif call == cfg.scope[1] or call.startswith(cfg.scope[1] + "."):
                self.scope_on = False
                return True
        if cfg.list:
            inside = any(c.dump and any(s in c.call for s in cfg.list) for _, c in self.module_stack)
            if not inside and not any(s == call or s in call for s in cfg.list):
                return False
        return True

    def wants(self, direction: str, io: str) -> bool:
        """msprobe's data_mode filter (forward/backward/input/output), memoised per (direction, io)."""
        key = (direction, io)
        hit = self._wanted.get(key)
        if hit is None:
            hit = self._wanted[key] = self._data_mode_allows(direction, io)
        return hit

    def _data_mode_allows(self, direction: str, io: str) -> bool:
        modes = self.cfg.data_mode
        if not modes or "all" in modes:
            return True
        d = "backward" if direction in ("backward", "parameters_grad") else "forward"
        has_dir = any(m in ("forward", "backward") for m in modes)
        has_io = any(m in ("input", "output") for m in modes)
        io_kind = "output" if io == "output" else "input"
        return (not has_dir or d in modes) and (not has_io or io_kind in modes or io in ("parameters",))

    # ------------------------------------------------------------------ stacks
    # ------------------------------------------------------------------ calls
    def current_parent(self) -> str:
        return self.module_stack[-1][1].call if self.module_stack else ""

    def open_api(self, family: str, op: str, frame) -> Call:
        key = (family, op)
        counter = self.api_counters.get(key, 0)
        self.api_counters[key] = counter + 1
        name = f"{family}.{op}.{counter}.forward"  # naming.api_call_name, inlined: this runs on every call
        stack = self.module_stack
        parent = stack[-1][1].call if stack else ""
        c = Call(name, family, op, counter, "recompute" if _graph_task_id() != -1 else "forward", "", parent)
        c.dump = self._select_all or self.selected(name, family, op)
        if c.dump:
            c.stack_id = self.stack_id(frame)
            c.index = self._take_index()
            if stack:
                self.construct[name] = parent or None
        return c

    def open_module(self, module: torch.nn.Module, path: str, frame) -> Call:
        cls = type(module).__name__
        counter = self.next_counter(f"Module.{path}.{cls}")
        name = module_call_name(path, cls, "forward", counter)
        c = Call(name, "Module", cls, counter, "recompute" if _graph_task_id() != -1 else "forward",
                 module_path=path, parent=self.current_parent())
        c.dump = self.cfg.level in ("L0", "mix") and (self._select_all or self.selected(name, "Module", cls))
        if c.dump:
            c.stack_id = self.stacks.walked_id(frame)
            c.index = self._take_index()
            self.construct[name] = c.parent or None
        return c

    def _take_index(self) -> int:
        i = self.call_index
        self.call_index += 1
        return i

    # ------------------------------------------------------------------ rows
    def add_rows(self, c: Call, direction: str, io: str, value: Any, *, is_kwarg: bool = False,
                 prefix: str = "", set_producer: bool = False) -> None:
        """Append one row per leaf of ``value`` (inputs, outputs, parameters, gradients)."""
        if not c.dump or not (self._all_data or self.wants(direction, io)):
            return
        calls = self.calls
        k = c.slot
        fresh = k < 0 or k >= len(calls) or calls[k] is not c  # the call's first rows this step
        if fresh:
            k = len(calls)
        io_code = self._ios.codes.get(io)
        if io_code is None:
            io_code = self._ios.code(io)
        base = c.call if io == "parameters_grad" else f"{c.call}.{io}"
        rows = self.rows
        if self.build_rows is not None:
            n = len(rows)
            try:
                self.build_rows(rows, value, prefix, k, base, io_code, is_kwarg, set_producer, c.call, self._seen,
                                self._row_ctx)
            finally:  # rows were added (even if a later leaf failed): they point at the call's slot
                if fresh and len(rows) > n:
                    c.slot = k
                    calls.append(c)
            return
        items = leaves(value, prefix)
        if not items:
            return
        if fresh:
            c.slot = k
            calls.append(c)
        call = c.call
        for path, leaf in items:
            rows.append(self._row_of(k, base, io_code, path, is_kwarg, leaf, call, set_producer))

    def _row_of(self, k: int, base: str, io_code: int, path: str, is_kwarg: bool, leaf: Any, call: str,
                set_producer: bool) -> tuple:
        """The row of one leaf (``k``: its call's slot in ``calls``; ``base``: the name its path extends)."""
        name = f"{base}.{path}" if path else base
        if isinstance(leaf, torch.Tensor):
            if (local := local_shard(leaf)) is not None:  # its shard's row, and what the shard is part of
                row = self._row_of(k, base, io_code, path, is_kwarg, local, call, set_producer)
                return (*row[:12], DTENSOR_TYPE, placement_text(leaf), *row[14:])
            e = self._seen.get(id(leaf))
            if e is not None and e[0]() is leaf and not set_producer and e[1] == leaf._version:
                idx, tid, producer = e[2], e[3], e[4]
            else:
                idx, tid, producer = self._first_sight(leaf, e, call, set_producer)
            dt = leaf.dtype
            return (k, name, io_code, path, is_kwarg, KIND_TENSOR, self._dtypes.code(dt),
                    tuple(leaf.shape), leaf.numel(), DEVICE_CPU if leaf.is_cpu else self._device_code(leaf),
                    leaf.requires_grad, idx, "", "", tid, producer)
        if leaf is None:
            return (k, name, io_code, path, is_kwarg, KIND_NONE, 0, None, NAN, 0, NAN, -1, "", "", NAN, "")
        vtype, vtext = describe_value(leaf)
        return (k, name, io_code, path, is_kwarg, KIND_VALUE, 0, None, NAN, 0, NAN, -1, vtype, vtext, NAN, "")

    def _device_code(self, t: torch.Tensor) -> int:
        """Code of a non-CPU tensor's device (add_rows gives CPU tensors DEVICE_CPU itself)."""
        try:
            name = str(t.device)
        except RuntimeError:
            return 0
        return self._devices.code(name)

    def _first_sight(self, t: torch.Tensor, e: list | None, call: str, set_producer: bool) -> tuple[int, int, str]:
        """(summary index, tensor_id, producer) of ``t`` when it is new, changed, or an output.

        ``_seen`` maps id(tensor) to [weakref, version, summary index, tensor_id, producing call]: the
        summary is reused while the version counter is unchanged; an output makes ``call`` the producer of
        the tensor object (a new tensor_id, even when an in-place op returns its input).
        """
        if e is None or e[0]() is not t:  # a new object (or a dead one's id reused)
            tid = self._next_tensor_id
            self._next_tensor_id += 1
            idx = self.summarizer.summarize(t)
            try:
                self._seen[id(t)] = [weakref.ref(t), t._version, idx, tid, call if set_producer else ""]
            except TypeError:  # not weak-referenceable: never cached
                pass
            return idx, tid, ""
        if e[1] != t._version:  # changed in place since it was summarised
            e[1] = t._version
            e[2] = self.summarizer.summarize(t)
        if set_producer:  # an object seen before comes out of this call: a new identity, made by ``call``
            e[3] = self._next_tensor_id
            self._next_tensor_id += 1
            e[4] = call
            return e[2], e[3], ""
        return e[2], e[3], e[4]

    def share_summary(self, out: torch.Tensor, source: torch.Tensor) -> None:
        """Let the output of a reshape / transpose / copy API reuse its input's summary (see
        :meth:`Summarizer.can_share`); the input must have been summarised, unchanged since."""
        e = self._seen.get(id(source))
        if e is None or e[0]() is not source or e[1] != source._version or e[2] < 0 \
                or not self.summarizer.can_share(out, source):
            return
        o = self._seen.get(id(out))
        if o is not None and o[0]() is out:
            return  # an object already seen (an API that returned its input): keep what it has
        try:
            self._seen[id(out)] = [weakref.ref(out), out._version, e[2], self._next_tensor_id, ""]
        except TypeError:
            return
        self._next_tensor_id += 1

    def rewritten(self, t: torch.Tensor) -> None:
        """``t`` was written in place by a call that leaves its version counter alone (a collective): the
        next sighting summarises it again instead of reusing the summary cached for its version."""
        e = self._seen.get(id(t))
        if e is not None and e[0]() is t:
            e[1] = -1

    def mark_written(self, t: torch.Tensor, call: str) -> None:
        """``call`` wrote into ``t`` in place and returned something else (``x[i] = v``): from now on ``t``
        is the call's product, not its creator's (uninitialised memory filled, a buffer overwritten)."""
        e = self._seen.get(id(t))
        if e is not None and e[0]() is t:
            e[3] = self._next_tensor_id
            self._next_tensor_id += 1
            e[4] = call

    # ------------------------------------------------------------------ hooks
    def remove_step_hooks(self) -> None:
        """The step is over: remove its autograd hooks and forget its frames and Function calls."""
        self.grads.remove_step()
        self.functions.reset()
        self.stacks.release_frame()

    def remove_all_hooks(self) -> None:
        """Recording stops: the step's hooks and the parameters' gradient hooks go."""
        self.remove_step_hooks()
        self.grads.remove_parameters()

    # ------------------------------------------------------------------ module paths
    def module_path(self, module: torch.nn.Module) -> str | None:
        """Dotted path of ``module`` in its model; None for a root model (msprobe does not record roots)."""
        try:
            path = self.module_paths.get(module)
        except TypeError:
            return None
        if path is not None:
            return path or None
        parent_mod = self.module_stack[-1][0] if self.module_stack else None
        if not isinstance(parent_mod, torch.nn.Module):
            self.module_paths[module] = ""
            return None
        ppath = self.module_paths.get(parent_mod, "")
        for n, child in parent_mod._modules.items():
            if child is module:
                path = f"{ppath}.{n}" if ppath else n
                self.module_paths[module] = path
                return path
        # called from a parent that does not own it: name it by its class in the parent
        path = f"{ppath}.{type(module).__name__}" if ppath else type(module).__name__
        self.module_paths[module] = path
        return path

    def register_model(self, model) -> None:
        """Name every submodule by its dotted path. ``start(model)`` runs once per step: the walk is skipped
        when the same model objects with the same top-level children were registered already (a module
        added deeper later is still named, from its parent, by :meth:`module_path`)."""
        models = model if isinstance(model, (list, tuple)) else [model]
        key = tuple((id(m), tuple(map(id, getattr(m, "_modules", {}).values()))) for m in models)
        if key == self._registered:
            return
        self._registered = key
        for i, m in enumerate(models):
            prefix = f"{i}." if len(models) > 1 else ""
            for name, sub in m.named_modules():
                if _ORIG_MOD in name:  # a torch.compile wrapper and what it wraps share one path
                    name = ".".join(part for part in name.split(".") if part != _ORIG_MOD)
                self.module_paths[sub] = f"{prefix}{name}" if name else (prefix[:-1] if prefix else "")

    # ------------------------------------------------------------------ flush
    def materialize(self) -> dict[str, Any] | None:
        """Columns of this step's rows (with statistics read back once) and the tensors, or None if empty
        (or, for the overflow_check task, when the step holds no overflow)."""
        self.collectives.step_ends()
        if not self.rows:
            return None
        padded, hashes = self.summarizer.materialize(pad=True)  # its last row, NaN, is index -1's: no statistics
        cols, nums = _columns(self.rows)
        out: dict[str, Any] = {}
        for f, i in _F.items():
            if not f.startswith("_"):
                out[f] = cols[i]
        # row fields held as small codes: the writer converts each distinct value once
        for f, vocab in (("kind", _KINDS), ("io", self._ios), ("dtype", self._dtypes), ("device", self._devices)):
            out[f] = Coded(nums[f].astype(np.int64), list(vocab.values))
        # nullable numbers as float arrays (rows hold NaN for "none", which the writer stores as <NA>)
        for f in ("numel", "tensor_id", "requires_grad"):
            out[f] = nums[f]
        out["is_kwarg"] = nums["is_kwarg"] != 0  # a bool array: the writer takes it as it is
        codes = nums["_call"].astype(np.int64)
        for col, values in zip(_CALL_COLUMNS, call_fields(self.calls)):
            out[col] = Coded(codes, values)
        sidx = nums["_stat"].astype(np.int64)  # -1: no statistics (values, None, tensors without data)
        picked = padded.take(sidx, axis=0)  # take: several times faster than indexing with an array here
        for j, col in enumerate(("max", "min", "mean", "norm")):
            out[col] = picked[:, j]
        for j, col in ((4, "nan_count"), (5, "posinf_count"), (6, "neginf_count")):
            out[col] = picked[:, j]  # float, NaN where not counted: the writer stores those as <NA>
        if hashes:
            hx = np.asarray(hashes + [""], dtype=object)
            out["hash"] = hx[sidx]  # -1: the "" after the step's hashes
        tensors: dict[str, torch.Tensor] = {}
        if not self.summarizer.keep_tensors:
            out["data_name"] = Coded(np.zeros(len(sidx), np.int64), [""])
        else:
            data_names = [""] * len(sidx)
            first_name: dict[int, str] = {}
            names = out["name"]
            for r, i in enumerate(sidx):
                if i < 0:
                    continue
                dn = first_name.get(i)
                if dn is None:
                    dn = f"step{self.step}/{names[r]}"
                    first_name[i] = dn
                    tensors[dn] = self.summarizer.tensors[i]
                data_names[r] = dn
            out["data_name"] = data_names
        data = {"columns": out, "tensors": tensors, "stacks": self.stacks.render_new(),
                "construct": dict(self.construct)}
        return data if self.overflow is None else self.overflow.keep(data)

    def note_error(self, where: str, exc: BaseException) -> None:
        """Never break the user's model: remember the failure, warn once, carry on."""
        msg = f"msprobe_nb: recording failed in {where}: {type(exc).__name__}: {exc}"
        if not self.errors:
            warnings.warn(msg + " (the model ran unaffected; further errors are kept in Debugger.errors)",
                          RuntimeWarning, stacklevel=3)
        self.errors.append(msg)


_CALL_COLUMNS = tuple(col for col, _ in CALL_FIELDS)
_CALL_ATTRS = tuple(attr for _, attr in CALL_FIELDS)


def call_fields(calls: list[Call]) -> list[list[Any]]:
    """The fields of CALL_FIELDS of each call, one list per field: read at their slots in C where the row builder
    is built, else one ``attrgetter`` pass per field."""
    if _attr_columns is not None:
        return _attr_columns(calls, _CALL_ATTRS)
    return [list(map(attrgetter(attr), calls)) for attr in _CALL_ATTRS]


def _columns(rows: list[tuple]) -> tuple[list, dict[str, np.ndarray]]:
    """The rows as columns (one sequence per field) and the numeric fields as float64 arrays: one pass in C
    where the row builder is built, else ``zip(*rows)`` and numpy's conversion of each numeric field."""
    if _split_rows is not None:
        nums = np.empty((len(_NUMERIC), len(rows)), dtype=np.float64)
        try:
            cols = _split_rows(rows, _NUMERIC_AT, nums)
        except (TypeError, ValueError):  # a row it does not take: the Python way says what is wrong, if anything
            pass
        else:
            return cols, dict(zip(_NUMERIC, nums))
    cols = list(zip(*rows)) if rows else [()] * len(ROW_FIELDS)
    return cols, {f: np.array(cols[_F[f]], dtype=np.float64) for f in _NUMERIC}


class _Working:
    """Context manager of :meth:`Recorder.working` (a class: cheaper than a generator-based one).

    It also turns ``__torch_function__`` handling off: hooks run outside the mode's handler, where every
    tensor attribute the kit reads (``.shape``, ``.dtype``, ``._version``...) would otherwise go through the
    mode once more (about 1.5 µs each).
    """

    __slots__ = ("rec", "_off")

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._off: list = []

    def __enter__(self):
        self.rec.lock.acquire()
        self.rec.busy += 1
        off = _DisableTorchFunction()
        off.__enter__()
        self._off.append(off)
        return self

    def __exit__(self, *exc):
        self._off.pop().__exit__(None, None, None)
        self.rec.busy -= 1
        self.rec.lock.release()


_DisableTorchFunction = torch._C.DisableTorchFunction


class _Vocab:
    """Small codes for the few distinct values of a row field (io, kind, dtype, device): rows hold the
    code, and the writer converts each distinct value once instead of once per row."""

    __slots__ = ("codes", "values")

    def __init__(self, values=()):
        self.values: list[str] = list(values)
        self.codes: dict[Any, int] = {v: i for i, v in enumerate(self.values)}

    def code(self, key: Any) -> int:
        i = self.codes.get(key)
        if i is None:
            i = self.codes[key] = len(self.values)
            self.values.append(str(key))
        return i


KIND_TENSOR, KIND_NONE, KIND_VALUE = (c_contract.KIND_CODES[k] for k in ("tensor", "none", "value"))
_KINDS = _Vocab(("tensor", "none", "value"))
DEVICE_CPU = 1  # code of "cpu" in Recorder._devices (code 0: no device)
