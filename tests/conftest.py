"""Shared pytest fixtures."""
from __future__ import annotations

from pathlib import Path

import pytest

#: Read-only reference data beside the repository (msprobe docs, real msprobe dumps); never copied in.
SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the repo; the test is skipped when it is absent (e.g. a bare checkout)."""
    if not SHARED.is_dir():
        pytest.skip(f"reference data folder {SHARED} is absent")
    return SHARED
