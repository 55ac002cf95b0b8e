"""Viewers: model layer (filter/sort/page/highlight), figures, and the viewers driven through their state.

Widgets are exercised headless (ipywidgets 8 uses a DummyComm outside a kernel). Set
MSPROBE_NB_UPDATE_GOLDEN=1 to rewrite the golden HTML under tests/golden/.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn as nn
from matplotlib.figure import Figure

import msprobe_nb
from msprobe_nb.analysis.compare import compare
from msprobe_nb.store.dump import load
from msprobe_nb.store.schema import coerce_calls
from msprobe_nb.viewers import CompareViewer, DumpViewer, grid_widget
from msprobe_nb.viewers import plots as P
from msprobe_nb.viewers.compare_viewer import trace_frame, trace_html
from msprobe_nb.viewers.grid_widget import GRID_CSS
from msprobe_nb.viewers.table import (
    FLAG_CSS,
    VERDICT_COLOURS,
    TableIndex,
    cell_flags,
    cell_styles,
    descending_first,
    filter_rows,
    format_number,
    format_value,
    grid_columns,
    page_payload,
    page_rows,
    reasons_by_severity,
    render_html,
    result_css,
    row_verdicts,
    sort_rows,
)
from msprobe_nb.viewers.tree import divergence_path, module_tree, tree_payload, visible_nodes, walk
from msprobe_nb.viewers.view_state import next_sort

GOLDEN = Path(__file__).parent / "golden"
FAMILIES = ["Functional", "Torch", "Tensor", "Module", "NPU", "Distributed", "Aten"]


# ------------------------------------------------------------------------------------------ fixtures
def synthetic(n: int, seed: int = 0) -> pd.DataFrame:
    """``n`` schema rows, 4 per call, 2 steps x 2 ranks; API calls nested in the latest module call."""
    rng = np.random.default_rng(seed)
    n_calls = -(-n // 4)
    ci = np.arange(n_calls)
    fam = np.array(FAMILIES, dtype=object)[ci % len(FAMILIES)]
    direction = np.where((ci // 100) % 2 == 0, "forward", "backward").astype(object)
    path = np.array([f"layers.{i // 7 % 20}" for i in ci], dtype=object)
    calls = np.array([f"Module.{p}.Linear.{d}.{i // 140}" if f == "Module" else f"{f}.op{i % 13}.{i}.{d}"
                      for f, d, p, i in zip(fam, direction, path, ci)], dtype=object)
    is_mod = fam == "Module"
    last = np.maximum.accumulate(np.where(is_mod, ci, -1))
    parent = np.where(is_mod | (last < 0), "", calls[np.maximum(last, 0)]).astype(object)
    r = np.repeat(ci, 4)[:n]
    io = np.tile(np.array(["input", "input", "output", "parameters"], dtype=object), n_calls)[:n]
    norm = np.abs(rng.normal(size=n)) * 10
    norm[rng.random(n) < 0.01] = np.nan
    df = pd.DataFrame({
        "step": (r * 2 // n_calls).astype(np.int32), "rank": (r % 2).astype(np.int32), "call_index": r,
        "call": calls[r], "family": fam[r], "module_path": np.where(is_mod, path, "")[r],
        "direction": direction[r], "io": io, "arg": "0", "kind": "tensor", "dtype": "torch.float32",
        "name": [f"{c}.{i}.{k}" for c, i, k in zip(calls[r], io, np.arange(n) % 4)],
        "max": rng.normal(size=n), "min": rng.normal(size=n), "norm": norm, "parent": parent[r]})
    return coerce_calls(df)


@pytest.fixture(scope="module")
def big() -> pd.DataFrame:
    return synthetic(120_000)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.l2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.l2(self.act(self.l1(x)))


_RELU = torch.relu


def _record(path: Path, task: str, perturb: bool) -> None:
    torch.manual_seed(0)
    m, x = Net(), torch.randn(3, 4)
    with msprobe_nb.record(dump_path=path, level="mix", task=task):
        if perturb:  # the NPU run's ReLU computes 3x its result: Functional.relu diverges with agreeing inputs
            with mock.patch.object(torch, "relu", lambda t: _RELU(t) * 3):
                y = m(x)
        else:
            y = m(x)
        y.pow(2).sum().backward()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two recorded runs per task (perturbed "npu", clean "bench") and their comparison."""
    root = tmp_path_factory.mktemp("viewers")
    out = {}
    for task in ("statistics", "tensor"):
        _record(root / task / "npu", task, True)
        _record(root / task / "bench", task, False)
        npu, bench = load(root / task / "npu"), load(root / task / "bench")
        out[task] = (npu, bench, compare(npu, bench))
    return out


