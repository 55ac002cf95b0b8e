"""The monitor's cheap default (issue 32): norms and NaN / inf counts of the weights the step used and of the
gradients, nothing else unless asked, and training bitwise the same with it as without it."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import msprobe_nb as mp
from msprobe_nb.store.monitor_schema import DEFAULT_STATS


def _mlp(layers=12, width=256):
    torch.manual_seed(0)
    mods: list = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _train(model, opt, steps, mon=None, batch=64):
    g = torch.Generator().manual_seed(1)
    width = model[0].in_features
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if mon is not None:
            mon.step(loss=loss)
    return losses


def test_the_default_records_norms_and_counts_of_weights_and_gradients_only(tmp_path):
    model = _mlp(3, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m")) as mon:
        _train(model, opt, 3, mon)
    m = mp.load_monitor(tmp_path / "m")
    assert mon.stats == list(DEFAULT_STATS) == ["norm", "nan", "inf"]
    assert m.columns == ["norm", "nan", "inf", "numel"]
    assert set(m.stats["kind"]) == {"weight", "grad"}  # no optimizer state, no activations unless asked
    assert (m.stats[["nan", "inf"]] == 0).all().all()


def test_a_12_layer_mlp_with_adamw_trains_bitwise_the_same_under_the_default_monitor(tmp_path):
    plain_model = _mlp()
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=1e-3)
    plain = _train(plain_model, plain_opt, 12)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m")) as mon:
        watched = _train(model, opt, 12, mon)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain_model.state_dict().values(), model.state_dict().values(),
                                                 strict=True))
    assert all(torch.equal(plain_opt.state[a]["exp_avg_sq"], opt.state[b]["exp_avg_sq"])
               for a, b in zip(plain_model.parameters(), model.parameters(), strict=True))


def test_a_gpt2_trains_bitwise_the_same_under_the_default_monitor(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: no GPT-2 to try")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))

    def run(path):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg)  # dropout on: the monitor must not draw from the generator
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = mp.Monitor(model, opt, dump_path=str(path)) if path else None
        losses = []
        for _ in range(6):
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if mon:
                mon.step(loss=loss)
        if mon:
            mon.close()
        return losses, model.state_dict()

    (plain, plain_w), (watched, w) = run(None), run(tmp_path / "g")
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert all(torch.equal(plain_w[k], w[k]) for k in plain_w)


def test_counts_are_exact_where_a_norm_is_not_finite_and_zero_where_it_is(tmp_path):
    """The counts are taken only where the norm says a NaN or an inf is there; a tensor of huge finite values
    (its float32 norm overflows to inf) has none."""
    model = _mlp(3, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m"), alerts=False) as mon:
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        g = model[2].weight.grad
        g[0, :3] = float("nan")
        g[1, :2] = float("inf")
        g[2, 0] = -float("inf")
        model[4].bias.grad.fill_(1e30)  # finite, but its squares overflow float32
        opt.step()
        mon.step()
    s = mp.load_monitor(tmp_path / "m").stats.set_index(["kind", "name"])
    assert tuple(s.loc[("grad", "2.weight"), ["nan", "inf"]]) == (3, 3)
    assert tuple(s.loc[("grad", "4.bias"), ["nan", "inf"]]) == (0, 0) and s.loc[("grad", "4.bias"), "norm"] > 1e30
    assert (s.drop([("grad", "2.weight"), ("grad", "4.bias")])[["nan", "inf"]] == 0).all().all()


def test_the_weights_recorded_are_those_the_step_computed_with(tmp_path):
    """Read in the optimizer's pre-hook: a weight changed between two steps shows in the next step's row."""
    model = _mlp(2, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = []
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m"), alerts=False) as mon:
        for step in range(3):
            opt.zero_grad()
            model(torch.ones(2, 8)).sum().backward()
            want.append(model[2].weight.norm().item())
            opt.step()
            if step == 0:
                with torch.no_grad():
                    model[2].weight.add_(1.0)
            mon.step()
    s = mp.load_monitor(tmp_path / "m").stats
    got = s.loc[(s["kind"] == "weight") & (s["name"] == "2.weight"), "norm"].tolist()
    assert got == pytest.approx(want, rel=1e-6)


def _train_accumulating(model, opt, steps, k, mon=None, record=None):
    """``steps`` optimizer steps of ``k`` micro-batches each (one backward per micro-batch, the loss over k)."""
    g = torch.Generator().manual_seed(2)
    width = model[0].in_features
    xs = torch.randn(steps * k, 8, width, generator=g)
    ys = torch.randn(steps * k, 8, width, generator=g)
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for m in range(k):
            loss = nn.functional.mse_loss(model(xs[s * k + m]), ys[s * k + m]) / k
            loss.backward()
            total = total + loss.detach()
        if record is not None:  # the accumulated gradients the optimizer is about to use
            record.append({n: p.grad.detach().double().norm().item() for n, p in model.named_parameters()})
        opt.step()
        losses.append(total)
        if mon is not None:
            mon.step(loss=total)
    return losses


def test_under_gradient_accumulation_the_norms_are_the_accumulated_gradients_and_training_is_unchanged(tmp_path):
    """optimizer.step every k=4 backward passes: the default monitor changes no bit of the training, and the
    gradient norm it records per step is the norm of the k micro-batches' summed gradient at optimizer.step,
    not of one micro-batch's."""
    k, steps = 4, 6
    model = _mlp(3, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain = _train_accumulating(model, opt, steps, k)
    plain_w = [p.detach().clone() for p in model.parameters()]
    model = _mlp(3, 16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    want: list = []
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m")) as mon:
        watched = _train_accumulating(model, opt, steps, k, mon=mon, record=want)
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain_w, model.parameters(), strict=True))
    st = mp.load_monitor(tmp_path / "m").stats
    grads = st.loc[st["kind"] == "grad"]
    assert sorted(set(grads["step"])) == list(range(steps))
    for step, norms in enumerate(want):
        got = grads.loc[grads["step"] == step].set_index("name")["norm"]
        assert set(got.index) == set(norms)
        for name, n in norms.items():
            assert got[name] == pytest.approx(n, rel=1e-5), (step, name)
    sc = mp.load_monitor(tmp_path / "m").scalars
    if "micro_batches" in sc.columns:
        assert (sc["micro_batches"] == k).all()
