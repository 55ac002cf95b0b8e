"""What recording costs a training step of real models: eight tiny Hugging Face / diffusers models.

Run from the repository root (``. .venv/bin/activate`` first; needs the ``bench`` extra: transformers and
diffusers)::

    python benchmarks/bench_real_models.py                     # every model, level and task
    python benchmarks/bench_real_models.py --models gpt2,vit --steps 6
    python benchmarks/bench_real_models.py --trees before=/tmp/base,after=.   # A/B of two msprobe_nb trees
    python benchmarks/bench_real_models.py --optimizer loop                    # AdamW's per-parameter loop only
    python benchmarks/bench_real_models.py --repeat 3          # three processes per cell: their median ratio

The models are those of ``recording/real_models.py`` (random weights from configs, offline; an AdamW
training step, by default twice: AdamW's loop over the parameters, the CPU's default, and its ``foreach``
path, the default on GPUs and NPUs, reported as ``<model>/foreach``). Each (model, configuration) runs in its
own subprocess through the recording benchmark's
child (``recording/child.py``): after warm-up, plain and recorded steps alternate in blocks in that one
process, one torch thread, CPU time; the ratio is median(recorded) / median(plain), the targets' measure.
The statistics L1 configuration also gets mean(recorded) / mean(plain) ("L1 mean"): the median leaves out the
steps that compress and write a full chunk of the calls table, which a run's total time pays. Peak memory is the
subprocess's ``ru_maxrss`` against the model's ``none`` subprocess. msprobe (``mindstudio-probe``) runs the
same models and configurations in the same run when an interpreter can import it; otherwise the output
says so. With ``--trees`` every kit configuration runs once per tree (``PYTHONPATH`` set to it), the trees
alternating process by process, so two versions of the kit are compared in one run. With ``--repeat N`` each
cell is measured in N processes (rounds over every model and configuration, so drift spreads over all cells),
and the table gives the median of their ratios; a miss names their range.

It prints each target with its measured ratio and by how much it is missed, then a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from recording.configs import KIT_CONFIGS, MS_CONFIGS
from recording.real_models import MODELS
from recording.report import mean_ratio, med, merge_runs, time_ratio
from recording.runner import find_msprobe_python, kernel_note, run_child

#: the configurations measured, in table order, and their msprobe twins
CONFIGS = ("stat-L0", "stat-L1", "stat-mix", "tensor-L1")
TWINS = {c: "ms-" + c for c in CONFIGS}
#: time targets (recorded / plain) and the peak-memory target of the statistics configurations: issue 37's
#: (statistics L1 3x, mix 3.5x, L0 1.6x); tensor L1 keeps the earlier bound, which 37 asks not to worsen
TIME_TARGETS = {"stat-L1": 3.0, "stat-mix": 3.5, "stat-L0": 1.6, "tensor-L1": 8.0}
MEM_TARGET = 1.10
MEM_CONFIGS = ("stat-L0", "stat-L1", "stat-mix")
LABELS = {"stat-L0": "L0", "stat-L1": "L1", "stat-mix": "mix", "tensor-L1": "tensor L1"}
#: --optimizer -> AdamW's foreach flag per run of a model: its per-parameter loop (the CPU default) and its
#: multi-tensor path (the GPU and NPU default), which record very different numbers of optimizer calls
OPTIMIZERS = {"loop": (False,), "foreach": (True,), "both": (False, True)}


def mem_ratio(run: dict, none: dict | None) -> float | None:
    """Peak RSS of a configuration's process over the plain (``none``) process of the same model."""
    if not none or not run.get("peak_rss_kib") or not none.get("peak_rss_kib"):
        return None
    return run["peak_rss_kib"] / none["peak_rss_kib"]