# ------------------------------------------------------------------------------------------ filters
def test_filters_combine(big):
    ix = TableIndex(big)
    got = filter_rows(big, ix, family="Functional", direction="forward", io="output", step=1, rank=[0])
    want = big[(big["family"] == "Functional") & (big["direction"] == "forward") & (big["io"] == "output")
               & (big["step"] == 1) & (big["rank"] == 0)]
    assert len(want) > 100 and got.index.equals(want.index)
    # call text (case-insensitive) + family list; regex
    got = filter_rows(big, ix, call="OP3.", family=["Torch", "Aten"])
    want = big[big["call"].str.contains("op3.", regex=False) & big["family"].isin(["Torch", "Aten"])]
    assert got.index.equals(want.index) and len(want)
    got = filter_rows(big, ix, call=r"^Tensor\.op1[0-2]\.", regex=True, io="input")
    want = big[big["call"].str.match(r"Tensor\.op1[0-2]\.") & (big["io"] == "input")]
    assert got.index.equals(want.index) and len(want)
    # "all" / None / "" mean no filter
    assert len(filter_rows(big, ix, family="all", io=None, call="")) == len(big)


def test_invalid_regex_is_a_message(big):
    got = filter_rows(big.head(400), call="op1.[", regex=True)
    assert got.empty and "invalid regular expression" in got.attrs["filter_messages"][0]
    v = DumpViewer(big.head(400)).set_state(call="(", regex=True)
    assert v.n_rows == 0 and any("invalid regular expression" in m for m in v.messages)
    assert "invalid regular expression" in v.status()
    with pytest.raises(TypeError):
        filter_rows(big.head(10), colour="red")


def test_module_subtree(big):
    ix = TableIndex(big)
    mod = "Module.layers.3.Linear.forward.0"
    got = filter_rows(big, ix, module=mod)
    assert set(got["call"]) == {mod} | set(big.loc[big["parent"] == mod, "call"])
    # a module path takes every call of that module (forward and backward) and what is nested in them
    # layers.1 has siblings layers.10 ... layers.19, which a prefix match would take too
    got = filter_rows(big, ix, module="layers.1", direction="backward")
    mods = set(big.loc[(big["module_path"] == "layers.1") & (big["direction"] == "backward"), "call"])
    assert mods and set(got["call"]) == mods | set(big.loc[big["parent"].isin(mods) & (big["direction"]
                                                                                        == "backward"), "call"])
    assert "no module" in filter_rows(big.head(100), module="nowhere").attrs["filter_messages"][0]


def test_compare_table_derives_family_and_verdicts(runs):
    r = runs["statistics"][2]
    assert "family" not in r.columns
    fun = filter_rows(r, family="Functional", verdict="error")
    assert list(dict.fromkeys(fun["call"])) == ["Functional.relu.0.forward"]
    assert set(filter_rows(r, direction="parameters_grad")["call"]) == {
        "Module.l1.Linear.parameters_grad.0", "Module.l2.Linear.parameters_grad.0"}
    assert set(filter_rows(r, module="act")["call"]) == {
        "Module.act.ReLU.forward.0", "Functional.relu.0.forward", "Module.act.ReLU.backward.0",
        "Functional.relu.0.backward"}


# ------------------------------------------------------------------------------------------ paging / sorting
def test_paging_and_sorting_120k(big):
    v = DumpViewer(big, page_size=100)
    assert v.n_rows == 120_000 and v.n_pages == 1200 and len(v.rows) == 100
    v.set_state(sort_by="norm", ascending=False, page=3)
    want = big.sort_values("norm", ascending=False, na_position="last").iloc[300:400]
    assert v.rows.index.equals(want.index)
    v.set_state(page=10**6)  # clamped to the last page; NaN norms sort last either way
    assert v.state.page == 1199 and v.rows["norm"].isna().all()
    v.set_state(ascending=True, page=0)
    assert v.rows["norm"].is_monotonic_increasing
    v.set_state(sort_by="call", family="Tensor", io="output")  # a filter resets the page
    want = big[(big["family"] == "Tensor") & (big["io"] == "output")].sort_values("call", kind="stable")
    assert v.state.page == 0 and v.n_rows == len(want) and v.rows.index.equals(want.index[:100])
    v.next_page().next_page()
    assert v.rows.index.equals(want.index[200:300])
    v.set_state(page_size=50)  # keeps the first visible row on screen
    assert v.state.page == 4 and v.rows.index[0] == want.index[200]
    v.set_state(sort_by=None)
    assert v.rows["call_index"].is_monotonic_increasing  # execution order
    assert sort_rows(big.head(8), "max").index.equals(big.head(8).sort_values("max").index)
    assert page_rows(big, 5, 7).index.equals(big.index[35:42])


