"""Instructions a recorded training step executes, counted by valgrind's callgrind: a measure that repeats.

On this 2-core machine the CPU time of one process moves by up to 0.45x between runs, so a change worth a few
per cent of a step cannot be told from noise by timing it. The count of instructions a step executes repeats to
about 0.02 %: each real model is built, three steps run uncounted (the first records the stacks and opens the
file), then counting is switched on (``callgrind_control -i on``) for ``--steps`` steps and off again.
Instructions are not time (a cache miss costs no instruction, a checksum loop costs many that run fast), so a
change is judged by both: this count first, then ``bench_real_models.py``. Every step runs from the same line
of the child, so the measured steps have the stacks of the warm-up ones.

Run from the repository root (needs valgrind and the ``bench`` extra)::

    python benchmarks/count_instructions.py --models vit,gpt2 --levels none,L1
    python benchmarks/count_instructions.py --models vit --levels none,L1 --trees base=/tmp/base,new=.

It prints millions of instructions per step, and each level's count over the plain step's (``none``).

``--stop-share`` counts each recorded level a second time, collecting only inside ``Debugger.stop()`` (the
child calls it through ``sys.call_tracing``, a C function nothing else in a step calls, and callgrind's
``--toggle-collect`` names it): how many of the step's instructions its end spends turning the rows into columns
and writing them, against the recorded step's own work.

``--cache-sim`` also simulates the caches (callgrind's ``--cache-sim=yes``) and prints the misses a step and
an estimate of its cycles: Ir + 10 x (first-level misses) + 100 x (last-level misses), the weights
KCachegrind's "cycle estimation" uses. The last level is simulated at ``--ll-kib`` (512 KiB by default, this
machine's per-core L2: the model's own step leaves its data there, and what the kit reads after it misses it).
A change that runs fewer instructions can still cost more where it touches memory the step has left cold (Python
objects, dicts), and this count shows it without timing noise. The simulation has no prefetcher: strided and
sequential reads it counts as misses are cheap on a real CPU, so a change it favours still needs a timed check
(benchmarks/README.md, "Counting the caches, and where they mislead").
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = """
import os, sys, tempfile, time, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {bench!r})
import torch
torch.set_num_threads(1)
from recording.real_models import build
name, steps, level, flag = {name!r}, {steps}, {level!r}, {flag!r}
w = build(name)
dbg = None
if level != "none":
    import msprobe_nb
    dbg = msprobe_nb.Debugger(dump_path=tempfile.mkdtemp(dir={tmp!r}), level=level, task="statistics")
for i in range(3 + steps):
    if i == 3:  # counting goes on here: one call site for every step, so the measured steps' stacks are known
        open(flag + ".ready", "w").close()
        while not os.path.exists(flag + ".go"):
            time.sleep(0.05)
    batch = w.make_batch()
    if dbg is not None:
        dbg.start(w.model)
    w.train_step(w.model, w.optimizer, *batch)
    if dbg is not None:
        sys.call_tracing(dbg.stop, ()) if {split_stop} else dbg.stop()
        dbg.step()
open(flag + ".done", "w").close()
while not os.path.exists(flag + ".end"):
    time.sleep(0.05)
if dbg is not None:
    dbg.close()
"""


def child_code(name: str, level: str, steps: int, flag: str, tmp: str, only_stop: bool = False) -> str:
    """The counted child's program; ``only_stop``: its stop() called through :data:`STOP_MARK`."""
    return _CHILD.format(bench=str(HERE), name=name, steps=steps, level=level, flag=flag, tmp=tmp,
                         split_stop=only_stop)


def _wait(path: str, proc: subprocess.Popen, what: str) -> None:
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"the child exited ({proc.returncode}) before {what}")
        time.sleep(0.2)


