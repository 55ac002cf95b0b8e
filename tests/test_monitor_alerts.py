"""The monitor's alerts (issue 32): quiet on clean runs, a planted NaN first, a x20 gradient spike and a loss
spike found at their step and series, a bounded console, and the record's anomalies() the very alerts the
run raised (the reader replays the writer's rules: a differential test over random planted series)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn as nn

import msprobe_nb as mp
from msprobe_nb.capture.monitor import ALERT_LINES
from msprobe_nb.store.monitor_rules import MAD_TO_SIGMA, REFRESH, AlertRules
from msprobe_nb.store.monitor_schema import THRESHOLDS

STEPS = 300


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _mlp_run(path, steps=STEPS, plant=None, **kw):
    """``steps`` full-batch AdamW steps of ``Net``; ``plant(step, model, y)`` may change the targets (returned)
    before the forward and the gradients after the backward (called twice: ``when`` "batch", "grads")."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g)
    with mp.Monitor(model, opt, dump_path=str(path), on_exists="overwrite", **kw) as mon:
        for step in range(steps):
            opt.zero_grad()
            target = plant(step, model, y, "batch") if plant else y
            loss = nn.functional.mse_loss(model(x), target)
            loss.backward()
            if plant:
                plant(step, model, y, "grads")
            opt.step()
            mon.step(loss=loss)
    return mon


def test_a_clean_300_step_run_of_an_mlp_raises_no_anomaly(tmp_path, capsys):
    mon = _mlp_run(tmp_path / "clean")
    assert mp.load_monitor(tmp_path / "clean").anomalies().empty
    assert mon.alerts == [] and capsys.readouterr().out == ""


def test_a_clean_300_step_run_of_a_gpt2_raises_no_anomaly(tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: no GPT-2 to try")
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1))
    capsys.readouterr()
    with mp.Monitor(model, opt, dump_path=str(tmp_path / "gpt2")) as mon:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            mon.step(loss=loss)
    assert mp.load_monitor(tmp_path / "gpt2").anomalies().empty
    assert mon.alerts == [] and capsys.readouterr().out == ""


def _plant_all(step, model, y, when):
    if when == "batch":
        return y * 6.0 if step == 200 else y  # a loss spike (and the gradients with it)
    if step == 150:
        model.fc1.weight.grad.mul_(20.0)
    if step == 240:
        model.fc2.bias.grad[3] = float("nan")
    return None


def test_a_nan_comes_first_and_a_gradient_and_a_loss_spike_are_found_where_planted(tmp_path, capsys):
    mon = _mlp_run(tmp_path / "planted", plant=_plant_all)
    out = capsys.readouterr().out.splitlines()
    a = mp.load_monitor(tmp_path / "planted").anomalies()
    first = a.iloc[0]
    assert (first["step"], first["name"], first["kind"], first["rule"]) == (240, "fc2.bias", "grad", "nonfinite")
    assert first["severity"] == math.inf
    spikes = a.loc[a["rule"] == "spike"]
    assert ((spikes["step"] == 150) & (spikes["name"] == "fc1.weight") & (spikes["kind"] == "grad")).any()
    loss = spikes.loc[(spikes["kind"] == "scalar") & (spikes["name"] == "loss")]
    assert list(loss["step"]) == [200]
    assert not (a["step"] < 150).any()  # quiet until the first plant
    at150 = spikes.loc[(spikes["step"] == 150) & (spikes["name"] == "fc1.weight")].iloc[0]
    assert at150["value"] / at150["reference"] == pytest.approx(20.0, rel=0.3)
    assert (a.loc[a["rule"] == "spike", "severity"].diff().dropna() <= 0).all()  # most severe first
    # the console: one line (and a count of the rest) per step with news, never a line per alert
    assert len(out) <= 2 * ALERT_LINES + 1 and len(out) < len(mon.alerts)
    assert out[0].startswith("msprobe_nb monitor: step 150, rank 0: grad of fc1.weight spiked to")
    assert "msprobe_nb monitor: step 240, rank 0: grad of fc2.bias is nan (first seen)" in out


# ------------------------------------------------------------------------------- one implementation
def _naive(series_values, warmup, window, spike_z, spike_ratio, direction_drop, spike_floor, direction=False):
    """The rules written out for one series ({step: value}), straight from their definition."""
    out, kept, told, slope, bar, low = [], [], False, None, None, None
    for step in sorted(series_values):
        v = series_values[step]
        if not direction and not math.isfinite(v):
            if not told:
                out.append((step, "nonfinite"))
                told = True
            continue
        if not math.isfinite(v) or (not direction and v <= 0):
            continue
        x = v if direction else math.log(v)
        if len(kept) >= warmup:
            prev = kept[-1]
            if len(kept) == warmup and not direction:
                low = float(np.median(kept)) + (math.log(spike_floor) if spike_floor > 0 else -math.inf)
            if (len(kept) - warmup) % REFRESH == 0:
                d = np.diff(np.asarray(kept))[-window:]
                slope = float(np.median(d))
                mad = float(np.median(np.abs(d - slope)))
                floor = direction_drop * prev if direction else math.log(spike_ratio)
                bar = max(spike_z * MAD_TO_SIGMA * mad, floor)
            expected = prev + slope
            dev = expected - x if direction else x - expected
            if dev > bar and dev > 0 and (direction or x >= low):
                out.append((step, "direction_drop" if direction else "spike"))
        kept.append(x)
    return out