# ------------------------------------------------------------------------------------------ highlighting
def _small_compare() -> pd.DataFrame:
    return pd.DataFrame({
        "call_index": [0, 0, 1, 1], "call": ["A.f.0.forward"] * 2 + ["B.g.0.forward"] * 2,
        "name": ["A.f.0.forward.input.0", "A.f.0.forward.output.0", "B.g.0.forward.input.0",
                 "B.g.0.forward.output.0"],
        "result": ["pass", "warning", "pass", "error"], "err": [0.0, 2e-3, 1e-4, np.inf],
        "norm_rel": [0.0, 0.5, 0.05, 0.9], "near_zero": ["", "norm", "", ""],
        "cosine": [1.0, 0.95, 0.999, 0.2], "diverges": [False, True, False, True]})


def test_highlighting_marks_the_right_cells():
    t = _small_compare()
    f = cell_flags(t)
    assert f["err"].tolist() == [False, True, False, True]
    assert f["norm_rel"].tolist() == [False, False, False, True]  # row 1 is near zero on the bench side
    assert f["cosine"].tolist() == [False, False, False, True]
    assert f["result"].tolist() == [False, True, False, True]
    assert not f["call"].any() and not f["name"].any()
    s = cell_styles(t)
    assert s.loc[3, "err"] == FLAG_CSS and s.loc[3, "call"] == "background-color:#f8d7da"
    assert s.loc[1, "name"] == "background-color:#fff3cd" and s.loc[0, "name"] == "background-color:#eef7ee"
    # the verdict cell in the grid's colours, one set everywhere: amber warning, red error (issue 33)
    assert s.loc[1, "result"] == result_css("warning") and "#ffd54f" in s.loc[1, "result"]
    assert s.loc[3, "result"] == result_css("error") and "#e57373" in s.loc[3, "result"]
    assert "#ffd54f" in GRID_CSS and "#e57373" in GRID_CSS and VERDICT_COLOURS["pass"] in GRID_CSS
    html = render_html(t, ["name", "result", "err", "norm_rel", "cosine"], s, sort_by="err")
    assert html.count(FLAG_CSS) == int(f[["err", "norm_rel", "cosine"]].to_numpy().sum())
    golden = GOLDEN / "compare_page.html"
    if os.environ.get("MSPROBE_NB_UPDATE_GOLDEN") or not golden.exists():
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(html, encoding="utf-8")
    assert html == golden.read_text(encoding="utf-8")


def test_dump_highlights_nan_and_inf():
    t = coerce_calls(pd.DataFrame({"call": ["A.x.0.forward"] * 2, "max": [np.inf, 1.0], "nan_count": [0, 3]}))
    f = cell_flags(t)
    assert f["max"].tolist() == [True, False] and f["nan_count"].tolist() == [False, True]


# ------------------------------------------------------------------------------------------ detail
def test_dump_viewer_detail_of_a_known_call(runs):
    npu = runs["statistics"][0]
    v = DumpViewer(npu)
    v.select("Functional.linear.0.forward")
    d = v.selected
    assert d.call == "Functional.linear.0.forward" and (d.step, d.rank) == (0, 0)
    assert d.inputs["name"].tolist() == [f"Functional.linear.0.forward.input.{i}" for i in range(3)]
    assert d.outputs["name"].tolist() == ["Functional.linear.0.forward.output.0"]
    assert d.outputs[["max", "min", "mean", "norm"]].notna().all().all()
    user = d.frames[d.frames["user"]]
    assert Path(__file__).name in Path(user["file"].iloc[0]).name and "self.l2(self.act(self.l1(x)))" in \
        user["code"].iloc[0]
    assert "Functional.linear.0.forward" in d.html and "forward" in d.html
    assert d.tensor_rows == [] and v.detail_figure() is None  # statistics: no whole tensors
    v.select("Nope.nothing")
    assert v.selected is None


def test_select_row_and_goto(runs):
    v = DumpViewer(runs["statistics"][0], page_size=5)
    v.select_row(7)
    assert v.state.selected == v.table.iloc[7]["call"]
    v.goto("Functional.relu.0.backward")
    first = int(np.flatnonzero(v.table["call"] == "Functional.relu.0.backward")[0])
    assert v.state.page == first // 5 and "Functional.relu.0.backward" in set(v.rows["call"])
    with pytest.raises(IndexError):
        v.select_row(10**6)


def test_compare_viewer_errors_show_the_perturbed_call_first(runs):
    npu, bench, r = runs["statistics"]
    v = CompareViewer(r)
    v.set_state(verdict="error")
    assert set(v.rows["result"]) == {"error"}
    first = v.rows["call"].iloc[0]
    assert first == "Module.act.ReLU.forward.0"  # in execution order, the module opens before its ReLU
    assert v.divergence.call == "Functional.relu.0.forward"  # the root: the innermost diverging call
    v.set_state(family="Functional")
    assert v.rows["call"].iloc[0] == "Functional.relu.0.forward"
    v.select("Functional.relu.0.forward")
    d = v.selected
    assert d.outputs["result"].tolist() == ["error"] and any("NormRelativeErr" in x for x in d.reasons)
    assert {"npu_norm", "bench_norm"} <= set(d.rows.columns) and "first divergence" in d.html
    assert any(d.frames["user"])
    v.set_state(verdict=None, family=None, page_size=5).goto_divergence()
    assert v.state.selected == "Functional.relu.0.forward" and "Functional.relu.0.forward" in set(v.rows["call"])
    assert "outline" in v.html()  # the divergence call is outlined


