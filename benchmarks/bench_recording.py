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
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: timed steps per block of each arm (after one untimed step): see child()
BLOCK_STEPS = {"small": 5, "large": 2}
RESULT_TAG = "BENCH_RESULT "

# name -> (tool, options). tool: none | imported | kit | msprobe | msprobe-none
KIT_CONFIGS = {
    "none": ("none", {}),
    "imported": ("imported", {}),
    "idle": ("kit", {"level": "L1", "task": "statistics", "step": [10**9]}),
    "stat-L1": ("kit", {"level": "L1", "task": "statistics"}),
    "stat-L0": ("kit", {"level": "L0", "task": "statistics"}),
    "stat-mix": ("kit", {"level": "mix", "task": "statistics"}),
    "stat-L2": ("kit", {"level": "L2", "task": "statistics"}),
    "md5-L1": ("kit", {"level": "L1", "task": "statistics", "summary_mode": "md5"}),
    "tensor-L1": ("kit", {"level": "L1", "task": "tensor"}),
}
MS_CONFIGS = {
    "ms-none": ("msprobe-none", {}),
    "ms-idle": ("msprobe", {"level": "L1", "task": "statistics", "step": [10**6]}),
    "ms-stat-L1": ("msprobe", {"level": "L1", "task": "statistics"}),
    "ms-stat-L0": ("msprobe", {"level": "L0", "task": "statistics"}),
    "ms-stat-mix": ("msprobe", {"level": "mix", "task": "statistics"}),
    "ms-md5-L1": ("msprobe", {"level": "L1", "task": "statistics", "summary_mode": "md5"}),
    "ms-tensor-L1": ("msprobe", {"level": "L1", "task": "tensor"}),
}
# time ratio targets (with / without) and the memory target for statistics configs
TIME_TARGETS = {"imported": 1.05, "idle": 1.05, "stat-L1": 3.0, "stat-L0": 2.0, "stat-mix": 4.0,
                "tensor-L1": 10.0}
MEM_TARGET = 0.10  # peak RSS at most +10 % over the run without the kit (statistics configs)
MEM_CONFIGS = ("imported", "idle", "stat-L1", "stat-L0", "stat-mix", "stat-L2", "md5-L1")
MS_TWIN = {"idle": "ms-idle", "stat-L1": "ms-stat-L1", "stat-L0": "ms-stat-L0", "stat-mix": "ms-stat-mix",
           "md5-L1": "ms-md5-L1", "tensor-L1": "ms-tensor-L1"}


# =============================================================================== child side
def _dir_bytes(path: str) -> int:
    """Apparent size (sum of st_size) of every file under ``path``."""
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "**"), recursive=True)
               if os.path.isfile(p))


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def _peak_rss_kib() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _recorded_step(dbg, work, train_step):
    """One step in the msprobe loop pattern (start, train, stop, step), the same for both tools."""
    def run(tokens, labels):
        dbg.start(work.model)
        train_step(work.model, work.optimizer, tokens, labels)
        dbg.stop()
        dbg.step()

    return run


def _kit_arm(opts, work, dump_root):
    from models import train_step

    import msprobe_nb

    dbg = msprobe_nb.Debugger(dump_path=os.path.join(dump_root, "kit"), **opts)

    return dbg, _recorded_step(dbg, work, train_step)