def summarize(results: dict, trees: list[str]) -> tuple[str, str, list[str]]:
    """(the printed table, the markdown table, the missed targets) of ``results[tree][model][config]``.

    Pure arithmetic on the children's numbers (tested on made-up timings in ``tests/test_benchmarks.py``)."""
    lines, md, missed = [], [], []
    cols = [LABELS[c] for c in CONFIGS] + ["L1 mean", "peak mem"]
    head = f"{'tree':8} {'model':12} {'plain ms':>8} " + " ".join(f"{c:>10}" for c in cols) + f" {'calls L1':>8}"
    lines += [head, "-" * len(head)]
    md.append("| model | plain ms/step | " + " | ".join(cols) + " | calls (L1) |")
    md.append("|---|---|" + "---|" * len(cols) + "---|")
    for tree in trees:
        for model, res in results.get(tree, {}).items():
            none = res.get("none")
            cells, mdcells, mems = [], [], []
            for cfg in CONFIGS:
                r = res.get(cfg)
                if r is None:
                    cells.append(f"{'-':>10}")
                    mdcells.append("-")
                    continue
                ratio = time_ratio(r)
                twin = res.get(TWINS[cfg])
                ms = f" (msprobe {time_ratio(twin):.1f}x)" if twin else ""
                cells.append(f"{ratio:9.2f}x")
                mdcells.append(f"{ratio:.2f}x{ms}")
                target = TIME_TARGETS[cfg]
                if ratio > target:
                    runs = f", runs {min(r['ratios']):.2f}-{max(r['ratios']):.2f}x" if r.get("ratios") else ""
                    missed.append(f"{tree} {model} {LABELS[cfg]}: {ratio:.2f}x > target {target:g}x "
                                  f"(missed by {ratio / target:.2f}x{runs})")
                m = mem_ratio(r, none)
                if m is not None and cfg in MEM_CONFIGS:
                    mems.append((m, cfg))
            l1 = mean_ratio(res["stat-L1"]) if res.get("stat-L1") else None
            cells.append(f"{l1:9.2f}x" if l1 is not None else f"{'-':>10}")
            mdcells.append(f"{l1:.2f}x" if l1 is not None else "-")
            worst = max(mems) if mems else None
            if worst and worst[0] > MEM_TARGET:
                missed.append(f"{tree} {model} peak memory ({LABELS[worst[1]]}): {worst[0]:.3f}x plain > target "
                              f"{MEM_TARGET:.2f}x (missed by {(worst[0] - MEM_TARGET) * 100:.1f} points)")
            mem = f"{worst[0]:.3f}x" if worst else "-"
            plain = med(none["base_ms"] + none["with_ms"]) if none else float("nan")
            calls = (res.get("stat-L1") or {}).get("calls", "")
            lines.append(f"{tree:8} {model:12} {plain:8.1f} " + " ".join(cells) + f" {mem:>10} {calls!s:>8}")
            md.append(f"| {model}{'' if len(trees) == 1 else f' ({tree})'} | {plain:.1f} | " + " | ".join(mdcells)
                      + f" | {mem} | {calls} |")
    return "\n".join(lines), "\n".join(md), missed


def targets_report(results: dict, trees: list[str]) -> list[str]:
    """Every target with the worst measured ratio over the models (per tree) and by how much it is missed."""
    out = []
    for tree in trees:
        res = results.get(tree, {})
        for cfg in CONFIGS:
            got = [(time_ratio(r[cfg]), m) for m, r in res.items() if r.get(cfg)]
            if not got:
                continue
            worst, model = max(got)
            best, _ = min(got)
            target = TIME_TARGETS[cfg]
            verdict = "met" if worst <= target else f"MISSED by {worst / target:.2f}x (worst: {model})"
            out.append(f"{tree:8} {LABELS[cfg]:9} target ≤{target:g}x: measured {best:.2f}x-{worst:.2f}x: {verdict}")
            if cfg == "stat-L1":  # no target of its own: what the median leaves out, shown beside it
                means = sorted(mean_ratio(r[cfg]) for r in res.values() if r.get(cfg))
                out.append(f"{tree:8} {'L1 mean':9} (mean step, no target): {means[0]:.2f}x-{means[-1]:.2f}x")
        mems = [(mem_ratio(r[c], r.get("none")), m) for m, r in res.items() for c in MEM_CONFIGS if r.get(c)]
        mems = [x for x in mems if x[0] is not None]
        if mems:
            worst, model = max(mems)
            verdict = ("met" if worst <= MEM_TARGET else
                       f"MISSED by {(worst - MEM_TARGET) * 100:.1f} points (worst: {model})")
            out.append(f"{tree:8} {'peak mem':9} target ≤{MEM_TARGET:.2f}x: measured up to {worst:.3f}x: {verdict}")
    return out


def _parse_trees(arg: str | None) -> dict[str, str | None]:
    if not arg:
        return {"kit": None}
    trees = {}
    for part in arg.split(","):
        name, _, path = part.partition("=")
        if not path or not os.path.isdir(os.path.join(path, "msprobe_nb")):
            raise SystemExit(f"--trees: {part!r} is not NAME=PATH with PATH/msprobe_nb a folder")
        trees[name] = os.path.abspath(path)
    return trees


