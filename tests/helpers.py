"""Helpers shared by several test files (never test modules importing each other): calls tables built by hand
for the many-rank tests, where the reference data beside the repository lives, the benchmark's real models as
(model, step) makers, and the real-browser harness (:class:`Lab`: JupyterLab and headless Chromium) of
tests/test_browser*.py and benchmarks/bench_viewers.py."""
from __future__ import annotations

import contextlib
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

import pandas as pd
import pytest

from msprobe_nb.store.schema import coerce_calls

#: read-only reference data beside the repository (real msprobe dumps); tests that need it skip without it
SHARED = Path(__file__).resolve().parents[2] / "shared"
#: msprobe's own two-rank dumps with collectives (../shared/interop)
INTEROP = SHARED / "interop" / "msprobe-2rank-collectives"


def real_model(name: str):
    """``make()`` -> (model, one training step) of benchmarks/recording/real_models.py's ``name``, the same seed,
    weights and batches each time; skips where transformers (or, for the UNet, diffusers) is missing."""
    pytest.importorskip("transformers", reason="transformers is not installed (the models extra)")
    if name == "unet":
        pytest.importorskip("diffusers", reason="diffusers is not installed (the models extra)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from recording.real_models import build
    finally:
        sys.path.pop(0)

    def make():
        work = build(name, threads=0)
        return work.model, lambda: work.train_step(work.model, work.optimizer, *work.make_batch())
    return make


@contextlib.contextmanager
def handlers(c: bool):
    """Record with the L1 handler, the API backward and the module hooks in C (``c``) or in Python, as where
    setup.py found no compiler. The handler is chosen when a mode is made, the module hooks when recording
    starts and the API backward at each call, so the whole recorded step runs inside this block."""
    from msprobe_nb.capture import api_mode, grad_hooks, module_hooks
    saved = api_mode._api_handler, grad_hooks._api_backward, module_hooks._module_hooks
    if not c:
        api_mode._api_handler = grad_hooks._api_backward = module_hooks._module_hooks = None
    try:
        yield
    finally:
        api_mode._api_handler, grad_hooks._api_backward, module_hooks._module_hooks = saved


def enable_checkpointing(model, reentrant: bool) -> None:
    """Hugging Face's activation checkpointing on ``model``: transformers 5 named it
    ``activation_checkpointing_enable`` (the old name warns); older releases have the old name only."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})


def table(ranks: dict[int, list[tuple[str, dict[str, float]]]], step: int = 0, group: list[int] | None = None):
    """{rank: [(call, {"input.0": v, "output.0": v}), ...]}: one tensor row per leaf, max v, min -v."""
    rows = []
    for rank, calls in ranks.items():
        for ci, (call, leaves) in enumerate(calls):
            for suffix, v in leaves.items():
                io, arg = suffix.split(".", 1)
                rows.append(dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.{suffix}", io=io,
                                 arg=arg, kind="tensor", dtype="torch.float32", shape=(4,), numel=4, max=v, min=-v,
                                 mean=v / 10, norm=2 * v))
            if group is not None and call.startswith("Distributed."):
                rows.append(dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.input.group",
                                 io="input", arg="group", is_kwarg=True, kind="value",
                                 value_type="torch.ProcessGroup", value=json.dumps({"group_ranks": group})))
    return coerce_calls(pd.DataFrame(rows))


def f(k: int, x: float, y: float | None = None):
    return (f"Functional.f.{k}.forward", {"input.0": x, "output.0": x if y is None else y})


def ar(k: int, x: float, y: float):
    return (f"Distributed.all_reduce.{k}.forward", {"input.0": x, "output.0": y})


def four_ranks(plant_rank: int | None, plant_step: int, steps: int = 3):
    """4 ranks, 3 steps: f0, f1, all_reduce 0, f2, all_reduce 1; a change planted on one rank's f1 at one step."""
    parts = []
    for s in range(steps):
        ranks = {}
        for r in range(4):
            planted = r == plant_rank and s == plant_step
            y1 = 2.0 * (1.5 if planted else 1.0)
            after = 1.5 if plant_rank is not None and s == plant_step else 1.0
            ranks[r] = [f(0, 1.0), f(1, 1.0, y1), ar(0, y1, 8.0 * after), f(2, 8.0 * after), ar(1, 8.0 * after,
                                                                                              32.0 * after)]
        parts.append(table(ranks, step=s))
    return pd.concat(parts, ignore_index=True)


# ------------------------------------------------------------------------------ the real-browser harness
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


def _requirements(notebook: Path | None = NOTEBOOK, grid: bool = False) -> tuple[str, object]:
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
    if notebook is not None and not notebook.is_file():
        pytest.skip(f"{notebook} is missing")
    if grid:
        try:
            import anywidget  # noqa: F401
        except ImportError:
            pytest.skip("anywidget is not installed (pip install anywidget, or the [browser] extra): "
                        "the viewers show their plain-ipywidgets fallback, which has no grid to click")
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


class Lab:
    """JupyterLab on 127.0.0.1 over a temporary folder, and a headless Chromium to look at it.

    ``with Lab(tmp, chromium, sync_playwright) as lab: page = lab.open(notebook, width)``: ``open`` copies or
    writes the notebook into the served folder, opens it at that viewport width and runs every cell. Open
    one notebook per Lab: JupyterLab brings an earlier notebook's tab back beside a later one.
    """

    def __init__(self, home: Path, chromium: str, sync_playwright):
        self.home, self.chromium, self._sp = home, chromium, sync_playwright
        self.root = home / "lab"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port, self.token = _free_port(), uuid.uuid4().hex
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = self.log = self._pw = self.browser = None

    def __enter__(self) -> Lab:
        self.proc, self.log = _start_jupyterlab(self.root, self.port, self.token, self.home)
        try:
            _wait_for_server(f"{self.base}/api/status?token={self.token}", self.proc, self.log, SERVER_START_S)
            self._pw = self._sp().start()
            self.browser = self._pw.chromium.launch(executable_path=self.chromium, headless=True,
                                                    args=CHROMIUM_FLAGS, timeout=60_000)  # a fresh profile
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.browser is not None:
                self.browser.close()
            if self._pw is not None:
                self._pw.stop()
        finally:
            _stop(self.proc)

    def open(self, notebook: Path | dict, width: int, height: int = 1600, name: str | None = None):
        """A new page with ``notebook`` (a path, or notebook JSON) open and run; returns the page."""
        if isinstance(notebook, dict):
            name = name or "viewer.ipynb"
            (self.root / name).write_text(json.dumps(notebook), encoding="utf-8")
            cells = notebook["cells"]
        else:
            name = name or notebook.name
            shutil.copy(notebook, self.root / name)
            cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        page = self.browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(60_000)
        n_code = sum(c["cell_type"] == "code" for c in cells)
        try:
            _run_notebook(page, f"{self.base}/lab/tree/{name}?token={self.token}", n_code)
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            _failure_shot(page, f"failure_{Path(name).stem}.png")
            raise
        return page


def notebook_json(*sources: str) -> dict:
    """A notebook of code cells (Python 3 kernel)."""
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": uuid.uuid4().hex[:8], "metadata": {}, "execution_count": None,
                       "outputs": [], "source": src} for src in sources]}