def test_compare_viewer_tensor_mode_detail_plot(runs):
    npu, bench, r = runs["tensor"]
    v = CompareViewer(r)
    v.select("Functional.relu.0.forward")
    d = v.selected
    assert d.tensor_rows[0] == "Functional.relu.0.forward.output.0"  # worst row first
    fig = v.detail_figure()
    assert isinstance(fig, Figure) and len(fig.axes) == 3  # histogram, heat map, colour bar
    row = d.rows.set_index("name").loc["Functional.relu.0.forward.output.0"]
    a, b = npu.tensor(row["npu_data_name"]), bench.tensor(row["bench_data_name"])
    heat = fig.axes[1].images[0].get_array()
    assert heat.shape == tuple(a.shape) and np.isclose(float(heat.max()), float((a - b).abs().max()))
    assert sum(p.get_height() for p in fig.axes[0].patches) == a.numel()
    with pytest.raises(KeyError):
        v.detail_figure("Functional.relu.0.forward.input.inplace")
    dv = DumpViewer(npu).select("Functional.relu.0.forward")
    assert isinstance(dv.detail_figure(), Figure)


# ------------------------------------------------------------------------------------------ plots
def test_metric_plot_marks_the_first_divergence(runs):
    r = runs["statistics"][2]
    fig = P.metric_along_order(r, "err")
    assert isinstance(fig, Figure)
    assert P.divergence_x(fig) == r.first_divergence().call_index == 3  # Functional.relu inside Module.act
    s = P.metric_series(r, "err")
    assert s["call_index"].is_monotonic_increasing and np.isclose(s.loc[s["call_index"] == 2, "value"].item(), 2.0)
    t = synthetic(4000)
    fig = P.metric_along_order(t, "norm", divergence="Tensor.op2.2.forward")
    assert P.divergence_x(fig) == 2
    assert P.divergence_x(P.metric_along_order(t, "norm")) is None  # a calls table has no divergence


def test_errors_summed_per_module(runs):
    r = runs["statistics"][2]
    m = P.module_errors(r, "err", by="module").set_index("module")
    api = r[~r["call"].str.startswith("Module.") | r["call"].str.contains("parameters_grad")]
    act = api[api["parent"].str.startswith("Module.act.")]
    assert np.isclose(m.loc["act", "sum"], act["err"].sum()) and m.loc["act", "rows"] == len(act)
    assert set(m.index) == {"l1", "act", "l2", P.TOP_LEVEL}
    by_call = P.module_errors(r, "err", by="parent").set_index("module")
    assert "Module.act.ReLU.forward.0" in by_call.index and "Module.l2.Linear.parameters_grad.0" in by_call.index
    fig = P.errors_by_module(r, "err")
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == len(m)
    t = _small_compare().assign(parent=["Module.m.X.forward.0"] * 4)
    assert P.module_errors(t).loc[0, "n_inf"] == 1  # inf is counted, not summed


def test_metric_line_breaks_at_gaps(runs):
    x, y = P.gapped(np.array([0, 1, 2, 5, 6]), np.array([1.0, np.nan, 3.0, 4.0, 5.0]))
    assert np.isnan(y[1]) and np.isnan(y[3]) and x[3] == 4.5 and len(x) == 6  # NaN breaks, a gap too
    r = runs["statistics"][2]
    fig = P.metric_along_order(r[r["call"] != "Functional.relu.0.forward"], "err")
    line = fig.axes[0].lines[0]
    xs, ys = np.asarray(line.get_xdata(), dtype=float), np.asarray(line.get_ydata(), dtype=float)
    assert np.isnan(ys).any()  # the left-out call is a break, not a segment from call 2 to call 4
    seg = np.flatnonzero(np.isnan(ys))
    assert any(xs[i - 1] < 3 < xs[i + 1] for i in seg if 0 < i < len(xs) - 1)


