"""The floor of recording by a torch function mode: what torch's mode dispatch costs with a handler that does
nothing, in Python and in C, against the kit's recorder (issue 37, "measure first").

Handlers, each a ``TorchFunctionMode`` (torch requires ``__torch_function__`` bound to the mode):

* ``none``: no mode;
* ``python``: ``def __torch_function__(self, func, types, args=(), kwargs=None): return func(*args, **kwargs)``;
* ``C function``: ``capture/_mode_floor.c``'s ``passthrough`` bound to the mode with ``types.MethodType``;
* ``C type``: an instance of its ``Passthrough`` type as the class attribute (a descriptor that binds itself;
  its ``tp_call`` calls the function);
* ``kit L1`` / ``kit mix``: the Debugger, statistics task, at L1 / mix, its step written (``dbg.step()``) in
  the timed span, so the figure is a recorded call's whole cost (the second step of a Debugger: the first
  opens its file and records the set-up); with the C handler and API backward (``capture/_api_handler.c``,
  ``_api_backward.c``) where they are built, and ``kit L1 py``: the same with their Python counterparts.

Two measures, one torch thread, CPU time of this process, medians of ``--repeats``:

* **per call**: a loop of ``--calls`` ``torch.add(a, b)`` on 16-element tensors; the µs a call adds over
  ``none`` (for the kit: over the loop without it, divided by the calls it recorded);
* **GPT-2**: the training step of the tiny GPT-2 of ``recording/real_models.py`` (AdamW, dropout), its ratio
  to the plain step, plain and handled steps alternating.

Run::

    python benchmarks/bench_mode_floor.py [--calls 20000] [--repeats 7] [--steps 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402


class PythonMode(TorchFunctionMode):
    """The empty Python handler."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _c_modes() -> dict[str, Callable[[], AbstractContextManager]]:
    try:
        from msprobe_nb.capture import _mode_floor as floor
    except ImportError:
        print("capture/_mode_floor is not built (no C compiler at install): the C rows are left out")
        return {}

    class CFunctionMode(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.__torch_function__ = types.MethodType(floor.passthrough, self)  # type: ignore[method-assign]

    class CTypeMode(TorchFunctionMode):
        __torch_function__ = floor.Passthrough()  # type: ignore[assignment]

    return {"C function": CFunctionMode, "C type": CTypeMode}


def _cpu(fn: Callable[[], object]) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def per_call(calls: int, repeats: int) -> dict[str, float]:
    """µs a call adds over no mode, per handler."""
    a, b = torch.randn(16), torch.randn(16)

    def loop() -> None:
        for _ in range(calls):
            torch.add(a, b)

    def under(make: Callable[[], AbstractContextManager]) -> float:
        with make():
            return _cpu(loop)

    def kit(level: str, c_handler: bool = True) -> float:
        import msprobe_nb as mp
        from msprobe_nb.capture import api_mode, grad_hooks
        saved = api_mode._api_handler, grad_hooks._api_backward
        if not c_handler:  # both C halves off: the Python handler and API backward
            api_mode._api_handler = grad_hooks._api_backward = None
        with tempfile.TemporaryDirectory() as tmp:
            dbg = mp.Debugger(dump_path=tmp, level=level, task="statistics")
            for _ in range(2):  # the second step is timed: the first opens the file and records the set-up
                t = time.process_time()
                dbg.start()
                loop()
                dbg.stop()
                dbg.step()
                took = time.process_time() - t
            dbg.close()
        api_mode._api_handler, grad_hooks._api_backward = saved
        return took

    modes: dict[str, Callable[[], float]] = {"python": lambda: under(PythonMode)}
    modes.update({name: (lambda m=m: under(m)) for name, m in _c_modes().items()})
    modes.update({"kit L1": lambda: kit("L1"), "kit L1 py": lambda: kit("L1", False), "kit mix": lambda: kit("mix")})
    base: list[float] = []
    got: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(repeats):  # interleaved, so the machine's drift falls on every handler alike
        base.append(under(nullcontext))
        for name, fn in modes.items():
            got[name].append(fn())
    b0 = statistics.median(base)
    out = {"none": b0 / calls * 1e6}
    out.update({name: (statistics.median(ts) - b0) / calls * 1e6 for name, ts in got.items()})
    return out


def gpt2(steps: int) -> dict[str, float]:
    """Ratio of a GPT-2 training step under each handler to the plain step (medians of alternating steps)."""
    import transformers
    from recording.real_models import MODELS
    transformers.logging.set_verbosity_error()
    build, batch, step = MODELS["gpt2"]
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, labels = batch(torch.Generator().manual_seed(1))
    modes: dict[str, Callable[[], AbstractContextManager]] = {"python": PythonMode, **_c_modes()}
    out: dict[str, float] = {}
    for _ in range(3):
        step(model, opt, ids, labels)
    for name, make in modes.items():
        ratios = []
        for _ in range(steps):
            plain = _cpu(lambda: step(model, opt, ids, labels))
            with make():
                handled = _cpu(lambda: step(model, opt, ids, labels))
            ratios.append(handled / plain)
        out[name] = statistics.median(ratios)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=15)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, 1 thread, CPU time; medians of {a.repeats} loops of {a.calls} torch.add calls")
    calls = per_call(a.calls, a.repeats)
    print(f"{'handler':12} {'µs per call':>12}")
    print(f"{'none':12} {calls.pop('none'):>10.2f}   (the call itself)")
    for name, us in calls.items():
        print(f"{name:12} {us:>+10.2f}   (added)")
    print(f"\nGPT-2 (tiny, AdamW) training step under each empty handler, medians of {a.steps} alternating pairs")
    for name, r in gpt2(a.steps).items():
        print(f"{name:12} {r:>8.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
