"""The autograd hooks of a recording: API and module backward, parameter gradients.

Everything is observed through hooks that only read: node post-hooks for an API's backward (see
:mod:`msprobe_nb.capture.api_backward`), tensor hooks for a module's backward (``register_full_backward_hook``
would insert BackwardHook nodes, which change how gradients accumulate: seed FAQ), and post-accumulate
hooks for parameter gradients. A step's hooks are removed at the step boundary, the parameters' when
recording stops; the API backward's node hooks are retired there instead (see :meth:`GradientHooks.remove_step`).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from msprobe_nb.capture import c_contract
from msprobe_nb.capture.api_backward import MAX_NODES, BackwardRows, CallGraph
from msprobe_nb.capture.calls import SAME_ELEMENTS, Call, _backward_name
from msprobe_nb.capture.leaves import leaves

# optional C API backward (setup.py); None where it is not built or was built for another layout
_api_backward = c_contract.api_backward()


class GradientHooks:
    """Installs the gradient hooks of one :class:`~msprobe_nb.capture.recorder.Recorder` and removes them."""

    def __init__(self, recorder: Any):
        self.recorder = recorder
        self._handles: list = []  # autograd hooks of this step, removed at the step boundary
        self._tensor_hooks: list[tuple[dict, int]] = []  # (a tensor's hook dict, our key in it), likewise
        self.replays: set[int] = set()  # ids of checkpoint nodes whose backward is recorded (api_mode)
        self._backward_names: dict[str, str] = {}  # forward call name -> its backward name
        self._grad_watch: dict[int, tuple] = {}  # id(tensor) -> (weakref, [(module backward, io, path)])
        self._param_hooks: dict[int, Any] = {}
        self._attach: Any = None  # the C API backward's attach, made on first use (the recorder is complete then)

    def _c_attach(self) -> Any:
        """The C API backward's ``attach`` bound to this recorder (None: api_backward's Python classes)."""
        if _api_backward is None:
            return None
        if self._attach is None:
            parts = {
                **self.recorder.c_parts(),
                "accumulate_grad": torch._C._functions.AccumulateGrad,  # type: ignore[attr-defined]
                "same_elements": SAME_ELEMENTS, "max_nodes": MAX_NODES, "backward_name": _backward_name,
                "backward_names": self._backward_names, "backward_of": self.backward_of}
            self._attach = _api_backward.Attacher(c_contract.context(_api_backward, parts)).attach
        return self._attach

    def attach_api_backward(self, c: Call, out: Any, inputs: list | None, seq0: int) -> None:
        """Record the API's backward when autograd runs the nodes the call made: the gradients of its outputs
        in, the gradient of each tensor input out (see :mod:`msprobe_nb.capture.api_backward`).

        ``inputs`` are the call's inputs that require grad, with their gradient edges from before the call;
        ``seq0`` the thread's autograd sequence number when the call began. An output that is an input passed
        through (``x.to(x.dtype)``, ``contiguous()``) is no node of the call's, and a call without one has no
        backward.
        """
        if not c.dump or not torch.is_grad_enabled():
            return
        call = c.call
        bname = call[:-7] + "backward" if call.endswith(".forward") else _backward_name(call)
        parent = self.backward_of(c.parent) if c.parent else ""
        attach = self._c_attach()
        if attach is not None:
            attach(c, out, inputs, seq0, bname, parent)
            return
        graph = CallGraph.of(out, inputs, seq0)
        if graph is None:
            return
        recorder = self.recorder

        def open_call() -> Call:
            b = Call(bname, c.family, c.op, c.counter, "backward", c.module_path, parent, c.stack_id,
                     recorder._take_index())
            if parent:
                recorder.construct[bname] = parent
            return b

        rows = BackwardRows(recorder, graph, [p for p, _ in inputs or ()], open_call, (c.family, c.op) in SAME_ELEMENTS)
        for node in graph.nodes():
            node.register_hook(rows.hook_for(node))  # retired at the step's end, not removed: remove_step

    def handler_attach(self) -> Any:
        """What the C handler calls for a recorded call's backward: the C API backward's ``attach`` itself where
        it is built (called without the names, which it finds as :meth:`attach_api_backward` does), else
        :meth:`attach_api_backward`. The handler checked the call dumps and gradients are on."""
        attach = self._c_attach()
        return attach if attach is not None else self.attach_api_backward

    def backward_of(self, call: str) -> str:
        """The backward call name of a forward call (cached: the same names come back every step)."""
        name = self._backward_names.get(call)
        if name is None:
            name = self._backward_names[call] = _backward_name(call)
        return name

    def attach_module_backward(self, c: Call, args: Any, out: Any) -> None:
        """Module backward through tensor hooks on its outputs and inputs (no BackwardHook node is inserted,
        so gradients are computed exactly as without the kit; the input side is the input tensor's full grad).

        One plain ``register_hook`` per tensor, shared by every module that sees it (one module's output is
        usually the next one's input): each gradient becomes its rows when autograd computes it.
        """
        if not c.dump or not torch.is_grad_enabled():
            return
        outs = [(p, t) for p, t in leaves(out if isinstance(out, (tuple, list, dict)) else [out])
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs:
            return
        ins = [(p, t) for p, t in leaves(args) if isinstance(t, torch.Tensor) and t.requires_grad]
        bname = self.backward_of(c.call)
        parent = self.backward_of(c.parent) if c.parent else ""
        b = Call(bname, "Module", c.op, c.counter, "backward", module_path=c.module_path, parent=parent,
                 stack_id=c.stack_id)
        watched = self._grad_watch
        for io, items in (("input", outs), ("output", ins)):
            for path, t in items:
                hit = watched.get(id(t))
                if hit is None or hit[0]() is not t:
                    consumers: list = []
                    self._hook_tensor(t, self._grad_hook(consumers))
                    watched[id(t)] = (weakref.ref(t), consumers)
                else:
                    consumers = hit[1]
                consumers.append((b, io, path))

    def _hook_tensor(self, t: torch.Tensor, hook) -> None:
        """``t.register_hook(hook)`` for the step, done as ``Tensor.register_hook`` does it (the tensor's hook
        dict, registered with its node once, keyed by the next ``RemovableHandle`` id, so no user hook's key is
        ever taken) without its handle object and per-call import: a module call hooks each new tensor it
        sees, and ``register_hook`` cost several times this. Tensor subclasses go through ``register_hook``
        itself (they may override it)."""
        if type(t) is not torch.Tensor:
            self._handles.append(t.register_hook(hook))
            return
        hooks = t._backward_hooks
        if hooks is None:
            t._backward_hooks = hooks = OrderedDict()
            fn = t.grad_fn
            if fn is not None:
                fn._register_hook_dict(t)
        key = RemovableHandle.next_id
        RemovableHandle.next_id = key + 1
        hooks[key] = hook
        self._tensor_hooks.append((hooks, key))

    def _grad_hook(self, consumers: list):
        """The hook of one tensor: its gradient is a row of each module backward in ``consumers``."""
        recorder = self.recorder

        def hook(grad):
            if recorder.active:
                with recorder.working():
                    try:
                        for b, io, path in consumers:
                            if io == "output" and b.index < 0:
                                # an input's gradient before any of the module's output gradients: this
                                # module call's outputs take no part in this backward (a forward recomputed
                                # by non-reentrant checkpointing shares its inputs with the original)
                                continue
                            if b.index < 0:
                                b.index = recorder._take_index()
                                recorder.construct[b.call] = b.parent or None
                            recorder.add_rows(b, "backward", io, grad, prefix=path)
                    except Exception as exc:  # never break the user's backward
                        recorder.note_error("a module backward", exc)
        return hook

    def watch_parameters(self, module: torch.nn.Module, path: str) -> None:
        """Parameter gradients: a post-accumulate hook per parameter, removed when recording stops."""
        if self.recorder.cfg.level not in ("L0", "mix"):
            return
        cls = type(module).__name__
        for pname, p in module._parameters.items():
            if p is None:
                continue
            if id(p) in self._param_hooks or not p.requires_grad:
                continue
            self._param_hooks[id(p)] = p.register_post_accumulate_grad_hook(
                self._param_grad_hook(path, cls, pname))

    def _param_grad_hook(self, path: str, cls: str, pname: str):
        recorder = self.recorder

        def hook(p):
            if not recorder.active or p.grad is None:
                return
            with recorder.working():
                try:
                    record_grad(p)
                except Exception as exc:  # never break the user's backward
                    recorder.note_error(f"the gradient of {path}.{pname}", exc)

        def record_grad(p):
            key = f"{path}.{cls}.{pname}"
            k = recorder.grad_counters.get(key, 0)
            recorder.grad_counters[key] = k + 1
            name = f"Module.{path}.{cls}.parameters_grad.{k}"
            index = recorder.grad_counters.get(name)  # one call per module and firing: params share it
            if index is None:
                index = recorder.grad_counters[name] = recorder._take_index()
            c = Call(name, "Module", cls, k, "parameters_grad", module_path=path, index=index)
            c.dump = recorder.selected(name, "Module", cls)
            recorder.add_rows(c, "parameters_grad", "parameters_grad", {pname: p.grad})

        return hook

    def keep(self, *handles) -> None:
        """Hooks a mode or hook installed for this step: removed at the step boundary with the others."""
        self._handles.extend(handles)

    def remove_step(self) -> None:
        """The step is over: its hooks go, and its API backward node hooks retire.

        A node hook is not removed: it stays on its node and does nothing once the recorder's ``backward_epoch``
        is not the one it was made in. Removing each through its handle was a Python call per hook at every
        step's end, while the graph that holds them is almost always freed with the step; a graph kept longer
        (``retain_graph``, a tensor held on to) runs them as no-ops, where it ran nothing before."""
        self.recorder.backward_epoch = object()
        self.replays.clear()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for hooks, key in self._tensor_hooks:
            hooks.pop(key, None)
        self._tensor_hooks.clear()
        self._grad_watch.clear()

    def remove_parameters(self) -> None:
        for h in self._param_hooks.values():
            h.remove()
        self._param_hooks.clear()
