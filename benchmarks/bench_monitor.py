"""The training monitor's cost on the large benchmark model (benchmarks/models.py): step time and bytes per step.

In one process, on one CPU thread, two copies of the workload built from the same seed (same weights, same
batches) take turns: a plain step of one, a monitored step of the other (the order swapped every pair). Each
pair gives a ratio (the monitored step's CPU time of this process over the plain step's; CPU time, which other
processes on a shared machine disturb far less than wall time; the wall-time ratio is printed too). Two steps
that follow each other see the same state of the machine, whose speed drifts by 10-30 % over seconds: pairs
of adjacent steps cancel that drift where blocks of steps a second apart did not. A configuration's ratio is
the median over its pairs, shown with its interquartile range; each configuration gets a fresh ``Monitor``,
closed after its pairs.
Models: ``mlp``, issue 32's 12-layer 256-wide ReLU MLP with AdamW (batch 64, a step of about 10 ms), and
``large``, the 45-layer transformer of benchmarks/models.py (SGD, about 230 ms). Configurations: ``default``
(norms and NaN / inf counts of weights and gradients, the alert rules; targets: 1.10x on the MLP, 1.02x on
the large model), ``no-alerts``, each option on top of the default (``CONFIGS``), and ``read-floor``: no
monitor, only the default's one read of every weight and gradient by the C kernel in an optimizer hook, the
least any monitor of weights and gradients costs a step. ``µs/tensor`` is the
monitored step's extra time per weight and gradient read, ``floor`` the same for one bare read of them by the
C norm kernel (the physical floor).

The alert rules run as they do by default (their lines are not printed here: random batches make the
gradient norms of a fresh model jump). Bytes written per step are the bytes of the record's committed tables
per step (the file adds a fixed header and the unused end of its last chunks). Run:

    python benchmarks/bench_monitor.py [--size both|mlp|large] [--pairs N] [--configs default,+signs]
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

#: the configuration that is no monitor but its floor (see CONFIGS)
READ_FLOOR = "read-floor"
#: configuration -> (Monitor options, or None for the read floor; target ratio or None); the targets are issue
#: 32's for the default
CONFIGS = {
    "default": ({}, None),  # norms and NaN / inf counts of weights and gradients, the alert rules
    "no-alerts": ({"alerts": False}, None),
    "+min/max/mean": ({"stats": ("norm", "min", "max", "mean", "nan", "inf")}, None),
    "+optimizer_state": ({"optimizer_state": True}, None),
    "+activations": ({"activations": True, "activation_grads": False}, None),
    "+activation_grads": ({"activations": True}, None),
    "+signs": ({"signs": True}, None),
    "+histogram": ({"histogram": [-1e-3, 0.0, 1e-3]}, None),
    # no monitor: an optimizer pre-hook that only collects every weight's and gradient's address and size and
    # runs the C norms kernel over them (no rows, no commit, no alerts): the least any monitor reading weights
    # and gradients each step can cost here
    READ_FLOOR: (None, None),
}
#: the default's target per model
TARGETS = {"mlp": 1.10, "large": 1.02}
#: configurations run on the large model by default (its step is 25x the MLP's)
LARGE_CONFIGS = ("default", READ_FLOOR, "+min/max/mean", "+activations")
MLP_LAYERS, MLP_WIDTH, MLP_BATCH = 12, 256, 64


def build_mlp(seed: int = 0) -> models.Workload:
    """The 12-layer, 256-wide ReLU MLP of issue 32 with AdamW, batch 64, one fixed batch, MSE loss."""
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    layers: list = []
    for _ in range(MLP_LAYERS):
        layers += [nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = torch.randn(MLP_BATCH, MLP_WIDTH, generator=gen), torch.randn(MLP_BATCH, MLP_WIDTH, generator=gen)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    work = models.Workload("mlp", model, opt, lambda: (x, y))
    work.step = step  # type: ignore[method-assign]
    return work


def build(size: str | int) -> models.Workload:
    return build_mlp() if size == "mlp" else models.build(size)


def one_read_floor_us(work: models.Workload, repeat: int = 50) -> tuple[float, int]:
    """(µs a step, tensors) of the physical floor of the default: one read of every weight and gradient, the
    C norm kernel alone over them (no Python around it), and how many tensors that is."""
    from msprobe_nb.capture.monitor_stats import cpu_norm_runs, cpu_norms_host

    work.step()
    ts = [p for p in work.model.parameters()] + [p.grad for p in work.model.parameters() if p.grad is not None]
    runs = cpu_norm_runs(ts)
    if runs is None:
        return float("nan"), len(ts)
    cpu_norms_host(runs)
    t0 = time.process_time()
    for _ in range(repeat):
        cpu_norms_host(runs)
    return (time.process_time() - t0) / repeat * 1e6, len(ts)


class _ReadFloor:
    """The read floor as a stand-in for a Monitor: an optimizer step pre-hook that reads every weight and
    gradient once with the C norms kernel (the default's own first pass), and nothing else."""

    def __init__(self, work: models.Workload) -> None:
        from msprobe_nb.capture.monitor_stats import cpu_norm_runs, cpu_norms_host

        params = list(work.model.parameters())

        def hook(*_: object) -> None:
            runs = cpu_norm_runs(params + [p.grad for p in params])
            if runs is None:
                raise RuntimeError("the read floor needs float32 CPU tensors and the built C kernel")
            cpu_norms_host(runs)

        self._handle = work.optimizer.register_step_pre_hook(hook)

    def step(self, loss: object = None) -> None:
        pass

    def close(self) -> None:
        self._handle.remove()


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
    plain, watched = build(size), build(size)
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
                mon = _ReadFloor(watched) if opts is None else \
                    mp.Monitor(watched.model, watched.optimizer, dump_path=path, **opts)
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
                         "tensors": 2 * sum(1 for _ in watched.model.parameters()),
                         "wall_ratio": statistics.median(walls), "target": target,
                         "with_ms": statistics.median(with_) * 1e3, "base_ms": statistics.median(base) * 1e3,
                         "bytes_per_step": 0.0 if opts is None else _record_bytes(path)}
            shutil.rmtree(path, ignore_errors=True)
        return out
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


