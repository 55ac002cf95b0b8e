"""Other threads while a step records: their module calls reach the global module hooks but are not recorded.

The L1 mode is the starting thread's alone (torch keeps a mode stack per thread); the module hooks are global,
so a thread that runs modules beside the training step (a data pipeline's ``nn.Module`` transforms, an EMA
model, an evaluation thread) reaches them as well. They record the starting thread's calls only: another
thread's calls pushed onto the one module stack would mis-parent the step's calls, and rows it added after
``stop()`` wrote the step broke the next write (an IndexError from ``Debugger.step()``, the step dropped).
"""
from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch
import torch.nn as nn
from helpers import handlers

import msprobe_nb


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("level", ["mix", "L0"])
def test_another_thread_s_modules_are_not_recorded_and_break_nothing(tmp_path, level, c):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    side = nn.Sequential(nn.Linear(8, 8), nn.Tanh())  # Tanh: a module only the other thread runs
    x = torch.randn(6, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.detach()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    want = [step() for _ in range(3)]
    model.load_state_dict(state)
    stop, ran, errors = threading.Event(), [0], []

    def other():
        try:
            with torch.no_grad():
                while not stop.is_set():
                    side(torch.ones(2, 8))
                    model[0](torch.ones(2, 16))  # a module of the recorded model: its path is known
                    ran[0] += 1
        except Exception as e:  # pragma: no cover - reported by the assertion below
            errors.append(repr(e))
    with handlers(c), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level=level)
        t = threading.Thread(target=other, daemon=True)
        t.start()
        try:
            got = []
            for _ in range(3):
                dbg.start(model)
                seen = ran[0]
                while ran[0] < seen + 20:  # the other thread runs its modules while this step records
                    time.sleep(0.001)
                got.append(step())
                dbg.stop()
                dbg.step()
        finally:
            stop.set()
            t.join(20)
        dbg.close()
    assert not t.is_alive() and not errors
    assert [str(w.message) for w in caught if "msprobe_nb" in str(w.message)] == []
    assert all(map(torch.equal, got, want))  # the step computes bitwise what it computes without the kit
    calls = msprobe_nb.load(tmp_path / "d").calls
    assert sorted(set(calls["step"])) == [0, 1, 2] and not dbg.errors
    modules = calls[calls.family == "Module"]
    assert set(modules.op) == {"Linear", "ReLU"}, set(modules.op)  # no Tanh: the other thread's are not recorded
    # the step's own module calls each step: 2 Linear + 1 ReLU forward, their inputs and outputs alike
    fwd = modules[modules.direction == "forward"]
    assert fwd.groupby("step").call.nunique().tolist() == [3, 3, 3]
    assert fwd[fwd.io == "output"].groupby("step").call.nunique().tolist() == [3, 3, 3]


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("level", ["mix", "L0"])
def test_a_backward_on_another_thread_records_as_on_the_starting_one(tmp_path, level, c):
    """On accelerators autograd runs a backward on its own thread per device, and a checkpointed module's
    recomputation runs there. A backward run on another thread (as CUDA's is) records the same rows, the
    recomputed modules' included, as the same step with its backward on the starting thread."""
    def run(where, on_thread: bool):
        torch.manual_seed(0)
        block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
        head = nn.Linear(8, 2)
        model = nn.ModuleDict({"block": block, "head": head})
        x = torch.randn(4, 8, requires_grad=True)
        with handlers(c):
            dbg = msprobe_nb.Debugger(dump_path=where, level=level)
            dbg.start(model)
            h = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            loss = head(h).square().mean()
            if on_thread:
                t = threading.Thread(target=loss.backward)
                t.start()
                t.join(20)
            else:
                loss.backward()
            dbg.stop()
            dbg.step()
            dbg.close()
        assert not dbg.errors
        return msprobe_nb.load(where).calls, [p.grad for p in model.parameters()]
    here, grads_here = run(tmp_path / "here", False)
    there, grads_there = run(tmp_path / "there", True)
    cols = ["call", "direction", "io", "name", "parent", "shape", "max", "min", "mean", "norm"]
    assert here[cols].equals(there[cols])
    assert all(map(torch.equal, grads_here, grads_there))
    recomputed = there[(there.family == "Module") & (there.direction == "recompute")]
    assert set(recomputed.op) >= {"Linear", "GELU"}, set(there.direction)


class _Gate(nn.Module):
    """On the recording thread, its forward lets another thread run this very module (while its own call is
    on the module stack) before it goes on."""

    def __init__(self, main: int, inside: threading.Event, done: threading.Event):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.main, self.inside, self.done = main, inside, done

    def forward(self, x):
        if threading.get_ident() == self.main:
            self.inside.set()
            assert self.done.wait(20), "the other thread did not run"
            self.done.clear()
        return self.lin(x)


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("level", ["mix", "L0"])
def test_another_thread_running_a_module_the_step_is_inside_leaves_its_call_alone(tmp_path, level, c):
    """The other thread's forward hook of a module whose call the step has on its module stack pops nothing:
    the step's call gets its outputs and parents as without the other thread."""
    inside, done, stop = threading.Event(), threading.Event(), threading.Event()
    torch.manual_seed(0)
    gate = _Gate(threading.get_ident(), inside, done)
    model = nn.Sequential(nn.Linear(8, 8), gate)
    x = torch.randn(4, 8)

    def other():
        while not stop.is_set():
            if inside.wait(0.05):
                inside.clear()
                with torch.no_grad():
                    gate(torch.ones(2, 8))
                done.set()
    t = threading.Thread(target=other, daemon=True)
    t.start()
    try:
        with handlers(c):
            dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level=level)
            for _ in range(2):
                dbg.start(model)
                model(x).sum().backward()
                dbg.stop()
                dbg.step()
            dbg.close()
    finally:
        stop.set()
        t.join(20)
    assert not dbg.errors
    calls = msprobe_nb.load(tmp_path / "d").calls
    fwd = calls[(calls.family == "Module") & (calls.direction == "forward")]
    for step, rows in fwd.groupby("step"):
        outs = set(rows[rows.io == "output"].call)
        assert {c for c in rows.call if "_Gate" in c} <= outs, (step, sorted(set(rows.call)))
        lin = rows[rows.call.str.contains(r"\.lin\.|Linear") & (rows.io == "output")]
        assert lin.parent.str.contains("_Gate").any(), (step, lin[["call", "parent"]])
