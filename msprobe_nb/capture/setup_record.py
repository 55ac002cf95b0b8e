"""The set-up record: what a run was started with (environment, versions, determinism, model, optimizer, data).

``collect_setup`` reads it once, cheaply: no tensor goes to the host but its hash. Each parameter, buffer
and data tensor is hashed where it lives (``capture/tensor_hashes.py``: integer sums over its bytes, exact and
order-free, so a CPU, GPU and NPU run hash the same values alike), and the hashes come to the host in one
copy per device. :class:`SetupWatch` completes the record of a recorded run as it goes: the first batches
the model is called with and the optimizer at its first step (global hooks that only read, removed once
they saw what they wait for). The store writes the record (``store/setup_store.py``), the analysis compares
two (``analysis/setup_compare.py``); docs/setup_check.md says what is recorded and what is not.
"""
from __future__ import annotations

import math
import os
import platform
import re
import socket
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from msprobe_nb.capture.setup_env import ENV_NAMES, ENV_PREFIXES, numerics_env
from msprobe_nb.capture.tensor_hashes import tensor_hashes

__all__ = ["DATA_BATCHES", "ENV_NAMES", "ENV_PREFIXES", "PACKAGES", "SetupWatch", "collect_setup", "data_section",
           "model_section", "optimizer_section", "tensor_hashes"]

#: distributions whose versions are read from their metadata (never imported for it)
PACKAGES = ("torch", "torch_npu", "numpy", "transformers", "accelerate", "deepspeed", "megatron-core", "megatron-lm",
            "mindspeed", "apex", "flash-attn", "triton", "safetensors", "tokenizers", "peft")
#: how many of the first batches are hashed
DATA_BATCHES = 2
_VALUE_MAX = 1000  # characters of an environment variable or a hyper-parameter kept
# ------------------------------------------------------------------------------------------------ values
def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON value for a hyper-parameter, config entry or flag (tensors as numbers, tuples as lists)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value if not isinstance(value, str) else value[:_VALUE_MAX]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, torch.Tensor):
        return _plain(value.item()) if value.numel() == 1 else f"tensor{tuple(value.shape)}"
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, (list, tuple)) and depth < 4:
        return [_plain(v, depth + 1) for v in value[:64]]
    if isinstance(value, dict) and depth < 4:
        return {str(k): _plain(v, depth + 1) for k, v in list(value.items())[:256]}
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _plain(value.item(), depth)
        except (TypeError, ValueError):
            pass
    return f"<{type(value).__name__}>"


_DIST = re.compile(r"^([A-Za-z0-9_.]+?)-([^-]+?)\.(?:dist-info|egg-info)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(names: tuple[str, ...]) -> dict[str, str]:
    """Versions of the distributions ``names`` from their ``*.dist-info`` folder names on sys.path (first one
    wins, as for imports): one listing per path entry, where importlib.metadata parses each METADATA file
    (about 20 ms a package, and a scan of every path entry for one that is not installed)."""
    want = {_norm(n): n for n in names}
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            m = _DIST.match(item)
            if m and (key := _norm(m.group(1))) in want and want[key] not in found:
                found[want[key]] = m.group(2)
    return {n: found[n] for n in names if n in found}


def _cann_version() -> str | None:
    """CANN's version, from the toolkit's own files (ASCEND_TOOLKIT_HOME or the default install path)."""
    homes = [os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
             "/usr/local/Ascend/ascend-toolkit/latest"]
    for home in filter(None, homes):
        for rel in ("version.cfg", f"{platform.machine()}-linux/ascend_toolkit_install.info",
                    "compiler/version.info"):
            p = Path(home) / rel
            try:
                if p.is_file() and p.stat().st_size < 65536:
                    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
                        key, sep, value = line.partition("=")
                        if sep and key.strip().lower() in ("version", "toolkit_version", "runtime_running_version"):
                            return value.strip().strip('"[]')[:100]
            except OSError:
                continue
    return None


# ------------------------------------------------------------------------------------------------ sections
def environment_section(rank: int, world_size: int) -> dict[str, Any]:
    env = numerics_env(os.environ)
    if "torch_npu" in sys.modules:
        device = "npu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        device = "cpu"
    name = platform.processor() or platform.machine()
    if device == "cuda":
        name = torch.cuda.get_device_name()
    elif device == "npu":
        try:
            name = torch.npu.get_device_name()  # type: ignore[attr-defined]  # torch_npu adds torch.npu
        except (AttributeError, RuntimeError):
            pass
    system = f"{platform.system()} {platform.release()} {platform.machine()}"  # not platform(): it reads libc
    return {"env": env, "hostname": socket.gethostname(), "platform": system,
            "device": device, "device_name": name, "rank": int(rank), "world_size": int(world_size),
            "torch_threads": torch.get_num_threads()}


def versions_section() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version()}
    out.update(_installed(PACKAGES))
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    if torch.cuda.is_available() and torch.backends.cudnn.is_available():
        out["cudnn"] = torch.backends.cudnn.version()
    cann = _cann_version()
    if cann:
        out["cann"] = cann
    return out


