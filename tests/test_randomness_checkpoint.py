"""dropout_off and host_random under activation checkpointing (capture/checkpoint_draws.py).

A checkpointed region's recompute must draw what its forward drew, or the gradients belong to another mask
(or torch raises CheckpointError). Where the kit's mode reaches the recompute (a reentrant checkpoint at L1 and
mix) the changed draws repeat, host draws included; where it cannot (use_reentrant=False at any level, any
checkpoint at L0), the draws are left as drawn, so the model computes bitwise what it computes without the kit.
"""
from __future__ import annotations

import tempfile
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import enable_checkpointing, handlers
from torch.utils.checkpoint import checkpoint

import msprobe_nb
from msprobe_nb.capture.random_apis import LEFT_AS_DRAWN


class _Region(nn.Module):
    """Draws followed by more ops, so a recompute that draws otherwise is seen: module and functional dropout,
    attention's dropout, a factory on the default generator, a hand-made mask."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        h = self.drop(self.a(x).relu())
        h = F.dropout(self.b(h), p=0.4, training=True).tanh()
        q = h.view(2, 1, -1, 8)
        h = h + F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).reshape(-1, 8)
        h = h * torch.rand(h.shape).add(0.5) + torch.empty_like(h).bernoulli_(0.7)
        return self.a(h).sigmoid()


def _run(kind: str, level: str | None, c: bool = True, **options):
    """Forward output, loss and gradients of one step of ``_Region`` (checkpointed by ``kind``: "none",
    "reentrant", "non-reentrant"), recorded at ``level`` with the C or the Python handler (None: no kit)."""
    torch.manual_seed(0)
    model = _Region()
    x = torch.randn(6, 8, requires_grad=True)
    dbg = None
    with handlers(c):
        try:
            if level is not None:
                dbg = msprobe_nb.Debugger(dump_path=tempfile.mkdtemp(), level=level, seed=11, **options)
                dbg.start(model)
            torch.manual_seed(1)
            out = model(x) if kind == "none" else checkpoint(model, x, use_reentrant=kind == "reentrant")
            loss = out.square().mean()
            loss.backward()
        finally:
            if dbg is not None:
                dbg.stop()
                dbg.close()
    return out.detach(), loss.detach(), [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def _same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and all(torch.equal(u, v) for u, v in zip(a[2], b[2]))


OPTIONS = [{"dropout_off": True}, {"host_random": True}, {"dropout_off": True, "host_random": True}]
IDS = ["dropout-off", "host-random", "both"]


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_reentrant_region_repeats_the_changed_draws_in_its_recompute(options, c, level):
    """At L1 and mix the kit's mode replays a reentrant region: dropout with p=0 and host draws repeat, so the
    checkpointed step computes bitwise what the same step computes without checkpointing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "left as drawn" warning here
        warnings.filterwarnings("ignore", "msprobe_nb. no call was recorded")
        plain = _run("none", level, c, **options)
        ckpt = _run("reentrant", level, c, **options)
    assert _same(plain, ckpt)


class _Nested(nn.Module):
    """A reentrant checkpoint inside another: the outer region's first host draw is made in the inner one."""

    def __init__(self):
        super().__init__()
        self.inner, self.out = _Region(), nn.Linear(8, 8)

    def forward(self, x, checkpointed: bool):
        h = checkpoint(self.inner, x, use_reentrant=True) if checkpointed else self.inner(x)
        return F.dropout(self.out(h), p=0.3, training=True).sigmoid() * torch.rand(h.shape)


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_nested_reentrant_regions_repeat_their_host_draws(c):
    """Each region's replay starts from its own first host draw, the outer one's included."""
    def run(checkpointed: bool):
        torch.manual_seed(0)
        model = _Nested()
        x = torch.randn(6, 8, requires_grad=True)
        dbg = msprobe_nb.Debugger(dump_path=tempfile.mkdtemp(), level="L1", host_random=True, seed=4)
        with handlers(c):
            try:
                dbg.start(model)
                torch.manual_seed(1)
                out = checkpoint(model, x, True, use_reentrant=True) if checkpointed else model(x, False)
                out.square().mean().backward()
            finally:
                dbg.stop()
                dbg.close()
        return out.detach(), out.square().mean().detach(), [x.grad] + [p.grad for p in model.parameters()]

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "msprobe_nb. no call was recorded")
        assert _same(run(False), run(True))


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("kind,level", [("non-reentrant", "L1"), ("non-reentrant", "mix"), ("non-reentrant", "L0"),
                                        ("reentrant", "L0")])
def test_a_region_recomputed_outside_the_mode_keeps_its_draws_and_says_so(options, kind, level):
    """The recompute runs without any function mode: the policy leaves the region's draws as drawn (with a
    warning), so the step is bitwise the step without the kit, where changing them made torch raise
    CheckpointError or gave the gradients of another mask."""
    bare = _run(kind, None)
    with pytest.warns(RuntimeWarning, match="cannot reach the recompute of this activation checkpoint"):
        kit = _run(kind, level, **options)
    assert _same(bare, kit)


