"""msprobe dumps held in the repository (data/samples/) load, compare and export with the core install alone.

These run in any clone: no ``../shared``, and no torch (CI runs this file in a fresh virtual environment with
``pip install -e .`` only, and fails if a test here skips or none runs). ``msprobe_2rank`` was written by
``data/samples/msprobe_2rank/make_sample.py`` in msprobe's layout (not by the kit's exporter).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import msprobe_nb as mp

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
TWO = SAMPLES / "msprobe_2rank"


def test_the_two_rank_sample_loads_with_its_stacks_and_modules():
    d = mp.load(TWO / "npu")
    assert d.steps == [0] and d.ranks == [0, 1]
    calls = d.calls.drop_duplicates(["rank", "call"])
    assert (calls["rank"] == 0).sum() == (calls["rank"] == 1).sum() == 9
    raw = json.loads((TWO / "npu" / "step0" / "rank0" / "dump.json").read_text(encoding="utf-8"))
    assert list(calls.loc[calls["rank"] == 0, "call"]) == list(raw["data"])
    assert d.stack("Tensor.__mul__.0.forward")[0].endswith("shared = shared * scale")


def test_the_first_divergence_is_rank_0_s_scale_spread_by_the_broadcast():
    r = mp.compare(TWO / "npu", TWO / "bench", progress=False)
    assert r.mode == "statistics" and len(r.pairs) == 2
    d = r.first_divergence()
    assert (d.rank, d.step, d.call) == (0, 0, "Tensor.__mul__.0.forward")
    assert d.spread_to == {1: "Distributed.broadcast.0.forward"}
    assert r.first_divergence(rank=1).call == "Distributed.broadcast.0.forward"


def test_identical_runs_pass_everywhere():
    with pytest.warns(UserWarning, match="same dump"):
        r = mp.compare(TWO / "bench", TWO / "bench", progress=False)
    assert r.counts()["error"] == r.counts()["warning"] == 0 and r.first_divergence() is None


def test_the_msprobe_csv_has_msprobe_s_columns_and_the_stacks(tmp_path):
    out = mp.compare(TWO / "npu", TWO / "bench", progress=False).to_msprobe_csv(tmp_path / "c.csv")
    with open(out, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {"NPU Name", "Bench Name", "Result", "NPU_Stack_Info"} <= set(rows[0])
    stacked = [r for r in rows if r["NPU_Stack_Info"] != "N/A"]
    assert stacked and "toy_ddp.py" in stacked[0]["NPU_Stack_Info"]
    assert {r["Result"] for r in rows} >= {"pass"}


def test_the_denoiser_samples_part_at_the_device_draw():
    r = mp.compare(SAMPLES / "denoiser_npu", SAMPLES / "denoiser_bench", progress=False)
    assert r.first_divergence().call == "Torch.randint.0.forward"
    same = mp.compare(SAMPLES / "denoiser_npu_host_random", SAMPLES / "denoiser_bench_host_random", progress=False)
    assert same.first_divergence() is None


def test_recording_without_torch_names_the_extra_to_install():
    """Where torch is missing (the core install), ``msprobe_nb.Debugger`` says which extra brings it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"  # torch unimportable, as in the core install
            "import msprobe_nb\n"
            "try:\n    msprobe_nb.Debugger\nexcept ImportError as e:\n    print(type(e).__name__, e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("ImportError") and "pip install 'msprobe_nb[record]'" in p.stdout, p.stdout