def _generator_digest(gen: torch.Generator) -> str:
    return f"seed={gen.initial_seed()} state={zlib.crc32(gen.get_state().numpy().tobytes()):08x}"


def _numpy_keys() -> np.ndarray:
    """The key array of numpy's global generator (``get_state()`` gives the legacy tuple by default; numpy's
    stubs do not narrow the return type by it)."""
    return cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())[1]


def determinism_section(seed_report: Any = None) -> dict[str, Any]:
    import random

    b = torch.backends
    out: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn.enabled": b.cudnn.enabled, "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.benchmark": b.cudnn.benchmark, "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
    }
    npu = getattr(torch, "npu", None) if "torch_npu" in sys.modules else None
    for what in ("matmul", "conv"):
        flag = getattr(getattr(npu, what, None), "allow_hf32", None)
        if isinstance(flag, bool):
            out[f"npu.{what}.allow_hf32"] = flag
    seeds = {"torch": _generator_digest(torch.default_generator),
             "python": f"state={zlib.crc32(repr(random.getstate()).encode()):08x}",
             "numpy": f"state={zlib.crc32(_numpy_keys().tobytes()):08x}" if "numpy.random" in sys.modules
             else "not imported"}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        seeds["cuda"] = f"seed={torch.cuda.initial_seed()}"
    out["seeds"] = seeds
    if seed_report is not None:
        out["seed_all"] = {"seed": seed_report.seed, "mode": seed_report.mode,
                           "items": {i.what: [i.value, i.applied] for i in seed_report.items}}
    return out


def _describe(module: torch.nn.Module) -> str:
    try:
        extra = module.extra_repr()
    except Exception:  # noqa: BLE001 - a user's extra_repr may fail; the class still says much
        extra = "?"
    return f"{type(module).__name__}({extra[:_VALUE_MAX]})" + ("" if module.training else " eval")


def model_section(model: torch.nn.Module) -> dict[str, Any]:
    """Class, config (transformers), module tree, and every parameter and buffer with the hash of its values."""
    inner = model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
    out: dict[str, Any] = {"class": type(inner).__name__}
    cfg = getattr(inner, "config", None)
    if cfg is not None and callable(getattr(cfg, "to_dict", None)):
        try:
            out["config"] = {k: _plain(v) for k, v in sorted(cfg.to_dict().items())
                             if not k.startswith("_") and k != "transformers_version"}
        except Exception:  # noqa: BLE001 - a custom config object; the modules still say what was built
            pass
    out["modules"] = {name or "(root)": _describe(m) for name, m in inner.named_modules()}
    for kind, items in (("parameters", list(inner.named_parameters())), ("buffers", list(inner.named_buffers()))):
        tensors = [t for _, t in items]
        hashes = tensor_hashes(tensors)
        out[kind] = {n: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                         "requires_grad": bool(t.requires_grad), "hash": h}
                     for (n, t), h in zip(items, hashes, strict=True)}
    return out


def optimizer_section(optimizer: Any, model: torch.nn.Module | None = None, scheduler: Any = None,
                      grad_scaler: Any = None) -> dict[str, Any]:
    """The optimizer's class and every parameter group's hyper-parameters, the scheduler, the grad scaler."""
    out: dict[str, Any] = {}
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        groups = []
        for g in getattr(optimizer, "param_groups", []):
            row = {k: _plain(v) for k, v in sorted(g.items()) if k != "params" and not callable(v)}
            params = list(g.get("params", []))
            row["params"] = len(params)
            if names:
                row["param_names"] = f"{zlib.crc32(' '.join(names.get(id(p), '?') for p in params).encode()):08x}"
            groups.append(row)
        out["class"] = type(optimizer).__name__
        out["groups"] = groups
    if scheduler is not None:
        state = {}
        try:
            state = {k: _plain(v) for k, v in sorted(scheduler.state_dict().items())
                     if not k.startswith("_") and not callable(v)}
        except Exception:  # noqa: BLE001 - a scheduler without a state dict: its class alone
            pass
        out["scheduler"] = {"class": type(scheduler).__name__, **state}
    if grad_scaler is not None:
        state = {}
        enabled = getattr(grad_scaler, "is_enabled", lambda: True)()
        if enabled:
            try:
                state = {k: _plain(v) for k, v in sorted(grad_scaler.state_dict().items()) if k != "_growth_tracker"}
            except Exception:  # noqa: BLE001
                pass
        out["grad_scaler"] = {"class": type(grad_scaler).__name__, "enabled": bool(enabled), **state}
    return out


