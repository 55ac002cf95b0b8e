"""``compile_check``: the same forward and backward run eagerly and compiled, compared module by module.

Inside one compiled graph nothing can be seen call by call, so the check compiles the modules one at a time:
a copy of the model has each chosen module (by default every leaf module) replaced by ``torch.compile`` of
it, and both the model and the copy run the same inputs forward and backward under the kit's L0 recording.
Each compiled module's call is recorded under the eager module's name (docs/stacks.md), so the two dumps
line up, and :func:`msprobe_nb.compare` with its precision model names the first module whose compiled result
departs from eager beyond what its precision allows; rounding differences of inductor's fused kernels stay
"within precision". The user's model is only read: the copy is trained, its gradients are not kept.
"""
from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from msprobe_nb.debugger import Debugger


@dataclass
class CompileCheckResult:
    """What :func:`compile_check` found: the first module whose compiled result departs from eager (None:
    every compiled module agrees with eager within precision), the compare table and the modules compiled."""

    first: Any  # the compare's Divergence, or None
    compare: Any  # the CompareResult of the compiled run (npu side) against the eager one (bench side)
    compiled: list[str] = field(default_factory=list)
    dump_path: Path | None = None
    _tmp: Any = field(default=None, repr=False)

    @property
    def module(self) -> str | None:
        """The module path of the first departing module's call (``Module.<path>.<Class>...``), or None."""
        if self.first is None:
            return None
        call = str(self.first.call)
        return call.split(".")[1] if call.startswith("Module.") else call

    def summary(self) -> str:
        if self.first is None:
            return (f"compile_check: {len(self.compiled)} compiled modules agree with eager "
                    f"({self.compare.precision_summary() if hasattr(self.compare, 'precision_summary') else ''})")
        return f"compile_check: the first module whose compiled result departs from eager:\n{self.first}"

    def __repr__(self) -> str:
        return self.summary()


def _leaf_paths(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if name and not m._modules]


def _set_submodule(root: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def _run(model: torch.nn.Module, inputs: Sequence[Any], loss_fn: Callable[[Any], torch.Tensor] | None,
         dump: Path) -> None:
    with Debugger(dump_path=str(dump), level="L0", on_exists="overwrite", model=model):
        out = model(*inputs)
        loss = loss_fn(out) if loss_fn is not None else _default_loss(out)
        params = [p for p in model.parameters() if p.requires_grad]
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        torch.autograd.grad(loss, params + leaves, allow_unused=True)  # gradients made, none kept in .grad


def _default_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.float().pow(2).mean()
    if isinstance(out, dict):
        out = list(out.values())
    parts = [o.float().pow(2).mean() for o in (out if isinstance(out, (list, tuple)) else [out])
             if isinstance(o, torch.Tensor) and o.is_floating_point()]
    return torch.stack(parts).sum()


def compile_check(model: torch.nn.Module, inputs: Any, *, modules: Sequence[str] | None = None,
                  loss_fn: Callable[[Any], torch.Tensor] | None = None, backend: str = "inductor",
                  dump_path: str | Path | None = None, **compile_kwargs: Any) -> CompileCheckResult:
    """Run ``model(*inputs)`` forward and backward eagerly and with ``modules`` (paths in the model; default:
    every leaf module) each compiled by ``torch.compile(backend=backend, **compile_kwargs)``, and name the
    first module whose compiled output or gradients depart from eager beyond precision.

    ``loss_fn(output)`` makes the scalar to differentiate (default: the mean square of every floating output).
    The two L0 dumps go to ``dump_path`` (``eager/`` and ``compiled/``), or to a temporary folder that lives as
    long as the result. A model made by ``torch.compile`` is checked through the module it wraps."""
    from msprobe_nb.analysis.compare import compare
    from msprobe_nb.capture.compiled import uncompiled

    model = uncompiled(model)
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    chosen = list(modules) if modules is not None else _leaf_paths(model)
    tmp = None
    if dump_path is None:
        tmp = tempfile.TemporaryDirectory(prefix="msprobe_nb_compile_check_")
        dump_path = tmp.name
    root = Path(dump_path)
    twin = copy.deepcopy(model)
    for path in chosen:
        # torch.compile of a Module gives an OptimizedModule (a Module); its stubs say a Callable
        compiled = cast(torch.nn.Module, torch.compile(twin.get_submodule(path), backend=backend, **compile_kwargs))
        _set_submodule(twin, path, compiled)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="msprobe_nb: a torch.compile'd model")
        _run(model, inputs, loss_fn, root / "eager")
        _run(twin, inputs, loss_fn, root / "compiled")
    result = compare(root / "compiled", root / "eager")
    return CompileCheckResult(result.first_divergence(), result, chosen, root, tmp)