def report(results: dict[str, dict], floor_us: float = float("nan")) -> tuple[str, list[str]]:
    """The table printed, and a line per missed target. ``µs/tensor``: the monitored step's extra CPU time
    over the weights and gradients read; ``floor``: the one-read floor's time per tensor."""
    lines = [f"{'config':<20} {'plain ms':>9} {'with ms':>9} {'ratio':>7} {'IQR':>13} {'wall':>7} {'target':>7} "
             f"{'µs/tensor':>9} {'floor':>6} {'bytes/step':>11}  verdict"]
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
        n = r.get("tensors") or 1
        per = (r["with_ms"] - r["base_ms"]) * 1e3 / n
        lines.append(f"{name:<20} {r['base_ms']:>9.2f} {r['with_ms']:>9.2f} {r['ratio']:>6.3f}x {span:>13} {wall:>7} "
                     f"{(f'{t}x' if t else '-'):>7} {per:>9.1f} {floor_us / n:>6.2f} {r['bytes_per_step']:>11,.0f}  "
                     f"{verdict}")
    return "\n".join(lines), missed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="both", help="'mlp', 'large', 'small', a number of layers, or 'both' "
                    "(mlp, then large)")
    ap.add_argument("--pairs", type=int, default=None, help="plain / monitored step pairs per configuration "
                    "(default 150 on the MLP, 60 on the large model)")
    ap.add_argument("--configs", default=None, help="comma-separated configuration names (default: all on the "
                    f"MLP, {', '.join(LARGE_CONFIGS)} on the large model)")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    sizes = ["mlp", "large"] if args.size == "both" else [int(args.size) if args.size.isdigit() else args.size]
    for size in sizes:
        work = build(size)
        n_params = sum(1 for _ in work.model.parameters())
        n_values = sum(p.numel() for p in work.model.parameters())
        floor, _ = one_read_floor_us(work)
        names = args.configs.split(",") if args.configs else list(CONFIGS if size != "large" else LARGE_CONFIGS)
        configs = {n: (CONFIGS[n][0], TARGETS.get(str(size)) if n == "default" else None) for n in names}
        pairs = args.pairs or (150 if size != "large" else 60)
        print(f"model {size}: {n_params} parameters ({n_values:,} values); {pairs} pairs of steps (plain, "
              f"monitored: two copies of the workload) per configuration, one thread; one-read floor of weights "
              f"and gradients: {floor:.0f} µs a step", flush=True)
        text, missed = report(run(size, pairs, args.warmup, configs=configs), floor)
        print(text)
        print("missed: " + ("; ".join(missed) if missed else "none"), flush=True)


if __name__ == "__main__":
    main()
