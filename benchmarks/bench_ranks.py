"""Compare dumps of many ranks: on Dask (2 workers) against the in-process compare, on the same data.

    python benchmarks/bench_ranks.py [--ranks 64] [--rows 200000] [--workers 2] [--skip-in-process]

Both dumps (NPU and bench) are written by the kit's HDF5 writer, one ``rank<N>.h5`` per rank: calls of 4
rows (3 inputs, 1 output) with an all_reduce every 50 calls; the NPU side has a planted change on the middle
rank, which reaches every rank through the next all_reduce. Each path runs in a fresh subprocess, so the
peak resident memory reported (``ru_maxrss`` of that process: the driver; Dask's workers are processes of
their own and not counted) is that path's alone. The in-process path loads both dumps whole and compares
them; the Dask path gathers per (step, rank) summaries only. Target: the Dask driver under 2 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROWS_PER_CALL = 4
ALL_REDUCE_EVERY = 50
OPS = ("linear", "gelu", "layer_norm", "matmul", "add", "mul")


def _rank_columns(rank: int, rows: int, npu: bool, planted_rank: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One rank's calls of one step as writer columns (every schema column the compare reads)."""
    n_calls = max(rows // ROWS_PER_CALL, 2)
    rng = np.random.default_rng(seed * 1000 + rank)
    is_ar = (np.arange(n_calls) % ALL_REDUCE_EVERY) == ALL_REDUCE_EVERY - 1
    op = np.array(OPS, dtype=object)[rng.integers(0, len(OPS), n_calls)]
    op[is_ar] = "all_reduce"
    family = np.where(is_ar, "Distributed", "Functional").astype(object)
    counter = np.zeros(n_calls, dtype=np.int64)
    for o in set(op):
        at = op == o
        counter[at] = np.arange(int(at.sum()))
    call = np.array([f"{f}.{o}.{c}.forward" for f, o, c in zip(family, op, counter)], dtype=object)
    r_call = np.repeat(call, ROWS_PER_CALL)
    io = np.tile(np.array(["input", "input", "input", "output"], dtype=object), n_calls)
    arg = np.tile(np.array(["0", "1", "2", "0"], dtype=object), n_calls)
    name = np.array([f"{c}.{i}.{a}" for c, i, a in zip(r_call, io, arg)], dtype=object)
    n = len(name)
    mx = np.abs(rng.normal(3, 1, n)) + 0.5
    stats = {"max": mx, "min": -mx, "mean": rng.normal(0, 0.1, n), "norm": np.abs(rng.normal(50, 10, n)) + 1}
    if not npu:  # the bench side: the same values within rounding noise
        stats = {k: v * (1 + rng.normal(0, 1e-6, n)) for k, v in stats.items()}
    else:  # the planted change: one rank's output of its middle call, every rank's after the next all_reduce
        mid = n_calls // 2 - int(is_ar[n_calls // 2])
        after = np.flatnonzero(is_ar[mid:]) + mid
        start = mid if rank == planted_rank else (int(after[0]) if len(after) else n_calls)
        for k in ("max", "norm"):
            stats[k][start * ROWS_PER_CALL + 3:] *= 1.05
    return {
        "call_index": np.repeat(np.arange(n_calls, dtype=np.int64), ROWS_PER_CALL), "call": r_call, "name": name,
        "family": np.repeat(family, ROWS_PER_CALL), "op": np.repeat(op, ROWS_PER_CALL),
        "counter": np.repeat(counter, ROWS_PER_CALL), "direction": np.full(n, "forward", dtype=object),
        "io": io, "arg": arg, "kind": np.full(n, "tensor", dtype=object),
        "dtype": np.full(n, "torch.float32", dtype=object), "shape": [(8, 16)] * n,
        "numel": np.full(n, 128, dtype=np.int64), "requires_grad": np.ones(n, dtype=bool), **stats,
        "nan_count": np.zeros(n, dtype=np.int64), "posinf_count": np.zeros(n, dtype=np.int64),
        "neginf_count": np.zeros(n, dtype=np.int64), "stack_id": np.full(n, -1, dtype=np.int64),
    }


def write_dumps(root: Path, ranks: int, rows: int, steps: int = 1) -> tuple[Path, Path]:
    """Write ``root/npu`` and ``root/bench``: ``ranks`` rank files of ``rows`` rows per step each."""
    from msprobe_nb.store.hdf5_writer import DumpWriter

    planted = ranks // 2
    for side in ("npu", "bench"):
        d = root / side
        d.mkdir(parents=True, exist_ok=True)
        for r in range(ranks):
            with DumpWriter(d, rank=r, meta={"task": "statistics", "level": "L1", "world_size": ranks}) as w:
                for s in range(steps):
                    w.write_step(s, _rank_columns(r, rows, side == "npu", planted, seed=s), {}, {}, {})
    return root / "npu", root / "bench"


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_path(path: str, npu: str, bench: str, workers: int) -> dict:
    """One path, measured in this process: wall time, peak RSS, counts and the first divergence."""
    t0 = time.perf_counter()
    if path == "in_process":
        import msprobe_nb
        res = msprobe_nb.compare(npu, bench)
        counts, first = res.counts(), res.first_divergence()
    else:
        from msprobe_nb.analysis.dask_compare import compare_on_dask
        res = compare_on_dask(npu, bench, workers=workers, progress=False)
        counts, first = res.counts(), res.first_divergence()
    wall = time.perf_counter() - t0
    return {"path": path, "wall_s": wall, "peak_rss_mib": _peak_rss_mib(),
            "rows": counts["rows"], "error": counts["error"],
            "first": None if first is None else [first.step, first.rank, first.call]}


def _child(path: str, npu: Path, bench: Path, workers: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, "--npu", str(npu), "--bench", str(bench),
                          "--workers", str(workers)], capture_output=True, text=True, env={**os.environ})
    if out.returncode != 0:
        return {"path": path, "failed": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--rows", type=int, default=200_000, help="rows per rank (per side)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--skip-in-process", action="store_true", help="only the Dask path (the in-process one needs "
                                                                   "every row of both dumps in memory)")
    p.add_argument("--keep", help="write the dumps here and keep them, or reuse those written there by an earlier "
                                  "run of the same sizes (default: a temporary folder)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--npu", help=argparse.SUPPRESS)
    p.add_argument("--bench", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(run_path(a.child, a.npu, a.bench, a.workers)))
        return 0
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench_ranks_"))
    t0 = time.perf_counter()
    marker = root / f"written_{a.ranks}x{a.rows}"
    if a.keep and marker.exists():
        npu, bench = root / "npu", root / "bench"
        print(f"reusing the dumps in {root}")
    else:
        npu, bench = write_dumps(root, a.ranks, a.rows)
        marker.touch()
    size = sum(f.stat().st_size for f in root.rglob("*.h5")) / 2 ** 20
    print(f"{a.ranks} ranks x {a.rows} rows per side ready in {time.perf_counter() - t0:.1f} s ({size:.0f} MiB "
          f"on disk, {root})")
    paths = ["dask"] + ([] if a.skip_in_process else ["in_process"])
    results = {path: _child(path, npu, bench, a.workers) for path in paths}
    for r in results.values():
        if "failed" in r:
            print(f"{r['path']:>10}: failed: {r['failed']}")
        else:
            print(f"{r['path']:>10}: {r['wall_s']:8.1f} s, driver peak RSS {r['peak_rss_mib']:8.0f} MiB, "
                  f"{r['rows']} rows, {r['error']} errors, first divergence {r['first']}")
    d, i = results.get("dask", {}), results.get("in_process", {})
    if "wall_s" in d and "wall_s" in i:
        print(f"dask / in-process: time {d['wall_s'] / i['wall_s']:.2f}x, driver peak memory "
              f"{d['peak_rss_mib'] / i['peak_rss_mib']:.2f}x; same rows and first divergence: "
              f"{d['rows'] == i['rows'] and d['first'] == i['first']}")
    ok = "peak_rss_mib" in d and d["peak_rss_mib"] < 2048
    print(f"target: Dask driver peak under 2048 MiB: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
