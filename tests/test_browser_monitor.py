"""A real browser at 900 px wide reads the MonitorViewer at a glance (issue 32, item 5): no horizontal scroll,
a labelled colour bar on the heat map, formatted numbers, and no hover tip left after the picture changes."""
from __future__ import annotations

import re

from helpers import ARTIFACTS, Lab, _failure_shot, _requirements, notebook_json

STEPS = 300  # more steps than fit at 4 px: the cells must narrow
CELL = """\
import torch
import torch.nn as nn
import msprobe_nb as mp

def run(path, plant):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)), torch.randn(32, 3)
    with mp.Monitor(model, opt, dump_path=path, alerts=False) as mon:
        for step in range({steps}):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if plant and step == 30:
                model[2].weight.grad.mul_(50.0)
            opt.step()
            mon.step(loss=loss)

run({root!r} + "/a", True)
run({root!r} + "/b", False)
viewer = mp.MonitorViewer(mp.compare_monitors({root!r} + "/a", {root!r} + "/b"), names=("npu", "gpu"))
viewer"""


def test_the_monitor_viewer_reads_at_900px(tmp_path):
    chromium, sync_playwright = _requirements(None, grid=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Lab(tmp_path, chromium, sync_playwright) as lab:
        page = lab.open(notebook_json(CELL.format(root=str(tmp_path / "runs"), steps=STEPS)), 900, 1400,
                        name="monitor900.ipynb")
        try:
            out = page.locator(".jp-OutputArea-output", has_text="first divergence").first
            out.wait_for(state="visible", timeout=60_000)
            canvas = out.locator("canvas").first
            canvas.wait_for(state="visible", timeout=30_000)
            # the colour scale, labelled with what its ends mean
            bar = out.locator(".heat-colorbar")
            assert bar.count() == 1 and bar.is_visible()
            assert "ratio" in out.locator(".heat-colorbar-label").inner_text()
            # no horizontal scroll: not of the page, the output, nor the heat map's frame
            over = out.evaluate("el => [document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth,"
                                " el.scrollWidth - el.clientWidth, el.querySelector('canvas').parentElement.scrollWidth"
                                " - el.querySelector('canvas').parentElement.clientWidth]")
            assert max(over) <= 0, over
            left, cw = canvas.evaluate("c => [Number(c.dataset.left), Number(c.dataset.cellW)]")
            # hover a cell: the tip names it with its value, formatted
            canvas.hover(position={"x": left + 10 * cw + cw / 2, "y": 5})
            tip = out.locator(".heat-tip")
            text = tip.inner_text()
            assert "0.weight @ step" in text and not re.search(r"\d\.\d{5,}", text), text
            canvas.click(position={"x": left + 10 * cw + cw / 2, "y": 5})
            numbers = out.locator(".widget-html", has_text="0.weight").locator("table").first
            numbers.wait_for(state="visible", timeout=30_000)
            wide = out.evaluate("el => [...el.querySelectorAll('.widget-html')]"
                                ".map(h => h.scrollWidth - h.clientWidth)")
            assert max(wide) <= 0, wide  # the numbers' table fits too
            cells = numbers.locator("td").all_inner_texts()
            assert cells and not any(re.search(r"\d\.\d{5,}|e-0\d", c) for c in cells), cells
            # a new picture (another kind): the old tip is gone
            page.mouse.move(5, 5)
            canvas.hover(position={"x": left + 10 * cw + cw / 2, "y": 5})
            assert tip.inner_text().strip() != ""
            out.locator(".widget-dropdown", has_text="kind").locator("select").select_option("weight")
            page.wait_for_function("t => t.textContent === ''", arg=tip.element_handle(), timeout=30_000)
            out.screenshot(path=str(ARTIFACTS / "monitor_viewer_900.png"), timeout=30_000)
        except BaseException:
            _failure_shot(page, "failure_monitor900.png")
            raise
