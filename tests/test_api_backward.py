"""API backward rows: the gradient of each output in, the gradient of each tensor input out, from this call.

One call often makes several autograd nodes (a linear on a 3-d input, cross_entropy, indexing, SDPA's math
path); the rows must hold the gradients of the call's own inputs, not of an internal view.
"""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load


def run(tmp_path, fn, level="L1"):
    dbg = Debugger(dump_path=str(tmp_path / "d"), level=level, task="statistics")
    dbg.start()
    out = fn()
    dbg.stop()
    c = load(str(tmp_path / "d")).calls
    return out, {n: r for n, r in zip(c["name"], c.itertuples())}


def same_stats(row, t):
    t = t.detach().double()
    assert tuple(row.shape) == tuple(t.shape), (row.name, row.shape, t.shape)
    assert row.max == pytest.approx(float(t.max()), rel=1e-5, abs=1e-7)
    assert row.min == pytest.approx(float(t.min()), rel=1e-5, abs=1e-7)
    assert row.norm == pytest.approx(float(t.norm()), rel=1e-5, abs=1e-7)


def test_linear_on_a_3d_input_records_the_gradient_of_input_weight_and_bias(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    x = torch.randn(2, 3, 8, requires_grad=True)

    def step():
        y = lin(x)
        (y * torch.arange(4.0)).sum().backward()
        return y
    y, rows = run(tmp_path, step)
    same_stats(rows["Functional.linear.0.backward.input.0"], torch.ones(2, 3, 4) * torch.arange(4.0))
    same_stats(rows["Functional.linear.0.backward.output.0"], x.grad)
    same_stats(rows["Functional.linear.0.backward.output.1"], lin.weight.grad)
    same_stats(rows["Functional.linear.0.backward.output.2"], lin.bias.grad)


def test_cross_entropy_records_the_gradient_of_its_logits(tmp_path):
    torch.manual_seed(0)
    logits = torch.randn(6, 4, requires_grad=True)
    target = torch.tensor([0, 1, 2, 3, 0, 1])
    _, rows = run(tmp_path, lambda: F.cross_entropy(logits, target).backward())
    row = rows["Functional.cross_entropy.0.backward.output.0"]
    same_stats(row, logits.grad)
    assert row.max > 0.05  # the gradient through NllLoss alone has max 0.0


def test_indexing_and_sdpa_record_their_inputs_gradients(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 3, requires_grad=True)
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))

    def step():
        a = x[:, :, None, None]
        o = F.scaled_dot_product_attention(q, k, v)
        ((a * 3).sum() + (o * o).sum()).backward()
    _, rows = run(tmp_path, step)
    same_stats(rows["Tensor.__getitem__.0.backward.output.0"], x.grad)
    for i, t in enumerate((q, k, v)):
        same_stats(rows[f"Functional.scaled_dot_product_attention.0.backward.output.{i}"], t.grad)


def test_gradients_are_this_calls_contribution_only_and_summed_over_its_edges(tmp_path):
    x = torch.randn(5, requires_grad=True)

    def step():
        y = torch.mul(x, x)  # two edges into x from one call: the call's gradient of x is 2x
        z = x * 3
        (y + z).sum().backward()
    _, rows = run(tmp_path, step)
    same_stats(rows["Torch.mul.0.backward.output.0"], 2 * x.detach())
    same_stats(rows["Tensor.__mul__.0.backward.output.0"], torch.full((5,), 3.0))
    assert "Torch.mul.0.backward.output.1" not in rows  # x passed twice: one input, one gradient
    same_stats(rows["Tensor.__mul__.0.backward.input.0"], torch.ones(5))


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_recording_the_new_backward_rows_changes_no_bit(tmp_path, level):
    def train(record):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
        x = torch.randn(2, 3, 8, requires_grad=True)
        dbg = Debugger(dump_path=str(tmp_path / f"d{record}"), level=level, task="statistics") if record else None
        if dbg:
            dbg.start(model)
        h = model(x)
        loss = F.cross_entropy(h.reshape(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])) + h[:, :, None].square().mean()
        loss.backward()
        if dbg:
            dbg.stop()
        return [loss.detach(), x.grad] + [p.grad for p in model.parameters()]
    for a, b in zip(train(False), train(True)):
        assert torch.equal(a, b)


def test_tensors_inside_a_namedtuple_argument_get_their_gradient_rows(tmp_path):
    """A namedtuple argument (a tuple subclass) is walked into its fields for the forward rows, and so for the
    backward rows too: ``torch.cat`` of a namedtuple of two tensors has the gradient of each."""
    pair = collections.namedtuple("Pair", "a b")
    torch.manual_seed(0)
    x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    weights = torch.randn(6)

    def step():
        (torch.cat(pair(x * 1, y * 1)) * weights).sum().backward()
    _, rows = run(tmp_path, step)
    same_stats(rows["Torch.cat.0.backward.output.0.a"], weights[:3])
    same_stats(rows["Torch.cat.0.backward.output.0.b"], weights[3:])


def test_every_one_of_many_flat_tensor_arguments_gets_its_gradient_row(tmp_path):
    """A call with more positional tensors than the fast path's table of paths (300 here: block_diag of
    every matrix) still has a backward output row for each of them, the last ones included."""
    torch.manual_seed(0)
    mats = [torch.randn(1, 2, requires_grad=True) for _ in range(300)]
    weights = torch.randn(300, 600)

    def step():
        out = torch.block_diag(*mats)
        (out * weights).sum().backward()
    _, rows = run(tmp_path, step)
    for i in (0, 63, 64, 255, 256, 299):
        same_stats(rows[f"Torch.functional.block_diag.0.backward.output.{i}"], mats[i].grad)
