"""Without a browser, the two widget behaviours the browser test of these viewers found missing: the
pre-check viewer's verdict buttons filter its grid, and a Ranks cell moves the CompareViewer's detail to that
rank's first divergence of that step (never leaving it on another rank's call)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import four_ranks  # noqa: I001 - the planted four-rank run
from planted_kernels import planted_kernels

import msprobe_nb as mp


def test_acc_check_viewer_verdict_buttons_filter_the_grid(tmp_path):
    pytest.importorskip("ipywidgets")
    torch.manual_seed(0)
    w, x = torch.randn(16, 8, requires_grad=True), torch.randn(6, 8)
    with planted_kernels(("_softmax",)), mp.record(dump_path=str(tmp_path / "d"), task="tensor", level="L1") as dbg:
        (torch.softmax(F.linear(x, w), -1) * 2.0).sum().backward()
    v = mp.AccCheckViewer(mp.acc_check(dbg.dump_dir))
    v.widget  # noqa: B018 - builds the widgets
    buttons = v.widgets["verdict"]
    assert buttons.options == ("all", "pass", "error")
    buttons.value = "error"
    assert list(v.rows["call"]) == ["Torch.softmax.0.forward", "Torch.softmax.0.backward"]
    v.set_state(verdict=None)
    assert buttons.value == "all" and len(v.rows) == 8


def test_a_ranks_cell_moves_the_detail_to_that_ranks_first_divergence():
    pytest.importorskip("ipywidgets")
    v = mp.CompareViewer(mp.compare(four_ranks(2, 1), four_ranks(None, 1)))
    v.widget  # noqa: B018 - builds the widgets
    v.widgets["tabs"].selected_index = len(v.widgets["tabs"].children) - 1  # the Ranks tab draws its grid
    v.rank_grid.buttons[(1, 3)].click()  # step 1, rank 3: reached from rank 2 through a collective
    d = v.selected
    assert (d.step, d.rank) == (1, 3) and d.call == v.result.first_divergence(step=1, rank=3).call
    v.rank_grid.buttons[(0, 0)].click()  # a passing cell: nothing to open, no other rank's call left open
    assert v.state.rank == 0 and v.state.step == 0 and v.selected is None
