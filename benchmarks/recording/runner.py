"""The parent side of ``bench_recording.py``: find msprobe, start one subprocess per configuration, collect.

:func:`run` is the whole measured run (every workload, every configuration, the dump-growth check); each
configuration runs in a fresh ``bench_recording.py --child SPEC`` process (:func:`run_child`), so its peak
RSS is its own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from .configs import KIT_CONFIGS, MS_CONFIGS, RESULT_TAG, SCRIPT
from .report import med, merge_runs

__all__ = ["find_msprobe_python", "kernel_note", "run", "run_child"]


def find_msprobe_python(arg: str | None) -> tuple[str | None, str]:
    """(an interpreter that can ``import msprobe.pytorch``, its torch and mindstudio-probe versions), or
    (None, why not)."""
    candidates = [arg] if arg else [os.environ.get("MSPROBE_PYTHON"), sys.executable, "/tmp/msvenv/bin/python"]
    tried = []
    for py in candidates:
        if not py or not os.path.exists(py):
            continue
        r = subprocess.run([py, "-c", "import torch, msprobe.pytorch, importlib.metadata as m;"
                                      "print(torch.__version__, m.version('mindstudio-probe'))"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return py, r.stdout.strip().splitlines()[-1]
        tried.append(py)
    return None, "no interpreter could `import msprobe.pytorch` (tried: " + (", ".join(tried) or "none") + ")"


def run_child(py: str, spec: dict, timeout: float) -> dict | None:
    """One configuration in a fresh ``py`` process (one torch thread): its results, or None (said why)."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        r = subprocess.run([py, SCRIPT, "--child", json.dumps(spec)],
                           capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  ! {spec['size']} {spec['name']}: timed out after {timeout:.0f} s", flush=True)
        return None
    for line in reversed(r.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-8:])
    print(f"  ! {spec['size']} {spec['name']}: child failed (rc {r.returncode}):\n{tail}", flush=True)
    return None


def kernel_note() -> str:
    """Which paths compute the kit's CPU statistics, stack keys, rows, L1 handler, API backward and module hooks
    here: the optional C extensions or their pure torch / Python fallbacks."""
    try:
        from msprobe_nb.capture import api_mode, grad_hooks, module_hooks, recorder, stacks, stats
    except ImportError as exc:
        return f"unknown (msprobe_nb does not import: {exc})"
    # private module attributes: the package has no public way to ask whether its C extensions were built
    parts = ["statistics: " + ("one-pass C kernel for float32 tensors, views along their strides"
                               if stats._fused_at is not None
                               else "torch reductions (the C kernel is not built: no C compiler at install?)"),
             "stack keys: " + ("C walk" if stacks._stack_key is not None else "Python walk"),
             "rows: " + ("C" if recorder._build_rows is not None else "Python"),
             "L1 handler: " + ("C" if api_mode._api_handler is not None else "Python"),
             "API backward: " + ("C" if grad_hooks._api_backward is not None else "Python"),
             "module hooks: " + ("C" if module_hooks._module_hooks is not None else "Python")]
    return "; ".join(parts)


def run(args) -> tuple[dict, list[str]]:
    """Measure what ``args`` (the parsed command line) asks for: (the results, with their ``meta``; the
    workloads), printing progress as it goes."""
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    wanted = set(args.configs.split(",")) if args.configs else None
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    repeat_import = args.repeat_import or (1 if args.quick else 3)
    growth_steps = args.growth_steps if args.growth_steps is not None else (25 if args.quick else 100)

    def repeat(size: str) -> int:
        if args.repeat:
            return args.repeat
        return 1 if args.quick or size != "small" else 3

    def measure(py: str, size: str, spec_: dict, res: dict) -> None:
        """One tool configuration in ``repeat(size)`` processes, merged into ``res``."""
        runs = [r for r in (run_child(py, spec_, timeout=1800) for _ in range(repeat(size))) if r]
        if runs:
            res[spec_["name"]] = merge_runs(runs)
            print(f"  {size} {spec_['name']}: " + ", ".join(f"{med(r['base_ms']):.2f} -> {med(r['with_ms']):.2f}"
                                                          for r in runs) + " ms/step", flush=True)
    if args.no_msprobe:
        ms_py, ms_note = None, "columns skipped (--no-msprobe)"
    else:
        ms_py, found = find_msprobe_python(args.msprobe_python)
        ms_note = (f"measured with {ms_py} (torch, mindstudio-probe: {found}); risk_level=ALL (its default FOCUS "
                   "skips 'low-risk' APIs); its baseline = same process before PrecisionDebugger, not interleaved"
                   if ms_py else f"columns skipped: {found}")
    print(f"msprobe: {ms_note}", flush=True)
    kernel = kernel_note()
    print(f"msprobe_nb: {kernel}", flush=True)

    results: dict = {}
    t_start = time.time()
    for size in sizes:
        n = args.steps or ((6 if size == "small" else 3) if args.quick else (30 if size == "small" else 10))
        res = results.setdefault(size, {"_none_meds": [], "_imported_meds": [], "_none_walls": [],
                                        "_imported_walls": []})

        def spec(name, tool, opts, size=size, n=n):
            return {"name": name, "tool": tool, "opts": opts, "size": size, "steps": n, "warmup": warmup,
                    "tmp": args.tmp}

        # none and imported alternate as whole processes (an import cannot be undone inside one)
        for _ in range(repeat_import):
            for name in ("none", "imported"):
                if name == "imported" and wanted and name not in wanted:
                    continue
                r = run_child(sys.executable, spec(name, name, {}), timeout=600)
                if r:
                    res.setdefault(name, r)
                    res[f"_{name}_meds"].append(med(r["base_ms"] + r["with_ms"]))
                    res[f"_{name}_walls"].append(med(r["base_wall_ms"] + r["with_wall_ms"]))
                    print(f"  {size} {name}: {med(r['with_ms']):.2f} ms/step", flush=True)
        for name, (tool, opts) in KIT_CONFIGS.items():
            if tool != "kit" or (wanted and name not in wanted):
                continue
            measure(sys.executable, size, spec(name, tool, opts), res)
        if ms_py:
            for name, (tool, opts) in MS_CONFIGS.items():
                if wanted and name != "ms-none" and name not in wanted and name[3:] not in wanted:
                    continue
                measure(ms_py, size, spec(name, tool, opts), res)
    if growth_steps:
        g = run_child(sys.executable, {"name": "growth", "tool": "growth", "size": "small", "steps": growth_steps,
                                       "opts": {"level": "L1", "task": "statistics"}, "tmp": args.tmp},
                      timeout=1800)
        if g:
            results["_growth"] = g
    title = (f"Recording overhead ({'quick' if args.quick else 'full'} run, {time.time() - t_start:.0f} s; "
             f"ratios of median CPU time per step after {warmup} warm-up steps; one torch thread)")
    results["meta"] = {"title": title, "msprobe": ms_note, "kernel": kernel}
    return results, sizes
