"""What ``MonitorViewer`` shows, as plain DataFrames and matplotlib figures (no widgets).

The source is a loaded record (``load_monitor``) or a comparison of two (``compare_monitors``):

* :func:`heatmap_frame`: one value per layer row (model order) and step column, for one kind of row;
* :func:`heat_scale`: that frame as shades 0..1 (NaN: no value), the scale the heat map draws;
* :func:`curves_frame`: loss and gradient norm per step (both runs' for a comparison);
* :func:`anomaly_frame`: the anomalies (of both runs, with a ``run`` column, for a comparison);
* :func:`cell_numbers`: every recorded number of one step and name (a clicked cell);
* :func:`heatmap_figure`, :func:`curves_figure`: the same as figures.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from msprobe_nb.store.monitor_schema import RULES

__all__ = ["anomaly_frame", "cell_numbers", "curves_figure", "curves_frame", "fmt_number", "format_numbers",
           "heat_scale", "heatmap_figure", "heatmap_frame", "is_comparison", "run_names", "scale_label",
           "value_choices"]

#: columns that hold counts or indices: shown as integers
COUNT_COLUMNS = ("step", "rank", "nan", "inf", "micro_batches", "parts")


def fmt_number(x: Any) -> str:
    """A number as a person reads it: 4 significant digits, compact (``-0.03333``, ``1.235e+06``); integers as
    integers; NaN as ``nan``; anything else as ``str``."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        if np.isnan(x):
            return "nan"
        return f"{float(x):.4g}"
    return str(x)


def format_numbers(t: pd.DataFrame) -> pd.DataFrame:
    """``t`` with every cell a string: floats by :func:`fmt_number`, counts (``COUNT_COLUMNS``) as integers."""
    out = t.copy()
    for c in out.columns:
        col = out[c]
        if c in COUNT_COLUMNS and pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            out[c] = [("" if pd.isna(v) else str(int(v))) for v in col]
        elif pd.api.types.is_numeric_dtype(col):
            out[c] = [fmt_number(v) for v in col]
    return out


def run_names(source: Any, names: tuple[str, str] | None = None) -> tuple[str, str]:
    """The two runs' names for legends: ``names`` if given, else their folders' names (``a``/``b`` when the
    folders share a name)."""
    if names is not None:
        return str(names[0]), str(names[1])
    from pathlib import Path

    a, b = (Path(str(getattr(f, "path", "") or "")).name for f in (source.a, source.b))
    return (a, b) if a and b and a != b else ("a", "b")


def scale_label(value: str) -> str:
    """What the heat map's colour scale means for ``value`` (its 0 and 1 ends, in the value's units)."""
    if value in RATIO_VALUES:
        return f"{value}: |log2 ratio|, 0 = equal (ratio 1) .. 1 = a factor of 2 or more"
    if value in SIMILARITY_VALUES:
        return f"{value}: cosine, 0 = 1.0 (same direction) .. 1 = 0.5 or less"
    return f"{value}: log10 scale, light = smallest .. dark = largest in view"

#: comparison values whose distance from 1 is what matters (shaded by |log value|)
RATIO_VALUES = ("norm_ratio",)
#: comparison values where 1 is agreement (shaded by 1 - value)
SIMILARITY_VALUES = ("direction",)


def is_comparison(source: Any) -> bool:
    return hasattr(source, "table") and hasattr(source, "first_divergence")


def value_choices(source: Any) -> list[str]:
    """The values a heat map of ``source`` can show."""
    if is_comparison(source):
        return ["norm_ratio", "direction", "norm_a", "norm_b"]
    return [c for c in source.columns if not c.startswith("hist_")]


def _rows(source: Any) -> pd.DataFrame:
    return source.table if is_comparison(source) else source.stats


def _order(source: Any) -> list[str]:
    return list(source.order)


