"""Every tutorial notebook in notebooks/ runs top to bottom in a real kernel, quickly, and is saved without outputs.

The notebooks are copied to one temporary folder and executed there in order, as a reader runs them from
notebooks/ (so their runs/ folders never land in the repository); the kernel finds data/samples through
``MSPROBE_NB_REPO``. Each notebook writes only under a ``runs/NN_name/`` folder of its own (NN: its number),
shows no warning, and running it again replaces that folder's files instead of piling up ``npu_1``,
``npu_2``... beside them. A failure names the cell, shows its source and the error.
"""
from __future__ import annotations

import os
import re
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
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def _repo_snapshot() -> set[str]:
    """Files where a notebook run by mistake in the repository would write (runs/ folders, data/samples)."""
    out = set()
    for folder in (REPO / "runs", REPO / "notebooks", REPO / "data" / "samples"):
        if folder.is_dir():
            out |= {str(p) for p in folder.rglob("*") if ".ipynb_checkpoints" not in p.parts}
    return out


def _warnings_of(nb) -> list[str]:
    """``cell i: text`` for every stderr output of ``nb`` that names a warning (SomethingWarning)."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = out.get("text", "") if out.get("output_type") == "stream" and out.get("name") == "stderr" else ""
            if re.search(r"[A-Za-z]*Warning\b", text):
                found.append(f"cell {i}: {_strip_ansi(text).strip()[:500]}")
    return found


def _files(workdir: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``workdir`` (but the notebook copies) with its mtime and size."""
    out = {}
    for p in workdir.rglob("*"):
        rel = p.relative_to(workdir)
        if p.is_file() and ".ipynb_checkpoints" not in rel.parts and not (len(rel.parts) == 1 and p.suffix == ".ipynb"):
            st = p.stat()
            out[rel.as_posix()] = (st.st_mtime_ns, st.st_size)
    return out


def _own_folder(path: Path, touched: set[str]) -> str:
    """The one ``runs/NN_name`` folder the notebook wrote (or removed) everything in; fails otherwise."""
    number = path.name.split("_", 1)[0]
    folders = {"/".join(f.split("/")[:2]) for f in touched}
    outside = sorted(f for f in touched if not re.fullmatch(rf"runs/{number}_[^/]+/.+", f))
    assert not outside, (f"{path.name} wrote outside a runs/{number}_*/ folder of its own: {outside[:8]}"
                         f"{' ...' if len(outside) > 8 else ''}")
    assert len(folders) <= 1, f"{path.name} wrote into several folders: {sorted(folders)}"
    return folders.pop() if folders else ""


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory) -> Path:
    """One folder for all the notebooks, as notebooks/ is for a reader who runs them one after another."""
    return tmp_path_factory.mktemp("notebooks")


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
def test_notebook_runs(path, shared_workdir, monkeypatch):
    monkeypatch.setenv("MSPROBE_NB_REPO", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "agg")
    before = _repo_snapshot()
    files_before = _files(shared_workdir)
    nb, seconds = run_notebook(path, shared_workdir)
    print(f"{path.name}: {seconds:.1f} s")
    errors = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _error_of(c)]
    assert not errors, f"{path.name}: cells {errors} show errors"
    assert _repo_snapshot() == before, "the notebook wrote into the repository"
    files_after = _files(shared_workdir)
    touched = {f for f in files_after if files_before.get(f) != files_after[f]} | (set(files_before) - set(files_after))
    _own_folder(path, touched)
    warned = _warnings_of(nb)
    assert not warned, f"{path.name} shows warnings:\n" + "\n".join(warned)
    assert seconds < NOTEBOOK_BUDGET_S, f"{path.name} took {seconds:.0f} s (budget {NOTEBOOK_BUDGET_S:.0f} s)"


#: the notebook run twice: the one with the most recordings (13 dumps)
RERUN = REPO / "notebooks" / "03_randomness.ipynb"


@pytest.mark.skipif(not RERUN.is_file(), reason=f"{RERUN.name} is missing")
def test_notebook_rerun_replaces_its_own_files(shared_workdir, monkeypatch):
    """Running a notebook again leaves the same files in its folder, all rewritten, with no warning."""
    monkeypatch.setenv("MSPROBE_NB_REPO", str(REPO))
    monkeypatch.setenv("MPLBACKEND", "agg")
    number = RERUN.name.split("_", 1)[0]
    first = {f: v for f, v in _files(shared_workdir).items() if f.startswith(f"runs/{number}_")}
    if not first:  # test_notebook_runs did not run it in this session
        run_notebook(RERUN, shared_workdir)
        first = {f: v for f, v in _files(shared_workdir).items() if f.startswith(f"runs/{number}_")}
    others = {f: v for f, v in _files(shared_workdir).items() if f not in first}
    nb, _ = run_notebook(RERUN, shared_workdir)
    after = _files(shared_workdir)
    again = {f: v for f, v in after.items() if f.startswith(f"runs/{number}_")}
    new, gone = sorted(set(again) - set(first)), sorted(set(first) - set(again))
    assert not new and not gone, f"a second run changed the files of {RERUN.name}: new {new[:8]}, gone {gone[:8]}"
    stale = sorted(f for f in first if first[f][0] == again[f][0])
    assert not stale, f"a second run of {RERUN.name} did not rewrite {stale[:8]}"
    assert {f: v for f, v in after.items() if f not in again} == others, "a second run touched other notebooks' files"
    warned = _warnings_of(nb)
    assert not warned, f"a second run of {RERUN.name} shows warnings:\n" + "\n".join(warned)