def _leaves(value: Any, path: str, out: list, depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        out.append((path or "0", value))
    elif depth > 6:
        return
    elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        for k in list(value.keys())[:64]:
            _leaves(value[k], f"{path}.{k}" if path else str(k), out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:64]):
            _leaves(v, f"{path}.{i}" if path else str(i), out, depth + 1)


def data_section(batches: Any) -> list[dict[str, Any]]:
    """Each batch's tensors (found in dicts, lists, tuples): shape, dtype and the hash of the values."""
    out = []
    for batch in batches:
        found: list = []
        _leaves(batch, "", found)
        hashes = tensor_hashes([t for _, t in found])
        out.append({p: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "hash": h}
                    for (p, t), h in zip(found, hashes, strict=True)})
    return out


def collect_setup(*, model: Any = None, optimizer: Any = None, scheduler: Any = None, grad_scaler: Any = None,
                  data: Any = None, seed_report: Any = None, rank: int = 0, world_size: int = 1,
                  source: str = "snapshot_setup") -> dict[str, Any]:
    """The whole record as plain JSON data; ``data``: an iterable of batches (the first DATA_BATCHES are hashed)."""
    record: dict[str, Any] = {"rank": int(rank), "world_size": int(world_size), "source": source,
                              "environment": environment_section(rank, world_size), "versions": versions_section(),
                              "determinism": determinism_section(seed_report)}
    if model is not None:
        record["model"] = model_section(model)
    if optimizer is not None or scheduler is not None or grad_scaler is not None:
        record["optimizer"] = optimizer_section(optimizer, model, scheduler, grad_scaler)
    if data is not None:
        batches = list(data[:DATA_BATCHES]) if isinstance(data, (list, tuple)) else _first(data, DATA_BATCHES)
        record["data"] = {"batches": data_section(batches)}
    return record


def _first(data: Any, n: int) -> list:
    if isinstance(data, torch.Tensor):
        return [data]
    out = []
    for batch in data:  # an iterator is consumed: pass a list to keep every batch for training
        out.append(batch)
        if len(out) == n:
            break
    return out


def _calling_scaler(depth: int = 24) -> Any:
    """The grad scaler whose ``step(optimizer)`` is calling the optimizer's step, if one is (torch's
    ``GradScaler`` and those made after it, torch_npu's included): found among the callers' frames, read only."""
    frame: Any = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name == "step" and frame.f_code.co_filename.endswith("grad_scaler.py"):
            scaler = frame.f_locals.get("self")
            return scaler if hasattr(scaler, "state_dict") and hasattr(scaler, "is_enabled") else None
    return None


class SetupWatch:
    """Completes a recorded run's set-up record as the run goes: the first batches the model is called with,
    and the optimizer at its first step. ``write(record)`` is called each time the record grows; ``quiet`` is
    the recorder's ``working`` (the kit's own torch calls are then not recorded). Hooks only read."""

    def __init__(self, record: dict, model: Any, write: Callable[[dict], Any], *, optimizer: Any = None,
                 quiet: Callable[[], Any] | None = None, batches: int = DATA_BATCHES) -> None:
        self.record, self._write, self._quiet = record, write, quiet or nullcontext
        self.model, self._batches = model, batches
        self._forward = self._step = None
        compiled = getattr(model, "_compiled_call_impl", None) is not None  # model.compile(): dynamo would trace
        if model is not None and "data" not in record and batches > 0 and not compiled:
            self._forward = model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
        if optimizer is None and "optimizer" not in record:
            self._step = register_optimizer_step_pre_hook(self._on_step)

    def _on_forward(self, _module: Any, args: Any, kwargs: Any) -> None:
        if len(self.record.get("data", {}).get("batches", ())) >= self._batches:
            return  # seen them all (hooks are removed at remove(): torch runs them from the dict being changed)
        with self._quiet(), self._guard("data"):
            batch = {"args": list(args), **({"kwargs": kwargs} if kwargs else {})}
            got = self.record.setdefault("data", {"batches": []})["batches"]
            got.extend(data_section([batch]))
            self._write(self.record)

    def _on_step(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if "optimizer" in self.record:
            return
        with self._quiet(), self._guard("optimizer"):
            self.record["optimizer"] = optimizer_section(optimizer, self.model, grad_scaler=_calling_scaler())
            self._write(self.record)

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """The training never fails for the record: an error is noted in it (``errors``) instead."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - a hook must not break the user's step
            self.record.setdefault("errors", []).append(f"{what}: {type(exc).__name__}: {exc}"[:_VALUE_MAX])

    def remove(self) -> None:
        for h in (self._forward, self._step):
            if h is not None:
                h.remove()
        self._forward = self._step = None
