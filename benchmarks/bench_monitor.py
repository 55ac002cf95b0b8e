"""The training monitor's cost on the large benchmark model (benchmarks/models.py): step time and bytes per step.

In one process, on one CPU thread, short blocks of plain training steps alternate with blocks of monitored
steps (a fresh ``Monitor`` per block, closed after it, so its hooks are gone for the next plain block). Each
pair of blocks gives a ratio (median monitored step over median plain step, in CPU time of this process,
which other processes on a shared machine disturb far less than wall time; the wall-time ratio is printed
too); a configuration's ratio is the median over its pairs, shown with their range.
Configurations and their targets (issue 18):

* ``norms``: gradient and weight norms of every parameter (``stats=("norm",)``): at most 1.03x;
* ``norms+activations``: the same and the norms of every module's output: at most 1.15x;
* ``norms+activations+grads``: also the norms of every module output's gradient: no target;
* ``norms+signs``: ``norms`` and the gradients' sign bitmaps: at most 1.2x;
* ``all-stats``: every aggregate (norm, min, max, mean, NaN and inf counts) of gradients and weights: no target.

The alert rules run as they do by default (their lines are not printed here: random batches make the
gradient norms of a fresh model jump). Bytes written per step are the bytes of the record's committed tables
per step (the file adds a fixed header and the unused end of its last chunks). Run:

    python benchmarks/bench_monitor.py [--size large] [--blocks 10] [--steps 4] [--warmup 5]
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


def _time_steps(work: models.Workload, n: int, mon=None) -> tuple[list[float], list[float]]:
    """(CPU seconds, wall seconds) of each of ``n`` training steps (with ``mon.step`` when monitored)."""
    cpu, wall = [], []
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        loss = work.step()
        if mon is not None:
            mon.step(loss=loss)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def _record_bytes(path: str) -> float:
    """Bytes of the committed tables of the record in ``path``, per step."""
    from msprobe_nb.store.monitor_store import read_monitor

    (r,) = read_monitor(path)
    n = len(r["steps"])
    data = (r["values"].size + 2 * len(r["row_name"])) * 8 + len(r["scalar_value"]) * 16 + \
        len(r["sign_row"]) * 16 + len(r["sign_bytes"]) + n * 9 * 8
    return data / max(n, 1)


def run(size: str | int = "large", blocks: int = 10, steps: int = 4, warmup: int = 5,
        root: str | None = None, configs: dict | None = None) -> dict[str, dict]:
    """{config: {"ratio", "low", "high", "target", "with_ms", "base_ms", "bytes_per_step"}} measured here."""
    import msprobe_nb as mp

    configs = CONFIGS if configs is None else configs
    work = models.build(size)
    own = root is None
    root = tempfile.mkdtemp(prefix="bench_monitor_") if own else root
    try:
        _time_steps(work, warmup)
        res = {name: {"with": [], "base": [], "bytes": [], "ratios": [], "wall": []} for name in configs}
        for b in range(blocks):
            for name, (opts, _) in configs.items():
                base, base_wall = _time_steps(work, steps)
                path = os.path.join(root, f"{name}_{b}")
                with contextlib.redirect_stdout(io.StringIO()):  # alerts are checked (the default), not shown
                    mon = mp.Monitor(work.model, work.optimizer, dump_path=path, **opts)
                    _time_steps(work, 1, mon)  # its first step allocates the file's tables
                    with_, with_wall = _time_steps(work, steps, mon)
                    mon.close()
                res[name]["base"] += base
                res[name]["with"] += with_
                res[name]["ratios"].append(statistics.median(with_) / statistics.median(base))
                res[name]["wall"].append(statistics.median(with_wall) / statistics.median(base_wall))
                res[name]["bytes"].append(_record_bytes(path))
                shutil.rmtree(path, ignore_errors=True)
        out = {}
        for name, (_, target) in configs.items():
            w, bse, ratios = statistics.median(res[name]["with"]), statistics.median(res[name]["base"]), \
                res[name]["ratios"]
            out[name] = {"ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
                         "wall_ratio": statistics.median(res[name]["wall"]),
                         "target": target, "with_ms": w * 1e3, "base_ms": bse * 1e3,
                         "bytes_per_step": statistics.median(res[name]["bytes"])}
        return out
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def report(results: dict[str, dict]) -> tuple[str, list[str]]:
    """The table printed, and a line per missed target."""
    lines = [f"{'config':<24} {'plain ms':>9} {'with ms':>9} {'ratio':>7} {'range':>13} {'wall':>7} {'target':>7} "
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
    ap.add_argument("--blocks", type=int, default=10, help="plain / monitored block pairs per configuration")
    ap.add_argument("--steps", type=int, default=4, help="steps per block")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    size = int(args.size) if args.size.isdigit() else args.size
    work = models.build(size)
    n_params = sum(1 for _ in work.model.parameters())
    n_modules = sum(1 for _ in work.model.modules())
    print(f"model {size}: {n_params} parameters, {n_modules} modules; {args.blocks} pairs of {args.steps}-step "
          "blocks (plain, monitored) per configuration, one thread", flush=True)
    text, missed = report(run(size, args.blocks, args.steps, args.warmup))
    print(text)
    print("missed: " + ("; ".join(missed) if missed else "none"))


if __name__ == "__main__":
    main()
