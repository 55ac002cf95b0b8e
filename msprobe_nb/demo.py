"""The demo: an NPU run and a GPU run of one diffusion training step disagree, replayed on one machine.

A diffusion-style training step draws its timesteps with ``torch.randint`` and its noise with
``torch.rand_like`` on the model's device. Two machines with the same seed draw different numbers from
their device generators. With CUDA present the "NPU" run really uses CUDA and the bench the CPU. On a
CPU-only machine the second machine's device generator is *emulated*: the default generator is reseeded
differently right before each run's training step (weights and data are identical), which is exactly
what two devices with different random number algorithms look like to the model.

Run it with ``python -m msprobe_nb.demo`` (or ``msprobe-nb demo``).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

#: device-generator seeds of the two emulated machines (CPU-only runs)
EMULATED_DEVICE_SEEDS = {"npu": 1, "bench": 2}


class Denoiser(nn.Module):
    """A small noise-prediction model with two device-side draws (a randint for the timesteps, a rand_like)."""

    alpha_bar: torch.Tensor  # a buffer

    def __init__(self, dim: int = 16, steps: int = 50, hidden: int = 32):
        super().__init__()
        self.steps = steps
        self.t_embed = nn.Embedding(steps, dim)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.register_buffer("alpha_bar", torch.cumprod(torch.linspace(0.99, 0.5, steps), 0))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        t = torch.randint(0, self.steps, (x0.shape[0],), device=x0.device)  # timesteps, drawn on the device
        noise = torch.rand_like(x0)  # noise, drawn on the device
        a = self.alpha_bar[t].unsqueeze(1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        pred = self.net(xt + self.t_embed(t))
        return F.mse_loss(pred, noise)


def machine_device(machine: str) -> torch.device:
    """Where a machine runs: CUDA for the "npu" side when there is one, else the CPU."""
    if machine == "npu" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def training_step(dump_path, machine: str = "npu", *, seed: int = 0, level: str = "mix", steps: int = 1,
                  **options):
    """Build the model with ``seed``, record ``steps`` training steps on ``machine``, return the Dump."""
    import msprobe_nb
    from msprobe_nb.store.dump import load

    device = machine_device(machine)
    torch.manual_seed(seed)
    model = Denoiser().to(device)
    x0 = torch.randn(8, 16).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if device.type == "cpu":  # emulate this machine's device generator (see the module docstring)
        torch.manual_seed(EMULATED_DEVICE_SEEDS[machine])
    dbg = msprobe_nb.Debugger(dump_path=dump_path, level=level, **options)
    dbg.start(model)
    for _ in range(steps):
        loss = model(x0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.step()
    dbg.close()
    assert dbg.dump_dir is not None, "the run recorded steps, so its dump folder stays"
    return load(dbg.dump_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="msprobe_nb.demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the dumps, kept (default: a temporary folder, removed at the end)")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="msprobe_nb_demo_"))
    try:
        ok = _run(out)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
            print(f"removed the demo's temporary folder {out} (keep the dumps with --out DIR)")
    print(NEXT)
    return 0 if ok else 1


#: what to do after the demo
NEXT = ("next: the same story step by step in notebooks/03_randomness.ipynb (jupyter lab notebooks/), your own "
        "runs with notebooks/01_quickstart.ipynb, or msprobe-nb compare NPU_DUMP BENCH_DUMP on two dumps")


def _run(out: Path) -> bool:
    """The demo's four steps, dumps under ``out``; True when the fix makes every call agree."""
    from msprobe_nb.analysis.compare import compare
    from msprobe_nb.analysis.provenance import trace_randomness

    print(f"1. record one training step on each machine (npu: {machine_device('npu')}, bench: cpu) -> {out}")
    npu = training_step(out / "npu", "npu")
    bench = training_step(out / "bench", "bench")
    result = compare(npu, bench)
    print(f"2. compare: {result.counts()}")
    print(result.first_divergence())
    print("3. trace it back to its random source:")
    print(trace_randomness(result))
    print("4. rerun both with random numbers drawn on the host (host_random=True)")
    npu = training_step(out / "npu_host", "npu", host_random=True)
    bench = training_step(out / "bench_host", "bench", host_random=True)
    result = compare(npu, bench)
    counts = result.counts()
    print(f"   compare: {counts}; first divergence: {result.first_divergence()}")
    ok = counts["error"] == 0 and counts["diverging"] == 0
    print("   every call agrees" if ok else "   the runs still differ")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
