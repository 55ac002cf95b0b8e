"""A real browser runs a tutorial notebook in JupyterLab and shows the CompareViewer's table and plots.

JupyterLab serves a temporary copy of notebooks/02_compare_npu_vs_bench.ipynb on 127.0.0.1. Headless
Chromium (Debian's /usr/bin/chromium, driven by Playwright) opens it, runs every cell in a live kernel,
and checks that the CompareViewer renders table rows and, in its Plots tab, its plot images. Screenshots
are saved under test-artifacts/browser/ and their paths are printed.

Needs: ``apt-get install chromium`` and ``pip install jupyterlab playwright`` (never ``playwright install``:
the test uses the system Chromium). Without any of them, the test is skipped and says which is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "02_compare_npu_vs_bench.ipynb"
ARTIFACTS = REPO / "test-artifacts" / "browser"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
SERVER_START_S = 90
RUN_ALL_S = 240


def _chromium() -> str | None:
    for cand in (os.environ.get("MSPROBE_NB_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def _requirements() -> tuple[str, object]:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the Python package playwright is not installed (pip install playwright; "
                    "no `playwright install` needed: the system Chromium is used)")
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        pytest.skip("JupyterLab is not installed (pip install jupyterlab)")
    if not NOTEBOOK.is_file():
        pytest.skip(f"{NOTEBOOK} is missing")
    return chromium, sync_playwright


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server we started and everything in its process group (its kernels)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # kernels the server left behind, if any
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _start_jupyterlab(root: Path, port: int, token: str, home: Path) -> tuple[subprocess.Popen, Path]:
    config = home / "config"
    (config / "labconfig").mkdir(parents=True)
    # no "receive Jupyter news?" toast over the page
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    # render every cell (JupyterLab 4 renders only the cells in view by default)
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none", "autoStartDefaultKernel": True}))
    env = dict(os.environ, MSPROBE_NB_REPO=str(REPO), MPLBACKEND="agg", JUPYTER_CONFIG_DIR=str(config),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), PYTHONUNBUFFERED="1")
    log = home / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def test_compare_viewer_renders_in_jupyterlab(tmp_path):
    chromium, sync_playwright = _requirements()
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    port, token = _free_port(), uuid.uuid4().hex
    proc, log = _start_jupyterlab(root, port, token, tmp_path)
    base = f"http://127.0.0.1:{port}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "failure.png").unlink(missing_ok=True)
    shots: list[Path] = []
    try:
        _wait_for_server(f"{base}/api/status?token={token}", proc, log, SERVER_START_S)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS,
                                         timeout=60_000)  # a fresh, temporary profile
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 2200})
                page.set_default_timeout(60_000)
                try:
                    _run_notebook_and_check(page, f"{base}/lab/tree/{NOTEBOOK.name}?token={token}", shots)
                except BaseException:
                    failed = ARTIFACTS / "failure.png"
                    try:
                        page.screenshot(path=str(failed), full_page=True, timeout=15_000)
                        print(f"screenshot of the failure: {failed}")
                    except Exception:  # noqa: BLE001 - the original failure matters more
                        pass
                    raise
            finally:
                browser.close()
    finally:
        _stop(proc)
    for s in shots:
        print(f"screenshot: {s}")


def _accept_dialog(page) -> bool:
    """Click the accept button of a JupyterLab dialog (the kernel choice) if one is open; True if it was."""
    button = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
    if button.count() and button.first.is_visible():
        print("accepted a JupyterLab dialog:", page.locator(".jp-Dialog-header").first.inner_text())
        button.first.click()
        time.sleep(1)
        return True
    return False


def _run_all(page) -> None:
    page.locator(".jp-NotebookPanel .jp-Cell").first.click()  # focus the notebook: Run All acts on it
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-item:not(.lm-mod-disabled) .lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _run_notebook_and_check(page, url: str, shots: list[Path]) -> None:
    page.goto(url, wait_until="domcontentloaded")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible", timeout=90_000)
    # a live kernel: Run > Run All Cells once it is idle; accept a "Select Kernel" dialog whenever one shows
    n_code = sum(c["cell_type"] == "code" for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"])
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    status = page.locator(".jp-StatusBar-Widget", has_text="Idle")  # "Python 3 (ipykernel) | Idle"
    deadline = time.monotonic() + 90
    while not (idle.count() and status.count() and not _accept_dialog(page)):
        if time.monotonic() > deadline:
            pytest.fail("the notebook's kernel did not become idle within 90 s")
        time.sleep(0.5)
    time.sleep(1)
    _run_all(page)

    # every code cell gets an execution count; none is left running ("[*]")
    deadline = time.monotonic() + RUN_ALL_S
    last_run = time.monotonic()
    while True:
        prompts = [p.strip() for p in page.locator(".jp-CodeCell .jp-InputArea-prompt").all_inner_texts()]
        if sum(p.startswith("[") and p.rstrip(":").strip("[]").isdigit() for p in prompts) == n_code:
            break
        accepted = _accept_dialog(page)
        stalled = not any("*" in p for p in prompts) and idle.count() and time.monotonic() - last_run > 15
        if accepted or stalled:  # a kernel dialog (or a kernel restart) dropped the queued cells: run them again
            print("run all again:", "after a dialog" if accepted else f"stalled at {prompts}")
            _run_all(page)
            last_run = time.monotonic()
        if time.monotonic() > deadline:
            pytest.fail(f"the notebook did not finish within {RUN_ALL_S} s; prompts: {prompts}")
        time.sleep(1)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, f"a cell failed in the browser:\n{tracebacks[0][:3000]}"

    viewer = page.locator(".jp-OutputArea-output .widget-vbox", has_text="CompareViewer").first
    viewer.wait_for(state="visible", timeout=60_000)
    viewer.scroll_into_view_if_needed()

    # the Table tab: rows of the comparison, with verdicts
    rows = viewer.locator("table tbody tr")
    rows.first.wait_for(state="visible", timeout=30_000)
    n_rows = rows.count()
    assert n_rows >= 10, f"the CompareViewer table shows {n_rows} rows"
    table_text = viewer.locator("table").first.inner_text()
    assert "pass" in table_text and "Functional.embedding.0.forward" in table_text, table_text[:1000]
    header = viewer.inner_text()
    assert "first divergence: Tensor.__matmul__.0.forward" in header, header[:1500]
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
