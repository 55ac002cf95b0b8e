"""Fix every source of randomness the kit knows of, and say what was fixed and what could not be.

``seed_all`` covers what msprobe's seed_all covers (Python, NumPy, torch CPU/CUDA/NPU generators, cuDNN
flags, deterministic algorithms and the CUDA/HCCL environment variables) and returns a ``SeedReport``
that lists every item with whether it was applied here, so a notebook shows at a glance that, say,
the NPU seed was skipped because torch_npu is not installed.
"""
from __future__ import annotations

import html
import importlib
import importlib.util
import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from msprobe_nb.config import SEED_MAX

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DETERMINISTIC_ENV", "SeedItem", "SeedReport", "seed_all"]

#: environment set by ``seed_all(mode=True)``: variable -> (value, why)
DETERMINISTIC_ENV: dict[str, tuple[str, str]] = {
    "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "deterministic cuBLAS (CUDA >= 10.2); read when the cuBLAS handle is made"),
    "HCCL_DETERMINISTIC": ("true", "deterministic HCCL reductions across NPU cards"),
    "LCCL_DETERMINISTIC": ("1", "deterministic LCCL reductions (NPU)"),
    "CLOSE_MATMUL_K_SHIFT": ("1", "no K-axis shift in NPU matmul (bitwise-stable accumulation order)"),
    "ATB_LLM_LCOC_ENABLE": ("0", "no compute/communication overlap in ATB LLM ops (NPU)"),
}
#: the report of the last seed_all call in this process (None before any)
last_report: SeedReport | None = None
_CUBLAS_OK = (":4096:8", ":16:8")  # both make cuBLAS deterministic; keep a user's choice of either


@dataclass
class SeedItem:
    """One thing seed_all set or skipped. ``applied`` is False when it was skipped or cannot act on this
    machine (no CUDA, no cuDNN, no torch_npu, env var left alone); ``note`` says why or what it does."""

    what: str
    value: str
    applied: bool
    note: str = ""


@dataclass
class SeedReport:
    """What ``seed_all`` did, item by item; prints as a table and shows as one in notebooks."""

    seed: int
    mode: bool
    items: list[SeedItem] = field(default_factory=list)

    def add(self, what: str, value: Any, applied: bool, note: str = "") -> None:
        self.items.append(SeedItem(what, str(value), applied, note))

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, what: str) -> SeedItem:
        """The item named ``what`` (e.g. ``report["numpy.random.seed"]``)."""
        for item in self.items:
            if item.what == what:
                return item
        raise KeyError(what)

    @property
    def applied(self) -> list[str]:
        return [i.what for i in self.items if i.applied]

    @property
    def skipped(self) -> list[str]:
        return [i.what for i in self.items if not i.applied]

    def summary(self) -> str:
        """One line: how many items were applied, and why the others were not (grouped by reason)."""
        line = f"seed_all(seed={self.seed}, mode={self.mode}): {len(self.applied)} of {len(self)} items applied"
        reasons: dict[str, int] = {}
        for item in self.items:
            if not item.applied:
                reasons[item.note] = reasons.get(item.note, 0) + 1
        if reasons:
            line += "; not applied: " + ", ".join(f"{note} ({n})" for note, n in reasons.items())
        return line

    def __str__(self) -> str:
        rows = [("item", "value", "applied", "note")]
        rows += [(i.what, i.value, "yes" if i.applied else "no", i.note) for i in self.items]
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"SeedReport(seed={self.seed}, mode={self.mode})"]
        for r in rows:
            lines.append("  ".join(r[c].ljust(widths[c]) for c in range(3)) + "  " + r[3])
        return "\n".join(line.rstrip() for line in lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        body = "".join(
            f"<tr style='color:{'inherit' if i.applied else 'gray'}'><td><code>{esc(i.what)}</code></td>"
            f"<td><code>{esc(i.value)}</code></td><td>{'&#10003;' if i.applied else '&mdash;'}</td>"
            f"<td style='text-align:left'>{esc(i.note)}</td></tr>" for i in self.items)
        return (f"<div><b>seed_all(seed={self.seed}, mode={self.mode})</b><table>"
                "<tr><th>item</th><th>value</th><th>applied</th><th>note</th></tr>"
                f"{body}</table></div>")

    def to_frame(self) -> pd.DataFrame:
        """The items as a DataFrame (columns what, value, applied, note)."""
        import pandas as pd

        return pd.DataFrame([vars(i) for i in self.items], columns=["what", "value", "applied", "note"])


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) <= SEED_MAX:
        raise ValueError(f"seed must be an int in 0..{SEED_MAX} (0..2**32-1), got {seed!r} ({type(seed).__name__})")
    return int(seed)


def _set_env(report: SeedReport, name: str, value: str, note: str) -> None:
    os.environ[name] = value
    report.add(f"env {name}", value, True, note)


