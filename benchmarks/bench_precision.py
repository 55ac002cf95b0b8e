"""The precision model's added cost: compare() of two 1,000,000-row statistics dumps with the verdicts
(the default) and without them (``precision=False``, the exact rule alone, today's compare), in one run;
target at most 1.5x. Also the first divergence on each, and the replay of suspect calls (``own_errors``:
each side's recorded inputs replayed in fp64) in ms per call, on tensor dumps recorded in the same run.

    python benchmarks/bench_precision.py [--rows 1000000] [--repeat 3] [--replay-layers 2] [--no-replay]

The dumps are bench_compare.py's synthetic tables (in memory, no file I/O timed). Arms alternate; medians.
The replay's dumps: models.py's classifier (``--replay-layers`` layers, eval mode), one training step at L1,
task tensor, under bf16 autocast, recorded twice; every judged API call is replayed on both sides.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

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
    ap.add_argument("--replay-layers", type=int, default=2)
    ap.add_argument("--no-replay", action="store_true", help="skip the replay's cost")
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
    if not a.no_replay:
        replay_cost(a.replay_layers, a.repeat)


def _record(path: Path, layers: int):
    import models
    import torch

    from msprobe_nb.debugger import Debugger
    from msprobe_nb.store.dump import load
    w = models.build(layers)
    w.model.eval()
    tokens, labels = w.make_batch()
    dbg = Debugger(dump_path=str(path), level="L1", task="tensor")
    dbg.start(w.model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(w.model(tokens).float(), labels)
    loss.backward()
    dbg.stop()
    return load(str(path))


def replay_cost(layers: int, repeat: int) -> None:
    """ms per replayed call (both sides, every variant): all judged API calls, and the default suspects."""
    from msprobe_nb.precheck.own_error import own_errors
    with tempfile.TemporaryDirectory() as tmp:
        npu, bench = _record(Path(tmp) / "npu", layers), _record(Path(tmp) / "bench", layers)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = compare(npu, bench)
        judged = r[(r["verdict"] != "") & ~r["call"].str.startswith("Module.")]
        calls = list(dict.fromkeys(judged["call"]))
        per_call, suspects = [], []
        for _ in range(repeat):
            dt, m = timed(lambda: own_errors(r, calls=calls, refine_verdicts=False))
            per_call.append(dt * 1e3 / len(calls))
            dt, m2 = timed(lambda: own_errors(r.copy(), n=8))
            suspects.append((dt * 1e3, m2["call"].nunique()))
        measured = m[m["own_ratio"].notna()]
        ms, n_sus = statistics.median(s[0] for s in suspects), suspects[0][1]
        print(f"replay of suspect calls (tensor task, {layers}-layer classifier, bf16 autocast, L1), median of "
              f"{repeat}:")
        print(f"  every judged API call: {len(calls)} calls, {statistics.median(per_call):.1f} ms per call "
              f"(both sides; {len(measured)} outputs measured, largest own error "
              f"{measured['own_ratio'].max():.2f}x its bound)")
        print(f"  own_errors(result) (default suspects and their neighbours): {n_sus} calls in {ms:.0f} ms, "
              f"{ms / max(n_sus, 1):.1f} ms per call, verdicts refined")


if __name__ == "__main__":
    main()
