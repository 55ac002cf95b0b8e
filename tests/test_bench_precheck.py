"""The pre-check benchmark (benchmarks/bench_precheck.py): its report's arithmetic on made-up timings, and one
real replay of a one-layer benchmark model, which must grade every API and fail none."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
bench = pytest.importorskip("bench_precheck")


def test_report_gives_apis_per_second_and_the_online_ratio():
    counts = {"pass": 9, "warning": 0, "error": 1, "unchecked": 2}
    results = {"replay": {"tensor": {"seconds": [2.0, 4.0, 3.0], "apis": 300, "outputs": 600, "counts": counts}},
               "online": {"base": [0.01, 0.02, 0.03], "online": [0.5, 0.4, 0.6], "ratio": 25.0}}
    text = bench.report(results)
    assert "300 forward APIs (600 outputs) in 3.00 s median (best 2.00 s) = 100 APIs/s" in text
    assert "1 error, 2 unchecked" in text
    assert "step 500 ms vs plain 20 ms median = 25.0x" in text


def test_one_layer_replay_grades_every_api_and_fails_none(tmp_path):
    r = bench.replay_throughput(bench.record(1, "statistics", tmp_path), repeat=1)
    assert r["apis"] > 30 and len(r["seconds"]) == 1
    assert r["counts"]["error"] == 0 and r["counts"]["pass"] > r["counts"]["unchecked"]
