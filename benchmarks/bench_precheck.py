"""Time the API pre-check: replay throughput (APIs per second) on a dump of the benchmark transformer, and the
online task's step time against a plain training step.

    python benchmarks/bench_precheck.py [--size large] [--repeat 3] [--no-online]

Replay: one training step of the model (``benchmarks/models.py``) is recorded at L1, in the tensor task and
in the statistics task; ``acc_check`` of each dump is timed from disk (loading the tensors is part of the
time), and "APIs" counts the forward calls graded (their backward, where recorded, is replayed within).
Online: the median time of a training step with ``task="acc_check"`` (recorded, then replayed and graded at
the step's end) divided by the median time of the same step without the kit.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models  # noqa: E402

import msprobe_nb as mp  # noqa: E402
from msprobe_nb.precheck.acc_check import acc_check  # noqa: E402


def record(size: str, task: str, where: Path) -> Path:
    """One recorded training step of the ``size`` workload."""
    w = models.build(size)
    w.step()  # warm-up, unrecorded
    with mp.record(dump_path=str(where / f"{size}_{task}"), task=task, level="L1", model=w.model) as dbg:
        w.step()
    return dbg.dump_dir


def replay_throughput(path: Path, repeat: int) -> dict:
    """Seconds per full pre-check of the dump at ``path`` (best and median of ``repeat``), forward APIs graded,
    and the verdict counts."""
    times, pre = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        pre = acc_check(path)
        times.append(time.perf_counter() - t0)
    forward = int(pre.loc[pre["direction"] == "forward", "api"].nunique())
    return {"seconds": times, "apis": forward, "outputs": len(pre), "counts": pre.counts()}


def online_ratio(size: str, steps: int, where: Path) -> dict:
    """Median step time with the online pre-check over the median plain step (same workload, same steps)."""
    w = models.build(size)
    w.step()
    base = []
    for _ in range(steps):
        t0 = time.perf_counter()
        w.step()
        base.append(time.perf_counter() - t0)
    w = models.build(size)
    w.step()
    dbg = mp.Debugger(dump_path=str(where / f"{size}_online"), task="acc_check", level="L1", model=w.model)
    dbg.start()
    online = []
    for _ in range(steps):
        t0 = time.perf_counter()
        w.step()
        dbg.step()
        online.append(time.perf_counter() - t0)
    dbg.close()
    pre = dbg.acc_check_result
    return {"base": base, "online": online, "ratio": statistics.median(online) / statistics.median(base),
            "counts": pre.counts()}


def report(results: dict) -> str:
    """The figures as text: APIs per second per task (median run), and the online step-time ratio."""
    lines = []
    for task, r in results.get("replay", {}).items():
        med = statistics.median(r["seconds"])
        c = r["counts"]
        lines.append(f"replay {task:10s}: {r['apis']} forward APIs ({r['outputs']} outputs) in {med:.2f} s median "
                     f"(best {min(r['seconds']):.2f} s) = {r['apis'] / med:.0f} APIs/s; "
                     f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['unchecked']} unchecked")
    o = results.get("online")
    if o:
        lines.append(f"online acc_check: step {statistics.median(o['online']) * 1e3:.0f} ms vs plain "
                     f"{statistics.median(o['base']) * 1e3:.0f} ms median = {o['ratio']:.1f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="large", choices=sorted(models.SIZES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="online: steps timed each way")
    ap.add_argument("--no-online", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        results: dict = {"replay": {}}
        for task in ("tensor", "statistics"):
            results["replay"][task] = replay_throughput(record(a.size, task, where), a.repeat)
        if not a.no_online:
            results["online"] = online_ratio(a.size, a.steps, where)
    print(f"bench_precheck, size {a.size} ({models.SIZES[a.size]} layers), one CPU thread")
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
