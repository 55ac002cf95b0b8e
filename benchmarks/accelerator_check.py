"""Recording on a real accelerator: no host synchronisation, no changed bit, and what it costs (minutes).

Run on a machine with a CUDA GPU, from the repository root (``. .venv/bin/activate`` first)::

    python benchmarks/accelerator_check.py            # every check; exit status 1 when one fails
    python benchmarks/accelerator_check.py --steps 10 # more timed steps per arm

1. **No host sync while recording**: one training step of ``models.py``'s small model on CUDA recorded at
   L0, L1 and mix (statistics) with ``torch.cuda.set_sync_debug_mode("error")`` on from ``start()`` to the
   step's last op: statistics must stay on the device until the step's end (the seed FAQ's reason why a
   tool can change results: a synchronisation changes the timing, and with it what asynchronous kernels
   see). The plain step is checked the same way first, so a sync the model makes itself is told apart.
2. **Bitwise non-interference on the device**: the same seeded step plain and recorded at every level and
   task; loss, every parameter and every gradient compared with ``torch.equal``. Deterministic
   algorithms are switched on (``CUBLAS_WORKSPACE_CONFIG`` set before CUDA starts) and two plain runs are
   compared first, so the device's own nondeterminism is not blamed on the kit.
3. **The seed-003 demo** (``msprobe_nb/demo.py``) with CUDA as the "npu" side and the CPU as the bench.
4. **GPU step-time ratios**: plain and recorded steps in alternating blocks, ``torch.cuda.synchronize()``
   after each step, wall time, median recorded / median plain.

Without CUDA, checks 2 and 3 run on the CPU and 1 and 4 are skipped, saying why.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

#: recorded configurations: (label, Debugger options)
LEVELS = (("L0", {"level": "L0"}), ("L1", {"level": "L1"}), ("mix", {"level": "mix"}))
TASKS = (("statistics", {"task": "statistics"}), ("tensor", {"task": "tensor"}))


def device_work(device: torch.device, seed: int = models.SEED):
    """The small workload with its model on ``device`` and batches made there."""
    work = models.build("small", seed=seed)
    work.model.to(device)
    work.optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-2, foreach=False)
    make = work.make_batch

    def on_device():
        tokens, labels = make()
        return tokens.to(device), labels.to(device)

    work.make_batch = on_device
    return work


def _record(work, dump_path: str, opts: dict, fn):
    """``fn()`` (the step's work) inside ``start()`` / ``stop()`` of a Debugger; returns its result."""
    import msprobe_nb

    dbg = msprobe_nb.Debugger(dump_path=dump_path, **opts)
    dbg.start(work.model)
    try:
        return fn()
    finally:
        dbg.stop()
        dbg.step()
        dbg.close()


def outcome(work, tokens, labels) -> list[torch.Tensor]:
    """One step; the loss, then every parameter and gradient after it (host copies)."""
    loss = models.train_step(work.model, work.optimizer, tokens, labels)
    params = list(work.model.parameters())
    return [loss.cpu()] + [p.detach().cpu() for p in params] + [p.grad.cpu() for p in params if p.grad is not None]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Every tensor of ``a`` equal, bit for bit, to its counterpart in ``b`` (and as many of them)."""
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b))


def check_bitwise(device: torch.device, tmp: str) -> list[tuple[str, bool, str]]:
    """(what, passed, detail) of the plain-vs-plain control and of every level and task."""
    def run(opts=None):
        work = device_work(device)
        torch.manual_seed(7)  # dropout draws
        tokens, labels = work.make_batch()
        if opts is None:
            return outcome(work, tokens, labels)
        return _record(work, os.path.join(tmp, f"bit_{len(os.listdir(tmp))}"), opts,
                       lambda: outcome(work, tokens, labels))

    results = []
    ref = run()
    control = same_bits(ref, run())
    results.append(("plain vs plain (the device's own determinism)", control,
                    "" if control else "the plain step is not reproducible here: the checks below cannot judge"))
    for level, lo in LEVELS:
        for task, to in TASKS:
            ok = same_bits(ref, run({**lo, **to}))
            results.append((f"{level} {task}", ok, "" if ok else "recorded step differs from the plain step"))
    return results


def check_no_sync(device: torch.device, tmp: str) -> list[tuple[str, bool, str]]:
    """Each level's recorded step under ``set_sync_debug_mode("error")`` (the plain step first)."""
    results = []

    def guarded(work, tokens, labels):
        torch.cuda.set_sync_debug_mode("error")
        try:
            models.train_step(work.model, work.optimizer, tokens, labels)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    for label, opts in [("plain", None)] + [(f"{lv} statistics", o) for lv, o in LEVELS]:
        work = device_work(device)
        tokens, labels = work.make_batch()
        torch.cuda.synchronize()
        try:
            if opts is None:
                guarded(work, tokens, labels)
            else:
                _record(work, os.path.join(tmp, f"sync_{label[:3]}"), {**opts, "task": "statistics"},
                        lambda w=work, t=tokens, y=labels: guarded(w, t, y))
            results.append((label, True, "no synchronising call"))
        except RuntimeError as exc:
            results.append((label, False, str(exc).splitlines()[0][:200]))
    return results


def _time_config(device: torch.device, dump_path: str, opts: dict, steps: int, block: int) -> tuple[float, float]:
    """(plain ms, recorded ms): medians of synchronised wall time per step, in alternating blocks."""
    import msprobe_nb

    work = device_work(device)
    dbg = msprobe_nb.Debugger(dump_path=dump_path, **{"task": "statistics", **opts})

    def plain():
        tokens, labels = work.make_batch()
        models.train_step(work.model, work.optimizer, tokens, labels)

    def recorded():
        tokens, labels = work.make_batch()
        dbg.start(work.model)
        models.train_step(work.model, work.optimizer, tokens, labels)
        dbg.stop()
        dbg.step()

    times: dict = {plain: [], recorded: []}
    for fn in (plain, recorded, plain, recorded):  # warm-up
        fn()
    for rnd in range(-(-steps // block)):
        for fn in (plain, recorded) if rnd % 2 == 0 else (recorded, plain):
            for _ in range(block):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                fn()
                torch.cuda.synchronize(device)
                times[fn].append(time.perf_counter() - t0)
    dbg.close()
    return statistics.median(times[plain]) * 1e3, statistics.median(times[recorded]) * 1e3


def step_ratios(device: torch.device, tmp: str, steps: int, block: int = 3) -> list[tuple[str, float, float]]:
    """(config, plain ms, recorded ms) of every level (statistics) and of tensor L1."""
    configs = LEVELS + (("tensor L1", {"level": "L1", "task": "tensor"}),)
    return [(label, *_time_config(device, os.path.join(tmp, f"time_{i}"), opts, steps, block))
            for i, (label, opts) in enumerate(configs)]


def run_demo(tmp: str) -> tuple[bool, str]:
    """The seed-003 demo; (its exit status was 0, the device its "npu" side ran on)."""
    from msprobe_nb import demo

    return demo.main(["--out", os.path.join(tmp, "demo")]) == 0, str(demo.machine_device("npu"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=6, help="timed steps per arm of the GPU timings (default 6)")
    p.add_argument("--skip-demo", action="store_true", help="leave out the seed-003 demo")
    args = p.parse_args(argv)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    why = "" if cuda else "no CUDA device (torch.cuda.is_available() is False)"
    print(f"torch {torch.__version__}; device: {torch.cuda.get_device_name(device) if cuda else 'cpu'}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="accel_check_") as tmp:
        print("\n1. no host synchronisation while recording (set_sync_debug_mode('error'))")
        if cuda:
            for what, ok, detail in check_no_sync(device, tmp):
                print(f"   {'ok  ' if ok else 'FAIL'} {what}: {detail}")
                failed |= not ok
        else:
            print(f"   skipped: {why}")
        print(f"\n2. bitwise non-interference on {device.type}")
        res = check_bitwise(device, tmp)
        for what, ok, detail in res:
            print(f"   {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
        failed |= not all(ok for _, ok, _ in res[1:]) and res[0][1]
        if args.skip_demo:
            print("\n3. seed-003 demo: skipped (--skip-demo)")
        else:
            print("\n3. seed-003 demo")
            ok, npu = run_demo(tmp)
            print(f"   {'ok  ' if ok else 'FAIL'} demo (npu side on {npu}"
                  f"{'' if cuda else ', emulated: ' + why}): exit status {0 if ok else 1}")
            failed |= not ok
        print("\n4. GPU step time, recorded / plain (wall, synchronised per step)")
        if cuda:
            for level, b, w in step_ratios(device, tmp, args.steps):
                print(f"   {level:10} {b:8.2f} ms -> {w:8.2f} ms  {w / b:5.2f}x")
        else:
            print(f"   skipped: {why}")
    print("\nFAILED" if failed else "\nall checks that ran passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