def _run_in(tree: str | None, spec: dict, timeout: float) -> dict | None:
    """One child, with ``tree`` first on ``PYTHONPATH`` (so its msprobe_nb is the one imported)."""
    old = os.environ.get("PYTHONPATH")
    if tree:
        os.environ["PYTHONPATH"] = tree + (os.pathsep + old if old else "")
    try:
        return run_child(sys.executable, spec, timeout)
    finally:
        if tree:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma list (default: all eight)")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma list of " + ", ".join(CONFIGS))
    p.add_argument("--steps", type=int, default=8, help="timed steps per arm (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per arm (default 2)")
    p.add_argument("--block", type=int, default=2, help="timed steps per block (default 2)")
    p.add_argument("--trees", help="NAME=PATH,...: A/B the kit of several source trees, alternating processes")
    p.add_argument("--msprobe-python", help="interpreter that can `import msprobe` (default: auto-detect)")
    p.add_argument("--no-msprobe", action="store_true", help="skip msprobe")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="both",
                   help="AdamW's per-parameter loop, its foreach path, or both (default)")
    p.add_argument("--repeat", type=int, default=1,
                   help="processes per (model, configuration, tree); the median of their ratios (default 1)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--tmp", help="folder for the temporary dumps")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"--configs: unknown {c!r}; expected {', '.join(CONFIGS)}")
    trees = _parse_trees(args.trees)
    if args.repeat < 1:
        raise SystemExit(f"--repeat: expected at least 1, got {args.repeat}")
    if args.no_msprobe:
        ms_py, ms_note = None, "not measured (--no-msprobe)"
    else:
        ms_py, found = find_msprobe_python(args.msprobe_python)
        ms_note = (f"measured with {ms_py} ({found})" if ms_py
                   else f"NOT measured: mindstudio-probe is not installed ({found})")
    print(f"msprobe: {ms_note}", flush=True)
    print(f"msprobe_nb: {kernel_note()}", flush=True)

    def spec(model, name, tool, opts, foreach):
        return {"name": name, "tool": tool, "opts": opts, "size": model, "steps": args.steps, "block": args.block,
                "warmup": args.warmup, "tmp": args.tmp, "workloads": "recording.real_models",
                "build": {"foreach": foreach}}

    runs: dict = {t: {} for t in trees}  # tree -> label -> config -> the processes' results
    t0 = time.time()
    for _ in range(args.repeat):
        for model, foreach in ((m, f) for m in models for f in OPTIMIZERS[args.optimizer]):
            label = f"{model}/foreach" if foreach else model
            for tree_name, tree in trees.items():
                r = _run_in(tree, spec(model, "none", "none", {}, foreach), 900)
                if r:
                    runs[tree_name].setdefault(label, {}).setdefault("none", []).append(r)
            for cfg in configs:
                for tree_name, tree in trees.items():
                    tool, opts = KIT_CONFIGS[cfg]
                    r = _run_in(tree, spec(model, cfg, tool, opts, foreach), 1800)
                    if r:
                        runs[tree_name].setdefault(label, {}).setdefault(cfg, []).append(r)
                        print(f"  {tree_name} {label} {cfg}: {med(r['base_ms']):.1f} -> {med(r['with_ms']):.1f} "
                              f"ms/step ({time_ratio(r):.2f}x)", flush=True)
            if ms_py:
                for name in ["ms-none"] + [TWINS[c] for c in configs]:
                    tool, opts = MS_CONFIGS[name]
                    r = run_child(ms_py, spec(model, name, tool, opts, foreach), 1800)
                    if r:
                        for tree_name in trees:
                            runs[tree_name].setdefault(label, {}).setdefault(name, []).append(r)
    results = {t: {label: {cfg: merge_runs(rs) for cfg, rs in cells.items()} for label, cells in by.items()}
               for t, by in runs.items()}
    title = (f"Recording overhead on real models ({time.time() - t0:.0f} s; median CPU ms per step, "
             f"{args.steps} timed steps per arm after {args.warmup} warm-up, blocks of {args.block}; one thread"
             + (f"; {args.repeat} processes per cell, the median of their ratios)" if args.repeat > 1 else ")"))
    table, markdown, missed = summarize(results, list(trees))
    print()
    print(title)
    print(table)
    print()
    print("Targets (worst model):")
    for line in targets_report(results, list(trees)):
        print("  " + line)
    print()
    if missed:
        print("Missed, per model:")
        for m in missed:
            print("  - " + m)
    else:
        print("All targets met on every model.")
    print(f"\nmsprobe: {ms_note}")
    print("\nMarkdown:\n")
    print(markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "msprobe": ms_note, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
