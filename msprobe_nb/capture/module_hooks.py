"""L0 / mix capture: global module forward hooks, tensor gradient hooks and optimizer step hooks.

Global hooks (``register_module_forward_pre_hook``) see every module of every model without touching
the model's own hook dictionaries, and are removed as a whole at stop. Module backward is observed with
tensor hooks rather than ``register_full_backward_hook``: the latter inserts BackwardHook nodes that
change how gradients accumulate (seed FAQ), while tensor hooks only read them.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

import torch
import torch.optim.optimizer as _optimizer
from torch.nn.modules import module as _module

from msprobe_nb.capture import c_contract
from msprobe_nb.capture.compiled import CompileWatch, compiled_name, is_compiled, uncompiled
from msprobe_nb.capture.leaves import POSITIONS
from msprobe_nb.capture.recorder import Call, Recorder

_is_compiling = torch.compiler.is_compiling
_get_ident = threading.get_ident
_graph_task_id = torch._C._current_graph_task_id
# optional C hooks (setup.py); None where they are not built or were built for another layout
_module_hooks = c_contract.module_hooks()


class ModuleHooks:
    """Installs and removes the global hooks that feed a :class:`Recorder`."""

    def __init__(self, recorder: Recorder, compile_watch: CompileWatch | None = None):
        self.recorder = recorder
        self.compile_watch = compile_watch or CompileWatch(recorder.cfg.compile, recorder.cfg.level)
        self._handles: list = []
        self._c: Any = None  # the C hooks' Hooks, made at install where they are built

    def install(self) -> None:
        if self._handles:
            return
        self._c = self._c_hooks()
        self._handles = [
            _module.register_module_forward_pre_hook(self._pre),
            _module.register_module_forward_hook(self._post, with_kwargs=True, always_call=True),
            _optimizer.register_optimizer_step_pre_hook(self._optim_pre),
            _optimizer.register_optimizer_step_post_hook(self._optim_post),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._c = None

    def _c_hooks(self) -> Any:
        """The C hooks bound to this recorder (None: the Python bodies below)."""
        if _module_hooks is None:
            return None
        rec = self.recorder
        grads = rec.grads
        paths = rec.module_paths.data  # type: ignore[attr-defined]  # the WeakKeyDictionary's dict (weakref keys)
        parts = {**rec.c_parts(), "io_parameters": rec._ios.codes["parameters"],
                 "graph_task_id": _graph_task_id,
                 "walked_id": rec.stacks.walked_id, "selected": rec.selected, "module_paths": paths,
                 "watch_parameters": grads.watch_parameters, "python_pre": self._pre_py, "python_post": self._post_py,
                 "records_modules": rec.cfg.level in ("L0", "mix"), "grad_enabled": torch.is_grad_enabled,
                 "backward_names": grads._backward_names, "backward_of": grads.backward_of,
                 "grad_watch": grads._grad_watch, "hook_tensor": grads._hook_tensor, "param_hooks": grads._param_hooks,
                 "io_parameters_grad": rec._ios.codes["parameters_grad"], "positions": POSITIONS}
        return _module_hooks.Hooks(c_contract.context(_module_hooks, parts))

    # forward pre-hook: inputs before the module runs (in-place modules change them)
    def _pre(self, module, args):
        if _is_compiling():  # first: dynamo traces these hooks, and must see nothing of the recorder
            return None
        c = self._c
        if c is not None:
            return c.pre(module, args)
        return self._pre_py(module, args, sys._getframe(1))

    def _pre_py(self, module, args, frame):
        """The pre-hook's body in Python (``frame``: the frame that called the hook); the C hooks come here for
        a module met for the first time, a root model and a torch.compile wrapper."""
        rec = self.recorder
        if not rec.active or not _recorded_thread(rec):  # another thread's module: not recorded
            return None
        with rec.working():
            try:
                target = module
                if is_compiled(module):  # torch.compile's wrapper: its call is all L0 sees of a compiled model
                    target = uncompiled(module)
                    path = None if self.compile_watch.mode == "eager" else compiled_name(rec.module_path(target))
                    if path is not None:
                        self.compile_watch.saw_compiled()
                else:  # (with compile="eager" the wrapped module runs next, eagerly, and is recorded itself)
                    path = rec.module_path(module)
                if path is None:  # a root model: not recorded, like msprobe, but it parents nothing either
                    rec.module_stack.append((module, Call("", "Module", type(target).__name__, -1, "forward",
                                                          dump=False)))
                    return None
                c = rec.open_module(target, path, frame)
                rec.add_rows(c, "forward", "input", args)
                rec.module_stack.append((module, c))
            except Exception as exc:
                rec.note_error(f"pre-hook of {type(module).__name__}", exc)
        return None

    def _post(self, module, args, *rest):
        """Forward hook, called by torch as ``(module, args, kwargs, output)`` after a forward that returned,
        but as ``(module, args, result)``, without kwargs, when the forward raised (always-call hooks on the
        exception path, e.g. the early stop of non-reentrant checkpointing's recomputation): then the
        module's stack entry is only popped, and nothing is recorded as its output."""
        if _is_compiling():
            return None
        c = self._c
        if c is not None:
            return c.post(module, args, *rest)
        return self._post_py(module, args, *rest)

    def _post_py(self, module, args, *rest):
        """The forward hook's body in Python; the C hooks come here for a torch.compile wrapper."""
        rec = self.recorder
        if not rec.module_stack or not _recorded_thread(rec):  # another thread's: its pre-hook pushed nothing
            return None
        with rec.working():
            try:
                c = _pop_module(rec.module_stack, module)
                if len(rest) != 2 or c is None or not rec.active or not c.call:
                    return None
                kwargs, output = rest
                if kwargs:
                    rec.add_rows(c, "forward", "input", kwargs, is_kwarg=True)
                rec.add_rows(c, "forward", "output", output if isinstance(output, (tuple, list, dict)) else [output],
                             set_producer=True)
                module = uncompiled(module)
                if c.dump:
                    params = {k: v for k, v in module._parameters.items() if v is not None}
                    if params:
                        rec.add_rows(c, "forward", "parameters", params)
                    rec.grads.attach_module_backward(c, args, output)
                rec.grads.watch_parameters(module, c.module_path)
            except Exception as exc:
                rec.note_error(f"forward hook of {type(module).__name__}", exc)
        return None

    def _optim_pre(self, optimizer, args, kwargs):
        rec = self.recorder
        if rec.active and _recorded_thread(rec):
            rec.module_stack.append((optimizer, Call("optimizer", "Optimizer", type(optimizer).__name__, 0,
                                                     "forward", dump=False)))

    def _optim_post(self, optimizer, args, kwargs):
        rec = self.recorder
        if rec.module_stack and rec.module_stack[-1][0] is optimizer and _recorded_thread(rec):
            rec.module_stack.pop()


def _recorded_thread(rec: Recorder) -> bool:
    """Whether a module call is the recorded step's: on the thread that called start(), or inside an autograd
    graph task (autograd's own threads run the step's backward, and with it checkpointed modules' recomputation).
    The hooks are global, so other threads' modules reach them too; the L1 mode is per thread as well."""
    return rec.thread == _get_ident() or _graph_task_id() != -1


def _pop_module(stack: list, module) -> Call | None:
    """Pop ``module``'s entry off ``stack`` with the entries above it (left by submodules that raised and
    whose exception the module caught), and return its call; None, with the stack untouched, when the
    module has no entry (its pre-hook ran before recording started)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] is module:
            c = stack[i][1]
            del stack[i:]
            return c
    return None
