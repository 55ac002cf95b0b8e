"""The benchmark report's arithmetic (benchmarks/recording/report.py): pooled processes, median ratios, missed targets.

The benchmark itself runs for minutes in subprocesses; here its report is fed made-up timings.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
bench = pytest.importorskip("recording.report")


def _run(base_ms, with_ms, rss_kib=300_000):
    return {"base_ms": base_ms, "with_ms": with_ms, "base_wall_ms": base_ms, "with_wall_ms": with_ms,
            "peak_rss_kib": rss_kib, "calls": 10, "import_kib": 1024}


def test_processes_are_merged_into_a_median_ratio_with_its_range():
    runs = [_run([2.0] * 5, [8.0] * 5), _run([2.0] * 5, [6.0] * 5, 310_000), _run([2.0] * 5, [7.0] * 5, 320_000)]
    merged = bench.merge_runs(runs)
    assert merged["ratios"] == [4.0, 3.0, 3.5]
    assert bench.time_ratio(merged) == 3.5  # the median process, not the ratio of pooled medians
    assert len(merged["with_ms"]) == 15 and merged["peak_rss_kib"] == 310_000
    assert bench.time_ratio(bench.merge_runs(runs[:1])) == 4.0  # one process: its own ratio


def test_report_shows_the_range_and_lists_missed_targets():
    none = _run([2.0] * 5, [2.0] * 5)
    l1 = bench.merge_runs([_run([2.0] * 5, [8.0] * 5), _run([2.0] * 5, [6.0] * 5), _run([2.0] * 5, [7.0] * 5)])
    l0 = _run([2.0] * 5, [3.0] * 5, 400_000)
    report, missed = bench.summarize({"small": {"none": none, "stat-L1": l1, "stat-L0": l0}}, ["small"], "skipped")
    line = next(x for x in report.splitlines() if " stat-L1 " in x)
    assert "3.50x" in line and "3.00-4.00" in line and "MISSED" in line
    assert any(m.startswith("small stat-L1: time 3.50x > target 3x") for m in missed)
    assert any(m.startswith("small stat-L0: peak RSS") for m in missed)  # +33 % memory
    assert not any(m.startswith("small stat-L0: time") for m in missed)  # 1.5x is within 2x
