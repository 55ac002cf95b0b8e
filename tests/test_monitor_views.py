"""MonitorViewer and the TensorBoard export over two short monitored runs that part at a planted step."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import msprobe_nb as mp
from msprobe_nb.viewers import monitor_plots as MP
from msprobe_nb.viewers.monitor_viewer import heatmap_payload

PLANT = 12


def _run(path, plant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)), torch.randn(32, 3)
    with mp.Monitor(model, opt, dump_path=str(path), signs=True, activations=True, alerts=False, warmup=5, spike_z=2.0,
                    spike_ratio=1.5) as mon:  # a short run: judged from step 5; thresholds for a x3 spike
        for step in range(20):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if plant and step == PLANT:
                model[2].weight.grad.mul_(3.0)
            opt.step()
            mon.step(loss=loss)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    _run(root / "a", plant=True)
    _run(root / "b", plant=False)
    return root


def test_the_heat_map_shows_the_planted_cell_and_bins_long_runs(runs):
    g = mp.compare_monitors(runs / "a", runs / "b")
    h = MP.heatmap_frame(g, "norm_ratio", "grad")
    assert list(h.index) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # model order
    assert list(h.columns) == list(range(20))
    assert h.loc["2.weight", PLANT] == pytest.approx(3.0) and (h.loc[:, : PLANT - 1] == 1.0).all().all()
    shade = MP.heat_scale(h, "norm_ratio")
    assert shade[2, PLANT] == 1.0 and shade[:, :PLANT].max() == 0.0  # a factor >= 2 is the darkest shade
    binned = MP.heatmap_frame(g, "norm_ratio", "grad", max_steps=5)
    assert list(binned.columns) == [0, 4, 8, 12, 16]
    assert binned.loc["2.weight", 12] == pytest.approx(3.0)  # the bin keeps its farthest-off value
    p = heatmap_payload(h, "norm_ratio", selected=(PLANT, "2.weight"))
    assert p["selected"] == [2, PLANT] and len(p["rows"]) == 4 and len(p["cols"]) == 20
    with pytest.raises(KeyError, match="no value 'bogus'"):
        MP.heatmap_frame(g, "bogus")


def test_curves_anomalies_and_a_clicked_cell(runs):
    g = mp.compare_monitors(runs / "a", runs / "b")
    c = MP.curves_frame(g)
    assert list(c.columns) == ["step", "loss_a", "loss_b", "grad_norm_a", "grad_norm_b"] and len(c) == 20
    assert (c["loss_a"][: PLANT + 1] == c["loss_b"][: PLANT + 1]).all()
    assert c["loss_a"][PLANT + 1] != c["loss_b"][PLANT + 1]
    v = mp.MonitorViewer(g)
    assert v.state["selected"] == (PLANT, "2.weight")  # opened at the first divergence
    numbers = v.click_cell(PLANT, "2.weight")
    grad = numbers.loc[numbers["kind"] == "grad"].set_index("run")
    assert grad.loc["a", "norm"] == pytest.approx(3 * grad.loc["b", "norm"])
    assert bool(grad.loc["a", "parts"]) and grad.loc["a", "norm_ratio"] == pytest.approx(3.0)
    v.set_state(kind="act", value="norm_a")
    assert list(v.heatmap().index) == ["0", "1", "2", "(model)"]
    with pytest.raises(ValueError, match="kind 'nope' is not one of"):
        v.set_state(kind="nope")
    assert set(MP.anomaly_frame(g).columns) >= {"run", "step", "name", "rule"}


def test_the_widgets_build_and_a_canvas_click_opens_the_cell(runs):
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed")
    v = mp.MonitorViewer(mp.compare_monitors(runs / "a", runs / "b"))
    box = v.widget()
    assert "first divergence" in box.children[0].value and "step 12" in box.children[0].value
    w = v.widgets
    with pytest.raises(TypeError):
        w["numbers"] = None  # read-only
    if "heat" not in w:
        pytest.skip("anywidget is not installed: the heat map is a picture")
    w["heat"]._on_msg(w["heat"], {"event": "cell", "row": 0, "col": 3}, [])  # as the browser sends a click
    assert v.state["selected"] == (3, "0.weight") and "step 3, 0.weight" in w["numbers"].value
    assert w["heat"].payload["selected"] == [0, 3]
    one = mp.MonitorViewer(str(runs / "b"))  # a record, not a comparison
    assert one.state["value"] == "norm" and not one.heatmap().empty and one.widget() is not None


def test_an_anomaly_opens_its_kind_step_and_layer(runs):
    """The planted gradient is an anomaly of run a; opening it (a click in the list) turns the heat map to its
    kind and opens its step and layer's numbers, both runs'; the widget's list does the same."""
    v = mp.MonitorViewer(mp.compare_monitors(runs / "a", runs / "b"), kind="act")
    a = v.anomalies()
    i = next(i for i, r in enumerate(a.itertuples()) if r.run == "a" and r.step == PLANT and r.name == "2.weight")
    numbers = v.open_anomaly(i)
    assert v.state["kind"] == "grad" and v.state["selected"] == (PLANT, "2.weight")
    grad = numbers.loc[numbers["kind"] == "grad"].set_index("run")
    assert grad.loc["a", "norm"] == pytest.approx(3 * grad.loc["b", "norm"])
    with pytest.raises(IndexError, match="out of range"):
        v.open_anomaly(len(a))
    j = next(i for i, r in enumerate(a.itertuples()) if r.kind == "scalar" and r.name == "grad_norm")
    scalar = v.open_anomaly(j).set_index("run")  # a scalar's anomaly: its value in both runs at that step
    curves = MP.curves_frame(mp.compare_monitors(runs / "a", runs / "b")).set_index("step")
    assert list(scalar["kind"]) == ["scalar", "scalar"] and scalar.loc["a", "step"] == a.loc[j, "step"]
    assert scalar.loc["a", "value"] == pytest.approx(curves.loc[a.loc[j, "step"], "grad_norm_a"])
    assert scalar.loc["b", "value"] == pytest.approx(curves.loc[a.loc[j, "step"], "grad_norm_b"])
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed")
    w = mp.MonitorViewer(mp.compare_monitors(runs / "a", runs / "b"), kind="act")
    w.widget()
    labels = [label for label, _ in w._anoms.options]
    assert len(labels) == len(a) and labels[i].startswith(f"a: step {PLANT}, rank 0: grad of 2.weight spiked")
    w._anoms.value = i  # as a click on it in the browser sets it
    assert w.state["kind"] == "grad" and w._w_kind.value == "grad" and f"step {PLANT}, 2.weight" in w._numbers.value
    assert w._anoms.value == i  # still shown as the one opened


