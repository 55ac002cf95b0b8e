"""Responsiveness of the viewers on a large table: filter + sort + render one page.

Builds a synthetic 200,000-row calls table (schema dtypes) and a compare-like table of the same size,
then times what a user action costs in ``DumpViewer`` / ``CompareViewer``: a filter change (which also
re-sorts and renders the page), a sort change, a page turn. Target: well under 0.3 s per action.

    python benchmarks/bench_viewers.py [n_rows]
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

from msprobe_nb.store.schema import coerce_calls
from msprobe_nb.viewers import CompareViewer, DumpViewer

FAMILIES = ["Functional", "Torch", "Tensor", "Module", "NPU", "Distributed", "Aten"]
OPS = ["linear", "matmul", "softmax", "add", "mul", "layer_norm", "gelu", "dropout"]


def synthetic_calls(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` rows, 4 per call, 2 steps; API calls nested under the latest module call."""
    rng = np.random.default_rng(seed)
    n_calls = -(-n // 4)
    ci = np.arange(n_calls)
    fam = np.array(FAMILIES, dtype=object)[ci % len(FAMILIES)]
    op = np.array(OPS, dtype=object)[(ci // 7) % len(OPS)]
    direction = np.where((ci // 1000) % 2 == 0, "forward", "backward").astype(object)
    module_path = np.array([f"layers.{i // 7 % 50}.block" for i in ci], dtype=object)
    calls = np.array([f"Module.{p}.Linear.{d}.{i // 350}" if f == "Module" else f"{f}.{o}.{i}.{d}"
                      for f, o, d, p, i in zip(fam, op, direction, module_path, ci)], dtype=object)
    is_mod = fam == "Module"
    last_mod = np.maximum.accumulate(np.where(is_mod, ci, -1))
    parent = np.where(is_mod | (last_mod < 0), "", calls[np.maximum(last_mod, 0)]).astype(object)
    rows = np.repeat(ci, 4)[:n]
    io = np.tile(np.array(["input", "input", "output", "parameters"], dtype=object), n_calls)[:n]
    arg = np.tile(np.array(["0", "1", "0", "weight"], dtype=object), n_calls)[:n]
    df = pd.DataFrame({
        "step": (rows >= n_calls // 2).astype(np.int32), "rank": np.zeros(n, dtype=np.int32),
        "call_index": rows, "call": calls[rows], "family": fam[rows], "op": op[rows],
        "module_path": np.where(is_mod, module_path, "")[rows], "direction": direction[rows],
        "io": io, "arg": arg, "kind": "tensor", "dtype": "torch.float32",
        "name": [f"{c}.{i}.{a}" for c, i, a in zip(calls[rows], io, arg)],
        "max": rng.normal(size=n) + 3, "min": rng.normal(size=n) - 3, "mean": rng.normal(size=n),
        "norm": np.abs(rng.normal(size=n)) * 10, "parent": parent[rows],
    })
    return coerce_calls(df)


def synthetic_compare(n: int, seed: int = 0) -> pd.DataFrame:
    """A compare-like table: the calls table plus ``result``, ``err``, ``norm_rel``, ``diverges``."""
    rng = np.random.default_rng(seed)
    t = synthetic_calls(n, seed)
    err = np.abs(rng.normal(size=n)) * 1e-4
    err[rng.random(n) < 0.01] = 0.7
    t["err"] = err
    t["norm_rel"] = err
    t["diverges"] = err > 1e-3
    t["result"] = np.where(err > 0.5, "error", np.where(rng.random(n) < 0.02, "warning", "pass"))
    t["match"] = "matched"
    return t


def timed(label: str, fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    print(f"  {label:<58s} {best * 1000:8.1f} ms")
    return best


def main(n: int = 200_000) -> int:
    worst = 0.0
    calls = synthetic_calls(n)
    t0 = time.perf_counter()
    v = DumpViewer(calls)
    html = v.html()
    print(f"DumpViewer on {len(calls):,} rows: build + first page {1000 * (time.perf_counter() - t0):.1f} ms "
          f"({len(html):,} chars of HTML)")
    t0 = time.perf_counter()
    v.set_state(call="linear", family="Functional", direction="forward", io="output")
    v.html()
    cold = time.perf_counter() - t0
    print(f"  {'first filter (cold codes: call, family, direction, io)':<58s} {cold * 1000:8.1f} ms")
    worst = max(worst, cold)
    k = [0]

    def filt():
        k[0] += 1
        v.set_state(call=("linear", "matmul")[k[0] % 2], family="Functional", direction="forward", io="output")
        v.html()

    def sort():
        k[0] += 1
        v.set_state(sort_by="norm", ascending=bool(k[0] % 2))
        v.html()

    def regex_module():
        k[0] += 1
        v.set_state(call=r"(linear|gelu)\.\d+", regex=True, family=None, io=None,
                    module=f"layers.{k[0] % 50}", sort_by="call")
        v.html()

    def turn():
        v.set_state(page=(v.state.page + 1) % v.n_pages)
        v.html()

    worst = max(worst, timed("filter (call text + family + direction + io) + page", filt))
    worst = max(worst, timed("sort by norm (float) + page", sort))
    worst = max(worst, timed("regex + module subtree + sort by call (string) + page", regex_module))
    worst = max(worst, timed("page turn", turn))
    v.set_state(call="", regex=False, module="", family=None, io=None, direction=None, sort_by="name")
    worst = max(worst, timed("no filter, sort 200k rows by name + page", lambda: (v.set_state(
        ascending=not v.state.ascending), v.html())))

    comp = synthetic_compare(n)
    t0 = time.perf_counter()
    c = CompareViewer(comp)
    c.html()
    print(f"CompareViewer on {len(comp):,} rows: build + first page {1000 * (time.perf_counter() - t0):.1f} ms")

    def errors():
        k[0] += 1
        c.set_state(verdict="error", sort_by="err", ascending=False, step=k[0] % 2)
        c.html()

    worst = max(worst, timed("verdict=error + step + sort by err desc + page", errors))
    def detail():
        k[0] += 1
        c.select_row(k[0] * 7 % c.n_rows)
        return c.selected

    worst = max(worst, timed("select a row + build its detail", detail))
    t0 = time.perf_counter()
    w = c.widget
    print(f"  {'build the ipywidgets shell':<58s} {(time.perf_counter() - t0) * 1000:8.1f} ms")

    def widget_filter():
        k[0] += 1
        c._w["call"].value = ("Functional.linear", "Tensor.add")[k[0] % 2]  # as if typed + Enter

    worst = max(worst, timed("filter typed in the widget (state + widgets re-synced)", widget_filter))
    assert w is c.widget
    print(f"worst action: {worst * 1000:.1f} ms (target < 300 ms)")
    return 0 if worst < 0.3 else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000))
