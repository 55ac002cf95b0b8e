"""A real browser opens the CompareViewer of two runs whose set-ups differ (issue 34, item 3).

The harness of :mod:`test_browser` (JupyterLab on 127.0.0.1, Debian's headless Chromium through Playwright).
The notebook records the noise harness's small CNN at L1 twice, the second time with ``CUBLAS_WORKSPACE_CONFIG``
set and its second relu 3 % off, compares and shows the viewer. What a user must see: the Set-up tab first in
the tab bar, the viewer opened on the Table with the first anomalous call, and a click on Set-up showing the one
difference that can be a cause, with its note. Screenshots go under test-artifacts/browser/. Skipped, saying
why, without Chromium, Playwright, JupyterLab or anywidget.
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
os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
bench = H.record({root!r} + "/bench", "cnn", level="L1")
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
npu = H.record({root!r} + "/npu", "cnn", level="L1", noise=H.DeviceNoise(plant=("relu", 1)))
os.environ.pop("CUBLAS_WORKSPACE_CONFIG")
viewer = mp.CompareViewer(mp.compare(npu, bench), page_size=200)
viewer"""

#: JavaScript: the titles of the viewer's tab bar, in order, and the current one
_TABS = """el => [...el.querySelectorAll('.lm-TabBar-tab')].map(t => [t.innerText.trim(),
  t.classList.contains('lm-mod-current')])"""


def _check(page, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer", has_text="CompareViewer").first
    viewer.wait_for(state="visible", timeout=90_000)
    viewer.locator(".msnb-grid tbody tr").first.wait_for(state="visible", timeout=30_000)
    viewer.scroll_into_view_if_needed()
    header = viewer.locator(".msnb-header").first.inner_text()
    assert "CUBLAS_WORKSPACE_CONFIG" in header and "Set-up" in header, header[:800]

    tabs = viewer.evaluate(_TABS)
    titles = [t for t, _ in tabs]
    assert titles[0] == "Set-up" and "Table" in titles, tabs
    assert [t for t, current in tabs if current] == ["Table"], tabs  # it opens on the table and its answer
    _wait_grid(page, viewer, "(el, call) => { const h = el.querySelector('.msnb-detail h4'); "
               "return h && h.textContent.startsWith(call + ' '); }", PLANTED)

    viewer.locator(".lm-TabBar-tab", has_text="Set-up").first.click()
    setup = viewer.locator(".msnb-setup").first
    setup.wait_for(state="visible", timeout=30_000)
    rows = setup.locator("tbody tr").all_inner_texts()
    causes = [r for r in rows if r.split("\t")[4].strip() == "False"]  # expected differences are listed apart
    assert len(causes) == 1 and "CUBLAS_WORKSPACE_CONFIG" in causes[0] and ":4096:8" in causes[0], rows
    assert [t for t, current in viewer.evaluate(_TABS) if current] == ["Set-up"]
    shot = ARTIFACTS / "compare_viewer_setup.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)

    # back on the Table, the selection is where it was
    viewer.locator(".lm-TabBar-tab", has_text="Table").first.click()
    _wait_grid(page, viewer, "el => { const sc = el.querySelector('.msnb-grid .msnb-scroll'); "
               "return !!sc && sc.offsetParent !== null && sc.querySelectorAll('tbody tr.sel').length > 0; }")


def test_compare_viewer_shows_the_set_up_tab_first(tmp_path):
    _serve(tmp_path, CELL.format(root=str(tmp_path / "dumps")), _check, "setup", WIDTH)
