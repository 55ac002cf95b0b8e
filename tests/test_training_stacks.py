"""Training stacks the kit must leave bitwise unchanged and record: gradient accumulation, and AMP (bf16
autocast on the CPU with a GradScaler). Activation checkpointing (tests/test_checkpointing.py), DDP
(tests/test_collectives.py) and plain bf16 autocast (tests/test_stats_half.py) have their own tests."""
from __future__ import annotations

import pytest
import torch

import msprobe_nb as mp


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)) for _ in range(6)]


def _train(dump=None, level="L1", accumulation=2, amp=False):
    """3 optimizer steps of ``accumulation`` micro-batches each; (losses, final parameters)."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0) if amp else None
    dbg = mp.Debugger(dump_path=str(dump), level=level, model=model).start() if dump else None
    losses = []
    torch.manual_seed(2)  # dropout's draws
    batches = _batches()
    for step in range(3):
        for x, y in batches[step * accumulation:(step + 1) * accumulation]:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = torch.nn.functional.mse_loss(model(x).float(), y) / accumulation
            (scaler.scale(loss) if amp else loss).backward()
            losses.append(loss.detach().clone())
        if amp:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
        if dbg:
            dbg.step()
    if dbg:
        dbg.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def _bitwise(a, b) -> None:
    assert len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))


@pytest.mark.parametrize("level", ["L1", "mix", "L2"])
def test_gradient_accumulation_is_bitwise_and_each_micro_batch_is_recorded(tmp_path, level):
    plain = _train(accumulation=2)
    recorded = _train(tmp_path / "d", level, accumulation=2)
    _bitwise(plain, recorded)
    calls = mp.load(tmp_path / "d").calls
    assert sorted(set(calls["step"])) == [0, 1, 2]
    name = "Aten.addmm" if level == "L2" else "Functional.linear" if level == "L1" else "Module.0.Linear.forward"
    fwd = calls.loc[calls["call"].str.startswith(name) & calls["call"].str.contains("forward"), ["step", "call"]]
    per_step = fwd.drop_duplicates().groupby("step").size()
    assert (per_step >= 2).all() and per_step.nunique() == 1, per_step  # both micro-batches, every step
    grads = calls.loc[calls["name"].str.contains("parameters_grad"), "step"] if level == "mix" else None
    assert grads is None or sorted(set(grads)) == [0, 1, 2]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_autocast_with_a_grad_scaler_is_bitwise_and_the_scaler_s_calls_are_recorded(tmp_path, level):
    plain = _train(accumulation=1, amp=True)
    recorded = _train(tmp_path / "d", level, accumulation=1, amp=True)
    _bitwise(plain, recorded)
    calls = mp.load(tmp_path / "d").calls
    assert sorted(set(calls["step"])) == [0, 1, 2]
    assert (calls["dtype"] == "torch.bfloat16").any()  # autocast's dtypes as they are
    if level == "L1":  # the scaler's own torch calls: its scale multiply and its unscale-and-check
        assert calls["call"].str.contains("_amp_foreach_non_finite_check_and_unscale_|_amp_update_scale_").any()