def _planted_series(rng, steps):
    """A random walk of log norms with planted spikes, NaNs, infs, zeros and missing steps."""
    logs = np.cumsum(rng.normal(0, rng.uniform(0.01, 0.3), steps)) + rng.normal(0, 2)
    v = np.exp(logs)
    for at in rng.choice(steps, 4, replace=False):
        v[at] *= rng.choice([3.0, 20.0, 1e3, 0.01])
    for at in rng.choice(steps, 2, replace=False):
        v[at] = rng.choice([np.nan, np.inf, 0.0])
    return {s: float(v[s]) for s in range(steps) if rng.random() > 0.05}


@pytest.mark.parametrize("seed", range(4))
def test_the_rules_are_their_definition_on_random_planted_series(seed):
    rng = np.random.default_rng(seed)
    th = {k: THRESHOLDS[k] for k in ("warmup", "window", "spike_z", "spike_ratio", "direction_drop", "spike_floor")}
    th.update(warmup=int(rng.integers(2, 30)), window=int(rng.integers(30, 120)), spike_z=float(rng.uniform(2, 8)),
              spike_ratio=float(rng.uniform(1.5, 10)), spike_floor=float(rng.choice([0.0, 0.01, 0.5])))
    series = [_planted_series(rng, 400) for _ in range(12)]
    rules = AlertRules(**th)
    got = {i: [] for i in range(len(series))}
    for step in range(400):
        ids = [i for i, s in enumerate(series) if step in s]
        for a in rules.observe(step, np.asarray(ids), np.asarray([series[i][step] for i in ids])):
            got[a.series].append((a.step, a.rule))
    want = {i: _naive(s, **th) for i, s in enumerate(series)}
    assert got == want
    assert sum(len(w) for w in want.values()) > 5  # the planted values are hits, not none at all


def test_a_spike_right_after_the_warm_up_is_the_first_alert_at_its_step():
    # documented: once a series holds ``warmup`` values, the next one is judged. Series 1 joins 5 steps late
    # (a parameter unfrozen later) and jumps by 1000x at its value number warmup + 1: that step is its alert
    w = int(THRESHOLDS["warmup"])
    rng = np.random.default_rng(0)
    rules = AlertRules()
    spike_at = 5 + w
    got = []
    for step in range(spike_at + 10):
        ids = [0] if step < 5 else [0, 1]
        vals = np.exp(rng.normal(0, 0.05, len(ids)))
        if step == spike_at:
            vals[1] *= 1e3
        got += [(a.step, a.series, a.rule) for a in rules.observe(step, np.asarray(ids), vals)]
    assert got[:1] == [(spike_at, 1, "spike")]


def test_anomalies_replays_what_the_running_monitor_raised(tmp_path):
    """Random planted gradient norms (and missing gradients), losses and sign flips through a real Monitor:
    the alerts it raised while running and the record's anomalies() are the same, alert for alert."""
    rng = np.random.default_rng(3)
    steps, k = 160, 6
    params = nn.ParameterList([nn.Parameter(torch.zeros(512)) for _ in range(k)])
    opt = torch.optim.SGD(params, lr=0.0)
    norms = [_planted_series(rng, steps) for _ in range(k)]
    losses = _planted_series(rng, steps)
    directions = [torch.from_numpy(rng.choice([-1.0, 1.0], 512).astype(np.float32)) for _ in range(k)]
    with mp.Monitor(params, opt, dump_path=str(tmp_path / "r"), signs=True, warmup=10, window=40, spike_z=4.0,
                    alerts=True) as mon:
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            for i, p in enumerate(params):
                if step in norms[i]:
                    if rng.random() < 0.03:
                        directions[i] = -directions[i]  # every sign flips: a direction drop
                    p.grad = directions[i] * (norms[i][step] / math.sqrt(512))
            opt.step()
            mon.step(loss=losses.get(step))
    prefix = re.compile(r"^msprobe_nb monitor: step (\d+), rank 0: ")
    ran = sorted((int(prefix.match(line).group(1)), prefix.sub("", line)) for line in mon.alerts)
    a = mp.load_monitor(tmp_path / "r").anomalies()
    replayed = sorted(zip(a["step"].astype(int), a["message"], strict=True))
    assert ran == replayed
    assert {"nonfinite", "spike", "direction_drop"} <= set(a["rule"])