def test_the_figures_mark_the_divergence(runs):
    g = mp.compare_monitors(runs / "a", runs / "b")
    fig = MP.curves_figure(MP.curves_frame(g), g.first_divergence().step)
    assert any(line.get_gid() == "first-divergence" for ax in fig.axes for line in ax.lines)
    fig = MP.heatmap_figure(MP.heatmap_frame(g), "norm_ratio", mark=(PLANT, "2.weight"))
    assert any(c.get_gid() == "mark" for c in fig.axes[0].collections)


def test_export_to_tensorboard(runs, tmp_path):
    pytest.importorskip("tensorboard", reason="the optional tensorboard package is not installed "
                        "(pip install 'msprobe_nb[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from msprobe_nb.analysis.monitor_tensorboard import export_tensorboard

    m = mp.load_monitor(runs / "a")
    (folder,) = export_tensorboard(m, tmp_path / "tb", kinds=["grad"])
    ea = EventAccumulator(str(folder), size_guidance={"tensors": 0})  # 0: every event, not a sample
    ea.Reload()
    tags = set(ea.Tags()["tensors"])
    assert {"scalars/loss", "scalars/grad_norm", "scalars/lr", "grad/2.weight/norm"} <= tags
    assert not any(t.startswith("weight/") for t in tags)
    got = [(e.step, e.tensor_proto.float_val[0]) for e in ea.Tensors("grad/2.weight/norm")]
    want = m.stats.loc[(m.stats["kind"] == "grad") & (m.stats["name"] == "2.weight"), ["step", "norm"]]
    assert [s for s, _ in got] == want["step"].tolist()
    assert np.allclose([v for _, v in got], want["norm"].to_numpy(), rtol=1e-6)


def test_the_command_line_summarises_a_record_and_names_the_divergence(runs, capsys):
    from msprobe_nb.cli import main

    assert main(["monitor", str(runs / "a"), "--compare", str(runs / "b")]) == 0
    out = capsys.readouterr().out
    assert "20 step(s) (0..19), rank(s) [0]" in out
    assert f"first divergence from {runs / 'b'}: step {PLANT}, rank 0: grad of 2.weight (layer 2)" in out
    assert main(["monitor", str(runs / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ------------------------------------------------------------------------- reads at a glance (issue 32, item 5)
def test_numbers_are_formatted_compactly_and_counts_as_integers(runs):
    import pandas as pd

    t = MP.format_numbers(pd.DataFrame({"norm": [-3.333402e-02, 1234567.0], "nan": [0.0, 2.0], "step": [3, 4]}))
    assert t["norm"].tolist() == ["-0.03333", "1.235e+06"] and t["nan"].tolist() == ["0", "2"]
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed")
    v = mp.MonitorViewer(mp.compare_monitors(runs / "a", runs / "b"))
    v.widget()
    html = v.widgets["numbers"].value
    assert "<td>0</td>" in html and "0.0</td>" not in html  # nan/inf counts as integers
    import re

    assert not re.search(r"\d\.\d{5,}", html)  # 4 significant digits, no "-3.333402e-02"
    p = heatmap_payload(v.heatmap(), "norm_ratio")
    assert p["values"][0][0] == "1" and "ratio" in p["scale_label"]  # what the hover tip shows, formatted


def test_legends_carry_the_runs_names(runs):
    g = mp.compare_monitors(runs / "a", runs / "b")
    assert MP.run_names(g) == ("a", "b")  # the folders' names
    assert MP.run_names(g, ("npu", "gpu")) == ("npu", "gpu")
    fig = MP.curves_figure(MP.curves_frame(g), names=("npu", "gpu"))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["npu", "gpu"]
    v = mp.MonitorViewer(g, names=("npu", "gpu"))
    assert v.names == ("npu", "gpu")


def test_anomalies_of_one_run_only_come_first_then_the_shared_by_severity(runs):
    g = mp.compare_monitors(runs / "a", runs / "b")
    a = MP.anomaly_frame(g)
    assert len(a) and "shared" in a.columns
    shared = a["shared"].tolist()
    assert shared == sorted(shared)  # every unshared row before every shared one
    first = a.iloc[0]
    assert first["run"] == "a" and not first["shared"]  # the planted spike is run a's alone
    for part in (a.loc[~a["shared"]], a.loc[a["shared"]]):
        for rule, grp in part.groupby("rule", sort=False):
            assert grp["severity"].is_monotonic_decreasing, rule


def test_the_heat_map_has_a_colour_scale_fits_900px_and_clears_a_stale_tip(runs):
    from msprobe_nb.viewers import monitor_viewer as MV

    g = mp.compare_monitors(runs / "a", runs / "b")
    fig = MP.heatmap_figure(MP.heatmap_frame(g), "norm_ratio")
    assert len(fig.axes) == 2 and "ratio" in fig.axes[1].get_ylabel()  # the colour bar, labelled
    assert fig.get_figwidth() * 80 <= 900  # figure_png's dpi
    assert MV.HEAT_MAX_WIDTH <= 880 and 'className = "heat-colorbar"' in MV._HEAT_ESM
    draw = MV._HEAT_ESM[MV._HEAT_ESM.index("function draw()"):]
    assert draw.index('tip.textContent = ""') < draw.index("canvas.width")  # a redraw clears the old tip


def test_the_anomaly_order_on_planted_shared_and_single_run_rows():
    """Rows both runs have come after those of one run only; within each, non-finite first, then by severity."""
    from types import SimpleNamespace

    import pandas as pd

    def frame(rows):
        return pd.DataFrame(rows, columns=["step", "rank", "name", "kind", "rule", "severity", "message"])

    a = frame([(5, 0, "w", "grad", "spike", 9.0, "shared big"), (7, 0, "w", "grad", "spike", 3.0, "a small"),
               (8, 0, "v", "grad", "nonfinite", 1.0, "a nan")])
    b = frame([(5, 0, "w", "grad", "spike", 8.0, "shared big"), (9, 0, "w", "grad", "spike", 6.0, "b mid")])
    g = SimpleNamespace(table=None, first_divergence=None, a=SimpleNamespace(anomalies=lambda: a),
                        b=SimpleNamespace(anomalies=lambda: b))
    got = MP.anomaly_frame(g)
    assert got["message"].tolist() == ["a nan", "b mid", "a small", "shared big", "shared big"]
    assert got["run"].tolist()[:3] == ["a", "b", "a"] and got["shared"].tolist() == [False] * 3 + [True] * 2
