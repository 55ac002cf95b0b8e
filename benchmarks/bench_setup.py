"""The set-up record's cost at ``Debugger.start()`` on GPT-2 (transformers, random weights from a config; issue 34).

For each model, ``Debugger.start()`` (level L0, a fresh dump folder each time) is timed with the set-up record
and without it (``setup_snapshot.start_setup`` replaced by a no-op for the second), alternating, and the
record's cost is the median difference; the record alone (``collect_setup`` and the JSON write) is timed too,
split into the parameter hashes and the rest. The first start of the process is reported apart: it pays for
one-time work (the first listing of site-packages, the first read of the device). Models: ``tiny`` (the
tests' 2-layer, 32-wide GPT-2) and ``gpt2`` (GPT-2 small, 124 M parameters, 0.5 GB of float32: the hashes
read every byte of it once). Run:

    python benchmarks/bench_setup.py [--models tiny,gpt2] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

CONFIGS = {"tiny": dict(n_layer=2, n_embd=32, n_head=4, vocab_size=96, n_positions=12),
           "gpt2": {}}


def _model(name: str) -> torch.nn.Module:
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIGS[name]))


def _start(model, folder: Path) -> float:
    import msprobe_nb as mp
    dbg = mp.Debugger(dump_path=str(folder), level="L0", model=model)
    t = time.perf_counter()
    dbg.start()
    took = time.perf_counter() - t
    dbg.stop()
    dbg.close()
    return took


def measure(name: str, repeats: int, root: Path) -> dict:
    import msprobe_nb.setup_snapshot as snap
    from msprobe_nb.capture.setup_record import collect_setup
    from msprobe_nb.capture.tensor_hashes import tensor_hashes
    from msprobe_nb.store.setup_store import write_setup
    model = _model(name)
    real = snap.start_setup
    first = _start(model, root / f"{name}_first")
    on, off = [], []
    for i in range(repeats):
        for with_record in ((True, False) if i % 2 else (False, True)):
            snap.start_setup = real if with_record else (lambda *a, **k: None)
            try:
                (on if with_record else off).append(_start(model, root / f"{name}_{i}_{with_record}"))
            finally:
                snap.start_setup = real
    params = list(model.parameters())
    hashes, whole = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        tensor_hashes(params)
        hashes.append(time.perf_counter() - t)
        t = time.perf_counter()
        write_setup(root, collect_setup(model=model))
        whole.append(time.perf_counter() - t)
    ms = 1e3
    return {"model": name, "params": sum(p.numel() for p in params), "first": first * ms,
            "start_on": statistics.median(on) * ms, "start_off": statistics.median(off) * ms,
            "cost": statistics.median(a - b for a, b in zip(on, off, strict=True)) * ms,
            "record": statistics.median(whole) * ms, "hashes": statistics.median(hashes) * ms,
            "bytes": (root / "setup_rank0.json").stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny,gpt2")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, 1 thread; times in ms, medians of {a.repeats}")
    print(f"{'model':6} {'params':>11} {'first start':>11} {'start':>7} {'no record':>9} {'cost':>6} "
          f"{'record':>7} {'hashes':>7} {'JSON bytes':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            r = measure(name, a.repeats, Path(tmp))
            print(f"{r['model']:6} {r['params']:>11,} {r['first']:>11.1f} {r['start_on']:>7.1f} {r['start_off']:>9.1f} "
                  f"{r['cost']:>6.1f} {r['record']:>7.1f} {r['hashes']:>7.1f} {r['bytes']:>10,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
