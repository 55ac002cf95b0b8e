"""Determinism check: two recordings of one machine and seed should agree bit for bit; list where not.

A call whose inputs are identical in both runs but whose outputs are not is a nondeterministic kernel
(atomics in scatter/index_add, some convolution algorithms, reductions on accelerators...). Random draws
that differ are listed apart: they mean the seeding, not a kernel, differs. Exact equality of the recorded
statistics (and hashes, when recorded) is the test, so the check needs no tolerance.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from msprobe_nb.analysis.divergence import forward_of
from msprobe_nb.capture.random_apis import NOT_DRAWN

if TYPE_CHECKING:
    from msprobe_nb.store.dump import Dump

_KEY = ["step", "rank", "name"]
_EXACT = ["max", "min", "mean", "norm", "nan_count", "posinf_count", "neginf_count"]


def _calls_of(x: str | os.PathLike[str] | Dump | pd.DataFrame) -> pd.DataFrame:
    if isinstance(x, pd.DataFrame):
        return x
    if hasattr(x, "calls"):
        return x.calls
    from msprobe_nb.store.dump import load
    return load(x).calls


def _same(a: pd.Series, b: pd.Series) -> np.ndarray:
    """Elementwise equality where two missing values (NaN / NA) count as equal."""
    a_na, b_na = a.isna().to_numpy(), b.isna().to_numpy()
    av = np.where(a_na, None, a.astype(object).to_numpy())
    bv = np.where(b_na, None, b.astype(object).to_numpy())
    eq = av == bv
    return np.where(a_na | b_na, a_na & b_na, eq).astype(bool)


def check_determinism(run_a: str | os.PathLike[str] | Dump | pd.DataFrame,
                      run_b: str | os.PathLike[str] | Dump | pd.DataFrame) -> pd.DataFrame:
    """Calls whose results differ between two runs of the same script, seed and machine.

    Returns one row per differing call in execution order: ``kind`` is ``nondeterministic`` (inputs
    identical, outputs differ), ``random`` (a random draw whose numbers differ) or ``inherited`` (its
    inputs already differ), with the rows that differ. Empty when the runs are bitwise identical.
    """
    a, b = _calls_of(run_a), _calls_of(run_b)
    cols = _KEY + ["call", "call_index", "io", "kind", "rng", "value", "hash", "shape"] + _EXACT
    m = a[cols].merge(b[cols], on=_KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    same = np.ones(len(m), dtype=bool)
    for col in _EXACT + ["value", "hash", "kind"]:
        same &= _same(m[f"{col}_a"], m[f"{col}_b"])
    same &= np.array([str(x) for x in m["shape_a"]]) == np.array([str(x) for x in m["shape_b"]])
    same &= (m["_merge"] == "both").to_numpy()
    m["same"] = same
    m["call"] = m["call_a"].fillna(m["call_b"])
    m["call_index"] = m["call_index_a"].fillna(m["call_index_b"])
    m["io"] = m["io_a"].fillna(m["io_b"])
    m["rng"] = m["rng_a"].fillna("")
    # a module whose forward made a random draw (nn.Dropout...) differs because of the draw, not a kernel
    drawn = a.loc[~a["rng"].isin(NOT_DRAWN), "parent"]
    random_modules = {p for p in drawn if p}
    random_modules |= {p.replace(".forward.", ".backward.") for p in random_modules}
    # a backward's outputs depend on what its forward saved: its forward's inputs count as its inputs too
    not_out = m["io"] != "output"
    fwd_in_same = m[not_out].groupby(["step", "rank", "call"], sort=False)["same"].all().to_dict()
    out = []
    for (step, rank, call), g in m.groupby(["step", "rank", "call"], sort=False):
        if g["same"].all():
            continue
        inputs_same = bool(g.loc[g["io"] != "output", "same"].all())
        fwd = forward_of(call)
        if fwd is not None:
            inputs_same = inputs_same and fwd_in_same.get((step, rank, fwd), True)
        rng = str(g["rng"].iloc[0] or "")
        if rng not in NOT_DRAWN or call in random_modules:
            kind = "random"
        elif inputs_same:
            kind = "nondeterministic"
        else:
            kind = "inherited"
        out.append({"step": int(step), "rank": int(rank), "call_index": int(g["call_index"].min()), "call": call,
                    "kind": kind, "rng": rng, "rows_differing": list(g.loc[~g["same"], "name"])})
    res = pd.DataFrame(out, columns=["step", "rank", "call_index", "call", "kind", "rng", "rows_differing"])
    return res.sort_values(["step", "rank", "call_index"], kind="stable").reset_index(drop=True)