def flag_path(tmp: str, name: str, level: str) -> str:
    """The stem of one count's handshake files, in a folder of its own: two trees' counts of the same model and
    level must not see each other's files (a child finding an earlier ``.go`` ran before counting began)."""
    return os.path.join(tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{level}-"), "flag")


#: the function the child calls stop() through when only stop() is counted (see --stop-share)
STOP_MARK = "sys_call_tracing"


def valgrind_args(out: str, cache_sim: bool = False, ll_kib: int = 512, only_stop: bool = False) -> list[str]:
    """callgrind's command line: counting off until the child's steps begin, and the caches simulated on
    request (first levels as valgrind finds them on this CPU, the last level ``ll_kib`` KiB, 8-way);
    ``only_stop``: events collected only inside :data:`STOP_MARK`."""
    args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if cache_sim:
        args += ["--cache-sim=yes", f"--LL={ll_kib * 1024},8,64"]
    if only_stop:
        args.append(f"--toggle-collect={STOP_MARK}")
    return args


def parse_events(err: str) -> dict[str, int]:
    """callgrind's totals from its stderr: event name -> count (``Ir`` alone without the cache simulation)."""
    got = re.search(r"Collected : ([\d ]+)", err)
    if got is None:
        return {}
    names = re.search(r"Events\s*:\s*([A-Za-z0-9 ]+)", err)
    counts = [int(x) for x in got.group(1).split()]
    return dict(zip(names.group(1).split() if names else ["Ir"], counts))


def estimated_cycles(ev: dict[str, float]) -> float:
    """Ir + 10 x first-level misses + 100 x last-level misses (KCachegrind's cycle estimation)."""
    first = sum(ev.get(k, 0) for k in ("I1mr", "D1mr", "D1mw"))
    last = sum(ev.get(k, 0) for k in ("ILmr", "DLmr", "DLmw"))
    return ev["Ir"] + 10 * first + 100 * last


def count(name: str, level: str, steps: int, tree: Path, tmp: str, cache_sim: bool = False,
          ll_kib: int = 512, only_stop: bool = False) -> dict[str, float]:
    """callgrind's events per step of ``steps`` steps of model ``name`` at ``level`` (``none``: without the kit):
    ``Ir`` (instructions), and with ``cache_sim`` the cache misses too; ``only_stop``: those of ``stop()``."""
    flag = flag_path(tmp, name, level)
    out = flag + ".callgrind"
    code = child_code(name, level, steps, flag, tmp, only_stop)
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([*valgrind_args(out, cache_sim, ll_kib, only_stop), sys.executable, "-c", code], env=env,
                            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait(flag + ".ready", proc, "its warm-up ended")
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        open(flag + ".go", "w").close()
        _wait(flag + ".done", proc, "its steps ended")
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
        open(flag + ".end", "w").close()
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    ev = parse_events(err)
    if proc.returncode != 0 or "Ir" not in ev:
        raise RuntimeError(f"callgrind gave no count for {name} {level} (exit {proc.returncode}):\n{err[-2000:]}")
    return {k: v / steps for k, v in ev.items()}


def describe(ev: dict[str, float], plain: dict[str, float] | None) -> str:
    """One count's line: instructions a step, and with the cache simulation its misses and estimated cycles,
    each with its multiple of the plain step's."""
    text = f"{ev['Ir'] / 1e6:.2f}M instructions a step"
    if plain is not None:
        text += f"  {ev['Ir'] / plain['Ir']:.3f}x of none"
    if "DLmr" in ev:
        d1, ll = ev["D1mr"] + ev["D1mw"], ev["DLmr"] + ev["DLmw"]
        text += (f"; misses a step: I1 {ev['I1mr'] / 1e3:.0f}K, D1 {d1 / 1e3:.0f}K, LL {ll / 1e3:.0f}K"
                 f" (code {ev['ILmr'] / 1e3:.0f}K)")
        text += f"; {estimated_cycles(ev) / 1e6:.2f}M estimated cycles"
        if plain is not None and "DLmr" in plain:
            text += f"  {estimated_cycles(ev) / estimated_cycles(plain):.3f}x of none"
    return text


def stop_share(step: dict[str, float], end: dict[str, float], plain: dict[str, float] | None) -> str:
    """How a recorded step's instructions split between its own work and stop(), each as a multiple of the plain
    step's where it was counted."""
    own = step["Ir"] - end["Ir"]
    text = f"of which stop() {end['Ir'] / 1e6:.2f}M ({end['Ir'] / step['Ir']:.1%}), the rest {own / 1e6:.2f}M"
    if plain is not None:
        text += f"; over the plain step: stop() +{end['Ir'] / plain['Ir']:.3f}x, the rest {own / plain['Ir']:.3f}x"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="vit", help="comma list of bench_real_models' models (default: vit)")
    ap.add_argument("--levels", default="none,L1", help="comma list of none, L0, L1, mix (default: none,L1)")
    ap.add_argument("--steps", type=int, default=5, help="counted steps (default 5)")
    ap.add_argument("--trees", default="", help="name=path,... of msprobe_nb trees to compare (default: this one)")
    ap.add_argument("--cache-sim", action="store_true", help="simulate the caches: misses and estimated cycles")
    ap.add_argument("--ll-kib", type=int, default=512, help="simulated last-level cache in KiB (default 512)")
    ap.add_argument("--stop-share", action="store_true", help="count stop() alone too: its share of a step")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (callgrind) is not installed: nothing counted")
        return 0
    trees = [(k, Path(v).resolve()) for k, v in (t.split("=", 1) for t in args.trees.split(",") if t)] \
        or [("this tree", HERE.parent)]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            plain: dict[str, float] | None = None
            for level in args.levels.split(","):
                for label, tree in trees if level != "none" else trees[:1]:
                    ev = count(name, level, args.steps, tree, tmp, args.cache_sim, args.ll_kib)
                    plain = ev if level == "none" else plain
                    who = f" ({label})" if level != "none" and len(trees) > 1 else ""
                    print(f"{name} {level}{who}: {describe(ev, plain if level != 'none' else None)}", flush=True)
                    if args.stop_share and level != "none":
                        end = count(name, level, args.steps, tree, tmp, False, args.ll_kib, only_stop=True)
                        print(f"  {stop_share(ev, end, plain)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
