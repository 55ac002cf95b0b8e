"""The precision model's figures along execution order: own and inherited error per call, the bound, the anomaly.

:func:`precision_series` takes, per call of one (step, rank), the judged output row with the largest
``bound_ratio`` (the precision model's columns, docs/compare.md "Precision model"); :func:`precision_along_order`
draws it on one log-scale plot: the error each call inherited from its inputs, its own error beyond that, the
bound its class and dtype allow, the anomalous calls ringed in red and the first of them marked by a line.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .plots import _text_figure

__all__ = ["ANOMALY_GID", "anomaly_x", "has_verdicts", "precision_along_order", "precision_series"]

#: ``gid`` of the vertical line marking the first anomalous call (tests and callers can find it)
ANOMALY_GID = "first-anomalous"
_ANOMALOUS = "anomalous"
_NEED = ("verdict", "own_err", "inherited_err", "bound", "bound_ratio")


def precision_series(table: pd.DataFrame, step: int | None = None, rank: int | None = None) -> pd.DataFrame:
    """Per judged call of one (step, rank), in execution order: ``call_index``, ``call``, ``own_err``,
    ``inherited_err``, ``bound``, ``bound_ratio``, ``verdict`` of its worst output row (largest ratio).

    By default the (step, rank) of the first anomalous row, else the first judged one; empty when the table
    has no verdict columns or no judged row."""
    missing = [c for c in _NEED if c not in table.columns]
    cols = ["call_index", "call", *_NEED]
    if missing:
        return pd.DataFrame(columns=cols)
    t = table[(table["verdict"].astype(object).fillna("") != "") & (table["call_index"] >= 0)]
    if step is None or rank is None:
        anom = t[t["verdict"] == _ANOMALOUS]
        pick = anom if len(anom) else t
        if len(pick):
            first = pick.sort_values(["step", "rank", "call_index"], kind="stable").iloc[0]
            step = int(first["step"]) if step is None else step
            rank = int(first["rank"]) if rank is None else rank
    if step is not None:
        t = t[t["step"] == step]
    if rank is not None:
        t = t[t["rank"] == rank]
    t = t.assign(_r=pd.to_numeric(t["bound_ratio"], errors="coerce").fillna(-1.0))
    worst = t.sort_values(["call_index", "_r"], ascending=[True, False], kind="stable") \
        .drop_duplicates("call_index", keep="first")
    out = pd.DataFrame({"call_index": worst["call_index"].to_numpy(dtype=np.int64),
                        "call": worst["call"].astype(object).to_numpy()})
    for c in ("own_err", "inherited_err", "bound", "bound_ratio"):
        out[c] = pd.to_numeric(worst[c], errors="coerce").to_numpy(dtype=float)
    out["verdict"] = worst["verdict"].astype(object).to_numpy()
    out.attrs.update(step=step, rank=rank)
    return out


def precision_along_order(table: pd.DataFrame, step: int | None = None, rank: int | None = None,
                          summary: str = "") -> Figure:
    """One plot along execution order (x: ``call_index``, y: log scale): each judged call's inherited error,
    its own error and the bound; anomalous calls ringed in red, the first one marked (``gid`` ANOMALY_GID).
    A zero error is drawn on the floor of the axis. ``summary``: a line for the title (the precision summary)."""
    s = precision_series(table, step, rank)
    if s.empty:
        return _text_figure("no call judged by the precision model (no verdict columns, or nothing compared)")
    x = s["call_index"].to_numpy(dtype=float)
    own, inh, bound = (s[c].to_numpy(dtype=float) for c in ("own_err", "inherited_err", "bound"))
    vals = np.concatenate([own, inh, bound])
    pos = vals[np.isfinite(vals) & (vals > 0)]
    floor = float(pos.min()) / 10 if len(pos) else 1e-6
    top = float(pos.max()) * 10 if len(pos) else 1.0

    def clip(v: np.ndarray) -> np.ndarray:
        return np.clip(np.where(np.isnan(v), floor, v), floor, top)

    fig = Figure(figsize=(9, 3.4))
    ax = fig.add_subplot()
    ax.step(x, clip(bound), where="mid", color="grey", lw=1.0, label="bound (inherited + own allowance)")
    ax.plot(x, clip(inh), ".-", lw=0.8, ms=3, color="#e67e22", label="inherited error")
    ax.plot(x, clip(own), "o", ms=3.5, color="#1f77b4", label="own error")
    anom = (s["verdict"] == _ANOMALOUS).to_numpy(dtype=bool)
    if anom.any():
        ax.plot(x[anom], clip(np.fmax(own[anom], inh[anom])), "o", ms=10, mfc="none", mec="#c0392b", mew=1.5,
                label=f"anomalous ({int(anom.sum())} call(s))")
        i = int(np.flatnonzero(anom)[0])
        ax.axvline(x[i], color="#c0392b", ls="--", lw=1.2, gid=ANOMALY_GID,
                   label=f"first anomalous: {s['call'].iloc[i]}")
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top)
    ax.set_xlabel("call index (execution order)")
    ax.set_ylabel("scale-relative error (0 on the floor)")
    where = f"step {s.attrs['step']}, rank {s.attrs['rank']}"
    ax.set_title(f"own vs inherited error along execution order ({where})" + (f"\n{summary}" if summary else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def anomaly_x(fig: Figure) -> float | None:
    """x of the first-anomalous marker of a :func:`precision_along_order` figure (None when absent)."""
    for ax in fig.axes:
        for line in ax.lines:
            if line.get_gid() == ANOMALY_GID:
                return float(np.asarray(line.get_xdata())[0])
    return None


def has_verdicts(table: Any) -> bool:
    """Whether a compare table carries judged precision verdicts."""
    return all(c in table.columns for c in _NEED) and bool((table["verdict"].astype(object).fillna("") != "").any())
