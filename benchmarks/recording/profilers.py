"""``bench_recording.py --profile``: where a recorded step's time goes, three ways, on the small model.

* :func:`profile`: cProfile of recorded steps (statistics L1 and mix), own time grouped by file and the
  kit's functions by cumulative time; then the two below.
* :func:`phases`: median CPU time of ``start()``, the training step and ``stop()`` + ``step()`` (the write).
* :func:`components`: the per-call cost of the pieces a recorded call is made of, timed one by one. This one
  drives the recorder's internals directly (``msprobe_nb.capture``: ``Recorder``, ``Call``, ``stats``,
  ``naming``), which the package keeps private: it measures pieces no public API exposes one by one.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from .configs import BENCH_DIR

__all__ = ["components", "phases", "profile"]


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


def components() -> None:
    """Per-call cost of the pieces a recorded call is made of, timed one by one (no profiler)."""
    import timeit

    import models
    import torch
    from torch.overrides import TorchFunctionMode

    from msprobe_nb import load_config
    from msprobe_nb.capture import stats
    from msprobe_nb.capture.calls import Call
    from msprobe_nb.capture.naming import api_name
    from msprobe_nb.capture.recorder import Recorder

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


def phases() -> None:
    """Where a recorded step's time goes: start(), the training step, stop() + step() (the write)."""
    sys.path.insert(0, BENCH_DIR)
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
    sys.path.insert(0, BENCH_DIR)
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
    phases()
    components()
    return 0

