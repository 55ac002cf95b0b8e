"""Seed 003's story: trace a divergence to its device-side random draws; host-side draws make runs agree.

On a machine without CUDA the second machine's device generator is emulated honestly: the default
generator is reseeded differently right before each run's training step (weights and data identical),
which is what two devices with different random algorithms look like to the model. With CUDA present the
"npu" side really runs on CUDA (msprobe_nb.demo.machine_device).
"""
from __future__ import annotations

import os
import random

import pytest
import torch
import torch.nn as nn

import msprobe_nb
from msprobe_nb.analysis.compare import compare
from msprobe_nb.analysis.determinism import check_determinism
from msprobe_nb.analysis.provenance import trace_randomness
from msprobe_nb.demo import Denoiser, training_step
from msprobe_nb.store.dump import load

DEMO_FILE = os.path.abspath(msprobe_nb.demo.__file__)


def test_trace_names_the_randint_line_first(tmp_path):
    npu = training_step(tmp_path / "npu", "npu")
    bench = training_step(tmp_path / "bench", "bench")
    result = compare(npu, bench)
    first = result.first_divergence()
    assert first is not None and first.call == "Torch.randint.0.forward"
    trace = trace_randomness(result)
    assert trace.found
    src = trace.sources.iloc[0]
    assert src.call == "Torch.randint.0.forward"
    assert src.file == DEMO_FILE and "torch.randint" in src.code
    assert any("host" in a for a in trace.advice)
    assert "Torch.randint" in str(trace)


def test_after_fixing_randint_the_trace_finds_rand_like(tmp_path, monkeypatch):
    """The walkthrough's second round: timesteps drawn on the host, the noise is what is left."""
    def forward(self, x0):
        g = torch.Generator().manual_seed(5)
        t = torch.randint(0, self.steps, (x0.shape[0],), generator=g).to(x0.device)
        noise = torch.rand_like(x0)
        a = self.alpha_bar[t].unsqueeze(1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return torch.nn.functional.mse_loss(self.net(xt + self.t_embed(t)), noise)

    monkeypatch.setattr(Denoiser, "forward", forward)
    result = compare(training_step(tmp_path / "npu", "npu"), training_step(tmp_path / "bench", "bench"))
    trace = trace_randomness(result)
    assert list(trace.sources.call) == ["Torch.rand_like.0.forward"]


def test_with_host_random_every_call_of_the_two_runs_passes(tmp_path):
    npu = training_step(tmp_path / "npu", "npu", host_random=True, steps=2)
    bench = training_step(tmp_path / "bench", "bench", host_random=True, steps=2)
    result = compare(npu, bench)
    counts = result.counts()
    assert counts["rows"] > 200 and counts["unmatched"] == 0
    assert counts["error"] == 0 and counts["warning"] == 0 and counts["diverging"] == 0
    assert result.first_divergence() is None
    assert not trace_randomness(result).found


def test_divergence_fed_by_a_random_draw_through_other_calls(tmp_path):
    """A later call consumes a draw made earlier: walking producers back finds it."""
    def run(path, device_seed):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(3, 4)
        torch.manual_seed(device_seed)
        with msprobe_nb.record(dump_path=path, list=["linear", "mul", "relu"]):
            mask = torch.rand(3, 4)  # not in the list: recorded by nothing but its producer link
            y = torch.relu(lin(x)) * mask
        return load(path), y

    (a, _), (b, _) = run(tmp_path / "a", 1), run(tmp_path / "b", 2)
    result = compare(a, b)
    first = result.first_divergence()
    assert first.call == "Tensor.__mul__.0.forward" and first.kind == "inputs"
    trace = trace_randomness(result)
    assert not trace.found and "no recorded random draw" in trace.message


def test_seed_all_makes_two_runs_bitwise_identical_and_reports(tmp_path):
    def run(path):
        rep = msprobe_nb.seed_all(1234, verbose=False)
        model = Denoiser()
        x0 = torch.randn(8, 16)
        noise = random.random()
        with msprobe_nb.record(dump_path=path, model=model):
            loss = model(x0) * noise
            loss.backward()
        return rep, load(path), loss.detach()

    rep_a, a, la = run(tmp_path / "a")
    _, b, lb = run(tmp_path / "b")
    assert torch.equal(la, lb)
    assert check_determinism(a, b).empty
    assert "torch.manual_seed" in str(rep_a)


def test_determinism_check_separates_kernels_from_random_draws(tmp_path):
    lib = torch.library.Library("msprobe_nb_nondet", "FRAGMENT")
    lib.define("unordered_sum(Tensor x) -> Tensor")

    def unordered_sum(x):  # like an atomics-based reduction: the summation order changes run to run
        order = torch.from_numpy(__import__("numpy").random.default_rng(
            int.from_bytes(os.urandom(4), "little")).permutation(x.numel()))
        acc = torch.zeros((), dtype=x.dtype)
        for v in x.reshape(-1)[order]:
            acc = acc + v
        return acc

    lib.impl("unordered_sum", unordered_sum, "CompositeExplicitAutograd")
    x = torch.randn(64) * 1e3

    def run(path, device_seed):
        torch.manual_seed(device_seed)
        with msprobe_nb.record(dump_path=path):
            s = torch.ops.msprobe_nb_nondet.unordered_sum(x)
            torch.rand(2)
            torch.relu(x)
        return load(path), s

    for attempt in range(20):  # the order-dependent sum differs in almost every pair of runs
        (a, sa), (b, sb) = run(tmp_path / f"a{attempt}", 1), run(tmp_path / f"b{attempt}", 2)
        if not torch.equal(sa, sb):
            break
    else:
        pytest.skip("the emulated nondeterministic sum happened to agree 20 times")
    found = check_determinism(a, b).set_index("call")
    assert found.loc["msprobe_nb_nondet.unordered_sum.0.forward", "kind"] == "nondeterministic"
    assert found.loc["Torch.rand.0.forward", "kind"] == "random"
    assert "Torch.relu.0.forward" not in found.index
