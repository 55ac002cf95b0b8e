"""``compare_setups(a, b)``: every difference between two runs' set-ups, before a single call is compared.

Each side is a set-up record (``collect_setup``'s dict), a ``setup_rank<N>.json`` file, a dump folder or a
monitor folder holding them, or an msprobe ``config_check`` pack (``store/msprobe_config_check.py``). A
dump folder adds the random-API call sites of its first recorded step, read from its calls. The result is
one row per differing item: ``group``, ``item``, ``a``, ``b``, ``expected`` and ``note`` (what the
difference can cause). Expected differences (host names, device names, torch_npu or CUDA on one side
only) come last, with ``expected`` True, and are never counted as causes (docs/setup_check.md).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from msprobe_nb.capture.setup_env import numerics_env

__all__ = ["COLUMNS", "GROUPS", "compare_setups", "load_setup", "setup_differences", "setup_pointer"]

COLUMNS = ["group", "item", "a", "b", "expected", "note"]
GROUPS = ("environment", "versions", "determinism", "model", "optimizer", "data", "randomness")
#: above this many parameters (or batch tensors) differing in one attribute, one row says how many
_ONE_BY_ONE = 8

#: what a difference in each group can cause
NOTES = {
    "environment": "changes kernels, reduction order or determinism",
    "versions": "other kernels and library defaults (attention implementation, fused ops, initialisation)",
    "determinism": "nondeterministic kernels or reduced-precision matmuls (TF32 / HF32): other rounding",
    "seeds": "other random draws: initial weights, dropout masks, data shuffling",
    "model": "another model: outputs differ from the first forward",
    "init": "other initial values: outputs differ from the first forward",
    "optimizer": "the same gradients give other updates: the runs part after the first optimizer step",
    "data": "other inputs: the first forward already differs",
    "randomness": "draws at other places or in other numbers: dropout masks and other random values differ",
    "expected": "differs between machines by nature; not a cause",
    "missing": "recorded on one side only: not compared",
    "clipping": "other gradient clipping: the same gradients give other updates once a norm passes the bound",
    "hash_scheme": "hashed by two versions of the kit: the values are not compared",
}
#: notes for single environment variables
ENV_NOTES = {
    "HCCL_DETERMINISTIC": "nondeterministic HCCL reductions across NPUs",
    "LCCL_DETERMINISTIC": "nondeterministic LCCL reductions across NPUs",
    "CUBLAS_WORKSPACE_CONFIG": "nondeterministic cuBLAS kernels (needed with deterministic algorithms)",
    "CLOSE_MATMUL_K_SHIFT": "another accumulation order in NPU matmuls",
    "NVIDIA_TF32_OVERRIDE": "TF32 matmuls and convolutions switched on or off",
    "OMP_NUM_THREADS": "another CPU thread count: other CPU reduction order",
    "CUDA_LAUNCH_BLOCKING": "synchronous launches: timing only, unless code races",
    "PYTHONHASHSEED": "another str hashing: set and dict orders of strings differ",
}
#: notes for the generators' states at start
SEED_NOTES = {"python": "other draws of Python's random module (shuffling, augmentation), if the run makes any",
              "numpy": "other draws of numpy's global generator (shuffling, augmentation), if the run makes any"}
#: environment variables that differ between machines by nature
_EXPECTED_ENV = re.compile(r"(_PATH|_HOME|_DIR|_ROOT|_VISIBLE_DEVICES|_IFNAME|_IF_IP|_ADDR|_PORT|_DEBUG|_LOG_LEVEL|"
                           r"_LOGS?|_SOCKET_FAMILY|_HOSTNAME|_DEVICE_ID|_RANK_ID|LOCAL_RANK|_TOKEN)$")
_EXPECTED_ITEMS = {("environment", "hostname"), ("environment", "platform"), ("environment", "device"),
                   ("environment", "device_name"), ("environment", "rank")}
_DEVICE_ONLY = {"torch_npu", "cuda", "cudnn", "cann", "triton", "apex", "mindspeed", "flash-attn"}


# ------------------------------------------------------------------------------------------------ inputs
def load_setup(source: Any, rank: int | None = None, randomness: bool = True) -> dict[str, Any]:
    """A set-up record from a dict, a record file, a dump or monitor folder, or an msprobe config_check pack."""
    if isinstance(source, dict):
        return source
    from msprobe_nb.store.setup_store import read_setup
    p = Path(source)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.suffix.lower() == ".zip" or (p.is_dir() and not any(p.glob("setup_rank*.json"))
                                      and any(p.glob("**/*env*.json"))):
        from msprobe_nb.store.msprobe_config_check import read_config_check
        rec = read_config_check(p)
        if "environment" in rec:  # the pack holds every variable: keep those a record of the kit keeps
            rec["environment"]["env"] = numerics_env(rec["environment"]["env"])
        return rec
    if p.is_file() and not re.match(r"setup_rank\d+\.json$", p.name):
        p = p.parent  # a dump's or monitor's rank file: the records beside it
    rec = read_setup(p, rank)
    folder = p if p.is_dir() else p.parent
    if randomness and "randomness" not in rec and any(folder.glob("rank*.h5")):
        from msprobe_nb.analysis.setup_from_calls import step_setup
        got = step_setup(folder, int(rec.get("rank", 0)))
        if got is not None:
            rec["randomness"] = got["randomness"]
            if "clipping" in got:
                rec.setdefault("optimizer", {})["clipping"] = got["clipping"]
    return rec


# ------------------------------------------------------------------------------------------------ rows
def _text(v: Any) -> str:
    if v is None:
        return "<absent>"
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, group: str, item: str, a: Any, b: Any, note: str, expected: bool = False) -> None:
        self.rows.append({"group": group, "item": item, "a": _text(a), "b": _text(b), "expected": bool(expected),
                          "note": NOTES["expected"] if expected and note not in NOTES.values() else note})

    def flat(self, group: str, a: dict, b: dict, note: str, prefix: str = "", expected=lambda k, va, vb: False,
             notes: dict | None = None) -> None:
        for k in sorted(set(a) | set(b), key=str):
            va, vb = a.get(k), b.get(k)
            if va != vb:
                exp = expected(k, va, vb)
                self.add(group, f"{prefix}{k}", va, vb, NOTES["expected"] if exp else (notes or {}).get(k, note), exp)


def _local(version: Any) -> Any:
    return version.split("+")[0] if isinstance(version, str) else version


def _env_rows(r: _Rows, a: dict, b: dict) -> None:
    ea, eb = a.get("environment", {}), b.get("environment", {})
    r.flat("environment", ea.get("env", {}), eb.get("env", {}), NOTES["environment"], "env ",
           lambda k, va, vb: bool(_EXPECTED_ENV.search(k)), ENV_NOTES)
    rest = {k: v for k, v in ea.items() if k != "env"}, {k: v for k, v in eb.items() if k != "env"}
    on_cpu = ea.get("device") == eb.get("device") == "cpu"  # else the CPU threads compute little of the model
    r.flat("environment", *rest, NOTES["environment"],
           expected=lambda k, va, vb: ("environment", k) in _EXPECTED_ITEMS or (k == "torch_threads" and not on_cpu))


def _version_rows(r: _Rows, a: dict, b: dict) -> None:
    r.flat("versions", a.get("versions", {}), b.get("versions", {}), NOTES["versions"],
           expected=lambda k, va, vb: (k in _DEVICE_ONLY and (va is None or vb is None))
           or (k == "torch" and _local(va) == _local(vb)))


def _determinism_rows(r: _Rows, a: dict, b: dict) -> None:
    da, db = a.get("determinism", {}), b.get("determinism", {})
    skip = ("seeds", "seed_all")
    flags_a, flags_b = ({k: v for k, v in d.items() if k not in skip} for d in (da, db))
    r.flat("determinism", flags_a, flags_b, NOTES["determinism"],
           expected=lambda k, va, vb: k.startswith("npu.") and (va is None or vb is None))
    r.flat("determinism", da.get("seeds", {}), db.get("seeds", {}), NOTES["seeds"], "seed ",
           lambda k, va, vb: k == "cuda" and (va is None or vb is None), SEED_NOTES)
    sa, sb = da.get("seed_all") or {}, db.get("seed_all") or {}
    keys = ("seed", "mode")
    r.flat("determinism", {k: sa.get(k) for k in keys if sa}, {k: sb.get(k) for k in keys if sb}, NOTES["seeds"],
           "seed_all ")


def _collapsed(r: _Rows, group: str, what: str, diffs: list[tuple[str, Any, Any]], note: str) -> None:
    """One row per difference, or one row for many of one kind."""
    if len(diffs) <= _ONE_BY_ONE:
        for name, va, vb in diffs:
            r.add(group, f"{what} {name}", va, vb, note)
        return
    names = ", ".join(n for n, _, _ in diffs[:3])
    r.add(group, f"{what} of {len(diffs)} tensors ({names}, ...)", diffs[0][1], diffs[0][2], note)


def _hash_scheme(h: Any) -> str:
    """The hash's scheme: its prefix (``w64``), or ``w32`` for the first version's bare hex."""
    return str(h).split(":", 1)[0] if ":" in str(h) else "w32"


def _tensor_rows(r: _Rows, group: str, label: str, ta: dict, tb: dict, note: str, init_note: str) -> None:
    for attr in ("shape", "dtype", "requires_grad", "hash"):
        diffs = [(n, ta[n].get(attr), tb[n].get(attr)) for n in ta if n in tb and ta[n].get(attr) != tb[n].get(attr)]
        if attr == "hash":
            diffs = [d for d in diffs if "unhashable" not in (d[1], d[2])]
            other = [d for d in diffs if _hash_scheme(d[1]) != _hash_scheme(d[2])]
            if other:  # records of two kit versions: their hashes cannot be compared
                diffs = [d for d in diffs if _hash_scheme(d[1]) == _hash_scheme(d[2])]
                r.add(group, f"{label} hash scheme", _hash_scheme(other[0][1]), _hash_scheme(other[0][2]),
                      NOTES["hash_scheme"], expected=True)
        _collapsed(r, group, f"{label} {attr}", diffs, init_note if attr == "hash" else note)
    for side, x, y in (("a", ta, tb), ("b", tb, ta)):
        only = [(n, "present", None) if side == "a" else (n, None, "present") for n in x if n not in y]
        _collapsed(r, group, f"{label} only in {side}", only, note)


def _module_rows(r: _Rows, ma: dict, mb: dict) -> None:
    """Modules that differ, one row per kind of difference (``LayerNorm eps`` in 5 modules is one row)."""
    kinds: dict[tuple[Any, Any], list[str]] = {}
    for name in list(ma) + [n for n in mb if n not in ma]:
        va, vb = ma.get(name), mb.get(name)
        if va != vb:
            kinds.setdefault((va, vb), []).append(name)
    for (va, vb), names in kinds.items():
        more = f" (+{len(names) - 1} more)" if len(names) > 1 else ""
        r.add("model", f"module {names[0]}{more}", va, vb, NOTES["model"])


def _model_rows(r: _Rows, a: dict, b: dict) -> None:
    ma, mb = a.get("model", {}), b.get("model", {})
    if ma.get("class") != mb.get("class"):
        r.add("model", "class", ma.get("class"), mb.get("class"), NOTES["model"])
    r.flat("model", ma.get("config", {}), mb.get("config", {}), NOTES["model"], "config ")
    _module_rows(r, ma.get("modules", {}), mb.get("modules", {}))
    _tensor_rows(r, "model", "parameter", ma.get("parameters", {}), mb.get("parameters", {}), NOTES["model"],
                 NOTES["init"])
    _tensor_rows(r, "model", "buffer", ma.get("buffers", {}), mb.get("buffers", {}), NOTES["model"], NOTES["init"])


def _optimizer_rows(r: _Rows, a: dict, b: dict) -> None:
    oa, ob = a.get("optimizer", {}), b.get("optimizer", {})
    note = NOTES["optimizer"]
    if oa.get("class") != ob.get("class"):
        r.add("optimizer", "class", oa.get("class"), ob.get("class"), note)
    ga, gb = oa.get("groups", []), ob.get("groups", [])
    if len(ga) != len(gb):
        r.add("optimizer", "parameter groups", len(ga), len(gb), note)
    for i, (x, y) in enumerate(zip(ga, gb)):
        r.flat("optimizer", x, y, note, f"group {i} ")
    for part in ("scheduler", "grad_scaler", "hyperparameters"):
        xa, xb = oa.get(part) or {}, ob.get(part) or {}
        if part != "hyperparameters" and bool(xa) != bool(xb):  # one side has none: one row, not one per key
            r.add("optimizer", part, xa.get("class", "recorded") if xa else "none",
                  xb.get("class", "recorded") if xb else "none", note)
        else:
            r.flat("optimizer", xa, xb, note, f"{part} ")
    if "clipping" in oa and "clipping" in ob:  # seen in a recorded step on both sides
        ca, cb = oa["clipping"], ob["clipping"]
        for fn in sorted(set(ca) | set(cb)):
            xa, xb = ca.get(fn), cb.get(fn)
            if xa is None or xb is None:
                r.add("optimizer", f"clipping {fn}", "none" if xa is None else xa, "none" if xb is None else xb,
                      NOTES["clipping"])
            else:
                r.flat("optimizer", {k: v for k, v in xa.items() if k != "site"},
                       {k: v for k, v in xb.items() if k != "site"}, NOTES["clipping"], f"clipping {fn} ")


def _data_rows(r: _Rows, a: dict, b: dict) -> None:
    ba, bb = a.get("data", {}).get("batches", []), b.get("data", {}).get("batches", [])
    for i, (x, y) in enumerate(zip(ba, bb)):
        _tensor_rows(r, "data", f"batch {i}", x, y, NOTES["data"], NOTES["data"])


def _random_rows(r: _Rows, a: dict, b: dict) -> None:
    def table(rec: dict) -> dict:
        sites = rec.get("randomness", {}).get("sites", [])
        return {f"{s.get('api')} at {s.get('site')}": s.get("count") for s in sites}
    r.flat("randomness", table(a), table(b), NOTES["randomness"])


_BY_GROUP = {"environment": _env_rows, "versions": _version_rows, "determinism": _determinism_rows,
             "model": _model_rows, "optimizer": _optimizer_rows, "data": _data_rows, "randomness": _random_rows}


def compare_setups(a: Any, b: Any, *, rank: int | None = None, rank_b: int | None = None,
                   randomness: bool = True) -> pd.DataFrame:
    """Every set-up difference of ``a`` and ``b`` (records, record files, dump or monitor folders, config_check
    packs): columns group, item, a, b, expected, note; causes first, expected differences after them.
    ``rank`` / ``rank_b``: which rank's record of a folder (default rank 0; ``rank_b`` defaults to ``rank``).
    ``randomness=False``: leave out the random call sites a dump folder's calls would add (no dump is read)."""
    ra = load_setup(a, rank, randomness)
    rb = load_setup(b, rank if rank_b is None else rank_b, randomness)
    r = _Rows()
    for group in GROUPS:
        have_a, have_b = group in ra, group in rb
        if have_a and have_b:
            _BY_GROUP[group](r, ra, rb)
        elif have_a != have_b and group in ("model", "optimizer", "data", "randomness"):
            r.add(group, f"{group} section", "recorded" if have_a else None, "recorded" if have_b else None,
                  NOTES["missing"], expected=True)
    out = pd.DataFrame(r.rows, columns=COLUMNS)
    if len(out):
        out = out.sort_values("expected", kind="stable").reset_index(drop=True)
    out["expected"] = out["expected"].astype(bool)
    return out


