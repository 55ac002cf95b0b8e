"""msprobe's multi-rank layout both ways: a kit dump of many ranks exported to step*/rank* and read back."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from helpers import INTEROP, ar, f, table  # noqa: I001

from msprobe_nb import compare, load
from msprobe_nb.store.hdf5_writer import DumpWriter

KEPT = ["step", "rank", "call", "name", "io", "arg", "kind", "dtype", "shape", "max", "min", "mean", "norm"]


def _kit_dump(root: Path, scale_rank: int | None = None) -> Path:
    """4 ranks x 2 steps of the kit's HDF5 (a collective with its process group); ``scale_rank`` changes
    that rank's f1 at step 1, which reaches the others through the all_reduce."""
    for rank in range(4):
        with DumpWriter(root, rank=rank, meta={"task": "statistics", "level": "mix"}) as w:
            for step in (0, 1):
                y = 2.0 * (1.5 if rank == scale_rank and step == 1 else 1.0)
                out = 9.0 * (1.5 if scale_rank is not None and step == 1 else 1.0)
                t = table({rank: [f(0, 1.0), f(1, 1.0, y), ar(0, y, out), f(2, out)]}, step=step, group=[0, 1, 2, 3])
                w.write_step(step, {c: t[c].tolist() for c in t.columns if c not in ("step", "rank")}, {}, {}, {})
    return root


@pytest.fixture
def kit(tmp_path):
    return _kit_dump(tmp_path / "kit")


def test_a_multi_rank_kit_dump_exports_to_step_rank_folders_and_reads_back(kit, tmp_path):
    d = load(kit)
    assert d.ranks == [0, 1, 2, 3] and d.steps == [0, 1]
    out = d.export_msprobe(tmp_path / "ms")
    assert sorted(str(p.relative_to(out)) for p in out.glob("step*/rank*")) == [
        f"step{s}/rank{r}" for s in (0, 1) for r in range(4)]
    back = load(out)
    a = d.calls[KEPT].sort_values(["step", "rank", "name"]).reset_index(drop=True)
    b = back.calls[KEPT].sort_values(["step", "rank", "name"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    group = back.calls[(back.calls["arg"] == "group") & (back.calls["rank"] == 3)]
    assert len(group) == 2 and all(json.loads(v)["group_ranks"] == [0, 1, 2, 3] for v in group["value"])


def test_the_exported_tree_compares_as_the_kit_dump_does(tmp_path):
    npu = _kit_dump(tmp_path / "npu", scale_rank=1)
    bench = _kit_dump(tmp_path / "bench")
    here = compare(npu, bench)
    exported = compare(load(npu).export_msprobe(tmp_path / "npu_ms"), load(bench).export_msprobe(tmp_path / "b_ms"))
    cols = ["step", "rank", "name", "result", "err"]
    a, b = (pd.DataFrame(x)[cols].sort_values(cols[:3]).reset_index(drop=True) for x in (here, exported))
    pd.testing.assert_frame_equal(a, b)  # the same rows (the exported tree puts keyword inputs before outputs)
    d = exported.first_divergence()
    assert (d.rank, d.step, d.call) == (1, 1, "Functional.f.1.forward")
    assert sorted(d.spread_to) == [0, 2, 3] and d.through == "Distributed.all_reduce.0.forward"


def test_the_real_two_rank_tree_round_trips(tmp_path):
    if not INTEROP.is_dir():
        pytest.skip(f"the msprobe two-rank dumps are not here ({INTEROP}: ../shared is absent)")
    d = load(INTEROP / "npu")
    back = load(d.export_msprobe(tmp_path / "out"))
    pd.testing.assert_frame_equal(d.calls, back.calls)


def _msprobe_cli() -> list[str] | None:
    exe = os.environ.get("MSPROBE_BIN") or shutil.which("msprobe")
    return [exe] if exe else None


@pytest.mark.skipif(_msprobe_cli() is None, reason="msprobe (mindstudio-probe) is not installed here; set "
                                                   "MSPROBE_BIN to compare against msprobe's own compare")
def test_msprobe_compare_of_an_exported_multi_rank_tree_gives_our_rows(tmp_path):
    npu = _kit_dump(tmp_path / "npu", scale_rank=1)
    bench = _kit_dump(tmp_path / "bench")
    n_ms, b_ms = load(npu).export_msprobe(tmp_path / "n_ms"), load(bench).export_msprobe(tmp_path / "b_ms")
    ours = compare(n_ms, b_ms).to_msprobe_frame()
    for rank in range(4):
        out = tmp_path / f"out{rank}"
        subprocess.run([*_msprobe_cli(), "compare", "-tp", str(n_ms / "step0" / f"rank{rank}" / "dump.json"),
                        "-gp", str(b_ms / "step0" / f"rank{rank}" / "dump.json"), "-o", str(out)],
                       check=True, capture_output=True, timeout=300)
        with open(next(out.glob("compare_result_*.csv")), newline="", encoding="utf-8") as fh:
            theirs = [row["NPU Name"] for row in csv.DictReader(fh)]
        mine = ours[(ours["Step"].astype(str) == "0") & (ours["Rank"].astype(str) == str(rank))] \
            if "Step" in ours.columns else ours
        assert sorted(theirs) == sorted(mine["NPU Name"].tolist())
