"""Random sources while recording: which generator each draw used, dropout off, host-side draws."""
from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import msprobe_nb
from msprobe_nb.store.hdf5_reader import read_hdf5


class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.drop2d = nn.Dropout2d(0.5)

    def forward(self, x):
        y = self.drop(self.fc(x)) + F.dropout(x, 0.4)
        return y + self.drop2d(y.view(2, 3, 2, 1)).view(2, 6)


def _step(tmp_path, device_seed, **kw):
    torch.manual_seed(0)
    model = DropNet().train()
    x = torch.randn(2, 6)
    torch.manual_seed(device_seed)  # the "device generator" differs from run to run
    with msprobe_nb.record(dump_path=tmp_path / f"d{device_seed}", **kw):
        out = model(x)
        noise = torch.rand_like(out)
        t = torch.randint(0, 1000, (4,))
    return out, noise, t


def test_dropout_off_gives_identical_outputs_across_seeds_in_train_mode(tmp_path):
    outs = [_step(tmp_path, seed, dropout_off=True)[0] for seed in (1, 2, 3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
    torch.manual_seed(0)
    model = DropNet()
    x = torch.randn(2, 6)
    with torch.no_grad():
        y = model.fc(x) + x
        assert torch.equal(outs[0], y + y)  # p=0: every dropout is the identity


def test_without_options_dropout_differs_across_seeds(tmp_path):
    a, b = _step(tmp_path, 1)[0], _step(tmp_path, 2)[0]
    assert not torch.equal(a, b)


def test_host_random_draws_identical_numbers_whatever_the_device_generator(tmp_path):
    a = _step(tmp_path, 1, host_random=True, seed=42)
    b = _step(tmp_path, 2, host_random=True, seed=42)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    calls = read_hdf5(tmp_path / "d1").calls
    draws = calls[calls.rng != ""].drop_duplicates("call").set_index("call")
    assert draws.loc["Torch.randint.0.forward", "rng"].startswith("host")


def test_random_sources_are_recorded_with_generator_and_state(tmp_path):
    gen = torch.Generator().manual_seed(9)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        torch.randint(0, 5, (3,))
        torch.randn(2, generator=gen)
        torch.empty(3).uniform_()
        nn.init.normal_(torch.empty(2, 2))
        random.random()
        np.random.rand(2)
        torch.manual_seed(77)
        torch.rand(1)
    calls = read_hdf5(tmp_path / "d").calls
    draws = calls[calls.rng != ""].drop_duplicates("call").set_index("call")
    assert draws.loc["Torch.randint.0.forward", "rng"] == "cpu"
    assert draws.loc["Torch.randn.0.forward", "rng"].startswith("custom")
    assert "Tensor.uniform_.0.forward" in draws.index and "Init.normal_.0.forward" in draws.index
    assert draws.loc["Random.random.0.forward", "rng"] == "python"
    assert draws.loc["NumpyRandom.rand.0.forward", "rng"] == "numpy"
    assert draws.loc["Torch.rand.0.forward", "rng_state"].startswith("seed=77 ")  # the reseed shows
    # wrappers are gone after recording
    assert not hasattr(random.random, "__wrapped__") and not hasattr(np.random.rand, "__wrapped__")


def test_python_random_wrappers_follow_a_function_replaced_between_steps(tmp_path):
    orig = random.random
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d")
    dbg.start()
    random.random()
    dbg.stop()
    dbg.step()
    assert random.random is orig  # restored at stop
    random.random = lambda: 0.25  # e.g. a test double installed between steps
    try:
        dbg.start()
        assert random.random() == 0.25  # the user's function runs, wrapped
        dbg.stop()
        assert random.random() == 0.25 and random.random.__name__ == "<lambda>"
    finally:
        random.random = orig
        dbg.close()
    calls = read_hdf5(tmp_path / "d").calls
    assert set(calls[calls.family == "Random"].step) == {0, 1}
