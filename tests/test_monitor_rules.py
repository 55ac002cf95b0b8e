"""The monitor's alert rules (store/monitor_rules.py, issue 36), alert for alert against their definition written
out for one series at a time: step, series, rule, value, what was expected and how far past the bar, on random
series with planted spikes, drops, NaNs, infs, zeros and gaps, for the spike rule and the direction rule, both
when every series is as long as the others and when they are not. Plus the thresholds' checks and the words.
Numpy only: seconds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from msprobe_nb.store.monitor_rules import AlertRules, alert_message
from msprobe_nb.store.monitor_schema import THRESHOLDS

#: docs/monitor.md's figures, written out (not imported: the module's own constants would follow a change)
MAD_TO_SIGMA = 1.4826  # a normal sample's standard deviation per median absolute deviation
REFRESH = 8  # a series' median change and spread are refreshed every 8 of its values


def _definition(values: dict[int, float], warmup, window, spike_z, spike_ratio, direction_drop, spike_floor,
                direction=False):
    """One series ({step: value}) judged as the module's docstring says: (step, rule, value, reference, severity)."""
    out, kept, told, slope, bar, low = [], [], False, None, None, -math.inf
    for step in sorted(values):
        v = values[step]
        if not direction and not math.isfinite(v):
            if not told:
                out.append((step, "nonfinite", v, math.nan, math.inf))
                told = True
            continue
        if not math.isfinite(v) or (not direction and v <= 0):
            continue
        x = v if direction else math.log(v)
        if len(kept) >= warmup:
            prev = kept[-1]
            if len(kept) == warmup and not direction:
                low = float(np.median(kept[:warmup])) + (math.log(spike_floor) if spike_floor > 0 else -math.inf)
            if (len(kept) - warmup) % REFRESH == 0:
                d = np.diff(np.asarray(kept))[-window:]
                slope = float(np.median(d))
                mad = float(np.median(np.abs(d - slope)))
                floor = direction_drop * prev if direction else math.log(spike_ratio)
                bar = max(spike_z * MAD_TO_SIGMA * mad, floor)
            expected = prev + slope
            dev = expected - x if direction else x - expected
            if dev > bar and dev > 0 and (direction or x >= low):
                ref = expected if direction else math.exp(expected)
                out.append((step, "direction_drop" if direction else "spike", v, ref,
                            dev / bar if bar > 0 else math.inf))
        kept.append(x)
    return out


def _norms(rng, steps, gaps):
    logs = np.cumsum(rng.normal(0, rng.uniform(0.01, 0.3), steps)) + rng.normal(0, 2)
    v = np.exp(logs)
    for at in rng.choice(steps, 5, replace=False):
        v[at] *= rng.choice([3.0, 20.0, 1e3, 1e5, 0.01])
    if gaps:
        for at in rng.choice(steps, 3, replace=False):
            v[at] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -1.0])
    return {s: float(v[s]) for s in range(steps) if not gaps or rng.random() > 0.05}


def _agreements(rng, steps, gaps):
    v = np.clip(rng.normal(0.8, rng.uniform(0.005, 0.05), steps), 0, 1)
    for at in rng.choice(steps, 4, replace=False):
        v[at] = rng.uniform(0.0, 0.5)
    if gaps:
        v[rng.choice(steps, 2, replace=False)] = np.nan
    return {s: float(v[s]) for s in range(steps) if not gaps or rng.random() > 0.05}


def _close(got, want):
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for g, w in zip(got, want):
        assert g[2] == w[2] or (math.isnan(g[2]) and math.isnan(w[2])), (g, w)
        for a, b in zip(g[3:], w[3:]):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12), (g, w)


