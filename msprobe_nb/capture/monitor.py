"""``MonitorHooks``: per-step aggregates of a training run, cheap enough to stay on (``mp.Monitor`` is it with a file).

Hooks only, and they only read: the optimizer's step pre-hook reads the weights the step's forward used and
the final gradients of the step (after any accumulation, after DDP's all-reduce, Megatron's ``main_grad``
where a parameter has one; the post-hook reads the gradients when a GradScaler leaves the unscaling to a fused
optimizer), its post-hook Adam's ``exp_avg`` / ``exp_avg_sq`` when asked; one post-accumulate-grad hook
counts the micro-batches of a step; module forward hooks and tensor hooks on their outputs read activations
and their gradients when asked. Every aggregate is computed on the tensor's device (``monitor_stats``);
``mon.step(loss=...)`` brings the whole step to the host in one copy, checks the alert rules (the store's
``monitor_rules``, which ``anomalies()`` replays) and hands the step to its sink (``msprobe_nb.monitor.Monitor``
gives it the store's ``MonitorWriter``; capture imports only the store's torch-free contract modules).
Without an optimizer, or when one skipped its step (a GradScaler that found inf), gradients and weights are read
in ``step()``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import numpy as np
import torch

from msprobe_nb.store.monitor_rules import AlertRules
from msprobe_nb.store.monitor_schema import (
    ACT_KINDS,
    COUNT_STATS,
    DEFAULT_STATS,
    FLOAT_STATS,
    STATS,
    THRESHOLDS,
)

from .monitor_acts import combined
from .monitor_live_alerts import ALERT_LINES, LiveAlerts  # noqa: F401 - ALERT_LINES: the shells' name for it
from .monitor_sharded import full_nonfinite_counts, full_norms, is_dtensor, local_shards
from .monitor_stats import (
    SignHistory,
    SignPacker,
    cpu_norm_runs,
    cpu_norms_host,
    gather,
    histograms,
    nonfinite_counts,
    tensor_stats,
)

__all__ = ["ACT_BATCH", "DEFAULT_STATS", "MonitorHooks"]

#: activations (or their gradients) held before their aggregates are computed together (bounds the memory held)
ACT_BATCH = 64
_graph_task_id = torch._C._current_graph_task_id  # != -1 inside autograd's backward
_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def _select(names: Iterable[str], which: Any, what: str) -> list[str]:
    """The names ``which`` selects: None / True: all; a string: a regular expression searched in each name;
    a list: exactly those names (every one must exist)."""
    names = list(names)
    if which is None or which is True:
        return names
    if isinstance(which, str):
        rx = re.compile(which)
        return [n for n in names if rx.search(n)]
    wanted = list(which)
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise ValueError(f"Monitor: no {what} named {', '.join(map(repr, missing[:5]))} in the model")
    keep = set(wanted)
    return [n for n in names if n in keep]


def _first_float(out: Any) -> torch.Tensor | None:
    """The module's output tensor, or the first floating tensor of a tuple / list / dict output."""
    if isinstance(out, torch.Tensor):
        return out if out.is_floating_point() and out.numel() else None
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    for x in items:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            return x
    return None


def _by_device(items: Sequence[tuple[str, torch.Tensor]]) -> list[Sequence[tuple[str, torch.Tensor]]]:
    """``items`` split by the device of their tensor and whether it is a DTensor (one group, as it is, in the
    common case)."""
    devices = {(t.device, is_dtensor(t)) for _, t in items}
    if len(devices) == 1:
        return [items]
    groups: dict[tuple, list] = {}
    for name, t in items:
        groups.setdefault((t.device, is_dtensor(t)), []).append((name, t))
    return list(groups.values())


