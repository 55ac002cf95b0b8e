"""Write the msprobe_2rank sample (see README.md here): ``python data/samples/msprobe_2rank/make_sample.py``.

numpy only, no torch and no msprobe: a two-rank, one-step data-parallel toy computed by hand in float32 and
written in msprobe's ``task: statistics``, ``level: mix`` layout (``<run>/step0/rank<r>/dump.json``,
``stack.json``, ``construct.json``), the layout documented in /work/shared/reference/msprobe.md. The "npu"
run differs from the "bench" run in one place: rank 0 scales its shared vector by 1.6 instead of 1.5,
and ``Distributed.broadcast`` from rank 0 carries that to rank 1. Seeded: a rerun writes the same bytes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORLD = 2


def _stat(a: np.ndarray, requires_grad: bool = False) -> dict:
    a = np.asarray(a, dtype=np.float32)
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape),
            "Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean(dtype=np.float64).astype(np.float32)),
            "Norm": float(np.linalg.norm(a.astype(np.float64))), "requires_grad": requires_grad}


def _run(scale0: float) -> list[dict]:
    """The two ranks' calls, in order: (name, entry, parent module call, source line) per rank."""
    rng = np.random.default_rng(2026)
    w = rng.standard_normal((4, 8), dtype=np.float32) * np.float32(0.2)
    b = np.zeros(4, dtype=np.float32)
    shared = [rng.standard_normal(8, dtype=np.float32) for _ in range(WORLD)]
    xs = [rng.standard_normal((3, 8), dtype=np.float32) for _ in range(WORLD)]
    scales = [scale0 if r == 0 else 1.5 for r in range(WORLD)]
    scaled = [s * np.float32(k) for s, k in zip(shared, scales)]
    ranks: list[list[tuple]] = [[] for _ in range(WORLD)]
    grads_w, grads_b = [], []
    for r in range(WORLD):
        calls = ranks[r]
        mul = {"input_args": [_stat(shared[r]), {"type": "float", "value": scales[r]}], "input_kwargs": {},
               "output": [_stat(scaled[r])]}
        calls.append(("Tensor.__mul__.0.forward", mul,
                      None, "shared = shared * scale"))
        got = scaled[0]  # broadcast from rank 0, in place: each rank's vector before it, rank 0's after
        calls.append(("Distributed.broadcast.0.forward",
                      {"input_args": [_stat(scaled[r]), {"type": "int", "value": 0}], "input_kwargs": {},
                       "output": [_stat(got), {"type": "int", "value": 0}]}, None, "dist.broadcast(shared, src=0)"))
        h = xs[r] + got
        calls.append(("Tensor.__add__.0.forward", {"input_args": [_stat(xs[r]), _stat(got)], "input_kwargs": {},
                                                   "output": [_stat(h)]}, None, "h = x + shared"))
        y = h @ w.T + b
        lin = {"input_args": [_stat(h), _stat(w, True), _stat(b, True)], "input_kwargs": {},
               "output": [_stat(y, True)]}
        calls.append(("Functional.linear.0.forward", lin, "Module.fc.Linear.forward.0", "return F.linear(x, w, b)"))
        calls.append(("Module.fc.Linear.forward.0", {"input_args": [_stat(h)], "input_kwargs": {},
                                                     "output": [_stat(y, True)]}, None, "y = fc(h)"))
        loss = np.float32((y * y).mean())
        calls.append(("Tensor.pow.0.forward", {"input_args": [_stat(y, True), {"type": "int", "value": 2}],
                                               "input_kwargs": {}, "output": [_stat(y * y, True)]},
                      None, "loss = y.pow(2).mean()"))
        gy = (2 * y / np.float32(y.size)).astype(np.float32)
        gw, gb = gy.T @ h, gy.sum(0)
        calls.append(("Functional.linear.0.backward", {"input": [_stat(gy)], "output": [_stat(gy @ w),
                                                       _stat(gw), _stat(gb)]},
                      "Module.fc.Linear.backward.0", "loss.backward()"))
        calls.append(("Module.fc.Linear.parameters_grad.0", {"bias": [_stat(gb)], "weight": [_stat(gw)]},
                      None, "loss.backward()"))
        grads_w.append(gw)
        grads_b.append(gb)
        del loss
    total_w = sum(grads_w)
    for r in range(WORLD):
        ranks[r].append(("Distributed.all_reduce.0.forward",
                         {"input_args": [_stat(grads_w[r])], "input_kwargs": {}, "output": [_stat(total_w)]},
                         None, "dist.all_reduce(p.grad)"))
    return ranks


def _write(run: str, ranks: list[list[tuple]]) -> None:
    for r, calls in enumerate(ranks):
        out = HERE / run / "step0" / f"rank{r}"
        out.mkdir(parents=True, exist_ok=True)
        data = {name: entry for name, entry, _, _ in calls}
        dump = {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": data}
        stack = {str(i): [[name], [f"File toy_ddp.py, line {20 + i}, in step, \n {line}",
                                   "File toy_ddp.py, line 60, in main, \n step(rank)"]]
                 for i, (name, _, _, line) in enumerate(calls)}
        construct = {name: parent for name, _, parent, _ in calls}
        for fname, obj in (("dump.json", dump), ("stack.json", stack), ("construct.json", construct)):
            (out / fname).write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    for run in ("npu", "bench"):
        shutil.rmtree(HERE / run, ignore_errors=True)
    _write("bench", _run(1.5))
    _write("npu", _run(1.6))


if __name__ == "__main__":
    main()