def _layers(n_layers: int) -> pd.DataFrame:
    """A compare-like table of an ``n_layers`` transformer: embed, layers.i.{attn,mlp}, head."""
    rows, ci = [], 0

    def mod(path, cls, parent):
        return f"Module.{path}.{cls}.forward.0", parent

    plan = [("embed", "Embedding", None)] + [(f"layers.{i}", "Block", None) for i in range(n_layers)] + [
        ("head", "Linear", None)]
    for path, cls, _ in plan:
        call, _ = mod(path, cls, "")
        rows.append((ci, call, "", 0.0))
        ci += 1
        subs = [("attn", "Attention"), ("mlp", "MLP")] if path.startswith("layers.") else [(None, None)]
        for sub, scls in subs:
            parent = call
            if sub:
                scall = f"Module.{path}.{sub}.{scls}.forward.0"
                rows.append((ci, scall, call, 0.0))
                ci += 1
                parent = scall
            rows.append((ci, f"Functional.op.{ci}.forward", parent, 0.01 * ci))
            ci += 1
    t = pd.DataFrame(rows, columns=["call_index", "call", "parent", "err"])
    return t.assign(step=0, rank=0, name=t["call"] + ".output.0", io="output")


def test_module_bars_in_model_order_at_45_layers():
    t = _layers(45)
    m = P.module_errors_tree(t, "err")
    assert m["module"].tolist() == ["embed", *[f"layers.{i}" for i in range(45)], "head"]  # one bar per layer
    assert m.attrs["depth"] == 2 and m.attrs["max_depth"] == 3
    l3 = t["parent"].str.startswith("Module.layers.3.") & ~t["call"].str.startswith("Module.")
    assert np.isclose(m.set_index("module").loc["layers.3", "sum"], t.loc[l3, "err"].sum())
    fig = P.errors_by_module(t, "err")
    ax = fig.axes[0]
    labels = [x.get_text() for x in ax.get_yticklabels()]
    assert labels[0] == "embed" and labels[1] == "layers.0" and labels[-1] == "head" and len(ax.patches) == 47
    assert fig.get_size_inches()[1] >= 0.2 * 47 and min(x.get_fontsize() for x in ax.get_yticklabels()) >= 7
    small = P.module_errors_tree(_layers(3), "err")
    assert small.attrs["depth"] == 3 and "layers.1.attn" in set(small["module"])  # small models: every module
    by_call = P.module_errors_tree(t, "err", by="parent")
    assert by_call["module"].iloc[1] == "Module.layers.0.Block.forward.0" and len(by_call) == 47


def test_tensor_diff_handles_shapes_and_1d():
    fig = P.tensor_diff(torch.zeros(3), torch.zeros(4), "x")
    assert "shapes differ" in fig.axes[0].texts[0].get_text()
    fig = P.tensor_diff(torch.arange(10.0), torch.arange(10.0) + 0.5)
    assert fig.axes[1].images[0].get_array().shape == (3, 4)  # 10 elements folded into a padded square
    assert P.as_2d(np.ones((1000, 3))).shape == (250, 3)
    assert P.figure_png(fig).startswith(b"\x89PNG")


# ------------------------------------------------------------------------------------------ trace
def test_trace_pane_from_a_given_trace(runs):
    r = runs["statistics"][2]
    trace = pd.DataFrame({"call": ["Torch.randint.0.forward", "Tensor.__getitem__.0.forward"],
                          "kind": ["random draw", "first divergence"], "file": ["train.py", "train.py"],
                          "line": [12, 14], "code": ["idx = torch.randint(0, 8, (4,))", "y = x[idx]"],
                          "note": ["device generator", ""]})
    v = CompareViewer(r, trace=trace)
    assert v.trace[["call", "file", "line"]].equals(trace[["call", "file", "line"]])
    html = v.trace_html()
    assert "train.py" in html and "torch.randint" in html and html.count("#fdebd0") == 6  # source row
    assert trace_frame([{"call": "a", "line": 1}])["call"].tolist() == ["a"]
    assert trace_frame(None) is None and "no trace" in trace_html(None)


def test_trace_pane_without_provenance(runs):
    with mock.patch.dict(sys.modules, {"msprobe_nb.analysis.provenance": None}):
        v = CompareViewer(runs["statistics"][2])
        assert v.trace is None and "no trace" in v.trace_html()


def test_trace_pane_with_provenance(runs):
    pytest.importorskip("msprobe_nb.analysis.provenance")
    v = CompareViewer(runs["statistics"][2])
    html = v.trace_html()
    assert "Functional.relu.0.forward" in html and "first divergence" in html


# ------------------------------------------------------------------------------------------ grid model
def test_numbers_have_one_format():
    assert [format_number(x) for x in (0.0, -0.0, 7.14538e-05, 0.00264508, 3.0, 12345.678, 1e9, np.inf, np.nan)] \
        == ["0", "0", "7.145e-05", "0.002645", "3", "1.235e+04", "1e+09", "inf", ""]
    assert format_number(np.int64(7)) == "7" and format_value(0.123456789) == "0.1235"
    assert format_value(["a", "b"]) == "a; b" and format_value(None) == ""


