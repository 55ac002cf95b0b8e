"""The gradient and training monitor (issue 18): two runs part where a change was planted, a planted NaN is the
first anomaly, the run's numbers are bitwise those of the run without the monitor, and the record holds what
the model's tensors hold."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import enable_checkpointing

import msprobe_nb as mp

STEPS = 300


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g)


def train(path=None, steps=STEPS, plant=None, groups=False, optimizer="sgd", monitor=True, **kw):
    """``steps`` full-batch steps of ``Net``; ``plant(step, model, opt)`` runs between backward and the optimizer
    step. Returns (losses, gradients of the last step, the monitor or None)."""
    torch.manual_seed(0)
    model = Net()
    params = ([{"params": list(m.parameters())} for m in (model.fc1, model.fc2, model.fc3)] if groups
              else model.parameters())
    opt = (torch.optim.SGD(params, lr=0.05) if optimizer == "sgd" else torch.optim.AdamW(params, lr=1e-2))
    mon = mp.Monitor(model, opt, dump_path=str(path), on_exists="overwrite", **kw) if monitor else None
    x, y = _data()
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if plant is not None:
            plant(step, model, opt)
        opt.step()
        losses.append(loss.detach().clone())
        if mon is not None:
            mon.step(loss=loss)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    if mon is not None:
        mon.close()
    return losses, grads, mon


def _scale_fc2_at_180(step, model, opt):
    if step == 180:
        model.fc2.weight.grad.mul_(2.0)


def _halve_fc2_lr_at_180(step, model, opt):
    if step == 180:
        opt.param_groups[1]["lr"] *= 0.5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("mon") / "ref"
    train(path, signs=True)
    return path


def test_a_scaled_gradient_at_step_180_is_where_the_runs_part(reference, tmp_path):
    train(tmp_path / "b", plant=_scale_fc2_at_180, signs=True)
    g = mp.compare_monitors(tmp_path / "b", reference)
    fd = g.first_divergence()
    assert (fd.step, fd.name, fd.layer, fd.kind) == (180, "fc2.weight", "fc2", "grad")
    assert fd.norm_ratio == pytest.approx(2.0, rel=1e-6) and fd.direction == 1.0  # scaled: same signs
    before = g.table.loc[g.table["step"] < 180]
    assert not before["parts"].any() and (before["norm_ratio"] == 1.0).all()
    assert (before.loc[before["kind"] == "grad", "direction"] == 1.0).all()
    at = g.parting()
    assert set(at.loc[at["step"] == 180, "layer"]) == {"fc2"}  # only the planted layer parts at step 180


def test_a_changed_learning_rate_of_one_group_at_step_180_is_named(tmp_path):
    train(tmp_path / "a", groups=True, steps=190)
    train(tmp_path / "b", groups=True, steps=190, plant=_halve_fc2_lr_at_180)
    fd = mp.compare_monitors(tmp_path / "b", tmp_path / "a").first_divergence()
    assert (fd.step, fd.layer, fd.kind) == (180, "fc2", "lr") and fd.norm_ratio == 0.5
    same = mp.compare_monitors(tmp_path / "a", tmp_path / "a")
    assert same.first_divergence() is None and not same.table["parts"].any()


def test_a_nan_planted_at_step_240_is_the_first_anomaly_and_alerts_once(tmp_path, capsys):
    def plant(step, model, opt):
        if step == 240:
            model.fc2.bias.grad[3] = float("nan")

    _, _, mon = train(tmp_path / "nan", plant=plant, steps=250)
    out = capsys.readouterr().out
    a = mp.load_monitor(tmp_path / "nan").anomalies()
    first = a.iloc[0]
    assert (first["step"], first["rank"], first["name"], first["kind"], first["rule"]) == \
        (240, 0, "fc2.bias", "grad", "nonfinite")
    assert not (a["step"] < 240).any()  # nothing flagged before it
    lines = [x for x in out.splitlines() if "grad of fc2.bias is nan" in x]
    assert lines == ["msprobe_nb monitor: step 240, rank 0: grad of fc2.bias is nan (first seen)"]
    assert lines[0] in mon.alerts
    m = mp.load_monitor(tmp_path / "nan")
    row = m.stats.loc[(m.stats["step"] == 240) & (m.stats["name"] == "fc2.bias") & (m.stats["kind"] == "grad")]
    assert row["nan"].item() == 1 and math.isnan(row["norm"].item())


def test_a_spike_and_a_direction_drop_are_flagged_where_planted(tmp_path):
    def plant(step, model, opt):
        if step == 40:
            model.fc1.weight.grad.mul_(30.0)
        if step == 60:
            model.fc2.weight.grad.neg_()

    train(tmp_path / "s", steps=70, plant=plant, signs=True)
    a = mp.load_monitor(tmp_path / "s").anomalies()
    spikes = a.loc[a["rule"] == "spike"].sort_values("step", kind="stable")
    assert (spikes.iloc[0]["step"], spikes.iloc[0]["name"]) == (40, "fc1.weight")
    drops = a.loc[a["rule"] == "direction_drop"].sort_values("step", kind="stable")
    assert (drops.iloc[0]["step"], drops.iloc[0]["name"]) == (60, "fc2.weight")
    assert drops.iloc[0]["value"] < 0.1  # every sign flipped
    assert set(drops["step"]) <= {60, 61}  # and back: nothing else


def test_monitoring_changes_no_bit_of_the_loss_or_any_gradient(tmp_path):
    plain_losses, plain_grads, _ = train(steps=25, monitor=False, optimizer="adam")
    losses, grads, _ = train(tmp_path / "m", steps=25, optimizer="adam", activations=True, signs=True,
                             histogram=[-0.01, 0.0, 0.01])
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
    assert grads.keys() == plain_grads.keys()
    assert all(torch.equal(grads[n], plain_grads[n]) for n in grads)


def test_the_record_holds_the_tensors_aggregates(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _data()
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "r"), activations=True, histogram=[-0.01, 0.0, 0.01],
                    signs=True, stats=("norm", "min", "max", "mean", "nan", "inf"), optimizer_state=True) as mon:
        for _ in range(3):
            opt.zero_grad()
            for half in (x[:32], x[32:]):  # two micro-batches accumulated into one step
                nn.functional.mse_loss(model(half), y[:32]).backward()
            grad = model.fc2.weight.grad.clone()
            used = model.fc2.weight.norm().item()  # the weight this step's forward used
            opt.step()
            mon.step(loss=1.5)
    m = mp.load_monitor(tmp_path / "r")
    s = m.stats.loc[m.stats["step"] == 2].set_index(["kind", "name"])
    g = s.loc[("grad", "fc2.weight")]
    assert g["norm"] == pytest.approx(grad.norm().item(), rel=1e-6)
    assert (g["min"], g["max"], g["numel"]) == pytest.approx((grad.min().item(), grad.max().item(), grad.numel()))
    assert g["mean"] == pytest.approx(grad.mean().item(), rel=1e-5, abs=1e-9)
    hist = [g[f"hist_{i}"] for i in range(4)]
    assert hist == [(grad < -0.01).sum().item(), ((grad >= -0.01) & (grad < 0)).sum().item(),
                    ((grad >= 0) & (grad < 0.01)).sum().item(), (grad >= 0.01).sum().item()]
    w = s.loc[("weight", "fc2.weight")]
    assert w["norm"] == pytest.approx(used, rel=1e-6)  # before the update: what the step computed with
    st = opt.state[model.fc2.weight]
    assert s.loc[("exp_avg_sq", "fc2.weight"), "norm"] == pytest.approx(st["exp_avg_sq"].norm().item(), rel=1e-6)
    act = s.loc[("act", "fc1")]
    with torch.no_grad():
        outs = torch.cat([model.fc1(x[:32]), model.fc1(x[32:])])  # the weights of step 3's forward differ: shape only
    assert act["numel"] == outs.numel()  # both micro-batches' outputs, as one row
    assert ("act_grad", "fc3") in s.index
    sc = m.scalars.set_index("step").loc[2]
    assert (sc["loss"], sc["micro_batches"], sc["lr"]) == (1.5, 2.0, 1e-2)
    grads = m.stats.loc[(m.stats["step"] == 2) & (m.stats["kind"] == "grad"), "norm"].to_numpy()
    assert sc["grad_norm"] == pytest.approx(float(np.sqrt((grads.astype(np.float64) ** 2).sum())))
    signs, blob = m.signs(0)
    one = signs.loc[(signs["step"] == 2) & (signs["name"] == "fc2.weight")].iloc[0]
    bits = np.unpackbits(blob[one["start"]:one["start"] + one["nbytes"]], bitorder="little")[: one["numel"]]
    assert np.array_equal(bits.astype(bool), (grad > 0).reshape(-1).numpy())


def test_activations_and_their_gradients_are_the_outputs_and_their_grads(tmp_path):
    torch.manual_seed(0)
    model = Net()
    outs = {}

    def keep(name):
        def hook(_module, _args, out):
            out.retain_grad()
            outs[name] = out
        return hook

    for name in ("fc1", "fc2", "fc3"):
        getattr(model, name).register_forward_hook(keep(name))
    x, y = _data()
    with mp.Monitor(model, dump_path=str(tmp_path / "act"), activations=r"^fc\d$", alerts=False,
                    stats=("norm", "max")) as mon:
        nn.functional.mse_loss(model(x), y).backward()
        mon.step()
    s = mp.load_monitor(tmp_path / "act").stats.set_index(["kind", "name"])
    for name, out in outs.items():
        assert s.loc[("act", name), "norm"] == pytest.approx(out.norm().item(), rel=1e-6)
        assert s.loc[("act_grad", name), "norm"] == pytest.approx(out.grad.norm().item(), rel=1e-6)
        assert s.loc[("act_grad", name), "max"] == pytest.approx(out.grad.max().item(), rel=1e-6)


def test_a_grad_scaler_s_scale_and_a_skipped_step_are_recorded(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = _data()
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "gs"), grad_scaler=scaler, alerts=False) as mon:
        for step in range(3):
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            if step == 1:
                model.fc1.bias.grad[0] = float("inf")  # the scaler skips the optimizer's step
            scaler.step(opt)
            scaler.update()
            mon.step()
    m = mp.load_monitor(tmp_path / "gs")
    skipped = m.stats.loc[(m.stats["step"] == 1) & (m.stats["name"] == "fc1.bias") & (m.stats["kind"] == "grad")]
    assert skipped["inf"].item() == 1  # read in step(), since no optimizer step happened
    assert m.scalars["loss_scale"].tolist() == [1024.0, 512.0, 512.0]  # as step() finds it: after update()


def test_a_fused_optimizer_under_a_grad_scaler_is_read_unscaled(tmp_path):
    """A GradScaler hands fused AdamW its scale (``opt.grad_scale``) instead of unscaling first; the step
    unscales the gradients in place. The record holds the unscaled gradients the step used."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = _data()
    want = []
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "fused"), grad_scaler=scaler, alerts=False) as mon:
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            scaled = model.fc2.weight.grad.norm().item()
            scaler.step(opt)
            scaler.update()
            want.append(model.fc2.weight.grad.norm().item())
            assert want[-1] == pytest.approx(scaled / 1024.0, rel=1e-5)  # unscaled in place by the step
            mon.step()
    s = mp.load_monitor(tmp_path / "fused").stats
    got = s.loc[(s["kind"] == "grad") & (s["name"] == "fc2.weight"), "norm"].tolist()
    assert got == pytest.approx(want, rel=1e-6)


