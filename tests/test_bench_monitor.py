"""benchmarks/bench_monitor.py runs end to end on a tiny model and reports each target with its verdict
(the measured figures come from running it on the large model, never from a test)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
bench = pytest.importorskip("bench_monitor")


def test_the_benchmark_runs_on_a_tiny_model_and_reports_every_configuration(tmp_path):
    results = bench.run(size=1, pairs=2, warmup=1, root=str(tmp_path))
    assert set(results) == set(bench.CONFIGS)
    for name, r in results.items():
        assert r["ratio"] > 0 and r["base_ms"] > 0
        assert (r["bytes_per_step"] > 0) == (name != bench.READ_FLOOR)  # the read floor writes nothing
    assert results["+signs"]["bytes_per_step"] > results["default"]["bytes_per_step"]  # the bitmaps
    mlp = bench.run(size="mlp", pairs=2, warmup=1, root=str(tmp_path / "mlp"), configs={"default": ({}, 1.1)})
    assert mlp["default"]["tensors"] == 48  # 12 layers: weight and bias, each read as weight and gradient
    floor, n = bench.one_read_floor_us(bench.build_mlp(), repeat=2)
    assert n == 48 and floor > 0
    text, _ = bench.report(results)
    assert all(name in text for name in bench.CONFIGS)


def test_the_report_says_by_how_much_a_target_is_missed():
    r = {"default": {"ratio": 1.0506, "target": 1.03, "with_ms": 105.06, "base_ms": 100.0, "bytes_per_step": 1e4},
         "all-stats": {"ratio": 1.5, "target": None, "with_ms": 150.0, "base_ms": 100.0, "bytes_per_step": 2e4}}
    text, missed = bench.report(r)
    line = next(x for x in text.splitlines() if x.startswith("default"))
    assert "1.051x" in line and "MISSED by 2.0 %" in line
    assert missed == ["default: 1.051x > target 1.03x"] and "no target" in text