def test_grid_columns_put_the_cause_first(runs):
    r = runs["statistics"][2]
    v = CompareViewer(r)
    assert v.columns[:7] == ["name", "result", "reasons", "npu_dtype", "bench_dtype", "err", "call_index"]
    assert grid_columns(["call", "io", "max", "call_index"], ["call", "io", "max", "call_index"]) == \
        ["call", "call_index", "io", "max"]
    p = v.grid_payload()
    keys = [c["key"] for c in p["columns"]]
    assert keys == v.columns and [c["key"] for c in p["columns"] if c["frozen"]] == ["name"]
    assert len(p["rows"]) == len(p["verdict"]) == len(p["flags"]) == len(v.rows)
    assert set(p["verdict"]) <= {"pass", "warning", "error", "unmatched"} and all(p["verdict"])  # every row coloured
    err = keys.index("err")
    for row, verdict, flags in zip(p["rows"], p["verdict"], p["flags"]):
        if verdict == "error":
            assert err in flags
        assert row[err] == format_number(float(row[err])) if row[err] not in ("", "inf") else True  # 4 digits
    assert p["pos"][0] == v.state.page * v.state.page_size


def test_row_verdicts_colour_every_row():
    t = _small_compare().assign(match=["matched", "matched", "npu_only", "matched"])
    assert row_verdicts(t) == ["pass", "warning", "unmatched", "error"]
    calls = coerce_calls(pd.DataFrame({"call": ["A.x.0.forward"] * 2, "max": [np.inf, 1.0], "nan_count": [0, 0]}))
    assert row_verdicts(calls) == ["nan", ""]


def test_metric_columns_sort_descending_first():
    assert next_sort(None, True, "err", descending_first=True) == ("err", False)
    assert next_sort("err", False, "err", descending_first=True) == ("err", True)
    assert next_sort("err", True, "err", descending_first=True) == (None, True)
    assert descending_first("err", True) and descending_first("rmse_ratio", True)
    assert not descending_first("call_index", True) and not descending_first("name", False)
    assert not descending_first("cosine", True)  # its low end is the bad one


def test_reasons_by_severity_put_the_verdict_s_reason_first():
    rs = ["note: MinRelativeErr 611% is not meaningful", "warning: dtype differs", "error: NormRelativeErr 58.7%"]
    assert reasons_by_severity(rs) == [rs[2], rs[1], rs[0]]
    assert reasons_by_severity(["warning: a", "note: b"]) == ["warning: a", "note: b"]
    t = _small_compare().assign(reasons=[[], ["note: n", "warning: w"], [], ["warning: w", "error: e"]])
    p = page_payload(t, ["name", "result", "reasons"])
    assert p["rows"][3][2].startswith("error: e") and p["rows"][1][2].startswith("warning: w"), p["rows"]
    assert ">error: e; warning: w<" in render_html(t, ["name", "reasons"])


def test_compare_viewer_opens_scrolled_to_the_divergence(runs):
    v = CompareViewer(runs["statistics"][2])
    d = v.divergence
    assert d is not None
    assert v.widget is not None  # the first payload the browser gets scrolls to the selected divergence
    p = v.widgets["grid"].payload
    assert p["selected"] and p["scroll_to"] == p["selected"][0], (p["selected"], p["scroll_to"])
    assert p["rows"][p["scroll_to"]][0].startswith(d.call), p["rows"][p["scroll_to"]]


def test_header_clicks_cycle_the_sort(big):
    assert next_sort(None, True, "norm") == ("norm", True)
    assert next_sort("norm", True, "norm") == ("norm", False)
    assert next_sort("norm", False, "norm") == (None, True)
    assert next_sort("norm", False, "max") == ("max", True)
    v = DumpViewer(big.head(4000), page_size=20)
    p = v.grid_payload()
    assert p["sort"] is None and [c["key"] for c in p["columns"] if c["frozen"]] == ["call"]


# ------------------------------------------------------------------------------------------ model tree
def test_module_tree_of_a_compare(runs):
    r = runs["statistics"][2]
    d = r.first_divergence()
    nodes = module_tree(r, d)
    flat = {n.call: n for n in walk(nodes)}
    assert [n.call for n in nodes] == ["Module.l1.Linear.forward.0", "Module.act.ReLU.forward.0",
                                       "Module.l2.Linear.forward.0", "Module.l2.Linear.backward.0",
                                       "Module.act.ReLU.backward.0", "Module.l1.Linear.backward.0"]
    act = flat["Module.act.ReLU.forward.0"]
    assert act.verdict == "error" and act.errors >= 1 and act.on_path and act.divergence
    assert act.rows == int(r["call"].isin(["Module.act.ReLU.forward.0", "Functional.relu.0.forward"]).sum())
    assert flat["Module.l1.Linear.forward.0"].verdict == "pass" and not flat["Module.l1.Linear.forward.0"].on_path
    # the parameter gradients count for their module's backward
    l2b = flat["Module.l2.Linear.backward.0"]
    assert l2b.rows == int(r["call"].isin(["Module.l2.Linear.backward.0", "Functional.linear.1.backward",
                                           "Module.l2.Linear.parameters_grad.0"]).sum())
    assert divergence_path(nodes) == ["Module.act.ReLU.forward.0"]
    payload = tree_payload(nodes)
    assert payload[1]["id"] == act.call and payload[1]["verdict"] == "error" and payload[1]["divergence"]