def _serve(tmp_path, cell: str, check, name: str, width: int = 1400, height: int = 1800) -> None:
    """Open a notebook of ``cell`` in a served JupyterLab and run ``check(page, shots)`` on it: a failure saves
    a screenshot of the page, a pass prints the screenshots ``check`` appended."""
    chromium, sync_playwright = _requirements(None, grid=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with Lab(tmp_path, chromium, sync_playwright) as lab:
        page = lab.open(notebook_json(cell), width, height, name=f"{name}.ipynb")
        try:
            check(page, shots)
        except BaseException:
            _failure_shot(page, f"failure_{name}.png")
            raise
    for s in shots:
        print(f"screenshot: {s}")


def _failure_shot(page, name: str = "failure.png") -> None:
    failed = ARTIFACTS / name
    try:
        page.screenshot(path=str(failed), full_page=True, timeout=15_000)
        print(f"screenshot of the failure: {failed}")
    except Exception:  # noqa: BLE001 - the original failure matters more
        pass


#: JavaScript: the grid's rows as {pos, cells} (the texts of each row's cells)
_GRID_ROWS = """el => [...el.querySelectorAll('.msnb-grid tbody tr')].map(tr => ({pos: tr.dataset.pos,
  cells: [...tr.querySelectorAll('td')].map(td => td.textContent),
  titles: [...tr.querySelectorAll('td')].map(td => td.title)}))"""
_GRID_KEYS = "el => [...el.querySelectorAll('.msnb-grid thead th')].map(th => th.dataset.col)"
#: JavaScript: buttons whose text does not fit, and toggle-button groups whose buttons are on several lines
_LAYOUT = """el => {
  const vis = e => e.offsetParent !== null;
  const cut = [...el.querySelectorAll('button')].filter(b => vis(b) && b.scrollWidth > b.clientWidth + 1)
    .map(b => b.textContent.trim());
  const stacked = [...el.querySelectorAll('.widget-toggle-buttons')].filter(vis).filter(g => {
    const tops = new Set([...g.querySelectorAll('button')].map(b => Math.round(b.getBoundingClientRect().top)));
    return tops.size > 1; }).map(g => g.textContent.trim());
  const wide = el.scrollWidth > el.clientWidth + 2;
  return {cut, stacked, wide, width: el.clientWidth};
}"""


def _cell_texts(viewer, column: str, whole: bool = False) -> list[str]:
    """The column's cells as shown, or (``whole``) their whole text (a long name is cut in its middle)."""
    keys = viewer.evaluate(_GRID_KEYS)
    j = keys.index(column)
    return [r["titles" if whole else "cells"][j] for r in viewer.evaluate(_GRID_ROWS)]


def _wait_grid(page, viewer, js_condition: str, arg=None, timeout: int = 30_000) -> None:
    """Wait until ``js_condition(viewerElement, arg)`` holds."""
    page.wait_for_function(f"([el, arg]) => ({js_condition})(el, arg)", arg=[viewer.element_handle(), arg],
                           timeout=timeout)


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


def _run_notebook(page, url: str, n_code: int) -> None:
    """Open ``url`` and run all of its ``n_code`` code cells in a live kernel; fail on a traceback."""
    page.goto(url, wait_until="domcontentloaded")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(state="visible", timeout=90_000)
    # a live kernel: Run > Run All Cells once it is idle; accept a "Select Kernel" dialog whenever one shows
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