class MonitorHooks:
    """Watch ``model`` (and ``optimizer``) every step; call ``step(loss=...)`` once per optimizer step.

    ``sink(columns, meta, rank)`` makes the object each finished step goes to: its ``write_step(step, names,
    kinds, values, scalars, signs)`` commits it, ``close()`` ends it, ``folder`` (if any) is where it writes.

    ``params``: the parameters watched (None: every trainable one; a regex; a list of names). ``stats``: the
    aggregates (``norm`` always; default also ``nan`` and ``inf``, counted only where the norm is not finite;
    opt-in ``min``, ``max``, ``mean``). ``weights``, ``grads``, ``optimizer_state`` (default off): which kinds
    of parameter rows. ``activations``: modules whose outputs are watched
    (False; True: every module; a regex; a list of names); ``activation_grads`` (default: as activations) their
    output gradients too. ``histogram``: bin bounds for gradient histograms; ``signs``: gradient sign bitmaps
    (for direction similarity). ``grad_scaler``: a GradScaler whose scale is recorded. ``rank``: default from
    torch.distributed. ``warmup``, ``window``, ``spike_z``, ``spike_ratio``, ``spike_floor``,
    ``direction_drop``: the alert thresholds (``monitor_schema.THRESHOLDS``, docs/monitor.md); ``alerts=False``
    checks and prints none. ``local_grads``: also each rank's own gradient norms as backward accumulated them,
    before DDP writes the reduced ones back (kind ``local_grad``; a hook per parameter).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 sink: Callable[[list[str], dict, int], Any], params: str | Iterable[str] | None = None,
                 stats: Sequence[str] = DEFAULT_STATS, weights: bool = True, grads: bool = True,
                 optimizer_state: bool = False, activations: bool | str | Iterable[str] = False,
                 activation_grads: bool | None = None,
                 histogram: Sequence[float] | None = None, signs: bool = False, grad_scaler: Any = None,
                 rank: int | None = None, warmup: int = int(THRESHOLDS["warmup"]),
                 window: int = int(THRESHOLDS["window"]),
                 spike_z: float = THRESHOLDS["spike_z"], spike_ratio: float = THRESHOLDS["spike_ratio"],
                 spike_floor: float = THRESHOLDS["spike_floor"], direction_drop: float = THRESHOLDS["direction_drop"],
                 alerts: bool = True, start_step: int = 0, local_grads: bool = False) -> None:
        bad = [s for s in stats if s not in STATS]
        if bad or "norm" not in stats:
            raise ValueError(f"Monitor: stats must include 'norm' and be among {', '.join(STATS)}; got {list(stats)}")
        self.stats = [s for s in STATS if s in stats]
        self._float_stats = [s for s in self.stats if s in FLOAT_STATS]
        #: the count columns, as positions in ``nonfinite_counts``' (nan, inf)
        self._count_sel = [COUNT_STATS.index(s) for s in self.stats if s in COUNT_STATS]
        self._norms_only = self._float_stats == ["norm"]
        inner = model
        if type(model).__name__ in _WRAPPERS and hasattr(model, "module"):
            # a wrapper's .module is a Module (torch's stubs type Module attributes as Tensor | Module)
            inner = cast(torch.nn.Module, model.module)
        self.model, self.optimizer, self.grad_scaler = inner, optimizer, grad_scaler
        named = {n: p for n, p in inner.named_parameters() if p.requires_grad}
        self._params = [(n, named[n]) for n in _select(named, params, "parameter")]
        self._param_tensors = [p for _, p in self._params]
        self._main_grad_in_class = any(hasattr(c, "main_grad") for c in {type(p) for p in self._param_tensors})
        self._weights = [(n, p) for n, p in self._params if p.numel()]
        self._layouts: dict[Any, list] = {}
        self._names: dict[tuple | None, list[str]] = {}  # positions of the parameters present -> their names
        self._want = {"weight": weights, "grad": grads, "opt": optimizer_state and optimizer is not None}
        self._local_grads = bool(local_grads)
        self._bounds = None if histogram is None else torch.as_tensor(sorted(float(b) for b in histogram))
        self._signs = SignPacker() if signs else None
        self._sign_history = SignHistory()
        self.columns = list(self.stats) + ["numel"] + (["sign_agree"] if signs else []) + \
            ([f"hist_{i}" for i in range(len(self._bounds) + 1)] if self._bounds is not None else [])
        self._col = {c: i for i, c in enumerate(self.columns)}
        self._float_cols = [self._col[s] for s in self.stats if s in FLOAT_STATS]
        self._count_cols = [self._col[s] for s in self.stats if s in COUNT_STATS]
        if rank is None:
            dist = torch.distributed
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.rank, self.step_index = int(rank), int(start_step)
        rules = AlertRules(warmup, window, spike_z, spike_ratio, direction_drop, spike_floor)  # checks them
        self._live = LiveAlerts(rules, self.rank, self._col) if alerts else None
        meta = {"stats": self.stats, "histogram": None if self._bounds is None else self._bounds.tolist(),
                "signs": bool(signs), **rules.thresholds, "direction_min_numel": THRESHOLDS["direction_min_numel"],
                "model": type(inner).__name__, "optimizer": type(optimizer).__name__ if optimizer else None,
                "parameters": [n for n, _ in self._params],
                "groups": self._groups(optimizer)}
        self._writer = sink(self.columns, meta, self.rank)
        self.dump_path = getattr(self._writer, "folder", None)
        self._handles: list[Any] = []
        try:
            self._install(activations, activations if activation_grads is None else activation_grads)
        except BaseException:
            self.close()
            raise
        self._reset()

    def _groups(self, optimizer: Any) -> list[list[str]]:
        """The watched parameters' names per optimizer parameter group (to name a group's learning rate)."""
        if optimizer is None:
            return []
        name = {id(p): n for n, p in self._params}
        return [[name[id(p)] for p in g["params"] if id(p) in name] for g in optimizer.param_groups]

    # -- hooks ---------------------------------------------------------------------------------------
    def _install(self, activations: Any, activation_grads: Any) -> None:
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._on_pre_step))
            self._handles.append(self.optimizer.register_step_post_hook(self._on_post_step))
        if self._params:
            self._handles.append(self._params[0][1].register_post_accumulate_grad_hook(self._on_accumulated))
        if self._local_grads:
            for i, (_, p) in enumerate(self._params):
                self._handles.append(p.register_post_accumulate_grad_hook(partial(self._on_local_grad, i)))
        modules = dict(self.model.named_modules())
        acts = _select(modules, activations, "module") if activations is not False else []
        self._act_grads = bool(activation_grads) and activation_grads is not False
        grad_set = set(_select(modules, activation_grads, "module")) if self._act_grads else set()
        for name in acts:
            label = name or "(model)"
            self._handles.append(modules[name].register_forward_hook(
                partial(self._on_forward, label, label in grad_set or name in grad_set)))

    def _reset(self) -> None:
        self._pending: dict[str, list] = {}  # kind -> [(names, floats, counts, extra)]
        self._acts: dict[str, list[tuple[str, torch.Tensor]]] = {"act": [], "act_grad": []}
        self._micro = 0
        self._local: dict[int, torch.Tensor] = {}
        self._grads_read = self._weights_read = self._grads_after_step = False

    def _on_local_grad(self, i: int, param: torch.Tensor) -> None:
        """The rank's own gradient of parameter ``i`` as backward accumulated it (the last micro-batch's holds
        the sum): its norm now, before a DDP reducer's finalisation replaces it with the average."""
        g = param.grad
        if g is not None and g.numel():
            with torch.no_grad():
                self._local[i] = torch.linalg.vector_norm(g, dtype=torch.float32)

    def _on_accumulated(self, _param: torch.Tensor) -> None:
        self._micro += 1

    def _on_pre_step(self, opt: Any, _args: Any, _kwargs: Any) -> None:
        # A GradScaler stepping an optimizer that unscales itself (fused Adam / AdamW) hands it the scale as
        # ``opt.grad_scale`` instead of unscaling first: the gradients are still scaled here and are unscaled
        # in place by the step. They are read after it, as that step used them.
        # The weights are read here too: those the step's forward and backward used, which is what its
        # gradients are paired with (a weight changed between two steps shows in the next step's record).
        self._grads_after_step = getattr(opt, "grad_scale", None) is not None
        if not self._grads_after_step and self._read_both():
            return
        self._read_weights()
        if not self._grads_after_step:
            self._read_grads()

    def _on_post_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        if self._grads_after_step:
            self._grads_after_step = False
            self._read_grads()
        if self._want["opt"]:
            self._read_optimizer_state()

    def _on_forward(self, name: str, with_grad: bool, _module: Any, _args: Any, out: Any) -> None:
        t = _first_float(out)
        if t is None:
            return
        # a forward inside autograd's backward is activation checkpointing's recompute (reentrant, or without
        # its early stop) of an output already held: not a second call. Its gradient hook is still set below,
        # since a reentrant checkpoint's first forward ran without a graph
        if _graph_task_id() == -1:
            self._hold("act", name, t)  # read under no_grad later; the graph holds it until backward anyway
        if with_grad and t.requires_grad:
            node = t.grad_fn
            if node is None:  # a leaf: its own tensor hook
                t.register_hook(partial(self._on_act_grad, name))
            else:  # the hook of the node that made it: cheaper than a tensor hook, and it only reads
                node.register_hook(partial(self._on_node_grad, name, t.output_nr))

    def _on_node_grad(self, name: str, index: int, _grad_inputs: Any, grad_outputs: Any) -> None:
        g = grad_outputs[index] if index < len(grad_outputs) else None
        if g is not None and g.numel():
            self._hold("act_grad", name, g)

    def _on_act_grad(self, name: str, grad: torch.Tensor) -> None:
        if grad is not None and grad.numel():
            self._hold("act_grad", name, grad)

    def _hold(self, kind: str, name: str, t: torch.Tensor) -> None:
        held = self._acts[kind]
        held.append((name, t))
        if len(held) >= ACT_BATCH:
            self._flush_held(kind)

    def _flush_held(self, kind: str) -> None:
        held, self._acts[kind] = self._acts[kind], []
        if held:
            self._aggregate(kind, held)

    # -- aggregates on the device --------------------------------------------------------------------
    def _aggregate(self, kind: str, items: Sequence[tuple[str, torch.Tensor]], signs: bool = False,
                   hist: bool = False, replace: bool = False, layout: Any = None) -> None:
        """Queue the aggregates of ``items`` (name, tensor) as rows of ``kind`` (computed now, read in step()).
        ``layout``: a key that changes whenever the items' names, shapes, dtypes or devices do; the split by
        device, the names and the sizes are then remembered under it instead of rebuilt."""
        groups = self._layouts.get(layout) if layout is not None else None
        if groups is None:
            groups = []
            for group in _by_device(items):
                at = {id(t): i for i, (_, t) in enumerate(items)} if len(groups) or len(group) != len(items) else None
                idx = list(range(len(items))) if at is None else [at[id(t)] for _, t in group]
                groups.append(([n for n, _ in group], idx, np.fromiter((t.numel() for _, t in group), np.int64,
                                                                       len(group))))
            if layout is not None:
                if len(self._layouts) > 64:
                    self._layouts.clear()
                self._layouts[layout] = groups
        entries = []
        for g, (names, idx, numel) in enumerate(groups):
            ts = [items[i][1] for i in idx] if len(idx) != len(items) else [t for _, t in items]
            extra: dict[str, Any] = {"numel": numel}
            full = None
            if is_dtensor(ts[0]):  # FSDP2 / tensor parallel: the full tensors' norms and counts (monitor_sharded)
                full, ts = ts, local_shards(ts)
            cpu = ts[0].is_cpu
            # counts: from the norms where they are on the host already (CPU); else read after the step's one
            # copy for the tensors whose norm is not finite (parameter-shaped kinds: their tensors live on),
            # counted on the device with the rest for activations (not held past their batch)
            eager = bool(self._count_sel) and not cpu and kind in ACT_KINDS
            counts: torch.Tensor | np.ndarray | None
            floats, counts = tensor_stats(ts, self.stats if eager else self._float_stats,
                                          None if layout is None else (layout, g))
            assert floats is not None, "the norm is always among the stats"
            if full is not None:
                floats[:, 0] = full_norms(full)
                eager = False
            if self._count_sel and not eager:
                count = nonfinite_counts if full is None else full_nonfinite_counts
                if cpu:
                    counts = count(ts if full is None else full, floats[:, 0].numpy())[:, self._count_sel]
                else:
                    extra["defer"], extra["sharded"] = (ts, False) if full is None else (full, True)
            if signs and self._signs is not None:
                extra["signs"] = self._signs.pack(ts)
            if hist and self._bounds is not None:
                extra["hist"] = histograms(ts, self._bounds)
            entries.append((names, floats, counts, extra))
        if replace:
            self._pending[kind] = entries
        else:
            self._pending.setdefault(kind, []).extend(entries)

    def _layout(self, kind: str, ts: Sequence[torch.Tensor], present: tuple) -> tuple:
        """The layout key of parameter-shaped tensors: which parameters, their sizes, dtypes and devices."""
        return (kind, present, tuple(t.numel() for t in ts), frozenset((t.dtype, t.device) for t in ts))

    def _kernel_runs(self, ts: Sequence[torch.Tensor]) -> tuple | None:
        """The C kernel's arguments for ``ts`` when norms (and the counts) alone are asked for and every tensor
        suits it."""
        return cpu_norm_runs(ts) if self._norms_only and ts[0].is_cpu else None

    def _aggregate_params(self, kind: str, present: tuple | None, ts: Sequence[torch.Tensor], runs: tuple | None,
                          signs: bool = False, hist: bool = False, norms: np.ndarray | None = None) -> None:
        """Queue the rows of parameter-shaped tensors ``ts`` (of the watched parameters at positions
        ``present``, None: all). With ``runs`` (:meth:`_kernel_runs`: norms alone of float32 CPU tensors, the
        default on a CPU) the norms come from the C kernel in one call, with no layout key built: at a model's
        hundreds of parameters the Python per tensor, not the arithmetic, is what a step pays for; the NaN and
        inf counts follow from those norms (``nonfinite_counts``). ``norms``: the kernel's result for ``runs``
        already computed. Without ``runs``, everything goes through ``_aggregate``."""
        if runs is None:
            items = [(self._params[i][0], t) for i, t in zip(present, ts)] if present is not None else \
                [(n, t) for (n, _), t in zip(self._params, ts)]
            key = self._layout(kind, ts, present if present is not None else ())
            self._aggregate(kind, items, signs=signs, hist=hist, replace=True, layout=key)
            return
        names = self._names.get(present)
        if names is None:
            names = [n for n, _ in self._params] if present is None else [self._params[i][0] for i in present]
            if len(self._names) > 64:
                self._names.clear()
            self._names[present] = names
        extra: dict[str, Any] = {"numel": np.array(runs[1], np.int64)}
        if signs and self._signs is not None:
            extra["signs"] = self._signs.pack(ts)
        if hist and self._bounds is not None:
            extra["hist"] = histograms(ts, self._bounds)
        norms = cpu_norms_host(runs) if norms is None else norms
        counts = nonfinite_counts(ts, norms) if self._count_sel else None
        if counts is not None and self._count_sel != [0, 1]:
            counts = counts[:, self._count_sel]
        self._pending[kind] = [(names, norms.reshape(-1, 1), counts, extra)]

    def _grad_list(self) -> list[torch.Tensor | None]:
        """Each watched parameter's final gradient, None where it has none. Read under no_grad: no detach (a
        call per parameter) needed. Megatron sets ``main_grad`` on each parameter object: its __dict__ is
        looked in, unless some parameter's class defines the name itself (a getattr that fails costs several
        times a dict lookup, at every parameter)."""
        if self._main_grad_in_class:
            return [p.grad if (m := getattr(p, "main_grad", None)) is None else m for p in self._param_tensors]
        return [p.grad if (m := p.__dict__.get("main_grad")) is None else m for p in self._param_tensors]

    def _read_both(self) -> bool:
        """Weights and gradients in one C kernel call (the default on a CPU: norms, every parameter with a
        float32 gradient); False, having read nothing, where that path does not apply."""
        if not (self._norms_only and self._want["weight"] and self._want["grad"] and self._params) \
                or len(self._weights) != len(self._params) or not self._param_tensors[0].is_cpu:
            return False
        ws, grads = self._param_tensors, self._grad_list()
        gs = [g for g in grads if g is not None]
        if len(gs) != len(grads):
            return False
        runs = cpu_norm_runs(ws + gs)
        if runs is None:
            return False
        n, norms = len(ws), cpu_norms_host(runs)
        self._aggregate_params("weight", None, ws, (runs[0][:n], runs[1][:n]), norms=norms[:n])
        self._aggregate_params("grad", None, gs, (runs[0][n:], runs[1][n:]), signs=True, hist=True, norms=norms[n:])
        self._weights_read = self._grads_read = True
        return True

    def _read_grads(self) -> None:
        if not self._want["grad"]:
            return
        grads = self._grad_list()
        present = None  # positions of the parameters that have a row; None: all
        ts = [g for g in grads if g is not None]
        if len(ts) != len(grads):  # parameters without a gradient this step have no row
            present = [i for i, g in enumerate(grads) if g is not None]
        runs = self._kernel_runs(ts) if ts else None
        if runs is None:  # the general path leaves out empty gradients (an empty tensor has no min)
            kept = [k for k, g in enumerate(ts) if g.numel()]
            if len(kept) != len(ts):
                present = [k if present is None else present[k] for k in kept]
                ts = [ts[k] for k in kept]
        if ts:
            self._aggregate_params("grad", None if present is None else tuple(present), ts, runs, signs=True,
                                   hist=True)
        self._grads_read = True

    def _read_weights(self) -> None:
        if self._want["weight"] and self._weights:
            items = self._weights
            ts = [p for _, p in items]
            if len(items) == len(self._params):
                self._aggregate_params("weight", None, ts, self._kernel_runs(ts))
            else:
                self._aggregate("weight", items, replace=True, layout=self._layout("weight", ts, ()))
        self._weights_read = True

    def _read_optimizer_state(self) -> None:
        assert self.optimizer is not None, "optimizer_state rows are wanted only with an optimizer"
        state = self.optimizer.state
        first = state.get(self._params[0][1]) if self._params else None
        if not first or not any(k in first for k in ("exp_avg", "exp_avg_sq")):
            return  # no Adam-like state (SGD, or before the first step): nothing to read
        rows: dict[str, list] = {"exp_avg": [], "exp_avg_sq": []}
        for name, p in self._params:
            st = state.get(p)
            if st:
                for key, items in rows.items():
                    t = st.get(key)
                    if isinstance(t, torch.Tensor) and t.numel():
                        items.append((name, t))
        for key, items in rows.items():
            if items:
                self._aggregate(key, items, replace=True)

    # -- the step --------------------------------------------------------------------------------------
    def step(self, loss: Any = None) -> None:
        """End the step: gather its aggregates (one host copy), check the alert rules, commit it to the file."""
        if self._writer is None:
            raise RuntimeError("step() after close(): the monitor is closed")
        if not self._grads_read:
            self._read_grads()
        if not self._weights_read:
            self._read_weights()
        for kind in ("act", "act_grad"):
            self._flush_held(kind)
        if self._local:  # counts, where a norm is not finite, from the gradients as they are now
            at = sorted(self._local)
            extra = {"numel": np.fromiter((self._params[i][1].numel() for i in at), np.int64, len(at)),
                     "defer": [self._params[i][1].grad for i in at], "sharded": False}
            norms = torch.stack([self._local[i] for i in at]).reshape(-1, 1)  # the norm only (other columns NaN)
            norms = torch.cat([norms, norms.new_full((len(at), len(self._float_stats) - 1), float("nan"))], 1)
            self._pending["local_grad"] = [([self._params[i][0] for i in at], norms, None, extra)]
        parts: list[torch.Tensor] = []
        layout = []
        for kind, entries in self._pending.items():
            for names, floats, counts, extra in entries:
                slots = {}
                for key, t in (("floats", floats), ("counts", counts), ("hist", extra.get("hist"))):
                    if t is not None:
                        slots[key] = len(parts)
                        parts.append(t)
                if "signs" in extra:
                    slots["packed"] = len(parts)
                    parts.append(extra["signs"][0])
                layout.append((kind, names, extra, slots))
        loss_at = scale_at = None
        if isinstance(loss, torch.Tensor) and loss.is_cpu and loss.numel() == 1:
            loss = float(loss.detach())  # on the host already: read now (no copy to batch), no grad warning
        if isinstance(loss, torch.Tensor):
            loss_at = len(parts)
            parts.append(loss.detach().float().reshape(-1)[:1])
        scale = getattr(self.grad_scaler, "_scale", None) if self.grad_scaler is not None else None
        if isinstance(scale, torch.Tensor):  # the scaler's own tensor: read in the same copy, no extra sync
            scale_at = len(parts)
            parts.append(scale.detach().float().reshape(-1)[:1])
        host = gather(parts) if parts else []
        self._commit(layout, host, loss, loss_at, scale_at)

    def _commit(self, layout: list, host: list[np.ndarray], loss: Any, loss_at: int | None,
                scale_at: int | None) -> None:
        names_all: list[str] = []
        kinds_all: list[str] = []
        blocks: list[np.ndarray] = []
        sign_pos, sign_numel, sign_bytes = [], [], []
        grad_sq = 0.0
        for kind, names, extra, slots in combined(layout, host, self._float_stats):
            v = np.full((len(names), len(self.columns)), np.nan)
            fl, co = slots.get("floats"), slots.get("counts")
            v[:, self._float_cols] = fl
            if self._count_cols:
                if co is None:  # deferred: counted now, only for the tensors whose norm is not finite
                    count = full_nonfinite_counts if extra["sharded"] else nonfinite_counts
                    co = count(extra["defer"], fl[:, 0])[:, self._count_sel]
                v[:, self._count_cols] = co
            v[:, self._col["numel"]] = extra["numel"]
            if slots.get("hist") is not None:
                v[:, self._col["hist_0"]:] = slots["hist"]
            if slots.get("packed") is not None:
                _, order, numel, nbytes = extra["signs"]
                blob = slots["packed"]
                in_order = [names[i] for i in order]
                v[order, self._col["sign_agree"]] = self._sign_history.agreement(in_order, numel, nbytes, blob,
                                                                                 self.step_index)
                base = len(names_all)
                sign_pos += [base + i for i in order]
                sign_numel += numel.tolist()
                sign_bytes.append(blob)
            if kind == "grad":
                norms = v[:, 0]
                grad_sq += float(np.dot(norms, norms))
            names_all += names
            kinds_all += [kind] * len(names)
            blocks.append(v)
        values = np.concatenate(blocks) if blocks else np.zeros((0, len(self.columns)))
        scalars: dict[str, float] = {}
        if loss is not None:
            scalars["loss"] = float(host[loss_at][0]) if loss_at is not None else float(loss)
        if self._want["grad"] and "grad" in kinds_all:
            scalars["grad_norm"] = float(np.sqrt(grad_sq))
        if self.optimizer is not None:
            for i, group in enumerate(self.optimizer.param_groups):
                lr = group.get("lr")
                if lr is not None:
                    scalars["lr" if i == 0 else f"lr/{i}"] = float(lr)
        if self.grad_scaler is not None:
            scalars["loss_scale"] = float(host[scale_at][0]) if scale_at is not None else float(
                self.grad_scaler.get_scale())
        scalars["micro_batches"] = float(self._micro)
        signs = (sign_pos, sign_numel, np.concatenate(sign_bytes)) if sign_bytes else None
        step = self.step_index
        if self._live is not None:
            self._live.observe(step, names_all, kinds_all, values, scalars)
        self._writer.write_step(step, names_all, kinds_all, values, scalars, signs)
        self.step_index += 1
        self._reset()


    @property
    def alerts(self) -> list[str]:
        """Every alert the run raised so far, as the console would word it (the console gets a summary)."""
        return self._live.alerts if self._live is not None else []

    # -- lifecycle -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Remove every hook and close the file (the steps are committed already); safe to call twice."""
        for h in self._handles:
            h.remove()
        self._handles = []
        w, self._writer = getattr(self, "_writer", None), None
        if w is not None:
            w.close()

    def __enter__(self) -> MonitorHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self._params)} parameter(s), {self.step_index} step(s), "
                f"{str(self.dump_path)!r})")
