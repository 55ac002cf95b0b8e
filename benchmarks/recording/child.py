"""The child side of ``bench_recording.py``: one configuration on one workload, in its own subprocess.

``child(spec)`` builds the workload, times plain and recorded steps in alternating blocks (or, for msprobe,
plain steps before ``PrecisionDebugger`` patches torch), measures the dump and the peak RSS, and returns
the numbers as a dict; ``bench_recording.py --child SPEC`` prints it after ``RESULT_TAG``. Runs under the
kit's interpreter or under msprobe's, which may not have msprobe_nb: nothing here imports it at import time.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile
import time

from .configs import BENCH_DIR, BLOCK_STEPS

__all__ = ["child"]


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


def _workloads(spec: dict):
    """The module that builds the spec's workload: ``models`` (the benchmark's own) or ``spec["workloads"]``
    (e.g. ``recording.real_models``)."""
    import importlib
    return importlib.import_module(spec.get("workloads") or "models")


def _train_step(mod, work):
    """The workload's own training step where it has one, else its module's ``train_step``."""
    return getattr(work, "train_step", None) or mod.train_step


def _kit_arm(opts, work, dump_root, train_step):
    import msprobe_nb

    dbg = msprobe_nb.Debugger(dump_path=os.path.join(dump_root, "kit"), **opts)

    return dbg, _recorded_step(dbg, work, train_step)


def _msprobe_arm(opts, work, dump_root, train_step):
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
    import msprobe_nb

    mod = _workloads(spec)
    work = mod.build(spec["size"], **spec.get("build", {}))
    train_step = _train_step(mod, work)
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
    sys.path.insert(0, BENCH_DIR)
    tool, opts = spec["tool"], spec["opts"]
    if tool == "growth":
        return _growth(spec)
    mod = _workloads(spec)
    work = mod.build(spec["size"], **spec.get("build", {}))
    train_step = _train_step(mod, work)
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
                dbg, run = _msprobe_arm(opts, work, dump_root, train_step)
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
                dbg, run = _kit_arm(opts, work, dump_root, train_step)

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
            block = spec.get("block") or BLOCK_STEPS[spec["size"]]
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

