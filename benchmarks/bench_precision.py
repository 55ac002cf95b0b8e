"""The precision model's added cost: compare() of two 1,000,000-row statistics dumps with the verdicts
(the default) and without them (``precision=False``, the exact rule alone, today's compare), in one run;
target at most 1.5x. Also the first divergence on each.

    python benchmarks/bench_precision.py [--rows 1000000] [--repeat 3]

The dumps are bench_compare.py's synthetic tables (in memory, no file I/O timed). Arms alternate; medians.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

from bench_compare import synthetic

from msprobe_nb.analysis.compare import compare


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    npu, bench = synthetic(a.rows)
    times: dict[str, list[float]] = {"exact rule only": [], "with verdicts": []}
    first: dict[str, list[float]] = {"exact rule only": [], "with verdicts": []}
    for _ in range(a.repeat):
        for label, prec in (("exact rule only", False), ("with verdicts", None)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dt, r = timed(lambda p=prec: compare(npu, bench, precision=p))
            times[label].append(dt)
            first[label].append(timed(r.first_divergence)[0])
    base, new = (statistics.median(times[k]) for k in times)
    print(f"compare of {a.rows:,} statistics rows, median of {a.repeat}:")
    for k in times:
        print(f"  {k:16s} {statistics.median(times[k]):6.2f} s   first_divergence() "
              f"{statistics.median(first[k]):5.2f} s")
    print(f"  verdicts / exact rule only: {new / base:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