def test_bad_input_is_named(tmp_path):
    model = Net()
    with pytest.raises(ValueError, match="no parameter named 'fc9.weight'"):
        mp.Monitor(model, dump_path=str(tmp_path / "x"), params=["fc9.weight"])
    with pytest.raises(ValueError, match="stats must include 'norm'"):
        mp.Monitor(model, dump_path=str(tmp_path / "x"), stats=["max"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "monitor_rank0.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(mp.DumpFormatError, match=r"monitor_rank0\.h5.*not an HDF5 file"):
        mp.load_monitor(tmp_path / "bad")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mp.load_monitor(tmp_path / "nowhere")


def test_a_second_monitor_on_the_same_folder_goes_beside_it(tmp_path):
    model = Net()
    with mp.Monitor(model, dump_path=str(tmp_path / "m")) as m1:
        with pytest.warns(UserWarning, match="writing to"):
            m2 = mp.Monitor(model, dump_path=str(tmp_path / "m"))
        m2.close()
        assert m1.dump_path.name == "m" and m2.dump_path.name == "m_1"
    with pytest.raises(FileExistsError, match="already holds monitor_rank0.h5"):
        mp.Monitor(model, dump_path=str(tmp_path / "m"), on_exists="error")


def _train_lm(model, opt, mon, vocab, steps, plant=None):
    """``steps`` training steps of a Hugging Face causal LM on one fixed batch (``plant(step, model)`` between
    backward and the optimizer step); the losses and the last gradients, for bitwise comparisons."""
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if plant:
            plant(step, model)
        opt.step()
        losses.append(loss.detach())
        if mon:
            mon.step(loss=loss)
    if mon:
        mon.close()
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_gpt2_model_from_a_config_is_monitored_without_changing_it(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: no GPT-2 to try")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

    def run(path):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = mp.Monitor(model, opt, dump_path=str(path), activations=r"^transformer\.h\.\d+$", signs=True) \
            if path else None
        return _train_lm(model, opt, mon, 97, 3)

    plain, plain_g = run(None)
    watched, g = run(tmp_path / "gpt2")
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert all(torch.equal(plain_g[n], g[n]) for n in plain_g)
    m = mp.load_monitor(tmp_path / "gpt2")
    assert set(m.stats.loc[m.stats["kind"] == "act", "name"]) == {"transformer.h.0", "transformer.h.1"}
    assert m.stats.loc[m.stats["kind"] == "grad", "name"].nunique() == len(plain_g)
    assert m.anomalies().empty


def test_a_ddp_model_is_named_as_its_module_and_its_rank_comes_from_the_process_group(tmp_path):
    dist = torch.distributed
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable here, or a process group is already up")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(Net())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        x, y = _data()
        with mp.Monitor(ddp, opt, dump_path=str(tmp_path / "ddp"), alerts=False) as mon:
            for _ in range(2):
                opt.zero_grad()
                nn.functional.mse_loss(ddp(x), y).backward()  # the all-reduce runs before the step pre-hook
                opt.step()
                mon.step()
        m = mp.load_monitor(tmp_path / "ddp")
        assert mon.rank == 0 and sorted(m.meta) == [0]
        assert set(m.stats["name"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}
        g = m.stats.loc[(m.stats["step"] == 1) & (m.stats["kind"] == "grad") & (m.stats["name"] == "fc2.weight")]
        assert g["norm"].item() == pytest.approx(ddp.module.fc2.weight.grad.norm().item(), rel=1e-6)
    finally:
        dist.destroy_process_group()


def test_megatron_main_grad_is_read_where_a_parameter_has_one(tmp_path):
    torch.manual_seed(0)
    model = Net()
    model.fc2.weight.main_grad = torch.full_like(model.fc2.weight, 0.5)  # what Megatron accumulates into
    x, y = _data()
    with mp.Monitor(model, dump_path=str(tmp_path / "mg"), alerts=False) as mon:
        nn.functional.mse_loss(model(x), y).backward()
        mon.step()
    s = mp.load_monitor(tmp_path / "mg").stats.set_index(["kind", "name"])
    assert s.loc[("grad", "fc2.weight"), "norm"] == pytest.approx(model.fc2.weight.main_grad.norm().item())
    assert s.loc[("grad", "fc1.weight"), "norm"] == pytest.approx(model.fc1.weight.grad.norm().item(), rel=1e-6)


def test_a_checkpointed_llama_is_monitored_bitwise_and_a_planted_gradient_is_named(tmp_path):
    """A Llama from a config (random weights) with activation checkpointing: norms alone (the C kernel's
    path) change no bit of the losses or gradients; a gradient scaled in one layer at step 3 of one run is
    where compare_monitors says the runs part."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: no Llama to try")
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=64, max_position_embeddings=16, use_cache=False)
    target = "model.layers.1.mlp.down_proj.weight"

    def _scale_at_3(step, model):
        if step == 3:
            model.get_parameter(target).grad.mul_(1.5)

    def run(path, plant=False):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        enable_checkpointing(model, reentrant=False)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = mp.Monitor(model, opt, dump_path=str(path), stats=("norm",), activations=r"^model\.layers\.\d+$",
                         alerts=False) if path else None
        return _train_lm(model, opt, mon, 64, 5, _scale_at_3 if plant else None)

    plain, plain_g = run(None)
    watched, g = run(tmp_path / "a")
    assert all(torch.equal(a, b) for a, b in zip(plain, watched, strict=True))
    assert plain_g.keys() == g.keys() and all(torch.equal(plain_g[n], g[n]) for n in plain_g)
    run(tmp_path / "b", plant=True)
    fd = mp.compare_monitors(tmp_path / "b", tmp_path / "a").first_divergence()
    assert (fd.step, fd.name, fd.kind) == (3, target, "grad") and fd.norm_ratio == pytest.approx(1.5, rel=1e-5)
    acts = mp.load_monitor(tmp_path / "a").stats
    assert set(acts.loc[acts["kind"] == "act", "name"]) == {"model.layers.0", "model.layers.1"}


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant, no early stop", "non-reentrant"])
def test_activation_checkpointing_s_recompute_is_not_a_second_call(tmp_path, mode):
    """A checkpointed block runs its forward again inside backward: its output and output-gradient rows are
    those of the run without checkpointing (one call each, not two outputs' worth)."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.tanh(self.fc(x))

    class Stack(nn.Module):
        def __init__(self, ckpt):
            super().__init__()
            self.blocks, self.ckpt = nn.ModuleList([Block(), Block()]), ckpt

        def forward(self, x):
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=mode == "reentrant") if self.ckpt else b(x)
            return x.square().sum()

    def rows(ckpt, path):
        torch.manual_seed(0)
        model = Stack(ckpt)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with mp.Monitor(model, opt, dump_path=str(path), stats=("norm",), activations=r"^blocks\.\d+$",
                        alerts=False) as mon:
            for _ in range(2):
                opt.zero_grad()
                x = torch.randn(4, 8, requires_grad=True)
                with set_checkpoint_early_stop(mode != "non-reentrant, no early stop"):
                    model(x).backward()
                opt.step()
                mon.step()
        st = mp.load_monitor(path).stats
        return st.loc[st["kind"].isin(["act", "act_grad"]), ["step", "kind", "name", "norm", "numel"]] \
            .sort_values(["step", "kind", "name"]).values.tolist()

    plain, checkpointed = rows(False, tmp_path / "plain"), rows(True, tmp_path / "ckpt")
    assert len(plain) == 8 and all(r[4] == 32 for r in plain)
    assert checkpointed == plain


def test_main_grad_defined_by_a_parameter_class_is_read_too(tmp_path):
    """A parameter class may define ``main_grad`` itself (a property) rather than on each object: still read."""
    class Held(nn.Parameter):
        @property
        def main_grad(self):
            return torch.full_like(self, 2.0)

    torch.manual_seed(0)
    model = Net()
    model.fc2.weight = Held(model.fc2.weight.detach())
    x, y = _data()
    with mp.Monitor(model, dump_path=str(tmp_path / "mgc"), alerts=False) as mon:
        nn.functional.mse_loss(model(x), y).backward()
        mon.step()
    s = mp.load_monitor(tmp_path / "mgc").stats.set_index(["kind", "name"])
    assert s.loc[("grad", "fc2.weight"), "norm"] == pytest.approx(2.0 * model.fc2.weight.numel() ** 0.5)
    assert s.loc[("grad", "fc1.weight"), "norm"] == pytest.approx(model.fc1.weight.grad.norm().item(), rel=1e-6)


def test_the_norms_kernel_checks_its_output_buffer():
    from msprobe_nb.capture.stats import norms_kernel

    kernel = norms_kernel()
    if kernel is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install)")
    t = torch.arange(4.0)
    out = np.full(1, -1.0, np.float32)
    kernel([t.data_ptr()], [4], out)
    assert out[0] == pytest.approx(14.0 ** 0.5)
    for bad in (np.empty(2, np.float32), np.empty(1, np.float64), b"four"):
        with pytest.raises((ValueError, TypeError)):
            kernel([t.data_ptr()], [4], bad)
    with pytest.raises(ValueError, match="as many counts"):
        kernel([t.data_ptr()], [4, 4], out)


def test_without_sign_bitmaps_the_direction_comes_from_histograms(tmp_path):
    def flip(step, model, opt):
        if step == 10:
            model.fc2.weight.grad.abs_()  # every sign made positive: the same norm, another distribution

    bounds = [-0.01, -0.001, 0.0, 0.001, 0.01]
    train(tmp_path / "a", steps=12, histogram=bounds, alerts=False)
    train(tmp_path / "b", steps=12, histogram=bounds, plant=flip, alerts=False)
    t = mp.compare_monitors(tmp_path / "b", tmp_path / "a").table
    grad = t.loc[(t["kind"] == "grad") & (t["name"] == "fc2.weight")].set_index("step")
    assert (grad.loc[:9, "direction"] == 1.0).all()
    assert grad.loc[10, "direction"] < 0.9 and bool(grad.loc[10, "parts"])  # the negative bins emptied
    assert grad.loc[10, "norm_ratio"] == pytest.approx(1.0)  # the norm alone would not see it


@pytest.mark.parametrize("kernel", [True, False], ids=["C kernel", "torch"])
def test_norms_match_torchs_on_either_path(monkeypatch, kernel):
    """Parameter norms come from the C kernel (float32 CPU tensors) or from torch; both give torch's norm,
    NaN, inf, overflow and one-element tensors included, and a transposed view falls back to torch."""
    from msprobe_nb.capture import monitor_stats
    from msprobe_nb.capture.stats import norms_kernel

    if kernel and norms_kernel() is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install)")
    if not kernel:
        monkeypatch.setattr(monitor_stats, "norms_kernel", lambda: None)
    torch.manual_seed(0)
    plain = [torch.randn(1000), torch.tensor([-3.0]), torch.tensor([float("nan"), 1.0]),
             torch.tensor([float("inf"), 1.0]), torch.full((10,), 1e20), torch.randn(64), torch.randn(64)]
    class Sub(torch.Tensor):  # a subclass's data_ptr() need not be its values: torch's path
        pass

    sub = torch.randn(6).as_subclass(Sub)
    assert monitor_stats.cpu_norm_runs(plain + [sub]) is None
    assert (monitor_stats.cpu_norm_runs(plain) is None) is not kernel
    for ts in (plain, plain + [torch.randn(8, 5).t()], plain + [sub]):  # a transposed view: torch's path
        got = monitor_stats.tensor_stats(ts, ("norm",))[0][:, 0]
        want = torch.stack([t.norm() for t in ts])
        assert torch.allclose(got, want, rtol=1e-6, equal_nan=True), (got, want)


def test_gradient_norms_stay_right_as_the_gradients_come_and_go(tmp_path):
    """Norms alone (the C kernel's path): a step where a parameter has no gradient has no row for it, the next
    step has again; each step's rows are its own gradients' norms, a main_grad set mid-run included."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data()
    want = []
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m"), stats=("norm",), alerts=False) as mon:
        for step in range(8):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            if step in (2, 5):
                model.fc2.bias.grad = None  # this step, fc2.bias has no gradient
            if step == 6:
                model.fc1.weight.main_grad = torch.full_like(model.fc1.weight, 0.25)
            grads = {n: (p.__dict__.get("main_grad", p.grad)).norm().item()
                     for n, p in model.named_parameters() if p.grad is not None}
            opt.step()
            want.append(grads)
            mon.step()
    st = mp.load_monitor(tmp_path / "m").stats
    g = st[st["kind"] == "grad"]
    for step, grads in enumerate(want):
        got = dict(zip(g.loc[g["step"] == step, "name"], g.loc[g["step"] == step, "norm"], strict=True))
        assert got.keys() == grads.keys(), step
        for n, v in grads.items():
            assert got[n] == pytest.approx(v, rel=1e-6), (step, n)
    assert "fc2.bias" not in set(g.loc[g["step"].isin([2, 5]), "name"])


class Odd(nn.Module):
    """A layer no step uses (no gradient) and a frozen one beside the used ones."""

    def __init__(self):
        super().__init__()
        self.unused, self.used, self.frozen = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)  # unused first
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.used(x))


@pytest.mark.parametrize("stats", [("norm",), ("norm", "max")], ids=["norms only", "norms and max"])
def test_parameter_rows_are_torchs_norms_whatever_the_gradients_layout(tmp_path, stats):
    """Norms alone take the C kernel's one-call path, other aggregates the general one; either way each row is
    its own tensor's norm: a parameter without a gradient has a weight row only, a frozen one no row, a
    transposed gradient (not contiguous) and a negative view (the C kernel reads its memory) are read right."""
    torch.manual_seed(0)
    model = Odd()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 6)
    want = []
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "m"), stats=stats, alerts=False) as mon:
        for step in range(3):
            opt.zero_grad()
            model(x).square().sum().backward()
            if step == 1:
                w = model.used.weight
                w.grad = w.grad.t().contiguous().t()  # same values, transposed strides
            if step == 2:
                model.used.bias.grad = torch._neg_view(-model.used.bias.grad)  # same values, negative bit
            grads = {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}
            weights = {n: p.norm().item() for n, p in model.named_parameters() if p.requires_grad}  # as used
            opt.step()
            want.append((grads, weights))
            mon.step()
    st = mp.load_monitor(tmp_path / "m").stats
    for step, (grads, weights) in enumerate(want):
        at = st[st["step"] == step]
        got = {k: dict(zip(g["name"], g["norm"], strict=True)) for k, g in at.groupby("kind")}
        assert set(got["grad"]) == {"used.weight", "used.bias"}
        assert set(got["weight"]) == {"used.weight", "used.bias", "unused.weight", "unused.bias"}
        for n, v in grads.items():
            assert got["grad"][n] == pytest.approx(v, rel=1e-6), (step, n)
        for n, v in weights.items():
            assert got["weight"][n] == pytest.approx(v, rel=1e-6), (step, n)
