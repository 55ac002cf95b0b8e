"""The monitoring API: ``Monitor(model, optimizer, dump_path=...)``, a training monitor that writes its record.

Thin over the layers: :class:`~msprobe_nb.capture.monitor.MonitorHooks` installs the hooks and gathers each
step; the store's :class:`~msprobe_nb.store.monitor_store.MonitorWriter` commits it to
``<dump_path>/monitor_rank<N>.h5``. ``load_monitor`` and ``compare_monitors`` read it back (docs/monitor.md).
"""
from __future__ import annotations

from typing import Any

import torch

from msprobe_nb.capture.monitor import MonitorHooks
from msprobe_nb.store.monitor_store import MonitorWriter

__all__ = ["Monitor"]


class Monitor(MonitorHooks):
    """Watch ``model`` and ``optimizer`` every step and write the record to ``dump_path`` (one file per rank).

    Call ``mon.step(loss=...)`` once per optimizer step and ``mon.close()`` at the end (or use ``with``);
    every finished step is on disk already, so a run that dies keeps them. ``on_exists`` says what happens
    when the folder already holds this rank's record: ``"new"`` writes to ``<dump_path>_1`` (with a warning),
    ``"error"`` raises, ``"overwrite"`` replaces it. Every other option is
    :class:`~msprobe_nb.capture.monitor.MonitorHooks`'s: ``params``, ``stats``, ``weights``, ``grads``,
    ``optimizer_state``, ``activations``, ``activation_grads``, ``histogram``, ``signs``, ``grad_scaler``,
    ``rank``, ``warmup``, ``window``, ``spike_z``, ``spike_ratio``, ``spike_floor``, ``direction_drop``, ``alerts``,
    ``start_step``, ``local_grads``.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 dump_path: str = "monitor", *, on_exists: str = "new", **options: Any) -> None:
        def sink(columns: list[str], meta: dict, rank: int) -> MonitorWriter:
            return MonitorWriter(dump_path, rank, columns, meta, on_exists=on_exists)

        super().__init__(model, optimizer, sink=sink, **options)
        from msprobe_nb.setup_snapshot import start_setup  # the set-up record (docs/setup_check.md)
        self._setup = start_setup(self.dump_path, self.rank, self.model, source="Monitor", optimizer=optimizer,
                                  grad_scaler=self.grad_scaler)

    def close(self) -> None:
        setup = getattr(self, "_setup", None)
        if setup is not None:
            setup.remove()
        super().close()