def test_module_tree_nests_and_rolls_up():
    calls = ["Module.blk.Block.forward.0", "Module.blk.attn.Attn.forward.0", "Functional.softmax.0.forward",
             "Module.blk.mlp.MLP.forward.0", "Functional.gelu.0.forward", "Module.head.Linear.forward.0"]
    parents = ["", "Module.blk.Block.forward.0", "Module.blk.attn.Attn.forward.0", "Module.blk.Block.forward.0",
               "Module.blk.mlp.MLP.forward.0", ""]
    t = pd.DataFrame({"call_index": range(6), "call": calls, "parent": parents, "step": 0, "rank": 0,
                      "name": [c + ".output.0" for c in calls], "io": "output",
                      "result": ["pass", "pass", "error", "warning", "pass", "pass"], "match": "matched"})
    div = {"call": "Functional.softmax.0.forward",
           "modules": ["Module.blk.attn.Attn.forward.0", "Module.blk.Block.forward.0"]}
    nodes = module_tree(t, div)
    assert [n.call for n in nodes] == ["Module.blk.Block.forward.0", "Module.head.Linear.forward.0"]
    blk = nodes[0]
    assert [c.path for c in blk.children] == ["blk.attn", "blk.mlp"] and blk.children[0].depth == 1
    assert blk.verdict == "error" and blk.rows == 5 and blk.errors == 1 and blk.warnings == 1
    assert blk.children[1].verdict == "warning" and nodes[1].verdict == "pass"
    assert divergence_path(nodes) == ["Module.blk.Block.forward.0", "Module.blk.attn.Attn.forward.0"]
    assert [n.call for n in visible_nodes(nodes)] == [nodes[0].call, nodes[1].call]
    assert len(visible_nodes(nodes, {blk.call})) == 4
    assert module_tree(t.drop(columns="parent"))[0].children == []  # no parent column: a flat list


# ------------------------------------------------------------------------------------------ the answer
def test_compare_viewer_opens_on_the_answer(runs):
    r = runs["statistics"][2]
    v = CompareViewer(r, page_size=5)
    d = r.first_divergence()
    assert v.state.selected == d.call and v.state.page > 0 and d.call in set(v.rows["call"])
    a = v.answer()
    assert a["call"] == d.call and a["modules"] == list(reversed(d.modules)) and a["chain"] == list(d.chain)
    box = v.answer_html()
    assert f"first divergence: {d.call}" in box and "inside" in box
    assert ("fix:" in box) == bool(a["advice"]) and ("cause:" in box or "fix:" in box)
    assert v.grid_payload(scroll=True)["scroll_to"] >= 0 and v.grid_payload()["marked"]
    assert CompareViewer(r, open_at_divergence=False).state.selected is None


