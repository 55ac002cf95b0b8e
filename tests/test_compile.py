"""torch.compile under recording: compiled numerics kept bitwise, what is visible recorded, compile="eager",
and ``compile_check`` naming the module that compiles differently (inductor on the CPU)."""
from __future__ import annotations

import warnings

import pytest
import torch

import msprobe_nb as mp

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")


class Scaled(torch.nn.Module):
    """A module whose compiled graph computes something else than its eager forward (a planted wrong
    decomposition): 1 % more under torch.compile."""

    def forward(self, x):
        return x * 1.01 if torch.compiler.is_compiling() else x


def _model(planted: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)]
    return torch.nn.Sequential(*layers, *([Scaled()] if planted else []), torch.nn.Linear(16, 4))


def _train(tmp_path, level, compile_mode="compiled", steps=3):
    model = _model()
    cm = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    dbg = mp.Debugger(dump_path=str(tmp_path / f"{level}_{compile_mode}"), level=level, model=cm,
                      compile=compile_mode) if level else None
    gen = torch.Generator().manual_seed(1)
    losses = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(steps):
            x = torch.randn(4, 8, generator=gen)
            if dbg:
                dbg.start()
            loss = cm(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if dbg:
                dbg.stop()
                dbg.step()
            losses.append(loss.detach())
        if dbg:
            dbg.close()
    ours = [str(w.message) for w in seen if str(w.message).startswith("msprobe_nb")]
    return losses, [p.detach().clone() for p in model.parameters()], dbg, ours


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("plain"), None)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_compiled_model_trains_bitwise_and_records_what_is_visible(tmp_path, plain, level):
    losses, params, dbg, ours = _train(tmp_path, level)
    assert all(torch.equal(a, b) for a, b in zip(losses, plain[0], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(params, plain[1], strict=True))
    dump = dbg.load()
    calls = set(dump.calls["call"].astype(str))
    assert sorted(set(dump.calls["step"])) == [0, 1, 2]
    if level in ("L0", "mix"):  # the compiled root's call, named for the module it wraps
        assert "Module.compiled.Sequential.forward.0" in calls
    if level in ("L1", "mix"):  # each compiled graph as one call, with its backward
        assert {"Function.CompiledFunction.0.forward", "Function.CompiledFunction.0.backward"} <= calls
    assert len(ours) == 1 and "compile='eager'" in ours[0]  # said once, with what to do
    assert "compile='eager'" in dump.meta["compile_note"]
    assert not any("_orig_mod" in c for c in calls)


def test_compile_eager_gives_per_call_rows_and_says_whose_numerics(tmp_path):
    _, _, dbg, ours = _train(tmp_path, "mix", compile_mode="eager", steps=1)
    dump = dbg.load()
    calls = set(dump.calls["call"].astype(str))
    assert {"Module.0.Linear.forward.0", "Functional.linear.0.forward", "Functional.layer_norm.0.forward"} <= calls
    assert not any(c.startswith("Function.CompiledFunction") for c in calls)
    assert "eager numerics" in dump.meta["compile_note"] and not ours


def test_compile_is_an_option_of_every_shell():
    from msprobe_nb.options import BY_NAME
    assert BY_NAME["compile"].choices == ("compiled", "eager")
    with pytest.raises(mp.ConfigError, match="compile"):
        mp.DumpConfig(compile="fast")


def test_compile_check_names_the_module_that_compiles_differently():
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    found = mp.compile_check(_model(planted=True), x)
    assert found.module == "3" and str(found.first.call) == "Module.3.Scaled.forward.0"
    clean = mp.compile_check(_model(), x)
    assert clean.first is None and clean.module is None and len(clean.compiled) == 4
