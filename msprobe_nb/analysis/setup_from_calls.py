"""The parts of a set-up that only a recorded step shows: where random numbers are drawn, and gradient clipping.

Both are read from a dump's first recorded step on one rank (the calls and their stacks), not from the
set-up record: ``load_setup`` (``analysis/setup_compare.py``) adds them to a dump folder's record.

* **Random call sites**: each random API call (the ``rng`` column, or the APIs of ``capture/random_apis.py``
  in msprobe dumps) as the call site outside torch and the kit, the API, and the count.
* **Gradient clipping**: the calls made inside ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``
  (their stacks pass through torch's ``clip_grad.py``), read back into the function, its call site and the
  arguments the calls carry: ``max_norm`` (the scalar divided by the total norm), ``norm_type`` (the order
  of the norms) and ``clip_value`` (the bound of the clamp). A clip written by hand is not recognised.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from msprobe_nb.capture.random_apis import RANDOM_APIS

__all__ = ["clipping", "random_sites", "step_setup"]

_FRAME = re.compile(r'File "?([^,"]+)"?, line (\d+)')
_INSIDE = re.compile(r"/(torch|msprobe_nb)/")
_CLIP = re.compile(r"clip_grad\.py\"?, line \d+, in (clip_grad_norm_|clip_grad_value_|clip_grads_with_norm_)\b")
#: (API, argument) -> the clipping argument it carries, for the calls inside a clipping function
_ARGS = {("Tensor.__rtruediv__", "1"): "max_norm", ("Torch._foreach_norm", "1"): "norm_type",
         ("Torch.linalg.vector_norm", "1"): "norm_type", ("Torch.linalg.vector_norm", "ord"): "norm_type",
         ("Torch._foreach_clamp_max_", "1"): "clip_value", ("Tensor.clamp_", "max"): "clip_value"}


def _site(frames: list[str]) -> str:
    """``file.py:line`` of the innermost frame outside torch and the kit (the file's name only: folders differ
    between machines)."""
    for f in frames or []:
        m = _FRAME.search(str(f))
        if m and not _INSIDE.search("/" + m.group(1).replace("\\", "/")):
            return f"{Path(m.group(1)).name}:{m.group(2)}"
    return "?"


def _first_step(calls: pd.DataFrame, rank: int) -> pd.DataFrame:
    c = calls[(calls["rank"] == rank) if rank in set(calls["rank"]) else calls["rank"] == calls["rank"].min()]
    return c[c["step"] == c["step"].min()]


def random_sites(calls: pd.DataFrame, frames: dict[int, list[str]]) -> list[dict[str, Any]]:
    """The random-API calls of one step's rows: site, API, count."""
    c = calls.drop_duplicates("call")
    if "rng" in c.columns and c["rng"].astype(str).str.len().gt(0).any():
        draws = c[c["rng"].astype(str).str.len() > 0]
    else:
        keys = list(zip(c["family"], c["op"], strict=True))
        draws = c[[k in RANDOM_APIS for k in keys]]
    counts: dict[tuple[str, str], int] = {}
    for fam, op, sid in zip(draws["family"], draws["op"], draws["stack_id"], strict=True):
        key = (_site(frames.get(int(sid), [])), f"{fam}.{op}")
        counts[key] = counts.get(key, 0) + 1
    return [{"site": s, "api": a, "count": n} for (s, a), n in sorted(counts.items())]


def _value(text: Any) -> Any:
    try:
        return json.loads(str(text))
    except ValueError:
        return str(text)


def clipping(calls: pd.DataFrame, frames: dict[int, list[str]]) -> dict[str, dict[str, Any]]:
    """The gradient clipping of one step's rows: per clipping function, its site, how many times it ran and
    the arguments its calls carry (``{}`` when the step clips nothing)."""
    inside: dict[int, tuple[str, str]] = {}  # stack id -> (function, user site)
    for sid in set(calls["stack_id"]):
        fr = frames.get(int(sid), [])
        names = [m.group(1) for f in fr if (m := _CLIP.search(str(f)))]
        if names:
            inside[int(sid)] = (names[-1], _site(fr))  # the outermost: clip_grad_norm_ calls the others
    out: dict[str, dict[str, Any]] = {}
    if not inside:
        return out
    rows = calls[calls["stack_id"].astype(int).isin(list(inside))]
    for call, sid, io, arg, kind, value in zip(rows["call"], rows["stack_id"], rows["io"], rows["arg"],
                                               rows["kind"], rows["value"], strict=True):
        fn, site = inside[int(sid)]
        entry = out.setdefault(fn, {"site": site})
        if io == "input" and kind == "value":
            name = _ARGS.get((_api(call), str(arg)))
            if name is not None:
                entry.setdefault(name, _value(value))
    for fn, entry in out.items():
        entry["count"] = _runs(rows, fn, inside)
    return out


def _runs(rows: pd.DataFrame, fn: str, inside: dict[int, tuple[str, str]]) -> int:
    """How many times ``fn`` ran in the step: the calls of its first API, counted once each."""
    mine = rows[[inside[int(s)][0] == fn for s in rows["stack_id"]]]
    apis = mine["call"].map(_api)
    return int(mine.loc[apis == apis.iloc[0], "call"].nunique())


def _api(call: Any) -> str:
    """``Tensor.__rtruediv__`` of ``Tensor.__rtruediv__.0.forward``."""
    return re.sub(r"\.\d+\.(forward|backward)$", "", str(call))


def step_setup(folder: Path, rank: int) -> dict[str, Any] | None:
    """``{"randomness": {"sites": [...]}, "clipping": {...}}`` from the dump in ``folder`` (its first recorded
    step on ``rank``; ``clipping`` only where API calls were recorded: at L0 a clip is not visible), or None
    when the dump cannot be read (what compares the runs reports that)."""
    from msprobe_nb.store.dump import load
    try:
        d = load(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    c = d.calls
    if not len(c):
        return {"randomness": {"sites": []}}
    c = _first_step(c, rank)
    frames = d.stack_frames
    out: dict[str, Any] = {"randomness": {"sites": random_sites(c, frames)}}
    if (c["family"] != "Module").any():  # API calls recorded (L1, mix, L2): a clip would show among them
        out["clipping"] = clipping(c, frames)
    return out