# ------------------------------------------------------------------------------------------ widgets
def test_widgets_mirror_state(runs):
    import ipywidgets as W

    v = DumpViewer(runs["statistics"][0], page_size=10)
    box = v.widget
    assert isinstance(box, W.VBox) and "application/vnd.jupyter.widget-view+json" in v._repr_mimebundle_()
    w = v.widgets
    with pytest.raises(TypeError):
        w["grid"] = None  # read-only: the viewer's own dict stays as built
    grid = w["grid"]
    w["io"].value = "output"  # widget -> state
    assert v.state.io == "output" and set(v.rows["io"]) == {"output"}
    v.set_state(family="Functional")  # state -> widget
    assert w["family"].value == "Functional" and all(r[0].startswith("Functional") for r in grid.payload["rows"])
    w["io"].value = "all"
    w["next"].click()
    assert v.state.page == 1 and w["page"].value == 2 and not w["prev"].disabled
    pos = grid.payload["pos"][3]
    grid.click_row(pos)  # a click on a row selects its call; its detail shows under the grid
    assert v.state.selected == v.table.iloc[v._positions[pos]]["call"] and w["tabs"].selected_index == 0
    assert v.state.selected in w["detail"].value and grid.payload["selected"]
    grid.click_header("norm")  # a metric column: descending first, the largest first (issue 33)
    assert v.state.sort_by == "norm" and not v.state.ascending and grid.payload["sort"] == ["norm", False]
    assert v.rows["norm"].is_monotonic_decreasing
    grid.click_header("norm")
    assert v.state.ascending and v.rows["norm"].is_monotonic_increasing
    grid.click_header("norm")
    assert v.state.sort_by is None
    grid.click_header("call")  # a name: ascending first
    assert v.state.sort_by == "call" and v.state.ascending
    w["call"].value = "relu"  # the live filter: its value follows the typing
    assert type(w["call"]).__name__ == "LiveText" and w["call"].hint
    assert v.state.page == 0 and set(v.rows["call"]) <= {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    w["tabs"].selected_index = 2
    assert bytes(w["plot_order"].value)[:4] == bytes(w["plot_module"].value)[:4] == b"\x89PNG"
    with pytest.raises(TypeError):
        v.set_state(colour="red")


def test_tree_node_filters_the_grid(runs):
    v = CompareViewer(runs["statistics"][2])
    w = v.widgets
    tree = w["tree"]
    assert tree.expanded == ["Module.act.ReLU.forward.0"] and tree.nodes[1]["verdict"] == "error"
    tree.click_node("Module.l2.Linear.forward.0")
    assert v.state.module == "Module.l2.Linear.forward.0" and v.state.selected == "Module.l2.Linear.forward.0"
    assert set(v.rows["call"]) == {"Module.l2.Linear.forward.0", "Functional.linear.1.forward"}
    assert tree.selected == "Module.l2.Linear.forward.0" and "Module.l2.Linear.forward.0" in w["detail"].value
    w["clear"].click()
    assert v.state.module == "" and v.n_rows == len(v.table)


def test_plain_widgets_without_anywidget(runs):
    """Without anywidget the shell is plain ipywidgets: a static page, a row picker, the tree as a list."""
    with mock.patch.object(grid_widget, "_load", lambda: None):
        v = DumpViewer(runs["statistics"][0], page_size=10)
        w = v.widgets
    assert "grid" not in w and type(w["call"]).__name__ == "Text"
    v.set_state(family="Functional")
    assert "Functional" in w["table"].value
    pos = w["pick"].options[0][1]
    w["pick"].value = pos  # choosing a call of the page selects it and opens the detail tab
    assert v.state.selected == v.table.iloc[v._positions[pos]]["call"] and w["tabs"].selected_index == 1
    assert v.state.selected in w["detail"].value
    w["call"].value = "relu"
    assert set(v.rows["call"]) <= {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    w["tree"].value = "Module.l1.Linear.forward.0"
    assert v.state.module == "Module.l1.Linear.forward.0"


def test_compare_viewer_widgets(runs):
    v = CompareViewer(runs["tensor"][2])
    w = v.widgets
    assert "first divergence: Functional.relu.0.forward" in w["header"].value
    w["verdict"].value = "warning"
    assert v.state.verdict == "warning" and set(v.rows["result"]) == {"warning"}
    w["verdict"].value = "all"
    w["goto_div"].click()  # the grid turns to the divergence and scrolls to it; its detail shows below
    assert v.state.selected == v.divergence.call and w["tabs"].selected_index == 0
    assert w["grid"].payload["scroll_to"] >= 0 and v.divergence.call in w["detail"].value
    w["tabs"].selected_index = 1  # the whole tensors are drawn when the Detail tab shows
    assert bytes(w["detail_img"].value)[:4] == b"\x89PNG"
    w["tabs"].selected_index = 3
    assert "first divergence" in w["trace"].value or "no trace" in w["trace"].value


def test_acc_check_viewer_err_is_the_worst_ratio_and_plots_per_call(tmp_path):
    """err: the worst ratio to the reference kernel, a number (not the reasons again); an L1 pre-check has no
    modules, so the per-module plot shows each API instead of one "(top level)" bar (issue 33)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    with msprobe_nb.record(dump_path=str(tmp_path / "d"), level="L1", task="tensor") as dbg:
        torch.softmax(model(torch.randn(4, 8)), -1).sum().backward()
    pre = msprobe_nb.acc_check(dbg.dump_dir)
    v = msprobe_nb.AccCheckViewer(pre)
    t = v.table
    assert pd.api.types.is_float_dtype(t["err"].dtype), t["err"].dtype
    ratios = t[["rmse_ratio", "max_rel_err_ratio", "mean_rel_err_ratio"]].max(axis=1)
    measured = ratios.notna()
    assert measured.any() and (t.loc[measured, "err"] >= ratios[measured]).all()
    assert "reasons" in [c["key"] for c in v.grid_payload()["columns"]]
    fig = v.module_figure()
    title = fig.axes[0].get_title()
    assert "per call" in title and "(top level)" not in [x.get_text() for x in fig.axes[0].get_yticklabels()]
    assert len(fig.axes[0].patches) == t.loc[t["err"].notna(), "call"].nunique()
    w = v.widgets
    w["grid"].click_header("err")  # the worst first
    assert v.state.sort_by == "err" and not v.state.ascending
    errs = pd.to_numeric(v.rows["err"]).dropna()
    assert errs.is_monotonic_decreasing and errs.iloc[0] == t["err"].max()
