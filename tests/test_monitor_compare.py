"""compare_monitors' first divergence (issue 32): for runs bitwise equal at first, the first value that differs
at all, named by what parted first in the step; for runs that differ from the start, the first step where a
series' ratio leaves the band it held over the early steps."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import msprobe_nb as mp


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _run(path, steps=200, after_update=None, before_update=None, noise=0.0, optimizer="adam"):
    """Full-batch steps of ``Net``; ``before_update(step, model)`` runs between backward and the optimizer's
    step, ``after_update(step, model)`` after it; ``noise``: a relative change of the inputs from the start."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g)
    x = x * (1 + noise)
    with mp.Monitor(model, opt, dump_path=str(path), alerts=False, optimizer_state=True) as mon:
        for step in range(steps):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if before_update:
                before_update(step, model)
            opt.step()
            if after_update:
                after_update(step, model)
            mon.step(loss=loss)


def _nudge_fc2_after_180(step, model):
    if step == 180:
        with torch.no_grad():
            model.fc2.weight.add_(1e-3)


def test_a_weight_changed_after_step_180_s_update_is_named_at_181_weight_first(tmp_path):
    _run(tmp_path / "a")
    _run(tmp_path / "b", after_update=_nudge_fc2_after_180)
    g = mp.compare_monitors(tmp_path / "b", tmp_path / "a")
    fd = g.first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what, fd.mode) == (181, "fc2.weight", "weight", "weight", "bitwise")
    assert fd.band == (1.0, 1.0) and fd.norm_ratio != 1.0 and abs(fd.norm_ratio - 1) < 1e-3  # under 1 %
    assert "first value that differs" in fd.reason
    at = g.table.loc[(g.table["step"] == 181) & (g.table["kind"] == "weight")]
    assert list(at.loc[at["norm_ratio"] != 1.0, "name"]) == ["fc2.weight"]  # the only weight that differs
    assert (g.table.loc[g.table["step"] <= 180, "norm_ratio"] == 1.0).all()


def test_a_gradient_scaled_before_the_update_is_named_gradient_first(tmp_path):
    def scale(step, model):
        if step == 150:
            model.fc1.weight.grad.mul_(1.0 + 1e-6)

    _run(tmp_path / "a", steps=160)
    _run(tmp_path / "b", steps=160, before_update=scale)
    fd = mp.compare_monitors(tmp_path / "b", tmp_path / "a").first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what) == (150, "fc1.weight", "grad", "gradient")


def test_runs_that_differ_from_the_start_part_where_a_ratio_leaves_its_early_band(tmp_path):
    def scale(step, model):
        if step == 120:
            model.fc2.weight.grad.mul_(1.05)

    _run(tmp_path / "a", steps=140, optimizer="sgd")
    _run(tmp_path / "b", steps=140, optimizer="sgd", noise=1e-6, before_update=scale)
    g = mp.compare_monitors(tmp_path / "b", tmp_path / "a")
    assert (g.table.loc[g.table["step"] == 0, "norm_ratio"] != 1.0).any()  # not bitwise equal at first
    fd = g.first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what, fd.mode) == (120, "fc2.weight", "grad", "gradient", "band")
    assert fd.norm_ratio == pytest.approx(1.05, rel=1e-3)
    assert fd.band[0] < 1.0 < fd.band[1] < 1.01 and "left the band" in fd.reason
    same = mp.compare_monitors(tmp_path / "a", tmp_path / "a")
    assert same.first_divergence() is None
