"""Models made by ``torch.compile`` under recording: what the kit sees of them, and ``compile="eager"``.

Inside a compiled graph no function mode and no module hook runs: dynamo traces the kit's mode and hooks
while it compiles (they do nothing then, so the graph is the one the model has without the kit) and the
graph's kernels run without them. What stays visible, with ``compile="compiled"`` (the default):

* each compiled graph's call as one call, ``Function.CompiledFunction.<n>`` (AOT autograd's function), with
  its inputs, outputs and backward; at L0 the compiled module's call itself (:func:`compiled_name`);
* the eager code between graph breaks, and the kernels inductor's wrapper calls through torch
  (``Torch.addmm``...), recorded as usual.

``compile="eager"`` runs every compiled function eagerly while recording (``torch.compiler.set_stance
("force_eager")``), for per-call rows; the dump says its numerics are eager's, not the compiled model's.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, cast

import torch

#: torch's warning that global module hooks also fire for the OptimizedModule: the kit relies on it
_TORCH_HOOK_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"

#: what the dump and the warning say, by ``compile`` option
NOTES = {
    "compiled": "a torch.compile'd model was recorded with its compiled numerics: each compiled graph is one call "
                "(Function.CompiledFunction.N, and at L0 the compiled module), the eager code between graph "
                "breaks and the kernels inductor calls through torch are recorded; the APIs and submodules inside "
                "a graph are not. Record with compile='eager' for their rows (with eager numerics), or use "
                "msprobe_nb.compile_check() to find the module whose compiled result departs from eager.",
    "L2": "a torch.compile'd model was recorded at L2: torch runs compiled code eagerly while a dispatch mode "
          "is active, so these rows (and the run's numerics while recording) are eager's, not the compiled model's.",
    "eager": "compile='eager': torch.compile'd code ran eagerly while recording (torch.compiler.set_stance"
             "('force_eager')), so every call has its rows; these are eager numerics, not the compiled model's.",
}


#: torch._dynamo's ``OptimizedModule`` once dynamo is loaded (None until then)
_OPTIMIZED: Any = None


def _optimized_module() -> Any:
    """``OptimizedModule``, or ``()`` while torch._dynamo is not loaded: no module can be one before
    ``torch.compile`` loads it, so the module hooks neither import dynamo (a heavy import) nor run an import
    statement at every module call."""
    global _OPTIMIZED
    if _OPTIMIZED is None:
        found = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
        if found is None:  # not loaded (or still loading): nothing is compiled yet
            return ()
        _OPTIMIZED = found
    return _OPTIMIZED


def is_compiled(module: Any) -> bool:
    """``module`` is what ``torch.compile(module)`` returned (an ``OptimizedModule``)."""
    cls = _optimized_module()
    return bool(cls) and isinstance(module, cls)


def uncompiled(module: Any) -> Any:
    """The module a ``torch.compile`` wrapper holds (the module itself otherwise): names come from it, so that a
    compiled run's calls are named as the eager run's are (no ``_orig_mod`` in the paths)."""
    while is_compiled(module):
        module = module._orig_mod
    return module


def compiled_name(path: str | None) -> str:
    """The module path under which a compiled model's call is recorded: its own path, or ``compiled`` for a
    compiled root (msprobe records no root module, but at L0 it is all there is to see)."""
    return path or "compiled"


class CompileWatch:
    """One recording's dealings with torch.compile: the ``compile`` option's stance, torch's hook warning
    silenced while recording, and the one warning (and dump note) that a compiled model was seen."""

    def __init__(self, mode: str, level: str = "L1"):
        self.mode = mode
        self.level = level
        self.seen = False  # a compiled model ran while recording (compiled mode) / eager stance was applied
        self._stance: Any = None
        self._filter: Any = None

    def enter(self) -> None:
        if self._filter is None:
            warnings.filterwarnings("ignore", message=_TORCH_HOOK_WARNING, category=UserWarning)
            self._filter = warnings.filters[0]
        if self.mode == "eager" and self._stance is None:
            self._stance = torch.compiler.set_stance("force_eager")
            self.seen = True

    def exit(self) -> None:
        if self._stance is not None:
            self._stance.__exit__(None, None, None)
            self._stance = None
        if self._filter is not None:
            try:
                # only the kit's own entry: the user's stay as they are (a list; typeshed says Sequence)
                cast("list[Any]", warnings.filters).remove(self._filter)
            except ValueError:
                pass
            warnings._filters_mutated()  # type: ignore[attr-defined]
            self._filter = None

    def saw_compiled(self) -> None:
        """A compiled model's call was recorded: warn once, and let the dump say so."""
        if self.seen or self.mode != "compiled":
            return
        self.seen = True
        warnings.warn(f"msprobe_nb: {self.note()}", UserWarning, stacklevel=3)

    def note(self) -> str | None:
        """The dump's note on compiled code, where there is one."""
        if not self.seen:
            return None
        return NOTES["L2" if self.level == "L2" and self.mode == "compiled" else self.mode]
