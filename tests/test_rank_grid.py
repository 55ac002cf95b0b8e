"""The rank x step grid of verdicts and its click, without a browser."""
from __future__ import annotations

import pandas as pd
import pytest
from helpers import f, four_ranks, table  # noqa: I001 - the planted four-rank run

from msprobe_nb import compare
from msprobe_nb.viewers import CompareViewer
from msprobe_nb.viewers.rank_grid import RankGrid, grid_html, rank_calls, rank_cells, rank_grid


@pytest.fixture(scope="module")
def result():
    return compare(four_ranks(2, 1), four_ranks(None, 1))


def test_grid_holds_a_verdict_per_rank_and_step(result):
    g = rank_grid(result)
    assert list(g.index) == [0, 1, 2, 3] and list(g.columns) == [0, 1, 2]
    assert (g[0] == "pass").all() and (g[2] == "pass").all()  # only step 1 was changed
    assert (g[1] == "error").all()


def test_cells_mark_the_origin_and_the_ranks_it_reached(result):
    c = rank_cells(result).set_index(["step", "rank"])
    assert c.loc[(1, 2), "role"] == "origin" and c.loc[(1, 2), "first_call"] == "Functional.f.1.forward"
    assert [c.loc[(1, r), "role"] for r in (0, 1, 3)] == ["spread"] * 3
    assert (c.loc[0, "role"] == "").all() and "step 1, rank 2: error" in c.loc[(1, 2), "title"]
    h = grid_html(rank_cells(result))
    assert h.count("<tr>") == 5 and "● error" in h and "↳ error" in h


def test_a_cell_opens_that_ranks_calls(result):
    calls = rank_calls(result, rank=2, step=1)
    assert list(calls["call"]) == ["Functional.f.0.forward", "Functional.f.1.forward",
                                   "Distributed.all_reduce.0.forward", "Functional.f.2.forward",
                                   "Distributed.all_reduce.1.forward"]
    assert set(calls["rank"]) == {2} and set(calls["step"]) == {1}
    picked = []
    grid = RankGrid(result, lambda r, s: picked.append((r, s)))
    grid.buttons[(1, 2)].click()
    assert picked == [(2, 1)] and len(grid.buttons) == 12
    assert grid.buttons[(1, 2)].description == "● error"


def test_the_compare_viewer_has_a_ranks_tab_that_filters_its_table(result):
    v = CompareViewer(result)
    v.open_rank(3, 1)
    rows = v.rows
    assert set(rows["rank"]) == {3} and set(rows["step"]) == {1} and len(rows) == 10
    v.widget  # noqa: B018 - builds the widgets
    tabs = v.widgets["tabs"]
    titles = [tabs.get_title(i) for i in range(len(tabs.children))]
    assert titles[-1] == "Ranks"
    tabs.selected_index = len(titles) - 1  # opening the tab draws the grid
    v.rank_grid.buttons[(1, 2)].click()  # rank 2, step 1
    assert tabs.selected_index == 0 and v.state.rank == 2 and v.state.step == 1
    assert set(v.rows["rank"]) == {2}


def test_one_rank_has_no_ranks_tab():
    r = compare(table({0: [f(0, 1.0)]}), table({0: [f(0, 1.0)]}))
    assert rank_grid(r).shape == (1, 1)
    assert pd.DataFrame(rank_cells(r))["role"].tolist() == [""]