def setup_differences(a: Any, b: Any) -> pd.DataFrame | None:
    """``compare_setups`` of two dumps' or monitor records' folders (or files in them), records only (no random
    call sites), when both carry a set-up record; None when either has none or it cannot be read (what
    compares the runs goes on without it)."""
    try:
        ta, tb = (Path(x) for x in (a, b))
        ta, tb = (p if p.is_dir() else p.parent for p in (ta, tb))
        if not any(ta.glob("setup_rank*.json")) or not any(tb.glob("setup_rank*.json")):
            return None
        return compare_setups(ta, tb, randomness=False)  # the records alone: no dump read again
    except (OSError, ValueError, TypeError, KeyError):
        return None


def setup_pointer(a: Any, b: Any) -> str | None:
    """One line for compare() and compare_monitors() when the runs' set-ups differ (expected differences aside)."""
    diff = setup_differences(a, b)
    if diff is None:
        return None
    causes = diff[~diff["expected"]]
    if not len(causes):
        return None
    items = ", ".join(f"{g} {i}" for g, i in zip(causes["group"].head(3), causes["item"].head(3), strict=True))
    more = ", ..." if len(causes) > 3 else ""
    n = len(causes)
    return (f"the runs differ in {n} set-up item{'s' if n != 1 else ''}: {items}{more}; "
            "see compare_setups (the viewer's Set-up tab)")
