"""``MsprobeCallback``: record or monitor a Hugging Face ``Trainer`` run without rewriting its loop.

A shell over the public API (:class:`~msprobe_nb.debugger.Debugger`, :class:`~msprobe_nb.monitor.Monitor`);
transformers is an optional extra, imported when this module is. Step numbers are ``Trainer``'s
``state.global_step`` (optimizer steps, from 0): step ``n`` spans ``on_step_begin`` (before its first
micro-batch's forward) to ``on_step_end`` (after ``optimizer.step()`` and ``zero_grad``), so every
micro-batch of a gradient-accumulation step lands in the one dump step. Data loading, logging, evaluation and
saving run outside it and are not recorded. See docs/integrations.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a checker sees the real base class (object stands in for it at run time without transformers)
    from transformers import TrainerCallback as _Base

    from msprobe_nb.debugger import Debugger
    from msprobe_nb.monitor import Monitor

    _MISSING = False
else:
    try:
        from transformers import TrainerCallback as _Base
    except ImportError:  # transformers is optional: the class still imports, and says what is missing when used
        _Base = object
        _MISSING = True
    else:
        _MISSING = False

__all__ = ["MsprobeCallback"]


class MsprobeCallback(_Base):
    """A ``TrainerCallback`` that records the optimizer steps ``steps`` (all when empty) to ``dump_path`` at
    ``level`` / ``task``, and with ``monitor=True`` runs the training monitor (``mp.Monitor``) at every step
    instead, one file per rank under ``dump_path``. Further keyword arguments go to ``Debugger`` (or to
    ``Monitor`` with ``monitor=True``). The training computes bit for bit what it computes without it."""

    def __init__(self, dump_path: str = "./dump", level: str = "L1", task: str = "statistics",
                 steps: Any = None, monitor: bool = False, **options: Any) -> None:
        if _MISSING:
            raise ImportError("MsprobeCallback needs transformers: pip install transformers")
        self.dump_path, self.level, self.task, self.monitor = dump_path, level, task, monitor
        self.steps = sorted({int(s) for s in steps}) if steps else []
        self.options = options
        self.debugger: Debugger | None = None  # the Debugger, once training began (monitor=False)
        self.monitor_hooks: Monitor | None = None  # the Monitor, once training began (monitor=True)
        self._counted = 0  # optimizer steps the Debugger has been told of (its step counter)

    # ------------------------------------------------------------------ Trainer events
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        if self.monitor:
            from msprobe_nb.monitor import Monitor
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer; hook the real one
            self.monitor_hooks = Monitor(model, inner, dump_path=self.dump_path,
                                         start_step=int(state.global_step), **self.options)
            return
        from msprobe_nb.debugger import Debugger
        self.debugger = Debugger(dump_path=self.dump_path, level=self.level, task=self.task, step=self.steps,
                                 model=model, **self.options)
        self.debugger.start(model)  # claims the dump folder and builds the recorder; steps start it again
        self.debugger.stop()
        while self._counted < int(state.global_step):  # a resumed run: the dump counts as Trainer does
            self.debugger.step()
            self._counted += 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.debugger is not None and self._wanted(int(state.global_step)):
            self.debugger.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor_hooks is not None:
            self.monitor_hooks.step()
            return
        if self.debugger is None:
            return
        self.debugger.stop()  # before logging, evaluation and saving: they are not part of the step
        self.debugger.step()
        self._counted += 1

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers
    def _wanted(self, step: int) -> bool:
        return not self.steps or step in self.steps

    def close(self) -> None:
        """Write and close the dump or the monitor's record (``on_train_end`` does it). Idempotent."""
        if self.debugger is not None:
            self.debugger.close()
        if self.monitor_hooks is not None:
            self.monitor_hooks.close()
