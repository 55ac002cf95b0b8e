"""How much does recording slow a training step down, how much does it write, how much memory does it take?

Run from the repository root (``. .venv/bin/activate`` first)::

    python benchmarks/bench_recording.py --quick          # about 3 minutes
    python benchmarks/bench_recording.py                  # the full run, about 9 minutes
    python benchmarks/bench_recording.py --profile        # cProfile of statistics L1 and mix (small model)

Every configuration runs in its own fresh subprocess (so its peak RSS is its own) on the two workloads of
``benchmarks/models.py`` (``small``: 2 layers, ``large``: 45 layers; one CPU thread). Inside a kit
subprocess, after warm-up, steps *without* the kit and steps *with* it run in alternating blocks (plain
steps after plain steps, recorded after recorded, as in a real run; the first step of each block is not
timed; A B, B A, ... so slow drift of the machine cancels out). The ratio is median(with) /
median(without) from the same process, of CPU time (``time.process_time``: steadier than wall time on a
shared machine; the wall-time ratio is printed beside it). Each configuration of the small model runs in
three processes (``--repeat``) and the median of their ratios is reported, with their range.
A recorded step is the msprobe loop pattern: ``start(model)``, the training step, ``stop()``, ``step()``,
so writing the step to disk is part of what is timed.

msprobe (PyPI ``mindstudio-probe``) is measured on the same workloads when an interpreter that can
``import msprobe`` is found (``--msprobe-python``, ``$MSPROBE_PYTHON``, the current interpreter, or
``/tmp/msvenv/bin/python``); otherwise its rows are skipped with a note. msprobe patches torch when its
``PrecisionDebugger`` is constructed and never unpatches it, so its baseline steps run in the same
process *before* construction (not interleaved). ``risk_level`` is set to ``"ALL"`` (its default ``FOCUS``
silently drops view/reshape/transpose/... calls, which would make it look cheaper than it is).
"""
# The command line only; the pieces live in benchmarks/recording/ by role: configs (what is measured, the
# targets), child (one configuration in its subprocess), runner (the parent side), report (the table and
# its arithmetic), profilers (--profile).
from __future__ import annotations

import argparse
import json
import sys

from recording.child import child
from recording.configs import RESULT_TAG
from recording.profilers import profile
from recording.report import print_report, summarize
from recording.runner import run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few steps: a smoke run of every configuration")
    p.add_argument("--steps", type=int, help="timed steps per arm (default 30 small / 10 large; quick 6 / 3)")
    p.add_argument("--warmup", type=int, help="warm-up steps per arm (default 3; quick 2)")
    p.add_argument("--sizes", default="small,large", help="comma list of workloads (small, large)")
    p.add_argument("--configs", help="comma list of configurations (default: all); 'none' always runs")
    p.add_argument("--repeat-import", type=int, help="none/imported process pairs (default 3; quick 1)")
    p.add_argument("--repeat", type=int, help="processes per tool configuration, median ratio reported "
                                              "(default 3 for the small model, 1 for the large; quick 1)")
    p.add_argument("--growth-steps", type=int, help="steps of the dump-growth check (default 100; quick 25; 0: off)")
    p.add_argument("--msprobe-python", help="interpreter that can `import msprobe` (default: auto-detect)")
    p.add_argument("--no-msprobe", action="store_true", help="skip the msprobe rows")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--tmp", help="folder for the temporary dumps (default: the system's temp folder)")
    p.add_argument("--profile", action="store_true", help="profile statistics L1 and mix on the small model")
    p.add_argument("--from-json", help="print the report of a run saved with --json (runs nothing)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        sizes = [k for k in saved if not k.startswith("_") and k != "meta"]
        meta = saved.get("meta", {})
        report, missed = summarize(saved, sizes, meta.get("msprobe", ""), meta.get("kernel", ""))
        print_report(meta.get("title", ""), report, missed)
        return 0

    if args.child:
        spec = json.loads(args.child)
        print(RESULT_TAG + json.dumps(child(spec)), flush=True)
        return 0
    if args.profile:
        return profile()

    results, sizes = run(args)
    meta = results["meta"]
    report, missed = summarize(results, sizes, meta["msprobe"], meta["kernel"])
    print()
    print_report(meta["title"], report, missed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
