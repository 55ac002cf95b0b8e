"""Long work shows a progress bar where a person would see it: in a notebook too, not only on a terminal."""
from __future__ import annotations

import sys
import types

import pytest

from msprobe_nb import progress


@pytest.fixture
def notebook(monkeypatch):
    """An IPython kernel as tqdm.auto sees one (a shell with a kernel)."""
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    return monkeypatch


def test_a_notebook_gets_a_bar_for_long_work(notebook):
    notebook.delenv("PYTEST_CURRENT_TEST", raising=False)  # pytest sets it for each phase of a test
    assert progress.in_notebook()
    assert progress.wanted(500, minimum=100)
    assert not progress.wanted(50, minimum=100)  # short work: no bar
    assert not progress.wanted(500, minimum=100, explicit=False)  # progress=False wins
    got = progress.bar(range(500), desc="x", unit="y")
    assert type(got).__module__.startswith("tqdm")


def test_no_bar_without_a_notebook_or_terminal(monkeypatch):
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not progress.wanted(10_000, minimum=100)
    items = [1, 2, 3]
    assert progress.bar(items, desc="x", unit="y", minimum=1) is items
