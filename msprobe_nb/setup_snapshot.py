"""``snapshot_setup(model=..., optimizer=..., data=..., path=...)``, and the set-up record the Debugger and the
Monitor write at start (docs/setup_check.md). Thin: the capture layer collects, the store writes."""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from msprobe_nb.capture.setup_record import SetupWatch, collect_setup
from msprobe_nb.store.setup_store import write_setup

__all__ = ["snapshot_setup", "start_setup"]


def _rank_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def _seed_report() -> Any:
    seeding = sys.modules.get("msprobe_nb.seeding")
    return getattr(seeding, "last_report", None)


def snapshot_setup(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                   data: Any = None, path: str | os.PathLike = ".", *,
                   scheduler: Any = None, grad_scaler: Any = None, rank: int | None = None) -> dict[str, Any]:
    """Record the run's set-up now and write it as ``<path>/setup_rank<N>.json`` (for runs not recorded by the
    Debugger or the Monitor); returns the record. ``data``: the first batches (a list, or an iterable of which
    the first two are taken). Compare two with ``compare_setups``."""
    r, world = _rank_world()
    record = collect_setup(model=model, optimizer=optimizer, scheduler=scheduler, grad_scaler=grad_scaler, data=data,
                           seed_report=_seed_report(), rank=r if rank is None else rank, world_size=world)
    Path(path).mkdir(parents=True, exist_ok=True)
    record["path"] = str(write_setup(path, record))
    return record


def start_setup(folder: Any, rank: int, model: Any, *, source: str, optimizer: Any = None, grad_scaler: Any = None,
                seed_report: Any = None, quiet: Any = None) -> SetupWatch | None:
    """The record of a run starting: written now into ``folder``, completed by a :class:`SetupWatch` (first
    batches, the optimizer at its first step). A failure is a warning: recording goes on without it."""
    if folder is None:
        return None
    try:
        _, world = _rank_world()
        record = collect_setup(model=model, optimizer=optimizer, grad_scaler=grad_scaler,
                               seed_report=seed_report if seed_report is not None else _seed_report(),
                               rank=rank, world_size=world, source=source)

        def write(rec: dict) -> None:
            write_setup(folder, rec)

        write(record)
        return SetupWatch(record, model, write, optimizer=optimizer, quiet=quiet)
    except Exception as exc:  # noqa: BLE001 - the set-up record never stops a recording
        warnings.warn(f"msprobe_nb: no set-up record written to {str(folder)!r}: {type(exc).__name__}: {exc}",
                      RuntimeWarning, stacklevel=3)
        return None
