"""A real browser drives the pre-check, monitor and rank viewers in JupyterLab, by clicking.

The harness of :mod:`test_browser` (JupyterLab on 127.0.0.1, Debian's headless Chromium through Playwright)
opens one served notebook per viewer and checks what a user sees and what a click does:

* ``AccCheckViewer``: the pre-check grid lists every graded output; a click on a row turns the detail to
  that API;
* ``MonitorViewer``: the heat map (layer x step) draws the planted cell darker than the agreeing steps, the
  curves render; a click on a heat map cell opens that step and layer's numbers of both runs; a click on the
  planted anomaly in the list turns the heat map back to the gradients and opens that step and layer;
* ``CompareViewer`` on msprobe's real two-rank dumps: the Ranks tab draws a rank x step grid of verdicts; a
  click on a cell brings the Table back filtered to that rank's calls of that step.

The records are made in the notebook itself, from tiny seeded models, under the test's temporary folder.
No button is cut in any of them. Screenshots go under test-artifacts/browser/. Skipped, saying why, without
Chromium, Playwright, JupyterLab or anywidget (and the rank test without ../shared).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import (
    _LAYOUT,
    ARTIFACTS,
    _cell_texts,
    _serve,
    _wait_grid,
)

INTEROP = Path(__file__).resolve().parents[2] / "shared" / "interop" / "msprobe-2rank-collectives"

WIDTH = 1400


def _shoot(element, shots: list[Path], name: str) -> None:
    shot = ARTIFACTS / name
    element.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)


def _layout_holds(element, what: str) -> None:
    lay = element.evaluate(_LAYOUT)
    assert not lay["cut"], f"{what}: these buttons are cut: {lay['cut']}"
    assert not lay["stacked"], f"{what}: these toggle buttons stack: {lay['stacked']}"
    assert not lay["wide"], f"{what}: wider than its output area: {lay}"


# ------------------------------------------------------------------------------------------ pre-check
ACC_CELL = """\
import os
import sys
import torch
import torch.nn.functional as F
import msprobe_nb as mp
sys.path.insert(0, os.path.join(os.environ["MSPROBE_NB_REPO"], "tests"))
from planted_kernels import planted_kernels
torch.manual_seed(0)
w = torch.randn(16, 8, requires_grad=True)
x = torch.randn(6, 8)
# softmax's CPU kernel computes in bf16 inside the record: the pre-check grades it an error
with planted_kernels(("_softmax",)), mp.record(dump_path={root!r}, task="tensor", level="L1") as dbg:
    s = torch.softmax(F.linear(x, w), -1)
    (s * 2.0).sum().backward()
pre = mp.acc_check(dbg.dump_dir)
viewer = mp.AccCheckViewer(pre)
viewer"""


def _check_acc(page, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer", has_text="AccCheckViewer").first
    viewer.wait_for(state="visible", timeout=60_000)
    grid = viewer.locator(".msnb-grid").first
    grid.locator("tbody tr").first.wait_for(state="visible", timeout=30_000)
    viewer.scroll_into_view_if_needed()
    assert "8 outputs: 6 pass, 0 warning, 2 error" in viewer.locator(".msnb-header").first.inner_text()
    calls = _cell_texts(viewer, "call", whole=True)  # a long name is shown cut in its middle
    assert calls[:2] == ["Functional.linear.0.forward", "Torch.softmax.0.forward"], calls
    assert "Functional.linear.0.backward" in calls and len(calls) == 8, calls
    assert sorted(set(_cell_texts(viewer, "result"))) == ["error", "pass"]
    _layout_holds(viewer, "AccCheckViewer")
    _shoot(viewer, shots, "acc_check_viewer.png")

    # a click on a row: the detail is that API's (its standard, its reasons)
    detail = viewer.locator(".msnb-detail").first
    for call, why in (("Functional.linear.0.backward", "every rule holds"), ("Torch.softmax.0.forward", "error")):
        grid.locator("tbody tr", has=page.locator(f"td[title^='{call}']")).first.click()  # names cut short
        _wait_grid(page, viewer, "(el, call) => { const h = el.querySelector('.msnb-detail h4'); "
                   "return h && h.textContent === call; }", call)
        text = detail.inner_text()
        assert "step 0, rank 0" in text and "graded by" in text and why in text, text[:800]
    _shoot(viewer, shots, "acc_check_viewer_detail.png")

    # a click on the "error" verdict: only the planted softmax's outputs are left
    viewer.locator(".widget-toggle-buttons button", has_text="error").first.click()
    _wait_grid(page, viewer, "el => el.querySelectorAll('.msnb-grid tbody tr').length === 2")
    assert _cell_texts(viewer, "call", whole=True) == ["Torch.softmax.0.forward", "Torch.softmax.0.backward"]
    _shoot(viewer, shots, "acc_check_viewer_errors.png")


def test_acc_check_viewer_answers_clicks(tmp_path):
    _serve(tmp_path, ACC_CELL.format(root=str(tmp_path / "dump")), _check_acc, "acc_check")


# ------------------------------------------------------------------------------------------ monitor
PLANT = 30  # after the alert rules' warm-up of 20 values
MONITOR_CELL = """\
import torch
import torch.nn as nn
import msprobe_nb as mp

