"""Custom autograd.Function calls are recorded as calls of their own, forward and backward."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from msprobe_nb.analysis.compare import compare
from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load


def scale_fn(back_factor):
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k, y):
            ctx.k = k
            return torch.mul(x, k) + y

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k * back_factor, None, g
    return Scale


class Square(torch.autograd.Function):  # the setup_context style: forward has no ctx
    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def train(path, fn, level="mix", record=True):
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    dbg = Debugger(dump_path=str(path), level=level, task="statistics") if record else None
    if dbg:
        dbg.start(lin)
    h = lin(x)
    y = Square.apply(fn.apply(h, 3.0, x))
    loss = y.sigmoid().sum()
    loss.backward()
    if dbg:
        dbg.stop()
    return [loss.detach(), x.grad] + [p.grad for p in lin.parameters()]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_custom_function_is_a_call_with_its_inputs_outputs_and_backward(tmp_path, level):
    train(tmp_path / "d", scale_fn(1.0), level)
    c = load(str(tmp_path / "d")).calls
    rows = dict(zip(c["name"], c.itertuples()))
    assert rows["Function.Scale.0.forward.input.0"].producer == \
        ("Functional.linear.0.forward" if level == "L1" else "Module.0.Linear.forward.0")
    assert rows["Function.Scale.0.forward.input.1"].value == "3.0"
    assert "Function.Scale.0.forward.output.0" in rows and "Function.Scale.0.backward.output.0" in rows
    assert "Function.Scale.0.backward.output.2" in rows  # the gradient it returns for y (input 2)
    assert "Function.Square.0.forward.output.0" in rows and "Function.Square.0.backward.output.0" in rows
    # the Function opens before the calls its forward makes
    first = c.drop_duplicates("call").set_index("call")["call_index"]
    assert first["Function.Scale.0.forward"] < first["Torch.mul.0.forward"]
    consumer = rows["Function.Square.0.forward.input.0"]
    assert consumer.producer == "Function.Scale.0.forward"


def test_a_wrong_custom_backward_is_the_first_divergence(tmp_path):
    train(tmp_path / "npu", scale_fn(0.5))
    train(tmp_path / "bench", scale_fn(1.0))
    d = compare(load(str(tmp_path / "npu")), load(str(tmp_path / "bench"))).first_divergence()
    assert d.call == "Function.Scale.0.backward" and d.kind == "call"


def test_recording_custom_functions_changes_no_bit(tmp_path):
    for a, b in zip(train(tmp_path / "x", scale_fn(1.0), record=False), train(tmp_path / "y", scale_fn(1.0))):
        assert torch.equal(a, b)


def test_a_function_whose_context_reuses_a_dead_ones_id_is_still_opened(tmp_path):
    """Under no_grad a Function's ctx dies when apply returns, and the next call's ctx often takes its memory,
    so its id: the new call is opened all the same, with its inputs (its ctx is not the dead one)."""
    fn = scale_fn(1.0)
    x, y = torch.randn(3), torch.randn(3)
    dbg = Debugger(dump_path=str(tmp_path / "d"), level="L1", task="statistics")
    dbg.start()
    with torch.no_grad():
        for _ in range(6):
            fn.apply(x, 2.0, y)
    dbg.stop()
    dbg.step()
    dbg.close()
    c = load(str(tmp_path / "d")).calls
    inputs = c[c.call.str.startswith("Function.Scale.") & (c.io == "input")]
    assert sorted(inputs.call.unique()) == [f"Function.Scale.{i}.forward" for i in range(6)]
