"""Regenerate the sample dumps in data/samples/ (see README.md there): ``python data/samples/make_samples.py``.

Each sample is one training step of seed 003's denoiser (``msprobe_nb.demo``) recorded by the kit on one of
the two emulated machines and exported in msprobe's own on-disk format (``step0/rank0/dump.json``,
``stack.json``, ``construct.json``), exactly what ``msprobe`` writes on an Ascend machine with
``task: statistics``. Weights, data and the emulated device generators are seeded, so a rerun with the same
torch build writes the same bytes. Absolute paths in the stacks are shortened (repository files relative to
the repository, installed packages to ``site-packages/...``) so the files do not depend on where the
repository or the virtual environment lives.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: sample folder -> (machine, recording options, what it is)
SAMPLES = {
    "denoiser_npu": ("npu", {}, "the 'NPU' machine of seed 003: timesteps and noise drawn on its device generator"),
    "denoiser_bench": ("bench", {}, "the bench (GPU/CPU) machine of seed 003: same seed, other device generator"),
    "denoiser_npu_host_random": ("npu", {"host_random": True},
                                 "the 'NPU' machine again, every random draw made on the host (host_random=True)"),
    "denoiser_bench_host_random": ("bench", {"host_random": True},
                                   "the bench machine again, every random draw made on the host (host_random=True)"),
}


def _short_path(path: str, repo: Path) -> str:
    """A frame's file path without the machine-specific prefix."""
    p = path.replace("\\", "/")
    m = re.search(r"/(?:site|dist)-packages/(.*)$", p)
    if m:
        return "site-packages/" + m.group(1)
    m = re.search(r"/lib/python\d+\.\d+/(.*)$", p)
    if m:
        return "lib/python/" + m.group(1)
    root = str(repo).replace("\\", "/").rstrip("/") + "/"
    return p[len(root):] if p.startswith(root) else p


_FRAME = re.compile(r"^File (?P<path>.+?), line (?P<rest>\d+.*)$", re.S)


def _normalize_stacks(stack_json: Path, repo: Path) -> None:
    """Shorten the file paths of every frame in a stack.json (keeps msprobe's layout)."""
    data = json.loads(stack_json.read_text(encoding="utf-8"))

    def fix(frame: str) -> str:
        m = _FRAME.match(frame)
        return f"File {_short_path(m.group('path'), repo)}, line {m.group('rest')}" if m else frame

    for key, value in data.items():
        if isinstance(value, list) and len(value) == 2 and isinstance(value[1], list):  # {id: [[calls], [frames]]}
            value[1] = [fix(f) for f in value[1]]
        elif isinstance(value, list):  # old format {call: [frames]}
            data[key] = [fix(f) for f in value]
    stack_json.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")


def make(out: Path = HERE, names: list[str] | None = None) -> list[Path]:
    """Record and export the samples into ``out``; returns the folders written."""
    from msprobe_nb.demo import training_step

    written = []
    with tempfile.TemporaryDirectory(prefix="msprobe_nb_samples_") as tmp:
        for name in names or list(SAMPLES):
            machine, options, _ = SAMPLES[name]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dump = training_step(Path(tmp) / name, machine, seed=0, level="mix", task="statistics", **options)
            target = out / name
            if target.exists():
                shutil.rmtree(target)
            dump.export_msprobe(target)
            for stack in sorted(target.glob("step*/rank*/stack.json")):
                _normalize_stacks(stack, REPO)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE, help="where to write the samples (default: beside this file)")
    p.add_argument("names", nargs="*", metavar="NAME", help=f"samples to make: {', '.join(SAMPLES)} (default: all)")
    a = p.parse_args(argv)
    unknown = [n for n in a.names if n not in SAMPLES]
    if unknown:
        p.error(f"unknown sample(s) {unknown}; choose from {list(SAMPLES)}")
    for folder in make(a.out, a.names or None):
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        print(f"wrote {folder} ({size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