def run(path, plant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)), torch.randn(32, 3)
    with mp.Monitor(model, opt, dump_path=path, alerts=False) as mon:
        for step in range(40):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if plant and step == {plant}:
                model[2].weight.grad.mul_(50.0)  # the planted spike: one layer's gradient, one step
            opt.step()
            mon.step(loss=loss)

run({root!r} + "/a", True)
run({root!r} + "/b", False)
g = mp.compare_monitors({root!r} + "/a", {root!r} + "/b")
viewer = mp.MonitorViewer(g)
viewer"""

#: JavaScript: the colour at the middle of heat map cell [row, col] of the canvas
_PIXEL = """(c, [r, k]) => { const left = Number(c.dataset.left), cw = 10, ch = 10;
  return [...c.getContext('2d').getImageData(left + Math.floor((k + 0.5) * cw), Math.floor((r + 0.5) * ch), 1, 1)
    .data].slice(0, 3); }"""


def _check_monitor(page, shots: list[Path]) -> None:
    out = page.locator(".jp-OutputArea-output", has_text="first divergence").first
    out.wait_for(state="visible", timeout=60_000)
    canvas = out.locator("canvas").first
    canvas.wait_for(state="visible", timeout=30_000)
    out.scroll_into_view_if_needed()
    head = out.inner_text()
    assert "2.weight" in head and f"{PLANT}" in head, head[:600]

    # the heat map: 4 layers x 40 steps; before the plant every cell agrees (the lightest shade); the planted
    # cell (2.weight, the planted step) is far darker
    # cells of 10 x 10 px after a gutter of layer names, above a row of step ticks
    left, width, height = canvas.evaluate("c => [Number(c.dataset.left), c.width, c.height]")
    assert left > 20 and (width - left, height) == (400, 40 + 14), (left, width, height)
    px = _PIXEL
    agree = {tuple(canvas.evaluate(px, [r, k])) for r in range(4) for k in range(PLANT)}
    assert agree == {(255, 240, 200)}, agree
    planted = canvas.evaluate(px, [2, PLANT])
    assert sum(planted) < sum((255, 240, 200)) - 200, planted
    # the curves render as a picture
    page.wait_for_function("el => [...el.querySelectorAll('img')].some(i => i.complete && i.naturalWidth > 300)",
                           arg=out.element_handle(), timeout=30_000)
    _layout_holds(out, "MonitorViewer")
    _shoot(out, shots, "monitor_viewer.png")

    # a click on a cell (0.weight at step 5): that step and layer's numbers, both runs; the tip names it
    for row, name, step in ((0, "0.weight", 5), (3, "2.bias", 17)):
        canvas.hover(position={"x": left + step * 10 + 5, "y": row * 10 + 5})
        assert out.get_by_text(f"{name} @ step {step}").count() == 1
        canvas.click(position={"x": left + step * 10 + 5, "y": row * 10 + 5})
        numbers = out.locator(".widget-html", has_text=f"step {step}, {name}").first
        numbers.wait_for(state="visible", timeout=30_000)
        table = numbers.locator("table tbody tr")
        runs = sorted({t.split("\t")[0].strip() for t in table.all_inner_texts()})
        assert runs == ["a", "b"], table.all_inner_texts()
    _shoot(out, shots, "monitor_viewer_cell.png")

    # the anomaly list: the planted gradient is run a's spike at the planted step. With the heat map turned to the
    # weights, a click on that anomaly turns it back to the gradients and opens that step and layer
    kind = out.locator(".widget-dropdown", has_text="kind").locator("select")
    kind.select_option("weight")
    page.wait_for_function("s => s.value !== undefined && s.selectedOptions[0].text === 'weight'",
                           arg=kind.element_handle(), timeout=10_000)
    option = out.locator(".widget-select select option", has_text=f"a: step {PLANT}, rank 0: grad of 2.weight spiked")
    assert option.count() == 1, out.locator(".widget-select select").inner_text()[:600]
    option.click()
    numbers = out.locator(".widget-html", has_text=f"step {PLANT}, 2.weight").first
    numbers.wait_for(state="visible", timeout=30_000)
    page.wait_for_function("s => s.selectedOptions[0].text === 'grad'", arg=kind.element_handle(), timeout=30_000)
    page.wait_for_function(f"c => {{ const p = ({_PIXEL})(c, [2, {PLANT}]); return p[0] + p[1] + p[2] < 495; }}",
                           arg=canvas.element_handle(), timeout=30_000)  # the gradients' planted cell again
    _shoot(out, shots, "monitor_viewer_anomaly.png")


def test_monitor_viewer_heat_map_cell_opens_its_numbers(tmp_path):
    _serve(tmp_path, MONITOR_CELL.format(root=str(tmp_path / "runs"), plant=PLANT), _check_monitor, "monitor")


# ------------------------------------------------------------------------------------------ ranks
RANKS_CELL = """\
import msprobe_nb as mp
result = mp.compare({npu!r}, {bench!r})
viewer = mp.CompareViewer(result, page_size=200)
viewer"""


#: JavaScript: the grid's selected rows are rows of call ``arg`` and the first of them is scrolled into view
_SELECTED_IN_VIEW = """(el, call) => { const sc = el.querySelector('.msnb-grid .msnb-scroll');
  const sel = [...sc.querySelectorAll('tbody tr.sel')]; if (!sel.length) return false;
  const a = sc.getBoundingClientRect(), b = sel[0].getBoundingClientRect();
  return sel.every(tr => (tr.querySelector('td.frz') || tr).title.includes(call + '.'))  // names are cut short
    && b.top >= a.top && b.bottom <= a.bottom; }"""


def _check_ranks(page, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer", has_text="CompareViewer").first
    viewer.wait_for(state="visible", timeout=60_000)
    viewer.locator(".msnb-grid tbody tr").first.wait_for(state="visible", timeout=30_000)
    viewer.scroll_into_view_if_needed()
    assert set(_cell_texts(viewer, "rank")) == {"0", "1"}  # both ranks, before a click

    viewer.locator(".lm-TabBar-tab", has_text="Ranks").first.click()
    cells = viewer.locator("button[title^='step ']")
    cells.first.wait_for(state="visible", timeout=30_000)
    titles = sorted(cells.evaluate_all("els => els.map(e => e.title)"))
    assert len(titles) == 4, titles  # 2 ranks x 2 steps
    titles_by = {tuple(int(x) for x in re.match(r"step (\d+), rank (\d+):", t).groups()): t for t in titles}
    origin = viewer.locator("button[title^='step 0, rank 0:']")
    assert origin.inner_text().strip() == "● error" and "(origin)" in origin.get_attribute("title")
    assert viewer.locator("button[title^='step 0, rank 1:']").inner_text().strip() == "↳ error"
    _layout_holds(viewer, "the Ranks tab")
    _shoot(viewer, shots, "rank_grid.png")

    # a click on a cell: the Table tab again, with that rank's calls of that step only
    for step, rank in ((1, 1), (0, 0)):
        viewer.locator(f"button[title^='step {step}, rank {rank}:']").click()
        _wait_grid(page, viewer, "(el, [s, r]) => { const keys = [...el.querySelectorAll('.msnb-grid thead th')]"
                   ".map(th => th.dataset.col); const rows = [...el.querySelectorAll('.msnb-grid tbody tr')]; "
                   "const k = keys.indexOf('rank'), j = keys.indexOf('step'); return el.querySelector("
                   "'.msnb-grid').offsetParent !== null && rows.length > 0 && rows.every(tr => "
                   "tr.querySelectorAll('td')[k].textContent === String(r) && "
                   "tr.querySelectorAll('td')[j].textContent === String(s)); }", [step, rank])
        assert set(_cell_texts(viewer, "rank")) == {str(rank)} and set(_cell_texts(viewer, "step")) == {str(step)}
        assert len(_cell_texts(viewer, "name")) > 20
        # the detail follows: that rank's first divergence of that step, as the cell's title names it
        first = titles_by[(step, rank)].split("first divergence ")[1].split(" ")[0]
        _wait_grid(page, viewer, "(el, call) => { const h = el.querySelector('.msnb-detail h4'); "
                   "return h && h.textContent.startsWith(call + ' '); }", first)
        assert f"step {step}, rank {rank}," in viewer.locator(".msnb-detail").first.inner_text()
        # ... and the grid has scrolled to that call's rows, selected
        _wait_grid(page, viewer, _SELECTED_IN_VIEW, first)
        _shoot(viewer, shots, f"rank_grid_step{step}_rank{rank}.png")
        if (step, rank) == (1, 1):
            viewer.locator(".lm-TabBar-tab", has_text="Ranks").first.click()
            cells.first.wait_for(state="visible", timeout=30_000)


def test_ranks_tab_cell_opens_that_ranks_calls(tmp_path):
    if not INTEROP.is_dir():
        pytest.skip(f"the msprobe two-rank dumps are not here ({INTEROP}: ../shared is absent)")
    cell = RANKS_CELL.format(npu=str(INTEROP / "npu"), bench=str(INTEROP / "bench"))
    _serve(tmp_path, cell, _check_ranks, "ranks")
