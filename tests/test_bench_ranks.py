"""benchmarks/bench_ranks.py run tiny: both paths measured in their own processes, the same answer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="distributed is not installed (pip install 'msprobe_nb[dask]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_ranks  # noqa: E402


def test_bench_ranks_runs_tiny_and_reports_both_paths(tmp_path, capsys):
    assert bench_ranks.main(["--ranks", "2", "--rows", "400", "--workers", "1", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    dask = next(line for line in out.splitlines() if line.strip().startswith("dask:"))
    here = next(line for line in out.splitlines() if line.strip().startswith("in_process:"))
    assert "800 rows" in dask and "800 rows" in here and "driver peak RSS" in dask
    assert "same rows and first divergence: True" in out and "under 2048 MiB: met" in out
    # the planted change: rank 1 (the middle of 2 ranks) parts first
    assert "first divergence [0, 1, " in dask
