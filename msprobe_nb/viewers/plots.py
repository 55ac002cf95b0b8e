"""Matplotlib figures for the viewers (plain ``Figure`` objects, no pyplot state).

* :func:`metric_along_order`: a metric per call along execution order, the first divergence marked;
* :func:`errors_by_module`: errors summed per module (or module call) in model order, as bars;
* :func:`tensor_diff`: where two whole tensors differ (histogram of errors, heat map of ``|npu - bench|``);
* :func:`tensor_values`: one whole tensor (histogram, heat map of ``|x|``).

The data behind each chart is available as a DataFrame (:func:`metric_series`, :func:`module_errors`,
:func:`module_errors_tree`).
"""
from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .table import derive_family, derive_module_path, metric_rules

__all__ = ["DIVERGENCE_GID", "errors_by_module", "figure_png", "gapped", "metric_along_order", "metric_series",
           "module_errors", "module_errors_tree", "tensor_diff", "tensor_values"]

#: ``gid`` of the vertical line marking the first divergence (tests and callers can find it)
DIVERGENCE_GID = "first-divergence"
#: metrics where smaller is worse (aggregated per call with min)
LOW_IS_BAD = ("cosine", "one_thousandth", "five_thousandths")
TOP_LEVEL = "(top level)"


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    """PNG bytes of a figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _text_figure(text: str, size: tuple[float, float] = (6, 1.2)) -> Figure:
    fig = Figure(figsize=size)
    ax = fig.add_subplot()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return fig


# ------------------------------------------------------------------------------------------ execution order
def _divergence_of(table: pd.DataFrame, divergence: Any) -> tuple[int | None, str, int | None, int | None]:
    """(call_index, call, step, rank) of a divergence given as an object, dict, call name or call index."""
    if divergence is None:
        fd = getattr(table, "first_divergence", None)
        if not callable(fd):
            return None, "", None, None
        try:
            divergence = fd()
        except Exception:  # noqa: BLE001 - a plot without a marker beats no plot
            return None, "", None, None
        if divergence is None:
            return None, "", None, None
    if isinstance(divergence, (int, np.integer)):
        return int(divergence), "", None, None
    if isinstance(divergence, str):
        hit = table.loc[table["call"] == divergence]
        if hit.empty:
            return None, divergence, None, None
        r = hit.iloc[0]
        return int(r["call_index"]), divergence, int(r["step"]), int(r["rank"])
    get = divergence.get if isinstance(divergence, dict) else lambda k: getattr(divergence, k, None)
    ci, step, rank = get("call_index"), get("step"), get("rank")
    return (None if ci is None else int(ci)), str(get("call") or ""), (None if step is None else int(step)), \
        (None if rank is None else int(rank))


def metric_series(table: pd.DataFrame, metric: str = "err", step: int | None = None,
                  rank: int | None = None) -> pd.DataFrame:
    """Per call of one (step, rank): ``call_index``, ``call``, ``value`` (worst row: max, min for cosine-like)."""
    t = table
    if step is None and len(t):
        step = int(t["step"].iloc[0])
    if rank is None and len(t):
        rank = int(t.loc[t["step"] == step, "rank"].iloc[0]) if (t["step"] == step).any() else 0
    t = t[(t["step"] == step) & (t["rank"] == rank) & (t["call_index"] >= 0)]
    if metric not in t.columns:
        raise KeyError(f"no column {metric!r} to plot")
    v = pd.to_numeric(t[metric], errors="coerce").astype(float)
    frame = pd.DataFrame({"call_index": t["call_index"].to_numpy(dtype=np.int64),
                          "call": t["call"].astype(object).to_numpy(), "value": v.to_numpy()})
    g = frame.groupby("call_index", sort=True)
    value = g["value"].min() if metric in LOW_IS_BAD else g["value"].max()
    out = pd.DataFrame({"call_index": value.index.to_numpy(), "call": g["call"].first().to_numpy(),
                        "value": value.to_numpy()})
    out.attrs.update(step=step, rank=rank, metric=metric)
    return out


def gapped(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x``, ``y`` with a NaN point wherever ``x`` skips (a call the filters or the metric left out), so
    that a line drawn through them breaks there instead of joining across the gap; NaN ``y`` breaks it too."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) < 2:
        return x, y
    gap = np.flatnonzero(np.diff(x) > 1) + 1
    return np.insert(x, gap, x[gap] - 0.5), np.insert(y, gap, np.nan)


def metric_along_order(table: pd.DataFrame, metric: str = "err", divergence: Any = None, *,
                       step: int | None = None, rank: int | None = None, thresholds: Any = None,
                       log: bool | None = None) -> Figure:
    """``metric`` per call along execution order (x: ``call_index``) with the first divergence marked.

    ``divergence``: a ``Divergence``, a dict, a call name or a call index; by default the table's own
    ``first_divergence()`` when it has one. Infinite values (hard mismatches) are drawn as red crosses at the top.
    The line breaks where a call has no value (NaN) and where calls are missing (:func:`gapped`).
    """
    ci, dcall, dstep, drank = _divergence_of(table, divergence)
    if step is None and rank is None and dstep is not None:
        step, rank = dstep, drank
    s = metric_series(table, metric, step, rank)
    fig = Figure(figsize=(9, 3.2))
    ax = fig.add_subplot()
    x, y = s["call_index"].to_numpy(), s["value"].to_numpy()
    fin = np.isfinite(y)
    gx, gy = gapped(x, np.where(fin, y, np.nan))
    ax.plot(gx, gy, ".-", lw=0.8, ms=3, color="#1f77b4", label=metric)
    inf = np.isinf(y)
    top = float(np.nanmax(np.abs(y[fin]))) if fin.any() else 1.0
    if inf.any():
        ax.plot(x[inf], np.full(inf.sum(), top if top > 0 else 1.0), "x", color="#c0392b", ms=6,
                label="hard mismatch (inf)")
    rule = metric_rules(thresholds).get(metric)
    if rule is not None:
        ax.axhline(rule[1], color="grey", ls=":", lw=1, label=f"threshold {rule[1]:g}")
    if log is None:
        log = metric not in LOW_IS_BAD and fin.any() and float(np.nanmax(y[fin])) > 0
    if log:
        pos = y[fin & (y > 0)]
        ax.set_yscale("symlog", linthresh=float(max(min(pos.min(), 1e-3), 1e-12)) if len(pos) else 1e-6)
        if not (y[fin] < 0).any():
            ax.set_ylim(bottom=0)
    if ci is not None:
        ax.axvline(ci, color="#c0392b", ls="--", lw=1.2, gid=DIVERGENCE_GID,
                   label=f"first divergence: {dcall or ci}")
    ax.set_xlabel("call index (execution order)")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} along execution order (step {s.attrs['step']}, rank {s.attrs['rank']})", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def divergence_x(fig: Figure) -> float | None:
    """x of the first-divergence marker of a :func:`metric_along_order` figure (None when absent)."""
    for ax in fig.axes:
        for line in ax.lines:
            if line.get_gid() == DIVERGENCE_GID:
                return float(np.asarray(line.get_xdata())[0])
    return None


# ------------------------------------------------------------------------------------------ per module
def module_errors(table: pd.DataFrame, metric: str = "err", by: str = "module") -> pd.DataFrame:
    """``metric`` summed per module: ``by="module"`` groups by module path (forward and backward together),
    ``by="parent"`` by the enclosing module call. Module calls' own forward/backward rows repeat the rows of
    the calls inside them and are left out (unless the table holds only module calls); parameter gradients
    count for their own module. Infinite values are counted in ``n_inf``, not summed.
    """
    t, key, keep, v = _module_keys(table, metric, by)
    out = _sum_per_key(t, key, keep, v)[["module", "sum", "n_inf", "rows"]]
    out = out.sort_values(["n_inf", "sum"], ascending=False, kind="stable").reset_index(drop=True)
    out.attrs.update(metric=metric, by=by)
    return out


def _module_keys(table: pd.DataFrame, metric: str, by: str):
    """(rows kept, module key per row, which rows count, metric values) for :func:`module_errors`."""
    if by not in ("module", "parent"):
        raise ValueError(f"by must be 'module' or 'parent', got {by!r}")
    t = table[table["call_index"] >= 0] if "call_index" in table.columns else table
    calls = t["call"].astype(object).to_numpy()
    codes, uniq = pd.factorize(calls)
    fam = np.array([derive_family(str(c)) for c in uniq] + [""], dtype=object)[codes]
    pgrad_u = np.array([".parameters_grad" in str(c) for c in uniq] + [False], dtype=bool)
    pgrad = pgrad_u[codes]
    module_row = (fam == "Module") & ~pgrad
    keep = ~module_row if (~module_row).any() else np.ones(len(t), dtype=bool)
    parent = (t["parent"].astype(object).fillna("").to_numpy() if "parent" in t.columns
              else np.full(len(t), "", dtype=object))
    if by == "parent":
        key = np.where(pgrad | (module_row & keep), calls, parent)
    else:
        pcodes, puniq = pd.factorize(parent)
        ppath = np.array([derive_module_path(str(p)) for p in puniq] + [""], dtype=object)[pcodes]
        own = np.array([derive_module_path(str(c)) for c in uniq] + [""], dtype=object)[codes]
        key = np.where(pgrad, own, ppath)
        if keep.all() and module_row.any():  # modules only: a module call counts for its own path
            key = np.where(module_row, own, key)
    key = np.where(key == "", TOP_LEVEL, key)
    v = pd.to_numeric(t[metric], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return t, key, keep, v


def _sum_per_key(t: pd.DataFrame, key: np.ndarray, keep: np.ndarray, v: np.ndarray) -> pd.DataFrame:
    ci = t["call_index"].to_numpy(dtype=np.int64) if "call_index" in t.columns else np.arange(len(t))
    frame = pd.DataFrame({"module": key[keep], "value": v[keep], "ci": ci[keep]})
    frame["finite"] = np.where(np.isfinite(frame["value"]), frame["value"], 0.0)
    frame["inf"] = np.isinf(frame["value"])
    g = frame.groupby("module", sort=False)
    return pd.DataFrame({"sum": g["finite"].sum(), "n_inf": g["inf"].sum().astype(np.int64),
                         "rows": g.size().astype(np.int64), "first": g["ci"].min()}).reset_index()


def module_errors_tree(table: pd.DataFrame, metric: str = "err", by: str = "module",
                       max_bars: int = 60) -> pd.DataFrame:
    """``metric`` per module with each module's whole subtree summed, cut at one depth of the model tree.

    ``by="module"``: the tree of module paths (``layers.3.mlp`` under ``layers.3`` under ``layers``);
    ``by="parent"``: the tree of module calls (each under the module call around it). The depth shown is
    the deepest whose modules (with the leaves above it) number at most ``max_bars``, so a 45-layer model
    shows one bar per layer; rows outside every module are one ``(top level)`` bar. In execution order
    (the first call of each module). Columns: ``module``, ``depth``, ``sum``, ``n_inf``, ``rows``, ``first``;
    ``attrs``: ``depth`` (shown) and ``max_depth``.
    """
    t, key, keep, v = _module_keys(table, metric, by)
    per = _sum_per_key(t, key, keep, v)
    if by == "parent":
        from .table import TableIndex

        tree = TableIndex(t).tree if "parent" in t.columns else {}

        def up(k: str) -> str:
            return tree.get(k, "") or ""
    else:
        def up(k: str) -> str:
            return k.rsplit(".", 1)[0] if "." in k else ""

    acc: dict[str, list] = {}  # node -> [sum, n_inf, rows, first]
    kids: dict[str, set] = {}
    for k, sm, ni, nr, fc in per[["module", "sum", "n_inf", "rows", "first"]].itertuples(index=False):
        node, seen = str(k), set()
        child = None
        while node and node not in seen:
            seen.add(node)
            a = acc.setdefault(node, [0.0, 0, 0, fc])
            a[0] += sm
            a[1] += ni
            a[2] += nr
            a[3] = min(a[3], fc)
            if child is not None:
                kids.setdefault(node, set()).add(child)
            child = node
            node = up(node) if node != TOP_LEVEL else ""

    def depth_of(k: str) -> int:
        d, seen = 1, set()
        while k != TOP_LEVEL and up(k) and k not in seen:
            seen.add(k)
            k, d = up(k), d + 1
        return d

    depth = {k: depth_of(k) for k in acc}
    max_depth = max(depth.values(), default=1)

    def cut(d: int) -> list[str]:
        return [k for k in acc if depth[k] == d or (depth[k] < d and not kids.get(k))]

    shown = 1
    for d in range(1, max_depth + 1):
        if len(cut(d)) <= max_bars:
            shown = d
    rows = sorted(cut(shown), key=lambda k: (acc[k][3], k))
    out = pd.DataFrame({"module": rows, "depth": [depth[k] for k in rows],
                        "sum": [float(acc[k][0]) for k in rows], "n_inf": [int(acc[k][1]) for k in rows],
                        "rows": [int(acc[k][2]) for k in rows], "first": [int(acc[k][3]) for k in rows]})
    if len(out) > max_bars:  # even the top level is too wide: keep the largest, still in tree order
        big = out.sort_values(["n_inf", "sum"], ascending=False, kind="stable").head(max_bars).index
        out = out.loc[sorted(big)].reset_index(drop=True)
    out.attrs.update(metric=metric, by=by, depth=shown, max_depth=max_depth)
    return out


def errors_by_module(table: pd.DataFrame, metric: str = "err", by: str = "module", top: int = 60) -> Figure:
    """Horizontal bars of :func:`module_errors_tree`: modules in tree (execution) order, top to bottom, at
    the deepest level that fits ``top`` bars (one bar per layer of a 45-layer model); ``+N inf`` noted
    beside a bar."""
    m = module_errors_tree(table, metric, by, max_bars=top)
    if m.empty:
        return _text_figure(f"no {metric} values to sum per module")
    if len(m) == 1 and str(m["module"].iloc[0]) == TOP_LEVEL:  # no modules (an L1 dump, a pre-check)
        return errors_by_call(table, metric, top)
    n = len(m)
    fs = 8 if n <= 30 else 7
    fig = Figure(figsize=(8.5, 0.2 * n + 1.3))
    ax = fig.add_subplot()
    y = np.arange(n)[::-1]
    vals = m["sum"].to_numpy(dtype=float)
    colours = np.where(m["n_inf"].to_numpy() > 0, "#c0392b", "#e67e22")
    ax.barh(y, vals, color=colours, height=0.75)
    ax.set_yticks(y, [str(k) if len(str(k)) < 48 else "…" + str(k)[-46:] for k in m["module"]], fontsize=fs)
    ax.set_ylim(-0.6, n - 0.4)
    for yy, sm, ni in zip(y, vals, m["n_inf"]):
        if ni:
            ax.text(sm, yy, f"  +{ni} inf", va="center", fontsize=fs, color="#c0392b")
    pos = vals[vals > 0]
    if len(pos) and pos.max() > 1e3 * pos.min():  # spans decades: a log scale keeps the small bars visible
        ax.set_xscale("symlog", linthresh=float(max(pos.min(), 1e-12)))
    what = "module" if by == "module" else "module call"
    depth, mx = m.attrs.get("depth", 1), m.attrs.get("max_depth", 1)
    ax.set_xlabel(f"sum of {metric} (whole subtree)")
    ax.set_title(f"{metric} per {what}, in model order (depth {depth} of {mx}, {n} bars)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------ tensors
def errors_by_call(table: pd.DataFrame, metric: str = "err", top: int = 60) -> Figure:
    """Horizontal bars of ``metric`` per call (its worst row), in execution order, the ``top`` worst kept: the
    per-module plot's stand-in where the rows sit in no module (one "(top level)" bar would sum them all)."""
    if metric not in table.columns or "call" not in table.columns:
        return _text_figure(f"no {metric} column to plot per call")
    v = pd.to_numeric(table[metric], errors="coerce")
    t = pd.DataFrame({"call": table["call"].astype(str).to_numpy(), "v": v.to_numpy(dtype=float, na_value=np.nan)})
    t = t[np.isfinite(t["v"])]
    if t.empty:
        return _text_figure(f"no {metric} values to plot per call")
    worst = t.groupby("call", sort=False)["v"].max()
    if len(worst) > top:
        keep = set(worst.nlargest(top).index)
        worst = worst[[c in keep for c in worst.index]]
    n = len(worst)
    fs = 8 if n <= 30 else 7
    fig = Figure(figsize=(8.5, 0.2 * n + 1.3))
    ax = fig.add_subplot()
    y = np.arange(n)[::-1]
    vals = worst.to_numpy(dtype=float)
    ax.barh(y, vals, color="#e67e22", height=0.75)
    ax.set_yticks(y, [k if len(k) < 48 else "…" + k[-46:] for k in worst.index], fontsize=fs)
    ax.set_ylim(-0.6, n - 0.4)
    pos = vals[vals > 0]
    if len(pos) and pos.max() > 1e3 * pos.min():
        ax.set_xscale("symlog", linthresh=float(max(pos.min(), 1e-12)))
    ax.set_xlabel(f"{metric} (the call's worst row)")
    ax.set_title(f"{metric} per call, in execution order ({n} bars; no module calls recorded)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _to_numpy(x: Any) -> np.ndarray:
    # a torch tensor, recognised by its methods: the viewers do not import torch (the core install has none);
    # float64 first, since numpy has no bfloat16
    if all(callable(getattr(x, m, None)) for m in ("detach", "cpu", "double", "numpy", "is_complex")):
        x = x.detach().cpu()
        if x.is_complex():
            x = x.abs()
        return x.double().numpy()
    a = np.asarray(x)
    if np.iscomplexobj(a):
        a = np.abs(a)
    return a.astype(np.float64)


def as_2d(a: np.ndarray, max_side: int = 256) -> np.ndarray:
    """A 2-D view of any tensor for a heat map (leading dims flattened; 1-D folded into a square), block-max
    pooled so no side exceeds ``max_side``."""
    m: np.ndarray
    if a.ndim == 0:
        m = a.reshape(1, 1)
    elif a.ndim == 1:
        w = max(1, math.ceil(math.sqrt(a.size)))
        m = np.full(w * math.ceil(a.size / w), np.nan)
        m[:a.size] = a
        m = m.reshape(-1, w)
    else:
        m = a.reshape(-1, a.shape[-1])
    fy, fx = math.ceil(m.shape[0] / max_side), math.ceil(m.shape[1] / max_side)
    if fy > 1 or fx > 1:
        py, px = (-m.shape[0]) % fy, (-m.shape[1]) % fx
        m = np.pad(m, ((0, py), (0, px)), constant_values=np.nan)
        m = m.reshape(m.shape[0] // fy, fy, m.shape[1] // fx, fx)
        with np.errstate(all="ignore"):
            allnan = np.isnan(m).all(axis=(1, 3))
            m = np.where(allnan, np.nan, np.nanmax(np.where(np.isnan(m), -np.inf, m), axis=(1, 3)))
    return m


def tensor_diff(npu: Any, bench: Any, name: str = "") -> Figure:
    """Where two tensors differ: histogram of ``npu - bench`` and heat map of ``|npu - bench|``."""
    a, b = _to_numpy(npu), _to_numpy(bench)
    if a.shape != b.shape:
        return _text_figure(f"{name}: shapes differ, NPU {list(a.shape)} vs bench {list(b.shape)}")
    with np.errstate(all="ignore"):
        d = a - b
    ad = np.abs(d)
    fin = np.isfinite(d)
    fig = Figure(figsize=(10, 3.4))
    h, m = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if fin.any() and np.any(d[fin] != 0):
        h.hist(d[fin].ravel(), bins=60, color="#8e44ad", log=True)
    else:
        h.text(0.5, 0.5, "identical" if fin.all() else "no finite difference", ha="center", va="center",
               transform=h.transAxes)
    bad = int((~fin).sum())
    h.set_title(f"npu - bench ({d.size} elements" + (f", {bad} NaN/inf" if bad else "") + ")", fontsize=9)
    h.set_xlabel("error")
    h.set_ylabel("count")
    img = m.imshow(as_2d(np.where(np.isnan(ad) & ~(np.isnan(a) & np.isnan(b)), np.inf, ad)), aspect="auto",
                   cmap="magma", interpolation="nearest")
    fig.colorbar(img, ax=m, fraction=0.046)
    mx = float(np.nanmax(ad[fin])) if fin.any() else float("nan")
    m.set_title(f"|npu - bench| (max {mx:.4g}); shape {list(a.shape)}", fontsize=9)
    if name:
        fig.suptitle(name, fontsize=10)
    fig.tight_layout()
    return fig


def tensor_values(x: Any, name: str = "") -> Figure:
    """One tensor: histogram of its values and heat map of ``|x|``."""
    a = _to_numpy(x)
    fin = np.isfinite(a)
    fig = Figure(figsize=(10, 3.4))
    h, m = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if fin.any():
        h.hist(a[fin].ravel(), bins=60, color="#2980b9", log=True)
    h.set_title(f"values ({a.size} elements, {int((~fin).sum())} NaN/inf)", fontsize=9)
    img = m.imshow(as_2d(np.abs(a)), aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(img, ax=m, fraction=0.046)
    m.set_title(f"|x|; shape {list(a.shape)}", fontsize=9)
    if name:
        fig.suptitle(name, fontsize=10)
    fig.tight_layout()
    return fig
