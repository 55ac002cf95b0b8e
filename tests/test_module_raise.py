"""Module hooks on the exception path: torch calls always-call forward hooks as ``hook(module, args,
result)`` when a forward raises; the stack entry must be popped without a warning and without an output."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import msprobe_nb as mp
from msprobe_nb.store.hdf5_reader import read_hdf5


class Raises(nn.Module):
    def forward(self, x):
        raise ValueError("boom")


class CatchesRaise(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.bad = Raises()
        self.b = nn.Linear(3, 3)

    def forward(self, x):
        x = self.a(x)
        try:
            self.bad(x)
        except ValueError:
            pass
        return self.b(x)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_module_that_raises_inside_a_model_is_popped_cleanly(level, tmp_path):
    torch.manual_seed(0)
    model = CatchesRaise()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mp.record(dump_path=tmp_path / "d", level=level, model=model) as dbg:
            for _ in range(2):
                model(torch.randn(2, 3)).sum().backward()
    assert dbg.errors == []
    calls = read_hdf5(tmp_path / "d").calls
    names = set(calls.name)
    for k in (0, 1):
        assert f"Module.bad.Raises.forward.{k}.input.0" in names
        assert not any(n.startswith(f"Module.bad.Raises.forward.{k}.output") for n in names)
        assert f"Module.b.Linear.forward.{k}.output.0" in names
    # the failed call left nothing on the stack: later calls are not parented under it
    assert set(calls[calls.call.str.startswith("Module.b.Linear.forward")].parent) == {""}


class CheckpointedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(checkpoint(self.mlp, x, use_reentrant=False))


def _checkpointed_step(record=None):
    torch.manual_seed(0)
    model = CheckpointedMLP()
    x = torch.randn(4, 8, requires_grad=True)
    if record is None:
        loss = model(x).sum()
        loss.backward()
    else:
        with mp.record(model=model, **record) as dbg:
            loss = model(x).sum()
            loss.backward()
        assert dbg.errors == []
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, x.grad


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_non_reentrant_checkpointing_records_without_warnings_and_bit_for_bit(level, tmp_path):
    """The recomputation in backward stops early by raising inside the checkpointed modules."""
    loss0, grads0, xgrad0 = _checkpointed_step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss1, grads1, xgrad1 = _checkpointed_step({"dump_path": tmp_path / "d", "level": level})
    assert torch.equal(loss0, loss1) and torch.equal(xgrad0, xgrad1)
    assert grads0.keys() == grads1.keys()
    for name in grads0:
        assert torch.equal(grads0[name], grads1[name]), name
    names = set(read_hdf5(tmp_path / "d").calls.name)
    assert "Module.mlp.Sequential.forward.0.output.0" in names
    assert "Module.head.Linear.forward.0.output.0" in names
    assert "Module.mlp.0.Linear.parameters_grad.0.weight" in names
