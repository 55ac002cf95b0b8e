"""Comparing many ranks on Dask gives the in-process compare's rows, summaries and first divergence."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("dask", reason="dask is not installed (pip install 'msprobe_nb[dask]'): the Dask path is optional")
distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install 'msprobe_nb[dask]')")

from msprobe_nb import compare, compare_on_dask  # noqa: E402
from msprobe_nb.analysis.compare import CompareError  # noqa: E402
from msprobe_nb.analysis.dask_compare import plan_units  # noqa: E402
from msprobe_nb.analysis.ranks import rank_step_summary  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_ranks  # noqa: E402

INTEROP = Path(__file__).resolve().parents[2] / "shared" / "interop" / "msprobe-2rank-collectives"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return bench_ranks.write_dumps(tmp_path_factory.mktemp("ranks"), ranks=4, rows=800, steps=2)


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as cl:
        yield cl


@pytest.fixture(scope="module")
def there(dumps, client):
    return compare_on_dask(*dumps, client=client, rows=True)


def test_rows_gathered_from_dask_equal_the_in_process_compare(dumps, there):
    npu, bench = dumps
    here = compare(npu, bench)
    pd.testing.assert_frame_equal(pd.DataFrame(there.result), pd.DataFrame(here))
    pd.testing.assert_frame_equal(there.summary, rank_step_summary(pd.DataFrame(here), here.pairs, here.divergences()))
    pd.testing.assert_frame_equal(there.pairs, here.pairs)
    assert str(there.first_divergence()) == str(here.first_divergence())
    d = there.first_divergence()
    assert (d.rank, d.step) == (2, 0) and d.through is not None and sorted(d.spread_to) == [0, 1, 3]
    assert there.result.first_divergence().call == here.first_divergence().call
    assert there.counts() == {k: v for k, v in here.counts().items() if k != "rows"} | {"rows": len(here)}
    assert there.grid().shape == (4, 2)


def test_a_lazy_dask_dataframe_of_the_rows(dumps, there):
    ddf = there.rows_frame()
    assert ddf.npartitions == 4
    errors = ddf[ddf["result"] == "error"].compute()
    want = there.result[there.result["result"] == "error"]
    got = errors.iloc[errors["pair"].to_numpy().argsort(kind="stable")]
    assert got["name"].tolist() == want["name"].tolist() and got["pair"].tolist() == want["pair"].tolist()


def test_summary_only_from_a_named_scheduler(dumps, there, client):
    r = compare_on_dask(*dumps, scheduler=client.scheduler.address)
    assert r.result is None  # no rows gathered
    pd.testing.assert_frame_equal(r.summary, there.summary)
    assert str(r.first_divergence()) == str(there.first_divergence())


def test_msprobe_trees_on_dask(client):
    if not INTEROP.is_dir():
        pytest.skip(f"the msprobe two-rank dumps are not here ({INTEROP}: ../shared is absent)")
    units, notes = plan_units(INTEROP / "npu", INTEROP / "bench")
    assert [(u.step, u.rank) for u in units] == [(0, 0), (0, 1), (1, 0), (1, 1)] and notes == []
    r = compare_on_dask(INTEROP / "npu", INTEROP / "bench", client=client, rows=True)
    here = compare(INTEROP / "npu", INTEROP / "bench")
    # stack ids are numbered by what one read loads together: the rest is the same
    skip = [c for c in here.columns if c.endswith("stack_id")]
    assert skip
    pd.testing.assert_frame_equal(pd.DataFrame(r.result).drop(columns=skip), pd.DataFrame(here).drop(columns=skip))
    d = r.first_divergence()
    assert (d.rank, d.step, d.call) == (0, 0, "Distributed.broadcast.0.forward")
    assert d.spread_to == {1: "Distributed.broadcast.0.forward"}


def test_world_sizes_and_missing_ranks_on_dask(dumps, tmp_path, client):
    npu, bench = dumps
    _, half = bench_ranks.write_dumps(tmp_path, ranks=2, rows=800, steps=2)  # recorded as world size 2
    with pytest.raises(CompareError, match="NPU run has 4 ranks .* bench run 2"):
        compare_on_dask(npu, half, client=client)
    r = compare_on_dask(npu, half, client=client, rank_map={0: 0, 1: 1})
    assert sorted(r.summary["rank"].unique()) == [0, 1]
    assert any("ranks in the NPU dump only" in n and "2, 3" in n for n in r.notes)
    with pytest.raises(FileNotFoundError, match="dump folder"):
        compare_on_dask(Path(npu) / "rank0.h5", bench, client=client)


def test_the_command_line_compares_on_dask(dumps, tmp_path, capsys, client):
    # (the default LocalCluster of worker processes runs in tests/test_bench_ranks.py)
    from msprobe_nb.cli import main
    npu, bench = dumps
    out = tmp_path / "r.csv"
    assert main(["compare", str(npu), str(bench), "--scheduler", client.scheduler.address, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "compared on Dask" in text and "first divergence over 4 ranks" in text and out.is_file()
    here = compare(npu, bench).to_msprobe_frame()
    assert len(pd.read_csv(out)) == len(here)
    assert main(["compare", str(npu), str(bench), "--workers", "0"]) == 2


def test_the_csv_from_dask_equals_the_in_process_csv_stacks_included(tmp_path, client):
    """`compare --workers/--scheduler -o` wrote N/A in NPU_Stack_Info on every row (the gathered rows had no dump
    to read stacks from): on a real 2-rank gloo run both paths now write the same bytes."""
    from distributed_runs import planted_change

    from msprobe_nb.cli import main
    runs = planted_change(tmp_path / "runs")
    here, there = tmp_path / "here.csv", tmp_path / "there.csv"
    assert main(["compare", str(runs["npu"]), str(runs["bench"]), "-o", str(here)]) in (0, 1)
    assert main(["compare", str(runs["npu"]), str(runs["bench"]), "--scheduler", client.scheduler.address,
                 "-o", str(there)]) in (0, 1)
    stacks = pd.read_csv(here, dtype=str, keep_default_na=False)["NPU_Stack_Info"]
    assert (stacks != "N/A").sum() > 0, "the in-process CSV has no stacks: the test would prove nothing"
    assert there.read_text(encoding="utf-8") == here.read_text(encoding="utf-8")


def test_mostly_unmatched_dumps_are_warned_about_on_dask_and_the_cli_exits_3(tmp_path, client):
    """Item 5 of issue 30: a small bench against a big NPU run (most NPU rows without a partner, while all of the
    bench's match) is warned about on the Dask path as in process, and `compare --scheduler` exits 3."""
    from msprobe_nb.cli import EXIT_UNMATCHED, main
    npu, _ = bench_ranks.write_dumps(tmp_path / "big", ranks=2, rows=800)
    _, bench = bench_ranks.write_dumps(tmp_path / "small", ranks=2, rows=60)
    with pytest.warns(UserWarning, match="NPU rows have no bench counterpart"):
        here = compare(npu, bench)
    assert here.mostly_unmatched
    with pytest.warns(UserWarning, match="NPU rows have no bench counterpart"):
        there = compare_on_dask(npu, bench, client=client, rows=True)
    assert there.mostly_unmatched and there.result.mostly_unmatched
    assert there.unmatched_warning == here._ctx.unmatched_warning  # the counts over all ranks, said once
    assert sum("no bench counterpart" in n for n in there.notes) == 1
    assert main(["compare", str(npu), str(bench), "--scheduler", client.scheduler.address, "-q"]) == EXIT_UNMATCHED
    same = compare_on_dask(npu, npu, client=client)
    assert not same.mostly_unmatched