def _msprobe_arm(opts, work, dump_root):
    from models import train_step
    from msprobe.pytorch import PrecisionDebugger

    task = opts["task"]
    sub = {"scope": [], "list": [], "data_mode": ["all"]}
    if task == "statistics":
        sub["summary_mode"] = opts.get("summary_mode", "statistics")
    cfg = {"task": task, "dump_path": os.path.join(dump_root, "msprobe"), "rank": [], "step": opts.get("step", []),
           "level": opts["level"], "extra_info": True, "async_dump": False, "risk_level": "ALL", task: sub}
    path = os.path.join(dump_root, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    dbg = PrecisionDebugger(config_path=path)

    return dbg, _recorded_step(dbg, work, train_step)


def _kit_post(dbg, opts, sizes, out, keep_pt_dir):
    """Bytes per step, calls per step and (tensor mode) what msprobe's one-.pt-per-tensor layout would take."""
    dbg.close()
    if dbg.dump_dir is None:
        out.update(bytes_total=0, bytes_first=0, bytes_last=0, calls=0)
        return
    total = _dir_bytes(str(dbg.dump_dir))
    deltas = [b - a for a, b in zip([0] + sizes, sizes)]
    out.update(bytes_total=total, bytes_first=deltas[0], bytes_last=deltas[-1], steps_written=len(sizes))
    dump = dbg.load()
    c = dump.calls
    last = int(c["step"].max())
    cl = c[c["step"] == last]
    out["calls"] = int(cl["call"].nunique())
    out["rows"] = int(len(cl))
    if opts.get("task") == "tensor":
        import torch
        seen: dict[str, int] = {}
        pt_bytes = pt_files = 0
        tdir = tempfile.mkdtemp(dir=keep_pt_dir)
        try:
            for dn in cl["data_name"]:
                if not dn:
                    continue
                if dn not in seen:
                    t = dump.tensor(dn, step=last, rank=int(cl["rank"].iloc[0]))
                    p = os.path.join(tdir, f"{len(seen)}.pt")
                    torch.save(t.detach().contiguous(), p)
                    seen[dn] = os.path.getsize(p)
                    os.remove(p)
                pt_bytes += seen[dn]  # msprobe writes one file per row, even for a tensor seen before
                pt_files += 1
        finally:
            shutil.rmtree(tdir, ignore_errors=True)
        out.update(pt_bytes=pt_bytes, pt_files=pt_files, unique_tensors=len(seen),
                   tensor_bytes=int(cl.loc[cl["data_name"] != "", "numel"].fillna(0).sum()))


def _msprobe_post(dump_root, out):
    steps = sorted(glob.glob(os.path.join(dump_root, "msprobe", "step*")),
                   key=lambda p: int(os.path.basename(p)[4:]))
    if not steps:
        out.update(bytes_total=0, bytes_first=0, bytes_last=0, calls=0)
        return
    sizes = [_dir_bytes(s) for s in steps]
    out.update(bytes_total=sum(sizes), bytes_first=sizes[0], bytes_last=sizes[-1], steps_written=len(steps))
    dumps = glob.glob(os.path.join(steps[-1], "*", "dump.json"))
    if dumps:
        with open(dumps[0]) as f:
            out["calls"] = len(json.load(f).get("data", {}))
    out["pt_files"] = len(glob.glob(os.path.join(steps[-1], "*", "dump_tensor_data", "*.pt")))
    out["pt_bytes"] = sum(os.path.getsize(p) for p in
                          glob.glob(os.path.join(steps[-1], "*", "dump_tensor_data", "*.pt")))


def _growth(spec: dict) -> dict:
    """Dump size after each of ``steps`` recorded steps (one Debugger, started once, ``step()`` per step)."""
    import models
    from models import train_step

    import msprobe_nb

    work = models.build(spec["size"])
    dump_root = tempfile.mkdtemp(prefix="bench_", dir=spec.get("tmp"))
    try:
        dbg = msprobe_nb.Debugger(dump_path=os.path.join(dump_root, "kit"), **spec["opts"])
        dbg.start(work.model)
        sizes, times, rss = [], [], [_rss_kib()]
        for _ in range(spec["steps"]):
            tokens, labels = work.make_batch()
            t0 = time.perf_counter()
            train_step(work.model, work.optimizer, tokens, labels)
            dbg.step()
            times.append((time.perf_counter() - t0) * 1e3)
            sizes.append(_dir_bytes(str(dbg.dump_dir)))
            rss.append(_rss_kib())
        dbg.close()
        rows = int(len(dbg.load().calls))
        sizes.append(_dir_bytes(str(dbg.dump_dir)))
    finally:
        shutil.rmtree(dump_root, ignore_errors=True)
    return {"name": spec["name"], "size": spec["size"], "sizes": sizes, "rows": rows, "with_ms": times, "rss": rss}


def child(spec: dict) -> dict:
    sys.path.insert(0, HERE)
    import models
    from models import train_step

    tool, opts = spec["tool"], spec["opts"]
    if tool == "growth":
        return _growth(spec)
    work = models.build(spec["size"])
    warmup, n = spec["warmup"], spec["steps"]
    base_t, with_t, sizes = [], [], []  # (wall s, CPU s) per timed step

    def timed(fn, *a):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(*a)
        return time.perf_counter() - w0, time.process_time() - c0

    def base_step():
        tokens, labels = work.make_batch()
        return timed(train_step, work.model, work.optimizer, tokens, labels)

    out = {"name": spec["name"], "size": spec["size"], "tool": tool}
    rss_before = _rss_kib()
    # What the tool's imports cost (resident): the modules a recording run loads anyway, loaded up front.
    if tool in ("kit", "imported"):
        import msprobe_nb  # noqa: F401
        if tool == "kit" and not opts.get("step"):  # a recording run loads the writer at its first flush anyway
            import msprobe_nb.store.hdf5_writer  # noqa: F401
    elif tool == "msprobe":
        from msprobe.pytorch import PrecisionDebugger  # noqa: F401
    out["import_kib"] = _rss_kib() - rss_before
    dbg = run = None
    dump_root = tempfile.mkdtemp(prefix="bench_", dir=spec.get("tmp"))
    try:
        if tool in ("msprobe", "msprobe-none"):
            # msprobe patches torch in the PrecisionDebugger constructor: baseline first, then msprobe
            for _ in range(warmup):
                base_step()
            base_t = [base_step() for _ in range(n)]
            if tool == "msprobe":
                dbg, run = _msprobe_arm(opts, work, dump_root)
            for i in range(warmup + n):
                tokens, labels = work.make_batch()
                if run is None:
                    t = timed(train_step, work.model, work.optimizer, tokens, labels)
                else:
                    t = timed(run, tokens, labels)
                if i >= warmup:
                    with_t.append(t)
            out["peak_rss_kib"] = _peak_rss_kib()
            if tool == "msprobe":
                _msprobe_post(dump_root, out)
        else:
            if tool == "kit":
                dbg, run = _kit_arm(opts, work, dump_root)

            def with_step():
                tokens, labels = work.make_batch()
                if run is None:
                    t = timed(train_step, work.model, work.optimizer, tokens, labels)
                else:
                    t = timed(run, tokens, labels)
                if dbg is not None and dbg.dump_dir is not None:
                    sizes.append(_dir_bytes(str(dbg.dump_dir)))
                return t

            for _ in range(warmup):
                base_step()
                with_step()
            # Blocks of steps, as a run has them: plain steps after plain steps, recorded after recorded.
            # (Alternating single steps made each plain step follow a recorded one, whose memory traffic it
            # paid for: ~10 % slower plain steps on the small model, and so a flattering ratio.) The first
            # step of each block is not timed; the blocks alternate A B, B A, so drift cancels.
            block = BLOCK_STEPS[spec["size"]]
            for rnd in range(-(-n // block)):
                arms = ((base_step, base_t), (with_step, with_t))
                for fn, times in arms if rnd % 2 == 0 else arms[::-1]:
                    fn()
                    times.extend(fn() for _ in range(block))
            out["peak_rss_kib"] = _peak_rss_kib()
            if dbg is not None:
                _kit_post(dbg, opts, sizes, out, spec.get("tmp"))
                out["errors"] = len(dbg.errors)
    finally:
        shutil.rmtree(dump_root, ignore_errors=True)
    out.update(rss_before_kib=rss_before,
               base_ms=[c * 1e3 for _, c in base_t], with_ms=[c * 1e3 for _, c in with_t],
               base_wall_ms=[w * 1e3 for w, _ in base_t], with_wall_ms=[w * 1e3 for w, _ in with_t])
    return out


# =============================================================================== parent side
def _find_msprobe_python(arg: str | None) -> tuple[str | None, str]:
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


def _run_child(py: str, spec: dict, timeout: float) -> dict | None:
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        r = subprocess.run([py, os.path.abspath(__file__), "--child", json.dumps(spec)],
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


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _ratio(r: dict) -> float:
    """The configuration's slowdown: the median of its processes' ratios (see ``--repeat``)."""
    if r.get("ratios"):
        return _med(r["ratios"])
    return _med(r["with_ms"]) / _med(r["base_ms"])


def _wall_ratio(r: dict) -> float:
    """The same in wall-clock time."""
    if r.get("wall_ratios"):
        return _med(r["wall_ratios"])
    return _med(r["with_wall_ms"]) / _med(r["base_wall_ms"])


def _merge_runs(runs: list[dict]) -> dict:
    """One configuration measured in several processes: each process's ratio is kept (their median is
    reported, with their range), the step times are pooled, and the peak RSS is the median peak."""
    r = dict(runs[0])
    if len(runs) > 1:
        r["ratios"] = [_ratio(x) for x in runs]
        r["wall_ratios"] = [_wall_ratio(x) for x in runs]
        for key in ("base_ms", "with_ms", "base_wall_ms", "with_wall_ms"):
            r[key] = [v for x in runs for v in x[key]]
        r["peak_rss_kib"] = _med([x["peak_rss_kib"] for x in runs])
    return r


def summarize(results: dict, sizes, ms_note: str, kernel_note: str = "") -> tuple[str, list[str]]:
    """The printed report and the list of missed targets."""
    lines, missed = [], []
    head = (f"{'size':5} {'config':12} {'calls':>5} {'w/o ms':>7} {'with ms':>8} {'ratio':>7} {'runs':>9} "
            f"{'target':>7} {'time':6} {'wall':>6} {'µs/call':>7} {'msprobe':>8} {'bytes/step':>10} {'1st step':>9} "
            f"{'peak RSS':>8} {'RSS Δ':>7} {'imports':>7} {'mem':5}")
    lines.append(head)
    lines.append("-" * len(head))
    for size in sizes:
        res = results.get(size, {})
        none, ms_none = res.get("none"), res.get("ms-none")
        for name in list(KIT_CONFIGS) + list(MS_CONFIGS):
            r = res.get(name)
            if r is None:
                continue
            b, w = _med(r["base_ms"]), _med(r["with_ms"])
            if name == "imported" and res.get("_none_meds"):
                # cross-process: an import cannot be undone, so compare with the "none" processes
                b, w = _med(res["_none_meds"]), _med(res["_imported_meds"])
            ratio = _ratio(r) if name != "imported" else w / b
            wall = _wall_ratio(r)
            spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}" if r.get("ratios") else ""
            if name == "imported" and res.get("_none_walls"):
                wall = _med(res["_imported_walls"]) / _med(res["_none_walls"])
            target = TIME_TARGETS.get(name)
            tstatus = "" if target is None else ("ok" if ratio <= target else "MISSED")
            if target is not None and ratio > target:
                missed.append(f"{size} {name}: time {ratio:.2f}x > target {target:g}x "
                              f"(missed by {ratio / target:.2f}x)")
            ref = ms_none if name.startswith("ms-") else none
            ref_kib = ref["peak_rss_kib"] if ref else None
            d_kib = r["peak_rss_kib"] - ref_kib if ref_kib else None
            mstatus = ""
            if name in MEM_CONFIGS and ref_kib:
                pct = d_kib / ref_kib
                mstatus = "ok" if pct <= MEM_TARGET else "MISS"
                if pct > MEM_TARGET:
                    imp = r.get("import_kib", 0)
                    missed.append(f"{size} {name}: peak RSS {r['peak_rss_kib'] / 1024:.0f} MB = {pct * 100:+.1f}% "
                                  f"over 'none' ({ref_kib / 1024:.0f} MB) > target +{MEM_TARGET * 100:.0f}% (missed by "
                                  f"{(pct - MEM_TARGET) * 100:.1f} points; {imp / 1024:.0f} MB of the "
                                  f"{d_kib / 1024:.0f} MB are the imports, {(d_kib - imp) / ref_kib * 100:+.1f}% "
                                  f"without them)")
            twin = res.get(MS_TWIN.get(name, ""))
            vs = f"{ratio / _ratio(twin):.2f}x" if twin is not None else ""
            steps = r.get("steps_written") or 0
            per_step = (r["bytes_total"] / steps if steps else 0) if "bytes_total" in r else None
            first = r.get("bytes_first") if "bytes_first" in r else None
            tgt = f"≤{target:g}x" if target is not None else "-"
            per_call = f"{(w - b) * 1e3 / r['calls']:.0f}" if r.get("calls") else ""
            rss_d = "" if d_kib is None else f"{d_kib / ref_kib * 100:+.1f}%"
            imp = r.get("import_kib")
            lines.append(
                f"{size:5} {name:12} {r.get('calls', '') or '':>5} {b:7.2f} {w:8.2f} {ratio:6.2f}x {spread:>9} "
                f"{tgt:>7} {tstatus:6} {wall:5.2f}x {per_call:>7} {vs:>8} {_fmt_bytes(per_step):>10} "
                f"{_fmt_bytes(first):>9} {r['peak_rss_kib'] / 1024:6.0f}MB {rss_d:>7} "
                f"{'' if not imp else f'{imp / 1024:.0f}MB':>7} {mstatus:5}")
        lines.append("")
    if any("pt_bytes" in results.get(size, {}).get("tensor-L1", {}) for size in sizes):
        lines.append("Tensor mode, bytes of one recorded step:")
    for size in sizes:
        res = results.get(size, {})
        t = res.get("tensor-L1")
        if t is None or "pt_bytes" not in t:
            continue
        kit_step = t["bytes_total"] / max(t.get("steps_written") or 1, 1)
        lines.append(f"  {size}: kit HDF5 {_fmt_bytes(kit_step)}/step ({t['unique_tensors']} distinct tensors stored "
                     f"once, uncompressed) vs msprobe's layout {_fmt_bytes(t['pt_bytes'])} in {t['pt_files']} "
                     ".pt files "
                     f"(torch.save of each recorded tensor, one file per row): kit/msprobe = "
                     f"{kit_step / t['pt_bytes']:.2f}; raw data {_fmt_bytes(4 * t['tensor_bytes'])}")
        m = res.get("ms-tensor-L1")
        if m is not None and m.get("pt_bytes"):
            lines.append(f"  {size}: msprobe itself wrote {_fmt_bytes(m['bytes_last'])} for its last step, "
                         f"{_fmt_bytes(m['pt_bytes'])} of it in {m['pt_files']} .pt files")
    g = results.get("_growth")
    if g:
        sz = g["sizes"]
        per_row = g["rows"] / max(len(sz) - 1, 1)
        marks = [k for k in (1, 5, 10, 25, 50, 100, 200, 500) if k <= len(sz) - 1]
        lines.append("")
        lines.append(f"Dump growth, statistics L1, {g['size']} model, one Debugger started once and step() per step, "
                     f"{len(sz) - 1} steps, {per_row:.0f} rows/step:")
        parts, prev = [], (0, 0)
        for k in marks:
            rate = (sz[k - 1] - prev[1]) / (k - prev[0])
            parts.append(f"after {k}: {_fmt_bytes(sz[k - 1])} ({_fmt_bytes(rate)}/step since {prev[0]})")
            prev = (k, sz[k - 1])
        lines.append("  " + "; ".join(parts))
        lines.append(f"  closed: {_fmt_bytes(sz[-1])} = {sz[-1] / g['rows']:.0f} bytes per row; "
                     f"step time {_med(g['with_ms']):.2f} ms (median, wall)")
        rss = g["rss"]
        lines.append("  resident memory (RSS) while recording: " + "; ".join(
            f"after {k}: {rss[k] / 1024:.0f} MB" for k in [0] + marks)
            + f" -> {(rss[marks[-1]] - rss[marks[0]]) / max(marks[-1] - marks[0], 1):.0f} KB/step after step "
            f"{marks[0]}")
    lines.append("")
    lines.append("'none' times the same step in both arms (A/A): its ratio is the measurement noise.")
    lines.append(f"msprobe: {ms_note}")
    if kernel_note:
        lines.append(f"msprobe_nb: {kernel_note}")
    return "\n".join(lines), missed


def _kernel_note() -> str:
    """Which paths compute the kit's CPU statistics and stack keys here: the optional C extensions or their
    pure torch / Python fallbacks."""
    try:
        from msprobe_nb.capture import recorder, stats
    except ImportError as exc:
        return f"unknown (msprobe_nb does not import: {exc})"
    parts = ["statistics: " + ("one-pass C kernel for contiguous float32 tensors" if stats._fused_at is not None
                               else "torch reductions (the C kernel is not built: no C compiler at install?)"),
             "stack keys: " + ("C walk" if recorder._stack_key is not None else "Python walk")]
    return "; ".join(parts)


# =============================================================================== profile
def _profile_level(level: str, steps: int):
    """(base s/step, recorded s/step, recorded calls per step, cProfile stats of ``steps`` recorded steps)."""
    import cProfile
    import pstats

    import models
    from models import train_step

    import msprobe_nb

    work = models.build("small")
    tmp = tempfile.mkdtemp(prefix="bench_prof_")
    try:
        dbg = msprobe_nb.Debugger(dump_path=os.path.join(tmp, "d"), level=level, task="statistics")

        def rec_step():
            tokens, labels = work.make_batch()
            dbg.start(work.model)
            train_step(work.model, work.optimizer, tokens, labels)
            dbg.stop()
            dbg.step()

        def base_step():
            tokens, labels = work.make_batch()
            train_step(work.model, work.optimizer, tokens, labels)

        for _ in range(3):
            rec_step()
            base_step()
        tb = tw = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            base_step()
            t1 = time.perf_counter()
            rec_step()
            t2 = time.perf_counter()
            tb += t1 - t0
            tw += t2 - t1
        calls = dbg.load().calls
        calls = int(calls.loc[calls["step"] == calls["step"].max(), "call"].nunique())
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            rec_step()
        prof.disable()
        dbg.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tb / steps, tw / steps, calls, pstats.Stats(prof)


def _components() -> None:
    """Per-call cost of the pieces a recorded call is made of, timed one by one (no profiler)."""
    import timeit

    import models
    import torch
    from torch.overrides import TorchFunctionMode

    from msprobe_nb.capture import stats
    from msprobe_nb.capture.naming import api_name
    from msprobe_nb.capture.recorder import Call, Recorder
    from msprobe_nb.config import load_config

    def us(fn, n=5000):
        return timeit.timeit(fn, number=n) / n * 1e6

    def deep(d, fn):  # call fn with ~d frames of model code above it, as in a training step
        return fn() if d == 0 else deep(d - 1, fn)

    x, s, w = torch.randn(8, 16, 64), torch.randn(()), torch.randn(64, 64)
    rec = Recorder(load_config(None, dump_path=os.path.join(tempfile.gettempdir(), "bench_prof_unused"), level="L1"))
    rec.active = True
    frame = sys._getframe()
    empty_frames = us(lambda: deep(20, lambda: None))
    c = Call("Functional.linear.0.forward", "Functional", "linear", 0, "forward", index=0)
    rec.add_rows(c, "forward", "input", (x, w))

    def working():
        with rec.working():
            pass

    def batched(n=5000):  # what the recorder pays per new small tensor: staging plus a share of a reduction
        summ = stats.Summarizer()
        t0 = time.perf_counter()
        for _ in range(n):
            summ.summarize(x)
        summ.materialize()
        return (time.perf_counter() - t0) / n * 1e6

    rows = [
        ("statistics of one (8,16,64) float32 tensor (_cpu_stats)", us(lambda: stats._cpu_stats(x))),
        ("the same, batched as the recorder does it (Summarizer)", batched()),
        ("statistics of a 0-d tensor", us(lambda: stats._cpu_stats(s))),
        ("  of which torch.aminmax", us(lambda: torch.aminmax(x))),
        ("  of which Tensor.sum", us(lambda: x.sum())),
        ("  of which linalg.vector_norm", us(lambda: torch.linalg.vector_norm(x))),
        ("  of which one read back (torch.stack + tolist of 4)", us(lambda: torch.stack((s, s, s, s)).tolist())),
        ("stack capture, Recorder.stack_id, ~20 frames deep", us(lambda: deep(20, lambda: rec.stack_id(
            sys._getframe(1)))) - empty_frames),
        ("open_api (counter, name, parent, stack)", us(lambda: deep(20, lambda: rec.open_api(
            "Functional", "linear", sys._getframe(1)))) - empty_frames),
        ("naming, api_name(Tensor.add) (operator check)", us(lambda: api_name(torch.Tensor.add, frame), 20000)),
        ("add_rows, 2 tensor rows, statistics cached", us(lambda: rec.add_rows(c, "forward", "input", (x, w)))),
        ("Recorder.working() enter + exit", us(working, 20000)),
    ]
    rec.rows.clear()

    class Empty(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    count = [0]

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            count[0] += 1
            return func(*args, **(kwargs or {}))

    work = models.build("small")

    def step():
        tokens, labels = work.make_batch()
        models.train_step(work.model, work.optimizer, tokens, labels)

    def cpu(mode=None, n=60):
        ts = []
        for _ in range(n):
            t0 = time.process_time()
            if mode is None:
                step()
            else:
                with mode:
                    step()
            ts.append(time.process_time() - t0)
        return statistics.median(ts)

    for _ in range(5):
        step()
    with Count():
        step()
    b1, e, b2 = cpu(), cpu(Empty()), cpu()
    rows.append((f"an empty TorchFunctionMode, per torch call ({count[0]} calls in a small step)",
                 (e - (b1 + b2) / 2) / count[0] * 1e6))
    print("\n=== per-call components (µs, CPU, one at a time) ===")
    for label, v in rows:
        print(f"  {v:7.2f} µs  {label}")


def _phases() -> None:
    """Where a recorded step's time goes: start(), the training step, stop() + step() (the write)."""
    sys.path.insert(0, HERE)
    import models
    from models import train_step

    import msprobe_nb

    print("\n=== phases of a recorded step (median CPU ms) ===")
    for size in ("small", "large"):
        for level in ("L1", "mix"):
            work = models.build(size)
            tmp = tempfile.mkdtemp(prefix="bench_prof_")
            try:
                dbg = msprobe_nb.Debugger(dump_path=os.path.join(tmp, "d"), level=level, task="statistics")
                ph: dict[str, list[float]] = {"without": [], "start": [], "train": [], "stop+step (write)": []}
                for i in range(23 if size == "small" else 7):
                    tokens, labels = work.make_batch()
                    a = time.process_time()
                    train_step(work.model, work.optimizer, tokens, labels)
                    b = time.process_time()
                    tokens, labels = work.make_batch()
                    c = time.process_time()
                    dbg.start(work.model)
                    d = time.process_time()
                    train_step(work.model, work.optimizer, tokens, labels)
                    e = time.process_time()
                    dbg.stop()
                    dbg.step()
                    f = time.process_time()
                    if i >= 3:
                        for k, v in zip(ph, (b - a, d - c, e - d, f - e)):
                            ph[k].append(v)
                dbg.close()
                calls = dbg.load().calls
                n_rows = len(calls) // max(dbg.current_step, 1)
                n_calls = calls.loc[calls["step"] == calls["step"].max(), "call"].nunique()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            m = {k: statistics.median(v) * 1e3 for k, v in ph.items()}
            cap = (m["train"] - m["without"]) * 1e3
            print(f"  {size:5} {level:3}: " + ", ".join(f"{k} {v:.2f}" for k, v in m.items())
                  + f"; {n_calls} calls, {n_rows} rows: capture {cap / n_calls:.0f} µs/call, "
                  f"write {m['stop+step (write)'] * 1e3 / n_rows:.1f} µs/row")


def profile(steps: int = 40) -> int:
    """cProfile of recorded steps (statistics L1 and mix, small model), grouped by where the time goes."""
    sys.path.insert(0, HERE)
    import msprobe_nb

    pkg = os.path.dirname(os.path.abspath(msprobe_nb.__file__))
    for level in ("L1", "mix"):
        tb, tw, calls, st = _profile_level(level, steps)
        print(f"\n=== statistics {level}, small model: {tb * 1e3:.2f} ms -> {tw * 1e3:.2f} ms per step; "
              f"{calls} recorded calls; overhead {(tw - tb) * 1e6 / max(calls, 1):.0f} µs per recorded call "
              f"(unprofiled) ===")
        total = sum(v[2] for v in st.stats.values())
        groups: dict[str, float] = {}
        for (fname, _line, func), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
            if fname.startswith(pkg):
                key = "msprobe_nb/" + os.path.relpath(fname, pkg)
            elif fname == "~":
                key = "builtin: " + func.strip("<>").replace("built-in method ", "").replace("method ", "")[:60]
            elif "site-packages" in fname:
                key = "/".join(fname.split("site-packages/")[1].split("/")[:3])
            else:
                key = os.path.basename(fname)
            groups[key] = groups.get(key, 0.0) + tt
        print(f"own time by file (or builtin), profiled total {total / steps * 1e3:.1f} ms per step:")
        for key, tt in sorted(groups.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {tt / total * 100:5.1f}%  {tt / steps * 1e3:7.2f} ms/step  {key}")
        print("msprobe_nb functions by cumulative time:")
        rows = [(ct, nc, fname, line, func) for (fname, line, func), (_cc, nc, _tt, ct, _c) in st.stats.items()
                if fname.startswith(pkg)]
        for ct, nc, fname, line, func in sorted(rows, reverse=True)[:22]:
            print(f"  {ct / steps * 1e3:7.2f} ms/step  {nc / steps:7.0f} calls/step  "
                  f"{os.path.relpath(fname, pkg)}:{line}({func})")
    _phases()
    _components()
    return 0


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
        print(meta.get("title", ""))
        print(report)
        print()
        print("Targets missed:\n" + "\n".join("  - " + m for m in missed) if missed else "All targets met.")
        return 0

    if args.child:
        spec = json.loads(args.child)
        print(RESULT_TAG + json.dumps(child(spec)), flush=True)
        return 0
    if args.profile:
        return profile()

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
        runs = [r for r in (_run_child(py, spec_, timeout=1800) for _ in range(repeat(size))) if r]
        if runs:
            res[spec_["name"]] = _merge_runs(runs)
            print(f"  {size} {spec_['name']}: " + ", ".join(f"{_med(r['base_ms']):.2f} -> {_med(r['with_ms']):.2f}"
                                                          for r in runs) + " ms/step", flush=True)
    if args.no_msprobe:
        ms_py, ms_note = None, "columns skipped (--no-msprobe)"
    else:
        ms_py, found = _find_msprobe_python(args.msprobe_python)
        ms_note = (f"measured with {ms_py} (torch, mindstudio-probe: {found}); risk_level=ALL (its default FOCUS "
                   "skips 'low-risk' APIs); its baseline = same process before PrecisionDebugger, not interleaved"
                   if ms_py else f"columns skipped: {found}")
    print(f"msprobe: {ms_note}", flush=True)
    kernel_note = _kernel_note()
    print(f"msprobe_nb: {kernel_note}", flush=True)

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
                r = _run_child(sys.executable, spec(name, name, {}), timeout=600)
                if r:
                    res.setdefault(name, r)
                    res[f"_{name}_meds"].append(_med(r["base_ms"] + r["with_ms"]))
                    res[f"_{name}_walls"].append(_med(r["base_wall_ms"] + r["with_wall_ms"]))
                    print(f"  {size} {name}: {_med(r['with_ms']):.2f} ms/step", flush=True)
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
        g = _run_child(sys.executable, {"name": "growth", "tool": "growth", "size": "small", "steps": growth_steps,
                                        "opts": {"level": "L1", "task": "statistics"}, "tmp": args.tmp},
                       timeout=1800)
        if g:
            results["_growth"] = g

    report, missed = summarize(results, sizes, ms_note, kernel_note)
    title = (f"Recording overhead ({'quick' if args.quick else 'full'} run, {time.time() - t_start:.0f} s; "
             f"ratios of median CPU time per step after {warmup} warm-up steps; one torch thread)")
    results["meta"] = {"title": title, "msprobe": ms_note, "kernel": kernel_note}
    print()
    print(title)
    print(report)
    print()
    if missed:
        print("Targets missed:")
        for m in missed:
            print("  - " + m)
    else:
        print("All targets met.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