def heatmap_frame(source: Any, value: str | None = None, kind: str = "grad", rank: int | None = None,
                  max_steps: int | None = None) -> pd.DataFrame:
    """``value`` per name (rows, model order) and step (columns) for rows of ``kind`` (rank: the lowest unless
    given). ``max_steps`` bins the steps (the worst value of each bin: farthest from 1 for ratios, lowest for
    similarities, highest otherwise) so a long run fits the screen."""
    value = value or ("norm_ratio" if is_comparison(source) else "norm")
    t = _rows(source)
    if value not in t.columns:
        raise KeyError(f"no value {value!r} to show; choose one of {value_choices(source)}")
    t = t.loc[t["kind"] == kind]
    if t.empty:
        return pd.DataFrame()
    rank = int(t["rank"].min()) if rank is None else rank
    t = t.loc[t["rank"] == rank]
    h = t.pivot_table(index="name", columns="step", values=value, aggfunc="first", dropna=False)
    pos = {n: i for i, n in enumerate(_order(source))}
    h = h.loc[sorted(h.index, key=lambda n: (pos.get(n, len(pos)), n))]
    if max_steps and h.shape[1] > max_steps:
        width = -(-h.shape[1] // max_steps)
        arr, cols = h.to_numpy(np.float64), []
        for at in range(0, arr.shape[1], width):
            blk = arr[:, at:at + width]
            if value in RATIO_VALUES:
                with np.errstate(invalid="ignore", divide="ignore"):
                    dev = np.abs(np.log(np.abs(blk)))
                dev = np.where(np.isnan(dev), -1.0, dev)
                cols.append(blk[np.arange(len(blk)), dev.argmax(axis=1)])
            else:
                cols.append((np.fmin if value in SIMILARITY_VALUES else np.fmax).reduce(blk, axis=1))
        h = pd.DataFrame(np.column_stack(cols), index=h.index, columns=list(h.columns[::width]))
    h.columns.name = "step"
    return h


def heat_scale(h: pd.DataFrame, value: str) -> np.ndarray:
    """Shades 0..1 of a heat map frame (1: most anomalous); NaN stays NaN. Ratios by ``|log ratio|`` (1 at a
    factor of 2), similarities by ``1 - value`` (1 at 0.5), other values by log magnitude between the frame's
    smallest and largest."""
    a = h.to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if value in RATIO_VALUES:
            s = np.abs(np.log(np.abs(a))) / np.log(2.0)
        elif value in SIMILARITY_VALUES:
            s = (1.0 - a) * 2.0
        else:
            m = np.log10(np.abs(a))
            fin = m[np.isfinite(m)]
            lo, hi = (fin.min(), fin.max()) if fin.size else (0.0, 1.0)
            s = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
            s = np.where(np.isfinite(a), s, np.where(np.isnan(a), np.nan, 1.0))
    s = np.where(np.isinf(s), 1.0, s)
    return np.clip(s, 0.0, 1.0)


def curves_frame(source: Any, rank: int | None = None) -> pd.DataFrame:
    """Per step: ``loss`` and ``grad_norm`` (``loss_a``, ``loss_b``, ``grad_norm_a``, ``grad_norm_b`` for a
    comparison), of ``rank`` (the lowest unless given)."""
    sc = source.scalars
    if sc.empty:
        return pd.DataFrame(columns=["step"])
    rank = int(sc["rank"].min()) if rank is None else rank
    sc = sc.loc[sc["rank"] == rank]
    names = ["loss", "grad_norm"]
    cols = [f"{n}_{s}" for n in names for s in "ab"] if is_comparison(source) else names
    return sc[["step", *[c for c in cols if c in sc.columns]]].reset_index(drop=True)


def anomaly_frame(source: Any) -> pd.DataFrame:
    """The anomalies; for a comparison, both runs' with a ``run`` column (``a`` or ``b``) and ``shared`` (the
    other run has the same step, name, kind and rule): those of one run only first, then the shared ones, each
    part non-finite first and by severity (as ``MonitorFrame.anomalies`` orders one run's)."""
    if not is_comparison(source):
        return source.anomalies()
    parts = [source.a.anomalies().assign(run="a"), source.b.anomalies().assign(run="b")]
    out = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
    cols = ["run", *[c for c in out.columns if c != "run"]]
    out = out[cols].reset_index(drop=True)
    key = ["step", "name", "kind", "rule"]
    runs_per = out.groupby(key, dropna=False)["run"].transform("nunique") if len(out) else out["run"]
    out["shared"] = (runs_per > 1) if len(out) else pd.Series(dtype=bool)
    rule = out["rule"].map({r: i for i, r in enumerate(RULES)}).fillna(len(RULES))
    sev = pd.to_numeric(out["severity"], errors="coerce").fillna(0.0)
    out = out.assign(_rule=rule, _sev=-sev).sort_values(["shared", "_rule", "_sev", "step", "run"], kind="stable")
    return out.drop(columns=["_rule", "_sev"]).reset_index(drop=True)


def cell_numbers(source: Any, step: int, name: str, rank: int | None = None) -> pd.DataFrame:
    """Every number recorded for ``name`` at ``step`` (one row per kind), both runs' for a comparison. A
    scalar's name (``loss``, ``grad_norm``, an ``lr``...) gives its value at ``step``, kind ``scalar``."""
    frames = [("a", source.a), ("b", source.b)] if is_comparison(source) else [("", source)]
    if not any((f.stats["name"] == name).any() for _, f in frames) and \
            any(name in f.scalars.columns for _, f in frames):
        return _scalar_numbers(frames, step, name, rank)
    out = []
    for label, f in frames:
        s = f.stats
        r = s.loc[(s["step"] == step) & (s["name"] == name)]
        if rank is not None:
            r = r.loc[r["rank"] == rank]
        r = r.drop(columns=[c for c in r.columns if c.startswith("hist_") and r[c].isna().all()])
        if label:
            r = r.assign(run=label)
        out.append(r)
    t = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    if is_comparison(source):
        g = source.table
        m = g.loc[(g["step"] == step) & (g["name"] == name), ["rank", "kind", "norm_ratio", "direction", "parts"]]
        t = t.merge(m, on=["rank", "kind"], how="left")
        t = t[["run", *[c for c in t.columns if c != "run"]]]
    return t.reset_index(drop=True)


def _scalar_numbers(frames: list, step: int, name: str, rank: int | None) -> pd.DataFrame:
    out = []
    for label, f in frames:
        sc = f.scalars
        if name not in sc.columns:
            continue
        r = sc.loc[sc["step"] == step, ["step", "rank", name]]
        if rank is not None:
            r = r.loc[r["rank"] == rank]
        r = r.rename(columns={name: "value"}).assign(name=name, kind="scalar")
        r = r[["step", "rank", "name", "kind", "value"]]
        out.append(r.assign(run=label)[["run", *r.columns]] if label else r)
    return pd.concat(out, ignore_index=True)


def heatmap_figure(h: pd.DataFrame, value: str, title: str = "", mark: tuple[int, str] | None = None) -> Figure:
    """The heat map of :func:`heatmap_frame` (shaded by :func:`heat_scale`); ``mark``: (step, name) circled."""
    fig = Figure(figsize=(10, max(2.5, min(10.0, 0.18 * len(h) + 1.5))))  # 800 px at figure_png's 80 dpi
    ax = fig.add_subplot()
    if h.empty:
        ax.axis("off")
        ax.text(0.5, 0.5, "nothing recorded for this kind", ha="center", va="center")
        return fig
    shade = np.ma.masked_invalid(heat_scale(h, value))
    im = ax.imshow(shade, aspect="auto", interpolation="nearest", cmap="magma_r", vmin=0, vmax=1)
    ax.set_yticks(range(len(h)))
    ax.set_yticklabels(h.index, fontsize=6)
    ticks = np.linspace(0, h.shape[1] - 1, min(10, h.shape[1])).astype(int)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(h.columns[i]) for i in ticks])
    ax.set_xlabel("step")
    ax.set_title(title or value)
    cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cb.set_label(scale_label(value), fontsize=9)
    cb.ax.tick_params(labelsize=8)
    if mark is not None and mark[1] in h.index:
        cols = list(h.columns)
        x = max(i for i, c in enumerate(cols) if c <= mark[0]) if cols[0] <= mark[0] else 0
        ax.scatter([x], [list(h.index).index(mark[1])], s=80, facecolors="none", edgecolors="cyan", gid="mark")
    return fig


def curves_figure(c: pd.DataFrame, divergence_step: int | None = None,
                  names: tuple[str, str] = ("a", "b")) -> Figure:
    """Loss and gradient norm per step (two runs overlaid for a comparison, labelled with ``names``); a
    vertical line at the first divergence."""
    fig = Figure(figsize=(10, 3))  # 800 px at figure_png's 80 dpi
    for i, metric in enumerate(("loss", "grad_norm")):
        ax = fig.add_subplot(1, 2, i + 1)
        for col, style, label in ((metric, "-", metric), (f"{metric}_a", "-", names[0]),
                                  (f"{metric}_b", "--", names[1])):
            if col in c.columns:
                ax.plot(c["step"], c[col], style, label=label)
        if divergence_step is not None:
            ax.axvline(divergence_step, color="red", lw=0.8, gid="first-divergence")
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
