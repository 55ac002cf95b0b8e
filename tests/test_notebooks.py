"""Every tutorial notebook in notebooks/ runs top to bottom in a real kernel, quickly, and is saved without outputs.

Each notebook is copied to a temporary folder and executed there (so its runs/ folders never land in the
repository); the kernel finds data/samples through ``MSPROBE_NB_REPO``. A failure names the cell, shows its
source and the error.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
#: seconds one notebook may take in all (they take well under a minute on a 2-core CPU)
NOTEBOOK_BUDGET_S = float(os.environ.get("MSPROBE_NB_NOTEBOOK_BUDGET_S", "120"))
CELL_TIMEOUT_S = 120


def _error_of(cell) -> str:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            tb = "\n".join(out.get("traceback", [])[-8:])
            return f"{out.get('ename')}: {out.get('evalue')}\n{_strip_ansi(tb)}"
    return ""


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _repo_snapshot() -> set[str]:
    """Files where a notebook run by mistake in the repository would write (runs/ folders, data/samples)."""
    out = set()
    for folder in (REPO / "runs", REPO / "notebooks", REPO / "data" / "samples"):
        if folder.is_dir():
            out |= {str(p) for p in folder.rglob("*") if ".ipynb_checkpoints" not in p.parts}
    return out


def run_notebook(path: Path, workdir: Path) -> tuple[nbformat.NotebookNode, float]:
    """Execute a copy of ``path`` in ``workdir``; returns the executed notebook and the seconds it took."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    copy = workdir / path.name
    shutil.copy(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", startup_timeout=120,
                            resources={"metadata": {"path": str(workdir)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        for i, cell in enumerate(nb.cells):
            err = _error_of(cell) if cell.cell_type == "code" else ""
            if err:
                pytest.fail(f"{path.name}: cell {i} failed\n--- source ---\n{cell.source}\n--- error ---\n{err}",
                            pytrace=False)
        running = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.get("execution_count") is None]
        where = f"cell {running[0]}:\n{nb.cells[running[0]].source}\n" if running else ""
        pytest.fail(f"{path.name}: {type(exc).__name__}: {_strip_ansi(str(exc))[-2000:]}\n{where}", pytrace=False)
    finally:
        nbformat.write(nb, copy)  # the executed copy stays in the temp folder for a look after a failure
    return nb, time.perf_counter() - t0


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for name in ("01_quickstart.ipynb", "02_compare_npu_vs_bench.ipynb", "03_randomness.ipynb",
                 "04_msprobe_dumps.ipynb", "05_scripting.ipynb"):
        assert name in names, f"notebooks/{name} is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_saved_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} were saved with outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    monkeypatch.setenv("MSPROBE_NB_REPO", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "agg")
    before = _repo_snapshot()
    nb, seconds = run_notebook(path, tmp_path)
    print(f"{path.name}: {seconds:.1f} s")
    errors = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _error_of(c)]
    assert not errors, f"{path.name}: cells {errors} show errors"
    assert _repo_snapshot() == before, "the notebook wrote into the repository"
    assert seconds < NOTEBOOK_BUDGET_S, f"{path.name} took {seconds:.0f} s (budget {NOTEBOOK_BUDGET_S:.0f} s)"
