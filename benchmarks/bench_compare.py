"""Time compare(): statistics dumps of 7,000 rows (target < 0.2 s) and 1,000,000 rows (< 10 s), and a
tensor-mode compare of about 7,000 whole tensors (target < 2 s; msprobe took 8 s for 7,000 on this machine).

    python benchmarks/bench_compare.py [--rows 7000 1000000] [--repeat 3] [--no-tensor]

Statistics: each dump is a calls table made with the schema (no file I/O is timed); the bench side is the
NPU side with perturbed statistics, a few renamed calls (unmatched rows) and a recomputed backward order.
Tensor mode: two real tensor-mode HDF5 dumps of one training step of the benchmark transformer (the "npu"
side with bf16-rounded attention scores), compared from disk: loading each tensor is part of the time.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from msprobe_nb.analysis.compare import compare
from msprobe_nb.store.schema import coerce_calls

OPS = ["linear", "gelu", "layer_norm", "matmul", "softmax", "dropout", "add", "mul"]


def synthetic(rows: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """An (NPU, bench) pair of calls tables with ``rows`` rows each (4 rows per call)."""
    rng = np.random.default_rng(seed)
    n_calls = rows // 4
    half = n_calls // 2
    op = np.array(OPS, dtype=object)[rng.integers(0, len(OPS), n_calls)]
    direction = np.where(np.arange(n_calls) < half, "forward", "backward").astype(object)
    counter = pd.Series(op).groupby([op, direction]).cumcount().to_numpy()
    family = np.where(np.isin(op, ["matmul", "softmax"]), "Torch", "Functional").astype(object)
    call = np.array([f"{f}.{o}.{c}.{d}" for f, o, c, d in zip(family, op, counter, direction)], dtype=object)
    io = np.array(["input", "input", "input", "output"], dtype=object)
    arg = np.array(["0", "1", "2", "0"], dtype=object)
    r_call = np.repeat(call, 4)
    r_io, r_arg = np.tile(io, n_calls), np.tile(arg, n_calls)
    name = np.array([f"{c}.{i}.{a}" for c, i, a in zip(r_call, r_io, r_arg)], dtype=object)
    n = len(name)
    mx = rng.normal(3, 1, n)
    stats = {"max": mx, "min": -mx, "mean": rng.normal(0, 0.1, n), "norm": np.abs(rng.normal(50, 10, n))}
    base = {
        "step": np.zeros(n, dtype=np.int32), "rank": np.zeros(n, dtype=np.int32),
        "call_index": np.repeat(np.arange(n_calls), 4), "call": r_call, "name": name,
        "family": np.repeat(family, 4), "op": np.repeat(op, 4), "counter": np.repeat(counter, 4),
        "direction": np.repeat(direction, 4), "io": r_io, "arg": r_arg, "kind": "tensor",
        "dtype": "torch.float32", "shape": [(8, 16)] * n, "requires_grad": True,
    }
    npu = coerce_calls(pd.DataFrame({**base, **stats}))
    noisy = {k: v * (1 + rng.normal(0, 1e-4, n)) for k, v in stats.items()}
    b = dict(base)
    b_name = name.copy()
    renamed = rng.choice(n, size=max(1, n // 1000), replace=False)  # a few rows only on one side each
    b_name[renamed] = np.array([s + "_x" for s in b_name[renamed]], dtype=object)
    b["name"] = b_name
    bench = coerce_calls(pd.DataFrame({**b, **noisy}))
    return npu, bench


def tensor_mode(layers: int = 42) -> None:
    """Record two tensor-mode dumps of the benchmark model and time the tensor-mode compare."""
    import torch

    import msprobe_nb
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import models

    out = Path(tempfile.mkdtemp(prefix="bench_compare_tensor_"))
    for side in ("npu", "bench"):
        w = models.build(layers)
        if side == "npu":  # one layer computes slightly differently, as on another chip
            with torch.no_grad():
                w.model.layers[layers // 2].up.weight.mul_(1 + 1e-3)
        with msprobe_nb.record(dump_path=out / side, task="tensor", level="L1", model=w.model):
            w.step()
    npu, bench = msprobe_nb.load(out / "npu"), msprobe_nb.load(out / "bench")
    n = int((npu.calls.kind == "tensor").sum())
    t0 = time.perf_counter()
    res = compare(npu, bench, mode="tensor", progress=False)
    dt = time.perf_counter() - t0
    first = res.first_divergence()
    print(f"tensor mode: {n:,} tensor rows compared in {dt:.2f} s (target 2 s); first divergence "
          f"{first.call if first else None}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[7000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-tensor", action="store_true", help="skip the tensor-mode compare")
    a = ap.parse_args()
    for rows in a.rows:
        npu, bench = synthetic(rows)
        times, cpu = [], []
        for _ in range(a.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            res = compare(npu, bench, progress=False)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        res.first_divergence()
        t_div = time.perf_counter() - t0
        t0 = time.perf_counter()
        res.calls_summary()
        t_sum = time.perf_counter() - t0
        c = res.counts()
        print(f"{rows:>9,} rows: compare {min(times):.3f} s (best of {a.repeat}; CPU {min(cpu):.3f} s), "
              f"first_divergence {t_div:.3f} s, "
              f"calls_summary {t_sum:.3f} s; {c['unmatched']} unmatched, {c['warning']} warning, {c['error']} error")
    if not a.no_tensor:
        tensor_mode()


if __name__ == "__main__":
    main()
