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


def _interop(shared_dir: Path, name: str) -> Path:
    p = shared_dir / "interop" / name
    if not p.is_dir():
        pytest.skip(f"{p} is absent")
    return p


@pytest.fixture(scope="session")
def toy(shared_dir: Path) -> Path:
    """msprobe's own dumps and compare CSVs of the toy transformer (CPU run of mindstudio-probe 26.2.0)."""
    return _interop(shared_dir, "msprobe-cpu-toy-L1")


@pytest.fixture(scope="session")
def megatron(shared_dir: Path) -> Path:
    """A real msprobe mix-level dump of a Megatron step on an Ascend NPU."""
    return _interop(shared_dir, "msprobe-npu-megatron-mix")
