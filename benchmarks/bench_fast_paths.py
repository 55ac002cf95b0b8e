"""What each optional C fast path buys a recorded step, measured in one process.

Run from the repository root (``. .venv/bin/activate`` first; the real models need the ``bench`` extra)::

    python benchmarks/bench_fast_paths.py                        # GPT-2 and ResNet, L0 and L1
    python benchmarks/bench_fast_paths.py --models gpt2,vit,unet --levels L1 --rounds 20
    python benchmarks/bench_fast_paths.py --task tensor --models vit --levels L1   # the C host copies too

Why a benchmark of its own: between processes the plain step of one model wanders by 10-20 % on this
machine, which is more than one fast path changes. Here one process records the same model with each path
switched off in turn (the switches are the ones the tests use), the arms taking turns step by step in a
rotating order, so every arm meets the same machine. Arms:

* ``plain``: no recording;
* ``all C``: every C path that was built;
* ``no C copies`` (``--task tensor`` only): the row builder without its host copies, which
  ``Summarizer.summarize`` then makes (``_host_copy``);
* ``no C handler``: the L1 mode's Python ``__torch_function__`` and ``api_backward.py`` instead of
  ``_api_handler.c`` and ``_api_backward.c`` (the rows, statistics and stack keys stay in C);
* ``no row builder``: ``Recorder.add_rows``' Python loop instead of ``_row_builder.c`` (the handler, the
  kernel statistics and the stack keys stay in C);
* ``Python only``: no C at all (statistics from torch, the Python stack walk, the Python rows and handler).

Each arm's step is CPU time (``time.process_time``, one torch thread) of start, the model's training step,
stop and ``step()``, the write included; the figure is its median over the rounds, and the ratio is against
the median plain step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARMS = ("plain", "all C", "no C handler", "no row builder", "Python only")
#: the arms of each task: the tensor task's C host copies get an arm of their own
TASK_ARMS = {"statistics": ARMS,
             "tensor": ("plain", "all C", "no C copies", "no C handler", "no row builder", "Python only")}


class _Switches:
    """Turns the kit's C paths off and on again, in one recorder (the same switches as the tests')."""

    def __init__(self, dbg):
        from msprobe_nb.capture import api_mode, c_contract, grad_hooks, recorder, stacks, stats
        self.dbg, self.recorder_mod, self.stacks_mod, self.stats_mod = dbg, recorder, stacks, stats
        self.api_mode, self.grad_hooks = api_mode, grad_hooks
        self.saved = (recorder._build_rows, stacks._stack_key, stats._fused_at)
        # read when start() makes the mode and at each API backward, so each step takes its arm's
        self.handler, self.backward = api_mode._api_handler, grad_hooks._api_backward
        self.ctx = dbg._recorder._row_ctx  # its host_copy field: where the builder makes host copies itself
        self.replaced = c_contract.replaced

    def set(self, arm: str) -> None:
        rec = self.dbg._recorder
        build, key, fused = self.saved
        rec.build_rows = None if arm in ("no row builder", "Python only") else build
        rec._row_ctx = self.replaced(self.recorder_mod._row_builder, self.ctx, "host_copy", None) \
            if arm == "no C copies" else self.ctx
        self.stacks_mod._stack_key = None if arm == "Python only" else key
        self.stats_mod._fused_at = None if arm == "Python only" else fused
        off = arm in ("no C handler", "Python only")
        self.api_mode._api_handler = None if off else self.handler
        self.grad_hooks._api_backward = None if off else self.backward

    def restore(self) -> None:
        self.set("all C")


def measure(model: str, level: str, rounds: int, warmup: int, tmp: str, task: str = "statistics") -> dict[str, float]:
    """Median CPU ms per step of each arm of ``task`` (:data:`TASK_ARMS`), on one model and level."""
    import torch
    from recording.real_models import build

    import msprobe_nb

    torch.set_num_threads(1)
    work = build(model)
    arms = TASK_ARMS[task]
    dbg = msprobe_nb.Debugger(dump_path=os.path.join(tmp, f"{model}-{level}-{task}"), level=level, task=task)
    dbg.start(work.model)  # the recorder exists from the first start on
    dbg.stop()
    switches = _Switches(dbg)

    def step(arm: str) -> float:
        tokens, labels = work.make_batch()
        t0 = time.process_time()
        if arm != "plain":
            dbg.start(work.model)
        work.train_step(work.model, work.optimizer, tokens, labels)
        if arm != "plain":
            dbg.stop()
            dbg.step()
        return time.process_time() - t0

    times: dict[str, list[float]] = {a: [] for a in arms}
    try:
        for r in range(warmup + rounds):
            order = arms[r % len(arms):] + arms[:r % len(arms)]  # each arm takes each place in turn
            for arm in order:
                switches.set(arm)
                dt = step(arm)
                if r >= warmup:
                    times[arm].append(dt)
    finally:
        switches.restore()
        dbg.close()
    return {a: statistics.median(v) * 1e3 for a, v in times.items()}


def report(results: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    """A markdown table: the plain step's ms and each arm's ratio to it; then what each path saves."""
    arms = list(next(iter(results.values()))) if results else list(ARMS)
    lines = ["| model | level | plain ms | " + " | ".join(arms[1:]) + " |", "|---|---|---|" + "---|" * (len(arms) - 1)]
    for (model, level), ms in results.items():
        plain = ms["plain"]
        cells = [f"{ms[a] / plain:.2f}x" for a in arms[1:]]
        lines.append(f"| {model} | {level} | {plain:.1f} | " + " | ".join(cells) + " |")
    lines.append("")
    words = {"no C copies": "without the C host copies", "no C handler": "without the C handler",
             "no row builder": "without the row builder",
             "Python only": "with no C path"}
    for (model, level), ms in results.items():
        c = ms["all C"]
        lines.append(f"{model} {level}: against every C path, a step takes "
                     + ", ".join(f"{ms[a] / c - 1:+.1%} {words[a]}" for a in arms[2:]))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2,resnet", help="comma list of recording/real_models.py's models")
    ap.add_argument("--levels", default="L0,L1", help="comma list of L0, L1, mix")
    ap.add_argument("--rounds", type=int, default=15, help="timed steps per arm (default 15)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    ap.add_argument("--task", default="statistics", choices=sorted(TASK_ARMS), help="the recording task")
    args = ap.parse_args(argv)
    from msprobe_nb.capture import api_mode, grad_hooks, recorder, stacks, stats
    built = [n for n, f in (("handler", api_mode._api_handler), ("API backward", grad_hooks._api_backward),
                            ("row builder", recorder._build_rows),
                            ("stack keys", stacks._stack_key), ("statistics kernel", stats._fused_at))
             if f is not None]
    print("C paths built:", ", ".join(built) or "none (every arm but plain runs the Python paths)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for level in args.levels.split(","):
                results[model, level] = ms = measure(model, level, args.rounds, args.warmup, tmp, args.task)
                print(f"  {model} {level}: " + ", ".join(f"{a} {v:.1f} ms" for a, v in ms.items()), flush=True)
    print("\n".join(["", *report(results)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