def test_draws_left_as_drawn_are_named_so_in_the_dump(tmp_path):
    torch.manual_seed(0)
    model = _Region()
    x = torch.randn(6, 8, requires_grad=True)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1", dropout_off=True, host_random=True, seed=3)
    with pytest.warns(RuntimeWarning, match="left as drawn"):
        dbg.start(model)
        checkpoint(model, x, use_reentrant=False).sum().backward()
        model(x).sum().backward()  # outside the region: changed as asked
        dbg.stop()
        dbg.step()
    dbg.close()
    calls = msprobe_nb.load(tmp_path / "d").calls
    rng = calls[calls.io == "input"].drop_duplicates("call").set_index("call").rng
    inside = [r for r in rng if r.endswith(LEFT_AS_DRAWN)]
    assert len(inside) == 5  # nn.Dropout, F.dropout, attention, rand, bernoulli_ of the checkpointed pass
    assert {"dropout-off", "host (for cpu)"} <= set(rng)


def test_without_a_checkpoint_nothing_is_left_as_drawn(tmp_path):
    torch.manual_seed(0)
    model = _Region()
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L0", dropout_off=True, host_random=True, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.filterwarnings("ignore", "msprobe_nb. no call was recorded")
        dbg.start(model)
        model(torch.randn(6, 8)).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_gpt2_with_gradient_checkpointing_trains_as_without_the_kit_or_as_unchecked(reentrant):
    """Hugging Face's gradient checkpointing on GPT-2 (dropout in attention and residuals) at L1: non-reentrant,
    with dropout_off and host_random, the blocks' draws are left as drawn and the step is bitwise the
    kit-free step (it raised CheckpointError before); reentrant, with host_random, the recompute repeats the
    host draws, so the step is bitwise the same recorded step without checkpointing."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the models extra)")

    def step(level, ckpt):
        torch.manual_seed(0)
        # every draw inside the checkpointed blocks (attention and residual dropout; none on the embeddings)
        cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                      embd_pdrop=0.0, attn_pdrop=0.2, resid_pdrop=0.2)
        model = transformers.GPT2LMHeadModel(cfg).train()
        if ckpt:
            enable_checkpointing(model, reentrant)
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        dbg = None
        if level is not None:
            # reentrant: host_random alone, so the dropout masks are host draws the recompute must repeat
            dbg = msprobe_nb.Debugger(dump_path=tempfile.mkdtemp(), level=level, dropout_off=not reentrant,
                                      host_random=True, seed=2)
            dbg.start(model)  # seeds torch with the config's seed: both arms are seeded again below
        torch.manual_seed(5)
        try:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        finally:
            if dbg is not None:
                dbg.stop()
                dbg.close()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = step("L1", True)
        want = step(None, True) if not reentrant else step("L1", False)
    assert torch.equal(got[0], want[0])
    if not reentrant:
        assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    else:
        # the recompute runs the blocks' GEMMs again, in other memory: MKL's kernels on some CPUs (AMD EPYC here,
        # unless MKL_CBWR=COMPATIBLE) round by the buffers' alignment, so the gradients may differ in the last
        # bits (2e-7 relative here). A draw the recompute did not repeat changes them by the mask's share.
        for a, b in zip(got[1], want[1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(self.a(x).relu())).tanh()


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="no gloo in this build")
@pytest.mark.parametrize("options", [{"dropout_off": True}, {"host_random": True}], ids=["dropout-off", "host-random"])
def test_fsdp2_with_checkpoint_wrapper_trains_as_without_the_kit(tmp_path, options):
    """FSDP2 (fully_shard, one rank) over blocks wrapped by torch.distributed's checkpoint_wrapper, whose
    default is the non-reentrant checkpoint: the step is bitwise the kit-free step (dropout_off raised
    CheckpointError before, host_random gave other gradients)."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    def step(kit: bool):
        torch.manual_seed(0)
        model = nn.Sequential(checkpoint_wrapper(_Block()), checkpoint_wrapper(_Block()), nn.Linear(8, 2))
        for block in model[:2]:
            fully_shard(block)
        fully_shard(model)
        x = torch.randn(4, 8)
        dbg = msprobe_nb.Debugger(dump_path=tmp_path / f"d{kit}", level="L1", **options) if kit else None
        if dbg is not None:
            dbg.start(model)
        torch.manual_seed(1)
        try:
            loss = model(x).square().mean()
            loss.backward()
        finally:
            if dbg is not None:
                dbg.stop()
                dbg.close()
        return loss.detach(), [p.grad.full_tensor() for p in model.parameters()]

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        want = step(False)
        with pytest.warns(RuntimeWarning, match="left as drawn"):
            got = step(True)
    finally:
        dist.destroy_process_group()
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