def _seed_npu(report: SeedReport, seed: int) -> None:
    """Seed torch_npu's generators when torch_npu can be imported; never required."""
    if importlib.util.find_spec("torch_npu") is None:
        for what in ("torch_npu.npu.manual_seed", "torch_npu.npu.manual_seed_all"):
            report.add(what, seed, False, "torch_npu not installed")
        return
    try:
        torch_npu = importlib.import_module("torch_npu")
        npu = torch_npu.npu
    except Exception as e:  # noqa: BLE001 - a broken CANN install raises all kinds of errors; report, don't fail
        for what in ("torch_npu.npu.manual_seed", "torch_npu.npu.manual_seed_all"):
            report.add(what, seed, False, f"torch_npu import failed: {type(e).__name__}: {e}")
        return
    available = bool(getattr(npu, "is_available", lambda: False)())
    note = "" if available else "torch_npu imported but no NPU available (seed queued for lazy init)"
    npu.manual_seed(seed)
    report.add("torch_npu.npu.manual_seed", seed, True, note or "current NPU")
    npu.manual_seed_all(seed)
    report.add("torch_npu.npu.manual_seed_all", seed, True, note or "all NPUs")


def seed_all(seed: int = 1234, mode: bool = False, *, verbose: bool = True, warn_only: bool = False,
             disable_cudnn: bool = False) -> SeedReport:
    """Seed Python, NumPy and torch (CPU, CUDA, NPU) and set the determinism switches; return what was done.

    ``mode=True`` turns on ``torch.use_deterministic_algorithms`` (an op without a deterministic kernel
    raises, or only warns with ``warn_only=True``) and sets the CUDA/HCCL/NPU variables in
    ``DETERMINISTIC_ENV``. cuDNN stays enabled unless ``disable_cudnn=True`` (msprobe's docs say
    "disable cuDNN"; its code never did). Seed range: 0..2**32-1.
    """
    seed = _check_seed(seed)
    mode = bool(mode)
    report = SeedReport(seed, mode)

    _set_env(report, "PYTHONHASHSEED", str(seed),
             "str hashing of subprocesses started from now on (this interpreter's was fixed at startup)")
    random.seed(seed)
    report.add("random.seed", seed, True)
    np.random.seed(seed)
    report.add("numpy.random.seed", seed, True, "legacy global RNG; np.random.default_rng() needs its own seed")
    torch.manual_seed(seed)
    report.add("torch.manual_seed", seed, True, "CPU generator (also seeds DataLoader worker base seeds)")

    cuda = torch.cuda.is_available()
    for what in ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all"):
        if cuda:
            getattr(torch.cuda, what.rsplit(".", 1)[1])(seed)
        report.add(what, seed, cuda, ("current GPU" if what.endswith("seed") else "all GPUs") if cuda
                   else "CUDA not available")
    _seed_npu(report, seed)

    torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    report.add("torch.use_deterministic_algorithms", f"{mode}, warn_only={warn_only}" if mode else mode, True,
               ("ops without a deterministic kernel " + ("warn" if warn_only else "raise")) if mode
               else "off: nondeterministic kernels allowed")

    has_cudnn = torch.backends.cudnn.is_available()
    off_here = "no cuDNN on this machine (flag set anyway)"
    torch.backends.cudnn.deterministic = True
    report.add("torch.backends.cudnn.deterministic", True, has_cudnn,
               "deterministic convolution algorithms" if has_cudnn else off_here)
    torch.backends.cudnn.benchmark = False
    report.add("torch.backends.cudnn.benchmark", False, has_cudnn,
               "no autotuning (its choice can differ run to run)" if has_cudnn else off_here)
    if disable_cudnn:
        torch.backends.cudnn.enabled = False
        report.add("torch.backends.cudnn.enabled", False, has_cudnn,
                   "cuDNN off: native kernels (slower)" if has_cudnn else off_here)
    else:
        report.add("torch.backends.cudnn.enabled", torch.backends.cudnn.enabled, False,
                   "left as is (disable_cudnn=True turns cuDNN off)")

    for name, (value, why) in DETERMINISTIC_ENV.items():
        if not mode:
            report.add(f"env {name}", os.environ.get(name, "<unset>"), False, "set only with mode=True")
        elif name == "CUBLAS_WORKSPACE_CONFIG" and os.environ.get(name) in _CUBLAS_OK:
            report.add(f"env {name}", os.environ[name], True, "kept the value already set (also deterministic)")
        else:
            if name == "CUBLAS_WORKSPACE_CONFIG" and cuda and torch.cuda.is_initialized():
                why += "; CUDA already initialised, may not affect existing handles"
            _set_env(report, name, value, why)

    global last_report
    last_report = report  # the set-up record reads it (docs/setup_check.md)
    if verbose:
        print(report.summary())
    return report
