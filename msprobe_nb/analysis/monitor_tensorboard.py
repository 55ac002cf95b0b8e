"""``export_tensorboard(record, logdir)``: a monitor record as TensorBoard scalars, for users who live there.

Written with the ``tensorboard`` package's own event writer (``tensorboard.summary.Writer``: no TensorFlow, no
torch), an optional extra (``pip install msprobe_nb[tensorboard]``). One run folder per rank under ``logdir``;
tags ``scalars/<name>`` (loss, grad_norm, lr, ...) and ``<kind>/<name>/<stat>`` for the rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .monitor_frame import MonitorFrame, load_monitor

__all__ = ["export_tensorboard"]


def export_tensorboard(record: MonitorFrame | str | Path, logdir: str | Path, stats: Sequence[str] = ("norm",),
                       kinds: Sequence[str] | None = None) -> list[Path]:
    """Write ``record`` (a ``MonitorFrame`` or a monitor folder) under ``logdir/rank<N>``; returns the folders.

    ``stats``: which aggregates of each row become scalars (``norm`` by default); ``kinds``: which kinds of rows
    (all by default). ImportError, saying what to install, without the ``tensorboard`` package.
    """
    try:
        from tensorboard.summary import Writer
    except ImportError as e:
        raise ImportError("export_tensorboard needs the tensorboard package: pip install 'msprobe_nb[tensorboard]'"
                          f" ({e})") from None
    m = load_monitor(record)
    missing = [s for s in stats if s not in m.stats.columns]
    if missing:
        raise ValueError(f"the record has no {missing}; it recorded {m.columns}")
    out = []
    for rank in sorted(m.meta):
        folder = Path(logdir) / f"rank{rank}"
        folder.mkdir(parents=True, exist_ok=True)
        w = Writer(str(folder))
        try:
            sc = m.scalars.loc[m.scalars["rank"] == rank]
            for col in [c for c in sc.columns if c not in ("step", "rank")]:
                for step, v in zip(sc["step"].to_numpy(), sc[col].to_numpy(np.float64), strict=True):
                    if not np.isnan(v):
                        w.add_scalar(f"scalars/{col}", float(v), step=int(step))
            s = m.stats.loc[m.stats["rank"] == rank]
            if kinds is not None:
                s = s.loc[s["kind"].isin(list(kinds))]
            for stat in stats:
                for step, kind, name, v in zip(s["step"].to_numpy(), s["kind"].to_numpy(), s["name"].to_numpy(),
                                               s[stat].to_numpy(np.float64), strict=True):
                    w.add_scalar(f"{kind}/{name}/{stat}", float(v), step=int(step))
            w.flush()
        finally:
            w.close()
        out.append(folder)
    return out
