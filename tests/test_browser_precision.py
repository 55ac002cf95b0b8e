"""A real browser opens the CompareViewer on a noisy pair with a planted wrong kernel (issue 30, item 4).

The harness of :mod:`test_browser` (JupyterLab on 127.0.0.1, Debian's headless Chromium through Playwright).
The notebook records the noise harness's small CNN at L1 twice (tests/noise_harness.py: the "NPU" run with
about one bf16 ulp of noise on every compute call and its second relu 3 % off), compares and shows the viewer.
What a user must see: the first *anomalous* call selected in the grid and scrolled to, its verdict and figures
in the detail, and the Precision tab drawing its plot. Screenshots go under test-artifacts/browser/. Skipped,
saying why, without Chromium, Playwright, JupyterLab or anywidget.
"""
from __future__ import annotations

from pathlib import Path

from helpers import ARTIFACTS, _serve, _wait_grid

WIDTH = 1400
PLANTED = "Functional.relu.1.forward"

CELL = """\
import os
import sys
import warnings
warnings.simplefilter("ignore")
sys.path.insert(0, os.path.join(os.environ["MSPROBE_NB_REPO"], "tests"))
import noise_harness as H
import msprobe_nb as mp
bench = H.record({root!r} + "/bench", "cnn", level="L1")
npu = H.record({root!r} + "/npu", "cnn", level="L1", noise=H.DeviceNoise(plant=("relu", 1)))
result = mp.compare(npu, bench)
viewer = mp.CompareViewer(result, page_size=200)
viewer"""

#: JavaScript: the grid's selected rows are rows of call ``arg`` and the first of them is scrolled into view
_SELECTED_IN_VIEW = """(el, call) => { const sc = el.querySelector('.msnb-grid .msnb-scroll');
  const sel = [...sc.querySelectorAll('tbody tr.sel')]; if (!sel.length) return false;
  const a = sc.getBoundingClientRect(), b = sel[0].getBoundingClientRect();
  return sel.every(tr => (tr.querySelector('td.frz') || tr).title.includes(call + '.'))
    && b.top >= a.top && b.bottom <= a.bottom; }"""

#: JavaScript: the Precision tab's image is shown and decoded (a PNG with a width)
_PLOT_SHOWN = """el => { const img = el.querySelector('.msnb-precision img');
  return !!img && img.offsetParent !== null && img.complete && img.naturalWidth > 200; }"""


def _check(page, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer", has_text="CompareViewer").first
    viewer.wait_for(state="visible", timeout=90_000)
    viewer.locator(".msnb-grid tbody tr").first.wait_for(state="visible", timeout=30_000)
    viewer.scroll_into_view_if_needed()
    header = viewer.locator(".msnb-header").first.inner_text()
    assert f"first divergence: {PLANTED}" in header and "beyond bf16 precision" in header, header[:800]

    # opened on the first anomalous call: selected in the grid, scrolled to, its detail below with the verdict
    _wait_grid(page, viewer, _SELECTED_IN_VIEW, PLANTED)
    _wait_grid(page, viewer, "(el, call) => { const h = el.querySelector('.msnb-detail h4'); "
               "return h && h.textContent.startsWith(call + ' '); }", PLANTED)
    verdict = viewer.locator(".msnb-detail .msnb-verdict").first
    text = verdict.inner_text()
    assert text.startswith("precision: anomalous: own error") and "what bf16 allows for" in text, text
    shot = ARTIFACTS / "precision_viewer_detail.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)

    # the Precision tab draws own and inherited error along execution order
    viewer.locator(".lm-TabBar-tab", has_text="Precision").first.click()
    _wait_grid(page, viewer, _PLOT_SHOWN)
    shot = ARTIFACTS / "precision_viewer_plot.png"
    viewer.locator(".msnb-precision").first.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)


def test_compare_viewer_opens_on_the_first_anomalous_call(tmp_path):
    _serve(tmp_path, CELL.format(root=str(tmp_path / "dumps")), _check, "precision", WIDTH)