@pytest.mark.parametrize("direction", [False, True])
@pytest.mark.parametrize("gaps", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_every_alert_is_the_definitions_alert(seed, gaps, direction):
    rng = np.random.default_rng(100 + seed)
    th = dict(warmup=int(rng.integers(2, 25)), window=int(rng.integers(25, 80)), spike_z=float(rng.uniform(2, 8)),
              spike_ratio=float(rng.uniform(1.5, 10)), direction_drop=float(rng.uniform(0.05, 0.5)),
              spike_floor=float([0.0, 0.01, 0.5][seed]))
    steps = 260
    make = _agreements if direction else _norms
    series = {i: make(rng, steps, gaps) for i in range(9)}
    rules = AlertRules(**th)
    got: dict[int, list] = {i: [] for i in series}
    for step in range(steps):
        ids = [i for i, s in series.items() if step in s]
        if gaps and step % 7 == 3:
            ids = ids[::-1]  # the ids of a step in any order
        for a in rules.observe(step, np.asarray(ids, np.int64), np.asarray([series[i][step] for i in ids]),
                               direction=direction):
            got[a.series].append((a.step, a.rule, a.value, a.reference, a.severity))
    want = {i: _definition(s, **th, direction=direction) for i, s in series.items()}
    for i in series:
        _close(got[i], want[i])
    assert sum(len(w) for w in want.values()) > 4


def test_series_that_join_late_are_judged_once_they_hold_their_warm_up():
    # series 3 starts at step 40, while the others are steady: its own count, not theirs, decides
    rng = np.random.default_rng(7)
    th = dict(warmup=5, window=30, spike_z=4.0, spike_ratio=5.0, direction_drop=0.3, spike_floor=0.01)
    series = {i: {s: float(np.exp(rng.normal(0, 0.05))) for s in range(120)} for i in range(3)}
    series[3] = {s: float(np.exp(rng.normal(0, 0.05))) for s in range(40, 120)}
    for i, at in ((0, 60), (3, 46), (3, 90), (1, 100)):
        series[i][at] *= 1e3
    rules = AlertRules(**th)
    got = []
    for step in range(120):
        ids = [i for i in series if step in series[i]]
        got += [(a.step, a.series) for a in rules.observe(step, np.asarray(ids), [series[i][step] for i in ids])]
    want = sorted((w[0], i) for i, s in series.items() for w in _definition(s, **th))
    assert sorted(got) == want and (46, 3) in want and (60, 0) in want


def test_a_first_non_finite_value_is_told_once_per_series_whatever_follows():
    rules = AlertRules(warmup=2, window=4)
    got = []
    for step, vals in enumerate([[1.0, 1.0], [np.nan, 1.0], [np.inf, -np.inf], [1.0, np.nan], [np.nan, 2.0]]):
        got += [(a.step, a.series, a.rule, a.value) for a in rules.observe(step, np.array([0, 1]), vals)]
    assert [g[:3] for g in got] == [(1, 0, "nonfinite"), (2, 1, "nonfinite")]
    assert math.isnan(got[0][3]) and got[1][3] == -math.inf
    assert rules.observe(9, np.array([], np.int64), np.array([])) == []


def test_series_ids_grow_the_windows_without_losing_what_they_hold():
    # ids far apart and growing step by step: a series' history survives each growth
    th = dict(warmup=3, window=10, spike_z=3.0, spike_ratio=4.0, direction_drop=0.3, spike_floor=0.0)
    rng = np.random.default_rng(1)
    ids_at = {s: [0, 1, 2, 3][: 1 + min(s // 5, 3)] + ([50] if s >= 12 else []) for s in range(60)}
    series: dict[int, dict[int, float]] = {}
    for s, ids in ids_at.items():
        for i in ids:
            series.setdefault(i, {})[s] = float(np.exp(rng.normal(0, 0.02)))
    series[2][30] *= 100
    series[50][40] *= 100
    rules = AlertRules(**th)
    got = []
    for s, ids in ids_at.items():
        got += [(a.step, a.series) for a in rules.observe(s, np.asarray(ids), [series[i][s] for i in ids])]
    assert sorted(got) == sorted((w[0], i) for i, v in series.items() for w in _definition(v, **th))
    assert (30, 2) in got and (40, 50) in got


@pytest.mark.parametrize("kw", [dict(warmup=1), dict(warmup=30, window=20), dict(spike_z=-0.1),
                                dict(spike_ratio=0.99), dict(direction_drop=-0.01), dict(direction_drop=1.01),
                                dict(spike_floor=-1e-9)])
def test_thresholds_out_of_range_are_refused_naming_them(kw):
    with pytest.raises(ValueError, match=r"alert thresholds out of range: warmup=.*spike_floor="):
        AlertRules(**kw)


@pytest.mark.parametrize("kw", [dict(warmup=2, window=2), dict(spike_z=0.0), dict(spike_ratio=1.0),
                                dict(direction_drop=0.0), dict(direction_drop=1.0), dict(spike_floor=0.0)])
def test_thresholds_at_their_limits_are_accepted(kw):
    r = AlertRules(**kw)
    want = {k: THRESHOLDS[k] for k in ("warmup", "window", "spike_z", "spike_ratio", "direction_drop", "spike_floor")}
    want.update(kw)
    assert r.thresholds == want


def test_the_words_of_each_alert():
    assert alert_message("nonfinite", "grad", "fc1.weight", math.nan, math.nan) == (
        "grad of fc1.weight is nan (first seen)")
    assert alert_message("spike", "scalar", "loss", 250.0, 2.5) == "loss spiked to 250, 100x the 2.5 expected"
    assert alert_message("direction_drop", "direction", "fc1.weight", 0.125, 0.8) == (
        "gradient direction of fc1.weight: 12.5% of signs agree with the previous step, after 80.0%")


def test_an_alert_is_a_value_kept_as_raised():
    import dataclasses

    rules = AlertRules(warmup=2, window=4)
    a = rules.observe(0, np.array([0]), np.array([np.nan]))[0]
    assert {a, dataclasses.replace(a)} == {a}  # hashable and equal by value: alerts can be counted in sets
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.value = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("longest_first", [True, False])
@pytest.mark.parametrize("direction", [False, True])
def test_series_of_different_lengths_refreshed_at_the_same_step_each_keep_their_own_statistics(direction,
                                                                                              longest_first):
    # series joining 8 and 16 steps apart reach their refreshes together while their windows hold different
    # numbers of changes: each series' typical change is its own
    rng = np.random.default_rng(11)
    th = dict(warmup=3, window=200, spike_z=3.0, spike_ratio=3.0, direction_drop=0.2, spike_floor=0.0)
    steps = 90
    series = {}
    for i, start in enumerate((0, 8, 16, 24)):
        if direction:
            v = np.clip(0.8 + rng.normal(0, 0.01 * (i + 1), steps), 0, 1)
            v[[40, 60 + i]] = 0.1
        else:
            v = np.exp(np.cumsum(rng.normal(0.05 * (i - 1.5), 0.02 * (i + 1), steps)))
            v[[40, 60 + i]] *= 50
        series[i] = {s: float(v[s]) for s in range(start, steps)}
    rules = AlertRules(**th)
    got = {i: [] for i in series}
    for step in range(steps):
        ids = [i for i in series if step in series[i]][:: 1 if longest_first else -1]
        for a in rules.observe(step, np.asarray(ids), [series[i][step] for i in ids], direction=direction):
            got[a.series].append((a.step, a.rule, a.value, a.reference, a.severity))
    for i, s in series.items():
        _close(got[i], _definition(s, **th, direction=direction))
    assert all(len(g) >= 2 for g in got.values())


@pytest.mark.parametrize("direction", [False, True])
def test_a_constant_series_never_alerts_even_with_every_bar_at_zero(direction):
    # spike_ratio 1, spike_z 0, direction_drop 0: the bar is 0; a value equal to the expected one is no hit
    rules = AlertRules(warmup=2, window=8, spike_z=0.0, spike_ratio=1.0, direction_drop=0.0, spike_floor=0.0)
    got = []
    for step in range(40):
        got += rules.observe(step, np.array([0, 1]), np.array([0.5, 0.25]), direction=direction)
    assert got == []


@pytest.mark.parametrize("other", [False, True])
@pytest.mark.parametrize("to,alert", [(0.01, True), (0.0099, False)])
def test_a_spike_must_reach_the_floor_and_reaching_it_exactly_is_enough(to, alert, other):
    # warm-up level 1, floor 0.01 x that: after a fall to 1e-4, a jump to 0.01 is "at least" the floor; alone,
    # or beside a series one value shorter (the path for series of different lengths)
    rules = AlertRules(warmup=4, window=50, spike_z=3.0, spike_ratio=10.0, spike_floor=0.01)
    vals = [1.0] * 4 + [1e-4] * 30 + [to]
    got = []
    for s, v in enumerate(vals):
        ids, vs = ([0, 1], [v, 1.0]) if other and s else ([0], [v])
        got += [(a.step, a.series, a.value) for a in rules.observe(s, np.array(ids), np.array(vs))]
    assert got == ([(34, 0, to)] if alert else [])


@pytest.mark.parametrize("other", [False, True])
@pytest.mark.parametrize("to,alert", [(10.0, False), (10.001, True)])
def test_a_spike_is_more_than_the_ratio_not_the_ratio_itself(to, alert, other):
    # a steady series at 1: a jump by exactly spike_ratio (10x) is not "more than a factor spike_ratio"; alone,
    # or beside a series one value shorter (the path for series of different lengths)
    rules = AlertRules(warmup=4, window=50, spike_z=3.0, spike_ratio=10.0, spike_floor=0.0)
    vals = [1.0] * 30 + [to]
    got = []
    for s, v in enumerate(vals):
        ids, vs = ([0, 1], [v, 1.0]) if other and s else ([0], [v])
        got += [(a.step, a.series) for a in rules.observe(s, np.array(ids), np.array(vs))]
    assert got == ([(30, 0)] if alert else [])


def test_the_words_are_the_same_for_rule_names_read_back_from_a_record():
    # a replayed record's rule names are strings built at run time, not this module's literals
    nonfinite, spike = "".join(["non", "finite"]), "".join(["spi", "ke"])
    assert alert_message(nonfinite, "grad", "w", math.inf, math.nan) == "grad of w is inf (first seen)"
    assert alert_message(spike, "activation", "fc", 5.0, 2.0) == "activation of fc spiked to 5, 2.5x the 2 expected"
