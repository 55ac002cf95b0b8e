"""A real browser drives the viewers in JupyterLab: the tutorial notebook renders, and the grid, the live
filter and the model tree answer clicks and typing, at 900 px and at 1400 px wide.

JupyterLab serves temporary notebooks on 127.0.0.1: a copy of notebooks/02_compare_npu_vs_bench.ipynb, and
one that opens a CompareViewer on the sample dumps under data/samples. Headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright) runs them in a live kernel and checks what a user sees: a click on
a row changes the detail, a click on a header changes the order, typing a filter (no Enter) changes the
rows, a click on a tree node filters the grid; buttons are not cut and the verdict buttons stay on one
line. Screenshots are saved under test-artifacts/browser/ and their paths are printed.

Needs: ``apt-get install chromium`` and ``pip install jupyterlab playwright`` (never ``playwright install``:
the test uses the system Chromium), and anywidget for the grid (the ``[browser]`` extra has all three but
Chromium). Without any of them, the tests are skipped and say which is missing. The same harness
(:class:`Lab`) serves ``benchmarks/bench_viewers.py --browser``.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import (  # the browser harness, shared with test_browser_pillars and bench_viewers
    _GRID_ROWS,
    _LAYOUT,
    ARTIFACTS,
    NOTEBOOK,
    REPO,
    Lab,
    _cell_texts,
    _failure_shot,
    _requirements,
    _wait_grid,
    notebook_json,
)

WIDTHS = (900, 1400)


def test_compare_viewer_renders_in_jupyterlab(tmp_path):
    chromium, sync_playwright = _requirements()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "failure.png").unlink(missing_ok=True)
    shots: list[Path] = []
    with Lab(tmp_path, chromium, sync_playwright) as lab:
        page = lab.open(NOTEBOOK, 1400, 2200)
        try:
            _check_tutorial(page, shots)
        except BaseException:
            _failure_shot(page)
            raise
    for s in shots:
        print(f"screenshot: {s}")


def _check_tutorial(page, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer", has_text="CompareViewer").first
    viewer.wait_for(state="visible", timeout=60_000)
    viewer.scroll_into_view_if_needed()

    # the Table tab: rows of the comparison, with verdicts; it opens on the first divergence
    rows = viewer.locator("table tbody tr")
    rows.first.wait_for(state="visible", timeout=30_000)
    n_rows = rows.count()
    assert n_rows >= 10, f"the CompareViewer table shows {n_rows} rows"
    table_text = viewer.locator("table").first.inner_text()
    # a long name is shown cut in its middle; the cell's title holds it whole
    softmax = viewer.locator("table tbody td[title^='Tensor.softmax.0.forward']")
    assert "pass" in table_text and softmax.count() > 0, table_text[:1000]
    header = viewer.inner_text()
    assert "first divergence: Tensor.softmax.0.forward" in header, header[:1500]  # the wrong kernel, not bf16
    shot = ARTIFACTS / "compare_viewer_table.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)

    # the Plots tab: the error along execution order and the errors per module, as images
    viewer.locator(".lm-TabBar-tab", has_text="Plots").first.click()
    images = viewer.locator("img")
    page.wait_for_function(
        "el => [...el.querySelectorAll('img')].filter(i => i.offsetParent !== null && i.complete"
        " && i.naturalWidth > 100).length >= 2", arg=viewer.element_handle(), timeout=60_000)
    sizes = [(int(i["w"]), int(i["h"])) for i in images.evaluate_all(
        "els => els.filter(e => e.offsetParent !== null).map(e => ({w: e.naturalWidth, h: e.naturalHeight}))")]
    assert len(sizes) >= 2 and all(w > 100 and h > 50 for w, h in sizes), sizes
    shot = ARTIFACTS / "compare_viewer_plots.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)


# ------------------------------------------------------------------------------------------ interactions
SAMPLES = REPO / "data" / "samples"
VIEWER_CELL = """\
import os
import msprobe_nb as mp
samples = os.path.join(os.environ["MSPROBE_NB_REPO"], "data", "samples")
result = mp.compare(os.path.join(samples, "denoiser_npu"), os.path.join(samples, "denoiser_bench"))
viewer = mp.CompareViewer(result, page_size=100)
viewer"""

def _interact(page, width: int, shots: list[Path]) -> None:
    viewer = page.locator(".jp-OutputArea-output .msnb-viewer").first
    viewer.wait_for(state="visible", timeout=60_000)
    grid = viewer.locator(".msnb-grid").first
    grid.locator("tbody tr").first.wait_for(state="visible", timeout=30_000)
    viewer.scroll_into_view_if_needed()
    time.sleep(0.5)
    shot = ARTIFACTS / f"viewer_{width}.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)

    # the layout holds: no button cut, no verdict buttons stacked, nothing wider than the page
    lay = viewer.evaluate(_LAYOUT)
    assert not lay["cut"], f"at {width} px these buttons are cut: {lay['cut']}"
    assert not lay["stacked"], f"at {width} px these toggle buttons stack: {lay['stacked']}"
    assert not lay["wide"], f"at {width} px the viewer is wider than its output area: {lay}"

    # it opens on the answer: the first divergence, its fix, its row selected in the grid
    header = viewer.locator(".msnb-header").first.inner_text()
    assert "first divergence: Torch.randint.0.forward" in header and "fix:" in header, header[:1000]
    detail = viewer.locator(".msnb-detail").first
    assert "Torch.randint.0.forward" in detail.inner_text()
    assert grid.locator("tbody tr.sel").count() >= 1

    # a click on a row: the detail shows that row's call
    target = grid.locator("tbody tr[data-pos='40']")
    # the row's name (its whole text is the title: a long name is cut in its middle), less ".output.0"
    call = target.locator("td").nth(1).get_attribute("title").rsplit(".", 2)[0]
    target.click()
    _wait_grid(page, viewer, "(el, call) => el.querySelector('.msnb-detail h4') && "
               "el.querySelector('.msnb-detail h4').textContent.includes(call)", call)
    assert call in detail.inner_text()

    # a click on a metric's header: the order follows the column (descending first: the worst rows first)
    before = [r["pos"] for r in viewer.evaluate(_GRID_ROWS)][:5]
    grid.locator("thead th[data-col='err']").click()
    _wait_grid(page, viewer, "el => [...el.querySelectorAll('.msnb-grid thead th')].some(t => "
               "t.textContent.includes('err ▼'))")
    errs = [float(x) for x in _cell_texts(viewer, "err") if x != ""]
    assert errs == sorted(errs, reverse=True) and errs[0] > 0, errs[:20]
    names = _cell_texts(viewer, "name")
    assert names[:5] != before, "the order did not change"
    grid.locator("thead th[data-col='err']").click()
    _wait_grid(page, viewer, "el => [...el.querySelectorAll('.msnb-grid thead th')].some(t => "
               "t.textContent.includes('err ▲'))")
    grid.locator("thead th[data-col='err']").click()  # back to execution order

    # typing a filter, no Enter: the rows change
    box = viewer.locator(".msnb-live input").first
    box.click()
    box.press_sequentially("linear", delay=40)
    _wait_grid(page, viewer, "el => { const r = [...el.querySelectorAll('.msnb-grid tbody tr')]; "
               "return r.length > 0 && r.every(tr => (tr.textContent + tr.querySelector('td.frz').title)"
               ".toLowerCase().includes('linear')); }")
    n_linear = grid.locator("tbody tr").count()
    assert 0 < n_linear < 100
    shot = ARTIFACTS / f"viewer_{width}_filtered.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)
    box.fill("")
    box.press("Enter")
    _wait_grid(page, viewer, "el => el.querySelectorAll('.msnb-grid tbody tr').length >= 100")

    # a click on a tree node: the grid shows that module's calls, the detail that module call
    tree = viewer.locator(".msnb-tree").first
    node = tree.locator(".node[data-id='Module.net.Sequential.forward.0'] .lbl")
    node.click()
    _wait_grid(page, viewer, "el => { const r = [...el.querySelectorAll('.msnb-grid tbody tr')]; "
               "return r.length > 0 && r.length < 40; }")
    names = _cell_texts(viewer, "name", whole=True)
    assert all(n.startswith(("Module.net.", "Functional.linear.", "Functional.gelu.")) for n in names), names
    _wait_grid(page, viewer, "el => el.querySelector('.msnb-detail').textContent"
               ".includes('Module.net.Sequential.forward.0')")
    child = tree.locator(".node[data-id='Module.net.2.Linear.forward.0']")
    assert child.count() == 1 and child.is_visible()  # the node opened on the click
    shot = ARTIFACTS / f"viewer_{width}_tree.png"
    viewer.screenshot(path=str(shot), timeout=30_000)
    shots.append(shot)


@pytest.mark.parametrize("width", WIDTHS)
def test_viewer_answers_clicks_and_typing(tmp_path, width):
    chromium, sync_playwright = _requirements(None, grid=True)
    if not (SAMPLES / "denoiser_npu").is_dir():
        pytest.skip(f"{SAMPLES} has no sample dumps")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with Lab(tmp_path, chromium, sync_playwright) as lab:
        page = lab.open(notebook_json(VIEWER_CELL), width, 1800)
        try:
            _interact(page, width, shots)
        except BaseException:
            _failure_shot(page, f"failure_{width}.png")
            raise
    for s in shots:
        print(f"screenshot: {s}")


# ------------------------------------------------------------------------------------------ a new user's hour
#: a 30-layer model whose NPU run has one layer's weight scaled: the divergence sits deep in a 500-row page;
#: then a short pre-check (14 outputs, no modules)
ANSWER_CELLS = ('''\
import copy, torch, torch.nn as nn, msprobe_nb as mp
torch.manual_seed(0)
model = nn.Sequential(*[m for _ in range(30) for m in (nn.Linear(16, 16), nn.ReLU())])
x = torch.randn(4, 16)
def run(path, bump):
    m = copy.deepcopy(model)
    if bump:
        with torch.no_grad():
            m[40].weight.mul_(1.5)
    with mp.record(dump_path=path, level="mix", model=m, on_exists="overwrite"):
        m(x).sum().backward()
    return mp.load(path)
result = mp.compare(run("runs/npu", True), run("runs/bench", False))
viewer = mp.CompareViewer(result, page_size=500)
viewer''', '''\
small = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
with mp.record(dump_path="runs/acc", level="L1", task="tensor", on_exists="overwrite") as dbg:
    torch.softmax(small(torch.randn(4, 8)), -1).sum().backward()
acc = mp.AccCheckViewer(mp.acc_check(dbg.dump_dir))
acc''')

#: JavaScript: where the grid stands (scroll, the selected row and its cells against the visible box)
_GRID_VIEW = """el => { const s = el.querySelector('.msnb-scroll'), box = s.getBoundingClientRect();
  const sel = s.querySelector('tbody tr.sel'), r = sel ? sel.getBoundingClientRect() : null;
  const res = sel ? sel.querySelector('td.res').getBoundingClientRect() : null;
  const head = s.querySelector('thead').getBoundingClientRect();
  return {scrollTop: s.scrollTop, top: box.top, bottom: box.bottom, left: box.left, right: box.right,
    headBottom: head.bottom, sel: r && [r.top, r.bottom], res: res && [res.left, res.right],
    name: sel && sel.querySelector('td.frz').textContent, title: sel && sel.querySelector('td.frz').title}; }"""


def _background(locator) -> str:
    return locator.evaluate("e => getComputedStyle(e).backgroundColor")


def _item_1_scrolled_to_the_divergence(page, viewer) -> None:
    g = viewer.evaluate(_GRID_VIEW)
    assert g["sel"] is not None, "no row selected"
    assert g["scrollTop"] > 0 and g["headBottom"] - 1 <= g["sel"][0] and g["sel"][1] <= g["bottom"] + 1, g


def _item_2_the_verdict_s_reason_first(page, viewer) -> None:
    reasons = [why for res, why in zip(_cell_texts(viewer, "result"), _cell_texts(viewer, "reasons"))
               if res == "error"]
    assert reasons and all(t.startswith("error:") for t in reasons), reasons


def _item_3_narrow_pane(page, viewer) -> None:
    """The name cut in its middle (its end kept), result visible when scrolled right, a resizable column."""
    grid = viewer.locator(".msnb-grid").first
    g = viewer.evaluate(_GRID_VIEW)
    assert "…" in g["name"] and g["title"].endswith(g["name"].split("…")[-1]), (g["name"], g["title"])
    viewer.evaluate("el => { const s = el.querySelector('.msnb-scroll'); s.scrollLeft = s.scrollWidth; }")
    time.sleep(0.3)
    g = viewer.evaluate(_GRID_VIEW)
    viewer.evaluate("el => { el.querySelector('.msnb-scroll').scrollLeft = 0; }")
    assert g["left"] - 1 <= g["res"][0] and g["res"][1] <= g["right"] + 1, g
    th = grid.locator("thead th.frz").first
    w0 = th.bounding_box()["width"]
    grip = th.locator(".msnb-rs")
    assert grip.count() == 1, "the name column has no resize grip"
    for dx in (120, -120):  # wider, then back, so that the metric columns show beside it again
        box = grip.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + dx, box["y"] + box["height"] / 2, steps=5)
        page.mouse.up()
        time.sleep(0.3)
        if dx > 0:
            assert th.bounding_box()["width"] > w0 + 80, (w0, th.bounding_box())
            longer = viewer.evaluate(_GRID_VIEW)["name"]
            assert len(longer) > len(g["name"]), (g["name"], longer)
    assert "▼" not in th.inner_text() and "▲" not in th.inner_text(), "the drag sorted the column"


def _item_4_one_set_of_colours(page, viewer) -> None:
    """A warning row's result in the detail pane is the grid's amber."""
    row = viewer.locator(".msnb-grid tbody tr.v-warning").first
    amber = _background(row.locator("td.res"))
    row.click()
    cell = viewer.locator(".msnb-detail td", has_text="warning").first
    cell.wait_for(state="attached", timeout=30_000)
    assert _background(cell) == amber, (_background(cell), amber)


def _item_6_metric_descending_first(page, viewer) -> None:
    viewer.locator(".msnb-grid thead th[data-col='err']").first.click()
    _wait_grid(page, viewer, "el => [...el.querySelectorAll('.msnb-grid thead th')].some(t => "
               "t.textContent.includes('err ▼') || t.textContent.includes('err ▲'))", timeout=15_000)
    errs = [float(x) for x in _cell_texts(viewer, "err") if x != ""]
    assert errs and errs[0] == max(errs) and errs[0] > 0, errs[:10]


def _item_5_acc_check_viewer(page, viewer) -> None:
    """err is a number (the worst ratio), not the reasons again; no empty space under the short table."""
    viewer.scroll_into_view_if_needed()
    viewer.locator(".msnb-grid tbody tr").first.wait_for(state="visible", timeout=30_000)
    errs = _cell_texts(viewer, "err")
    assert any(errs) and all(e == "" or float(e) >= 0 for e in errs), errs
    gap = viewer.evaluate("""el => el.querySelector('.msnb-detail').getBoundingClientRect().top
      - el.querySelector('.msnb-scroll').getBoundingClientRect().bottom""")
    assert gap < 40, f"{gap:.0f} px of empty space under the pre-check's table"


def test_viewers_open_on_the_answer_in_a_narrow_pane(tmp_path):
    """Issue 33's viewer items at 900 px with JupyterLab's file browser open: opened on the divergence, its
    reason first, names cut in the middle, result visible, a resizable name column, one set of colours,
    AccCheckViewer's numeric err and no empty space, metric columns descending first."""
    chromium, sync_playwright = _requirements(None, grid=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Lab(tmp_path, chromium, sync_playwright) as lab:
        page = lab.open(notebook_json(*ANSWER_CELLS), 900, 1600)
        try:
            if not page.locator(".jp-FileBrowser").first.is_visible():
                page.locator(".lm-TabBar-tab[data-id='filebrowser']").first.click()
            page.locator(".jp-FileBrowser").first.wait_for(state="visible", timeout=10_000)
            viewers = page.locator(".jp-OutputArea-output .msnb-viewer")
            viewers.nth(1).wait_for(state="visible", timeout=60_000)
            answer, acc = viewers.nth(0), viewers.nth(1)
            answer.locator(".msnb-grid tbody tr.sel").first.wait_for(state="attached", timeout=30_000)
            time.sleep(0.5)
            wrong = []  # every item is checked, the wrong ones reported together
            for item, viewer in ((_item_1_scrolled_to_the_divergence, answer), (_item_2_the_verdict_s_reason_first,
                                 answer), (_item_3_narrow_pane, answer), (_item_4_one_set_of_colours, answer),
                                 (_item_6_metric_descending_first, answer), (_item_5_acc_check_viewer, acc)):
                try:
                    item(page, viewer)
                except Exception as e:  # noqa: BLE001 - an assertion or a playwright timeout
                    wrong.append(f"{item.__name__}: {type(e).__name__}: {str(e)[:600]}")
            answer.screenshot(path=str(ARTIFACTS / "answer_900.png"), timeout=30_000)
            acc.screenshot(path=str(ARTIFACTS / "acc_check_900.png"), timeout=30_000)
            assert not wrong, "\n".join(wrong)
        except BaseException:
            _failure_shot(page, "failure_answer_900.png")
            raise
