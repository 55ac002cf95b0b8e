"""The training monitor's cost on the large benchmark model (benchmarks/models.py): step time and bytes per step.

In one process, on one CPU thread, two copies of the workload built from the same seed (same weights, same
batches) take turns: a plain step of one, a monitored step of the other (the order swapped every pair). Each
pair gives a ratio (the monitored step's CPU time of this process over the plain step's; CPU time, which other
processes on a shared machine disturb far less than wall time; the wall-time ratio is printed too). Two steps
that follow each other see the same state of the machine, whose speed drifts by 10-30 % over seconds: pairs
of adjacent steps cancel that drift where blocks of steps a second apart did not. A configuration's ratio is
the median over its pairs, shown with its interquartile range; each configuration gets a fresh ``Monitor``,
closed after its pairs.
Configurations and their targets (issue 18):

* ``norms``: gradient and weight norms of every parameter (``stats=("norm",)``): at most 1.03x;
* ``norms+activations``: the same and the norms of every module's output: at most 1.15x;
* ``norms+activations+grads``: also the norms of every module output's gradient: no target;
* ``norms+signs``: ``norms`` and the gradients' sign bitmaps: at most 1.2x;
* ``all-stats``: every aggregate (norm, min, max, mean, NaN and inf counts) of gradients and weights: no target.

The alert rules run as they do by default (their lines are not printed here: random batches make the
gradient norms of a fresh model jump). Bytes written per step are the bytes of the record's committed tables
per step (the file adds a fixed header and the unused end of its last chunks). Run:

    python benchmarks/bench_monitor.py [--size large] [--pairs 150] [--warmup 5]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402

#: configuration -> (Monitor options, target ratio or None)
CONFIGS = {
    "norms": ({"stats": ("norm",)}, 1.03),
    "norms+activations": ({"stats": ("norm",), "activations": True, "activation_grads": False}, 1.15),
    "norms+activations+grads": ({"stats": ("norm",), "activations": True}, None),
    "norms+signs": ({"stats": ("norm",), "signs": True}, 1.2),
    "all-stats": ({}, None),
}


def _time_step(work: models.Workload, mon=None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one training step (with ``mon.step`` when monitored)."""
    w0, c0 = time.perf_counter(), time.process_time()
    loss = work.step()
    if mon is not None:
        mon.step(loss=loss)
    return time.process_time() - c0, time.perf_counter() - w0


def _record_bytes(path: str) -> float:
    """Bytes of the committed tables of the record in ``path``, per step."""
    from msprobe_nb.store.monitor_store import read_monitor

    (r,) = read_monitor(path)
    n = len(r["steps"])
    data = (r["values"].size + 2 * len(r["row_name"])) * 8 + len(r["scalar_value"]) * 16 + \
        len(r["sign_row"]) * 16 + len(r["sign_bytes"]) + n * 9 * 8
    return data / max(n, 1)


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def run(size: str | int = "large", pairs: int = 150, warmup: int = 5, root: str | None = None,
        configs: dict | None = None) -> dict[str, dict]:
    """{config: {"ratio", "low", "high", "wall_ratio", "target", "with_ms", "base_ms", "bytes_per_step"}}
    measured here (``low``-``high``: the pairs' interquartile range)."""
    import msprobe_nb as mp

    configs = CONFIGS if configs is None else configs
    plain, watched = models.build(size), models.build(size)
    own = root is None
    root = tempfile.mkdtemp(prefix="bench_monitor_") if own else root
    try:
        for _ in range(warmup):
            _time_step(plain)
            _time_step(watched)
        out = {}
        for name, (opts, target) in configs.items():
            path = os.path.join(root, name)
            base, with_, ratios, walls = [], [], [], []
            with contextlib.redirect_stdout(io.StringIO()):  # alerts are checked (the default), not shown
                mon = mp.Monitor(watched.model, watched.optimizer, dump_path=path, **opts)
                _time_step(watched, mon)  # its first step allocates the file's tables
                for i in range(pairs):
                    if i % 2:
                        (c1, w1), (c0, w0) = _time_step(watched, mon), _time_step(plain)
                    else:
                        (c0, w0), (c1, w1) = _time_step(plain), _time_step(watched, mon)
                    base.append(c0)
                    with_.append(c1)
                    ratios.append(c1 / c0)
                    walls.append(w1 / w0)
                mon.close()
            low, high = _quartiles(ratios)
            out[name] = {"ratio": statistics.median(ratios), "low": low, "high": high,
                         "wall_ratio": statistics.median(walls), "target": target,
                         "with_ms": statistics.median(with_) * 1e3, "base_ms": statistics.median(base) * 1e3,
                         "bytes_per_step": _record_bytes(path)}
            shutil.rmtree(path, ignore_errors=True)
        return out
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def report(results: dict[str, dict]) -> tuple[str, list[str]]:
    """The table printed, and a line per missed target."""
    lines = [f"{'config':<24} {'plain ms':>9} {'with ms':>9} {'ratio':>7} {'IQR':>13} {'wall':>7} {'target':>7} "
             f"{'bytes/step':>11}  verdict"]
    missed = []
    for name, r in results.items():
        t = r["target"]
        if t is None:
            verdict = "no target"
        elif r["ratio"] <= t:
            verdict = "met"
        else:
            verdict = f"MISSED by {(r['ratio'] / t - 1) * 100:.1f} %"
            missed.append(f"{name}: {r['ratio']:.3f}x > target {t}x")
        span = f"{r['low']:.3f}-{r['high']:.3f}" if "low" in r else "-"
        wall = f"{r['wall_ratio']:.3f}x" if "wall_ratio" in r else "-"
        lines.append(f"{name:<24} {r['base_ms']:>9.2f} {r['with_ms']:>9.2f} {r['ratio']:>6.3f}x {span:>13} {wall:>7} "
                     f"{(f'{t}x' if t else '-'):>7} {r['bytes_per_step']:>11,.0f}  {verdict}")
    return "\n".join(lines), missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="large", help="'small', 'large' or a number of layers")
    ap.add_argument("--pairs", type=int, default=150, help="plain / monitored step pairs per configuration")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    size = int(args.size) if args.size.isdigit() else args.size
    work = models.build(size)
    n_params = sum(1 for _ in work.model.parameters())
    n_modules = sum(1 for _ in work.model.modules())
    print(f"model {size}: {n_params} parameters, {n_modules} modules; {args.pairs} pairs of steps (plain, "
          "monitored: two copies of the workload) per configuration, one thread", flush=True)
    text, missed = report(run(size, args.pairs, args.warmup))
    print(text)
    print("missed: " + ("; ".join(missed) if missed else "none"))


if __name__ == "__main__":
    main()
