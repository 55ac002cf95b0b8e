"""Time the HDF5 store: write 1,000,000 calls rows in 10 steps, then read_hdf5 them into the DataFrame.

Run: ``python benchmarks/bench_store.py [--rows N] [--steps K] [--dir PATH] [--compression C ...]``. Prints
seconds, once per codec (``bitshuffle``, the default, ``lzf``, or a gzip level); the target is read_hdf5 <= 2 s
for 1M rows on a 2-core machine.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from msprobe_nb.store.hdf5_reader import read_hdf5  # noqa: E402
from msprobe_nb.store.hdf5_writer import DumpWriter  # noqa: E402
from msprobe_nb.store.schema import coerce_calls  # noqa: E402


def build_step(step: int, n: int, n_names: int, rng: np.random.Generator) -> dict[str, object]:
    """One step of a realistic table: ~n_names distinct row names repeating every step, 50 stacks."""
    i = np.arange(n)
    call_no = i // 3  # three rows (two inputs, one output) per call
    ops = np.array([f"op{k}" for k in range(200)], dtype=object)
    fams = np.array(["Functional", "Torch", "Tensor", "Module", "NPU"], dtype=object)
    op = ops[call_no % 200]
    fam = fams[call_no % 5]
    calls = np.array([f"{f}.{o}.{c % (n_names // 3)}.forward" for f, o, c in zip(fam, op, call_no, strict=True)],
                     dtype=object)
    io = np.where(i % 3 == 2, "output", "input")
    arg = (i % 3 % 2).astype(str)
    names = calls + "." + io.astype(object) + "." + arg.astype(object)
    kinds = np.where(i % 50 == 0, "value", "tensor")
    shapes = [(int(a), int(b)) for a, b in zip(8 + call_no % 31, 16 * (1 + i % 32), strict=True)]
    return {
        "call_index": call_no.astype(np.int64),
        "call": calls,
        "name": names,
        "family": fam,
        "op": op,
        "module_path": np.array([f"layers.{k % 24}.mlp" for k in call_no], dtype=object),
        "counter": (call_no % 97).astype(np.int32),
        "direction": np.where(call_no % 4 == 3, "backward", "forward"),
        "io": io,
        "arg": arg,
        "is_kwarg": i % 11 == 0,
        "kind": kinds,
        "dtype": np.where(i % 7 == 0, "torch.float32", "torch.bfloat16"),
        "shape": [None if k == "value" else s for k, s in zip(kinds, shapes, strict=True)],
        "numel": np.array([a * b for a, b in shapes], dtype=np.int64),
        "device": np.full(n, "npu:0", dtype=object),
        "requires_grad": i % 5 == 0,
        "max": rng.standard_normal(n),
        "min": rng.standard_normal(n),
        "mean": rng.standard_normal(n),
        "norm": rng.random(n) * 100,
        "nan_count": np.zeros(n, np.int64),
        "posinf_count": np.zeros(n, np.int64),
        "neginf_count": np.zeros(n, np.int64),
        "value_type": np.where(kinds == "value", "int", ""),
        "value": np.where(kinds == "value", (i % 1000).astype(str), ""),
        "stack_id": (call_no % 50).astype(np.int32),
        "parent": np.array([f"Module.layers.{k % 24}.mlp.MLP.forward.{step}" for k in call_no], dtype=object),
        "tensor_id": i.astype(np.int64),
        "producer": np.roll(calls, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--names", type=int, default=100_000)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--repeat", type=int, default=5, help="number of timed reads")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one read")
    ap.add_argument("--compression", nargs="+", default=["bitshuffle"],
                    help="the writer's codecs to measure, one after the other: bitshuffle, lzf or a gzip level")
    args = ap.parse_args()
    for codec in args.compression:
        run(args, int(codec) if codec.isdigit() else codec)


def run(args: argparse.Namespace, compression: str | int) -> None:

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_store_"))
    dump = root / "dump"
    shutil.rmtree(dump, ignore_errors=True)
    per = args.rows // args.steps
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    steps = [build_step(s, per, args.names, rng) for s in range(args.steps)]
    t_build = time.perf_counter() - t0
    stacks = {k: [f"train.py:{10 * k + j} in fn{j}" for j in range(12)] for k in range(50)}

    t0 = time.perf_counter()
    with DumpWriter(dump, rank=0, meta={"task": "statistics", "level": "L1"}, compression=compression) as w:
        for s, cols in enumerate(steps):
            w.write_step(s, cols, stacks, {f"Module.layers.{k}.mlp.MLP.forward.{s}": None for k in range(24)}, {})
    t_write = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in dump.iterdir())
    del steps

    times = []
    for _ in range(args.repeat):
        parts = None
        t0 = time.perf_counter()
        parts = read_hdf5(dump)
        times.append(time.perf_counter() - t0)
    n = len(parts.calls)
    t0 = time.perf_counter()
    coerce_calls(parts.calls)
    t_coerce = time.perf_counter() - t0
    t0 = time.perf_counter()
    read_hdf5(dump, steps=[args.steps - 1])
    t_one = time.perf_counter() - t0

    print(f"compression={compression} rows={n:,} steps={args.steps} "
          f"distinct names={parts.calls['name'].nunique():,} cpus={os.cpu_count()}")
    print(f"build {t_build:.2f} s | write {t_write:.2f} s ({n / t_write / 1e6:.2f} M rows/s) "
          f"| file {size / 1e6:.1f} MB")
    print(f"read_hdf5: best {min(times):.3f} s, median {statistics.median(times):.3f} s "
          f"(runs {', '.join(f'{t:.3f}' for t in times)}; load average {os.getloadavg()[0]:.1f})")
    print(f"coerce_calls on the result alone: {t_coerce:.3f} s | read one step: {t_one:.3f} s")
    if args.profile:
        cProfile.runctx("read_hdf5(dump)", globals(), {"read_hdf5": read_hdf5, "dump": dump}, "/tmp/bench_store.prof")
        pstats.Stats("/tmp/bench_store.prof").sort_stats("tottime").print_stats(15)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
