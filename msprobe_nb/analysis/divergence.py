"""First divergence: the earliest call whose inputs agree and whose outputs do not.

A row *diverges* when it is matched and its scale-aware relative error (column ``err``) exceeds
``Thresholds.diverge_rtol`` (hard mismatches such as shape or NaN/inf positions count as infinite). Calls
are scanned in execution order. If the first call with any diverging row already receives diverging inputs,
the difference entered from outside the recorded calls (data loading, parameters, or an unrecorded
operation) and the report says so.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .grading import INPUT_IO, OUTPUT_IO, Thresholds

_FRAME = re.compile(r'File "?(?P<path>.+?)"?, line (?P<line>\d+)(?:, in (?P<func>[^,\n]+))?')
_INTERNAL = ("site-packages", "dist-packages", "/torch/", "\\torch\\", "msprobe_nb/capture/", "msprobe_nb/debugger.py",
             "msprobe_nb/magics.py", "/msprobe/", "\\msprobe\\",
             "<frozen ", "/lib/python3", "<string>")


@dataclass
class Divergence:
    """Where two runs first part ways (one (step, rank) pair)."""

    call: str
    step: int
    rank: int
    call_index: int
    #: "call" (inputs agree, outputs diverge), "argument" (tensor inputs agree, a non-tensor argument differs)
    #: "extra" (a call made by the NPU run only, whose products diverge downstream) or "inputs" (the call
    #: already receives diverging inputs from outside the recorded calls)
    kind: str
    message: str
    rows: pd.DataFrame  #: the call's diverging rows with their metrics
    frame: str | None = None  #: "file:line" of the first user frame of the call's stack
    frame_source: str | None = None
    stack: list[str] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)  #: downstream calls whose inputs diverge, execution order
    chain_table: pd.DataFrame = field(default_factory=pd.DataFrame)
    previous_call: str | None = None
    modules: list[str] = field(default_factory=list)  #: enclosing module calls, innermost first

    @property
    def outputs(self) -> list[tuple[str, float]]:
        """(row name, err) of the diverging output rows."""
        o = self.rows[self.rows["io"].isin(OUTPUT_IO)]
        return list(zip(o["name"], o["err"].astype(float)))

    @property
    def inputs(self) -> list[tuple[str, float]]:
        """(row name, err) of the diverging input rows."""
        o = self.rows[self.rows["io"].isin(INPUT_IO)]
        return list(zip(o["name"], o["err"].astype(float)))

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call, "step": self.step, "rank": self.rank, "call_index": self.call_index,
                "kind": self.kind, "message": self.message, "frame": self.frame, "frame_source": self.frame_source,
                "outputs": self.outputs, "inputs": self.inputs, "previous_call": self.previous_call,
                "modules": list(self.modules), "chain": list(self.chain)}

    def __str__(self) -> str:
        lines = [f"first divergence: {self.call} (step {self.step}, rank {self.rank}, call #{self.call_index})",
                 f"  {self.message}"]
        if self.frame:
            lines.append(f"  at {self.frame}" + (f": {self.frame_source}" if self.frame_source else ""))
        if self.modules:
            lines.append(f"  inside {self.modules[0]}" + (f" (+{len(self.modules) - 1} outer)" if len(self.modules) > 1
                                                          else ""))
        for what, items in (("output", self.outputs), ("input", self.inputs)):
            for name, err in items[:8]:
                lines.append(f"  {what} {name}: relative error {err:.3g}")
        if self.chain:
            more = f" ... (+{len(self.chain) - 5} more)" if len(self.chain) > 5 else ""
            lines.append(f"  flows into {len(self.chain)} later call(s): {', '.join(self.chain[:5])}{more}")
        return "\n".join(lines)

    __repr__ = __str__


def is_user_file(path: str) -> bool:
    """True for the user's own code: not torch, not site-packages, not the kit's recording machinery."""
    return not any(s in path for s in _INTERNAL)


def parse_frame(frame: str) -> tuple[str, int, str, str] | None:
    """(file, line, function, source line) of one msprobe-style frame string; None if it is not one."""
    m = _FRAME.search(frame)
    if not m:
        return None
    code = frame.split("\n", 1)[1].strip() if "\n" in frame else ""
    return m.group("path"), int(m.group("line")), (m.group("func") or "").strip(), code


def user_frame(stack: list[str]) -> tuple[str | None, str | None]:
    """("file:line", source line) of the first frame outside torch, site-packages and msprobe_nb."""
    for fr in stack or []:
        parsed = parse_frame(fr)
        if parsed is None or not is_user_file(parsed[0]):
            continue
        path, line, _, code = parsed
        return f"{path}:{line}", (code if "\n" in fr else None)
    return None, None


def forward_of(call: str) -> str | None:
    """The forward call a backward call comes from (same counter), or None."""
    if ".backward" not in call:
        return None
    head, _, tail = call.rpartition(".backward")
    return f"{head}.forward{tail}"


def find_divergences(t: pd.DataFrame, th: Thresholds, stack_of: Callable[[str, int, int], list[str]] | None = None,
                     mode: str = "statistics") -> list[Divergence]:
    """The first divergence of every (step, rank) pair of a compare table, in (step, rank) order."""
    if t.empty:
        return []
    out = []
    for _, g in t.groupby("pair", sort=True):
        d = _first_in_group(g, th, stack_of, mode)
        if d is not None:
            out.append(d)
    return out


def _one_sided_arguments(g: pd.DataFrame) -> np.ndarray:
    """Non-tensor input rows that only one side has, in a call both sides made: an argument passed on one
    side only (``F.gelu(x, approximate='tanh')`` against ``F.gelu(x)``) is an argument that differs."""
    if "kind" not in g.columns:
        return np.zeros(len(g), dtype=bool)
    match = g["match"].astype(object).to_numpy()
    one = (match != "matched") & (g["kind"].astype(object).to_numpy() == "value") \
        & np.isin(g["io"].astype(object).to_numpy(), INPUT_IO)
    if one.any():
        calls = g["call"].astype(object).to_numpy()
        one &= np.isin(calls, np.unique(calls[match == "matched"]))
    return one


def _first_in_group(g: pd.DataFrame, th: Thresholds, stack_of: Callable | None, mode: str) -> Divergence | None:
    full = g  # with the bench-only rows, for a call only the bench run makes
    one = _one_sided_arguments(g)
    if one.any():  # bench-only argument rows stay, placed at their call's position in the NPU run
        g = g.copy()
        g["diverges"] = g["diverges"].to_numpy(dtype=bool) | one
        npu = g["match"] != "bench_only"
        first = g[npu].drop_duplicates("call").set_index("call")["call_index"]
        bench_args = one & ~npu.to_numpy()
        g.loc[bench_args, "call_index"] = g.loc[bench_args, "call"].map(first).to_numpy(dtype=np.int64)
        g = g[npu.to_numpy() | one]
    else:
        g = g[g["match"] != "bench_only"]
    if g.empty:
        return None
    ci = g["call_index"].to_numpy(dtype=np.int64, na_value=-1)
    order = np.argsort(ci, kind="stable")
    g = g.iloc[order]
    ci = ci[order]
    calls = g["call"].astype(object).to_numpy()
    io = g["io"].astype(object).to_numpy()
    op = g["op"].astype(object).fillna("").to_numpy() if "op" in g.columns else np.full(len(g), "", dtype=object)
    div = g["diverges"].to_numpy(dtype=bool) & ~np.isin(op, np.array(th.diverge_skip_ops, dtype=object))
    codes, uniq = pd.factorize(calls)  # order of first appearance == execution order
    is_in = np.isin(io, INPUT_IO)
    is_out = np.isin(io, OUTPUT_IO)
    ncall = len(uniq)
    in_div = np.zeros(ncall, dtype=bool)
    out_div = np.zeros(ncall, dtype=bool)
    in_div[codes[div & is_in]] = True
    out_div[codes[div & is_out]] = True
    hit = np.flatnonzero(in_div | out_div)
    if len(hit) == 0:
        return None
    code_of = {c: i for i, c in enumerate(uniq)}  # call name -> its code, for the producer walks
    parents = _parent_codes(g, codes, code_of)
    c0 = _innermost(hit, parents)
    producer = g["producer"].astype(object).fillna("").to_numpy() if "producer" in g.columns else None
    kinds = g["kind"].astype(object).fillna("").to_numpy() if "kind" in g.columns else np.full(len(g), "tensor")
    rows0 = np.flatnonzero(codes == c0)
    drawn = _draw_behind(c0, rows0, div, is_in, producer, codes, code_of, g)
    if drawn is not None:
        c0, rows0 = drawn, np.flatnonzero(codes == drawn)
    extra = None if drawn is not None or not in_div[c0] else _extra_behind(c0, rows0, div, is_in, producer,
                                                                                          codes, code_of, g)
    if extra is None and drawn is None and in_div[c0]:  # a backward: who consumed its forward's output?
        extra = code_of.get(_consumer_only(full, str(uniq[c0]), "npu") or "")
    if extra is not None:
        consumer, c0, rows0 = str(uniq[c0]), extra, np.flatnonzero(codes == extra)
    root = str(uniq[c0])
    step, rank = int(g["step"].iat[rows0[0]]), int(g["rank"].iat[rows0[0]])
    prev = str(uniq[c0 - 1]) if c0 > 0 else None
    bad_in = rows0[div[rows0] & is_in[rows0]]
    own_args = len(bad_in) > 0 and bool(np.all(kinds[bad_in] == "value"))
    if drawn is None and extra is None and len(bad_in) and not own_args:
        bench_extra = _bench_extra(full, g, root, bad_in, ci, stack_of)
        if bench_extra is not None:
            later, rows = _chain(codes, uniq, c0, div, is_in, producer, g, ci)
            bench_extra.chain, bench_extra.chain_table = [root] + later, pd.DataFrame(rows)
            return bench_extra

    if extra is not None:
        kind = "extra"
        msg = (f"this call is made in the NPU run only (the bench run has no such call), and what it produces "
               f"reaches {consumer}, whose inputs diverge: the two runs' code differs here")
    elif drawn is not None:
        kind = "call"
        msg = ("a random draw whose generator state differs between the runs; its statistics agree (a permutation "
               "has the same max, min, mean and norm) but the call that consumes it diverges: this draw is where "
               "the runs part ways")
    elif not in_div[c0]:
        kind = "call"
        msg = "inputs agree within tolerance, outputs diverge: this call is where the runs part ways"
    elif own_args:
        kind = "argument"
        args = ", ".join(f"{_arg_label(g, i)} {_side_value(g, i, 'npu')} vs {_side_value(g, i, 'bench')}"
                         for i in bad_in[:4])
        msg = (f"its tensor inputs agree, but its own non-tensor argument(s) differ ({args}): the call is made "
               "differently, and this is where the runs part ways")
    else:
        kind = "inputs"
        prods = sorted({p for p in (producer[bad_in] if producer is not None else []) if p})
        if c0 == 0:
            msg = ("the very first recorded call already receives diverging inputs: the difference comes from "
                   "data loading / the model inputs or initial parameters (treated as the root)")
        elif prods:
            msg = (f"inputs diverge although {', '.join(prods)} produced them and every earlier call agrees: "
                   "an unrecorded operation in between changed them (treated as the root)")
        else:
            msg = ("inputs diverge although every earlier recorded call agrees: the difference enters from "
                   f"outside the recorded calls (data, parameters, or an unrecorded operation after {prev}); "
                   "this call is treated as the root")
    cols = [c for c in ("name", "io", "arg", "err", "result", "max_rel", "min_rel", "mean_rel", "norm_rel",
                        "near_zero", "cosine", "max_abs_err", "max_rel_err", "rel_l2_err", "rmse") if c in g.columns]
    if mode != "tensor":
        cols = [c for c in cols if c not in ("cosine", "max_abs_err", "max_rel_err", "rel_l2_err", "rmse")]
    rows = g.iloc[rows0[div[rows0]]][cols].reset_index(drop=True)

    stack: list[str] = []
    note = ""
    if stack_of is not None:
        stack = list(stack_of(root, step, rank) or [])
        if not stack and forward_of(root):
            stack = list(stack_of(forward_of(root), step, rank) or [])
            note = " (stack of the forward call)"
    frame, src = user_frame(stack)

    chain_calls, chain_rows = _chain(codes, uniq, c0, div, is_in, producer, g, ci)
    return Divergence(call=root, step=step, rank=rank, call_index=int(ci[rows0[0]]), kind=kind,
                      message=msg + note, rows=rows, frame=frame, frame_source=src, stack=stack,
                      chain=chain_calls, chain_table=pd.DataFrame(chain_rows), previous_call=prev,
                      modules=_modules(g, root))


def _parent_codes(g: pd.DataFrame, codes: np.ndarray, code_of: dict[str, int]) -> np.ndarray:
    """Code of each call's enclosing call (its module, from the ``parent`` column); -1 for none or unknown."""
    out = np.full(len(code_of), -1, dtype=np.int64)
    if "parent" not in g.columns:
        return out
    _, first = np.unique(codes, return_index=True)
    parent = g["parent"].astype(object).fillna("").to_numpy()[first]
    for i, p in enumerate(parent):
        out[i] = code_of.get(p, -1) if p else -1
    return out


def _innermost(hit: np.ndarray, parents: np.ndarray) -> int:
    """The innermost call among the diverging ones: the first in execution order, then, while a call nested
    inside it diverges too, the first such call. A module opens before its children, so its row comes first;
    the call that actually changed is the deepest one the difference can be pinned on."""
    root = int(hit[0])
    for c in hit[1:]:
        p, depth = int(parents[c]), 0
        while p >= 0 and depth < 256:
            if p == root:
                root = int(c)
                break
            p, depth = int(parents[p]), depth + 1
    return root


def _draw_behind(c0: int, rows0: np.ndarray, div: np.ndarray, is_in: np.ndarray, producer: np.ndarray | None,
                 codes: np.ndarray, code_of: dict[str, int], g: pd.DataFrame, limit: int = 2000) -> int | None:
    """A random draw upstream of call ``c0`` whose generator state differs between the runs although its own
    statistics agree (a permutation keeps max, min, mean and norm, and so do the rows it reorders): that draw
    is the root, not the first call whose statistics show the difference. Walks the producers of ``c0``'s
    inputs (its diverging ones, where any diverges) back through calls that agree; None when no such draw."""
    if producer is None or "npu_rng_state" not in g.columns:
        return None
    ns = g["npu_rng_state"].astype(object).fillna("").to_numpy()
    bs = g["bench_rng_state"].astype(object).fillna("").to_numpy()
    if not (ns != "").any():
        return None
    inputs: dict[int, list[str]] = {}
    for i in np.flatnonzero(is_in & (producer != "")):
        inputs.setdefault(int(codes[i]), []).append(producer[i])
    state_differs = set(codes[(ns != "") & (bs != "") & (ns != bs)].tolist())
    if not state_differs:
        return None
    bad = rows0[div[rows0] & is_in[rows0]]
    queue = [p for p in dict.fromkeys(producer[bad if len(bad) else rows0[is_in[rows0]]]) if p]
    seen = set(queue)
    while queue and len(seen) < limit:
        c = code_of.get(queue.pop(0))
        if c is None:
            continue
        if c in state_differs:
            return c
        for p in inputs.get(c, ()):
            if p not in seen:
                seen.add(p)
                queue.append(p)
    return None


def _extra_behind(c0: int, rows0: np.ndarray, div: np.ndarray, is_in: np.ndarray, producer: np.ndarray | None,
                  codes: np.ndarray, code_of: dict[str, int], g: pd.DataFrame) -> int | None:
    """The earliest call made in the NPU run only (no row of it matched) in the chain of producers of call
    ``c0``'s diverging inputs: a cast, a round trip or an extra step that only one side's code makes."""
    if producer is None or "match" not in g.columns:
        return None
    match = g["match"].astype(object).to_numpy()
    bad = rows0[div[rows0] & is_in[rows0]]
    found = None
    todo = [p for p in dict.fromkeys(producer[bad]) if p]
    seen = set(todo)
    while todo and len(seen) < 256:
        p = todo.pop(0)
        c = code_of.get(p)
        if c is None:
            continue
        at = np.flatnonzero(codes == c)
        if not len(at) or not np.all(match[at] == "npu_only"):
            continue
        if found is None or c < found:
            found = c
        for q in producer[at[is_in[at]]]:
            if q and q not in seen:
                seen.add(q)
                todo.append(q)
    return found


def _bench_extra(full: pd.DataFrame, g: pd.DataFrame, consumer: str, bad_in: np.ndarray, ci: np.ndarray,
                 stack_of: Callable | None) -> Divergence | None:
    """A call made in the bench run only behind ``consumer``'s diverging inputs, as a divergence: the earliest
    bench-only call in the chain of the bench run's producers of those inputs (the mirror of
    :func:`_extra_behind`; the bench scaling its logits by 1.001 is a code difference, whichever side has it)."""
    if "bench_producer" not in full.columns or "bench_call" not in full.columns:
        return None
    match = full["match"].astype(object).to_numpy()
    bcall = full["bench_call"].astype(object).fillna("").to_numpy()
    only = set(bcall[match == "bench_only"]) - set(bcall[match != "bench_only"]) - {""}
    if not only:
        return None
    bprod = full["bench_producer"].astype(object).fillna("").to_numpy()
    bci = full["bench_call_index"].to_numpy(dtype=np.int64, na_value=-1)
    is_in = np.isin(full["io"].astype(object).to_numpy(), INPUT_IO)
    found, todo = None, [p for p in dict.fromkeys(g["bench_producer"].astype(object).fillna("").to_numpy()[bad_in])
                         if p in only]
    seen = set(todo)
    while todo and len(seen) < 256:
        p = todo.pop(0)
        at = np.flatnonzero(bcall == p)
        if found is None or bci[at].min() < bci[bcall == found].min():
            found = p
        for q in bprod[at[is_in[at]]]:
            if q in only and q not in seen:
                seen.add(q)
                todo.append(q)
    if found is None:
        found = _consumer_only(full, consumer, "bench")
    if found is None:
        return None
    fwd = forward_of(found)
    root = fwd if fwd is not None and fwd in only else found  # a bench-only backward: its forward's code differs
    at = np.flatnonzero(bcall == root)
    after = (match == "matched") & (bci > bci[at].min())
    cidx = full["call_index"].to_numpy(dtype=np.int64, na_value=-1)
    where = int(cidx[after].min()) if after.any() else int(ci.max())
    step, rank = int(full["step"].iat[at[0]]), int(full["rank"].iat[at[0]])
    bstep = int(full["bench_step"].iat[at[0]]) if "bench_step" in full.columns else step
    brank = int(full["bench_rank"].iat[at[0]]) if "bench_rank" in full.columns else rank
    stack: list[str] = []
    if stack_of is not None:
        try:
            stack = list(stack_of(root, bstep, brank, side="bench") or [])
        except TypeError:  # a stack source that knows the NPU run only
            stack = []
    frame, src = user_frame(stack)
    msg = (f"this call is made in the bench run only (the NPU run has no such call), and what it produces "
           f"reaches {consumer}, whose inputs diverge: the two runs' code differs here")
    return Divergence(call=root, step=step, rank=rank, call_index=where, kind="extra", message=msg,
                      rows=full.iloc[:0][["name", "io", "err"]].reset_index(drop=True), frame=frame, frame_source=src,
                      stack=stack, previous_call=None, modules=[])


def _consumer_only(full: pd.DataFrame, call: str, side: str) -> str | None:
    """For a backward ``call`` (whose gradient inputs have no recorded producer): the earliest call made on
    ``side`` only that consumed its forward's output there. Its backward is what sent the diverging gradient."""
    fwd = forward_of(call)
    col, prod_col, label = ("call", "producer", "npu_only") if side == "npu" else \
        ("bench_call", "bench_producer", "bench_only")
    if fwd is None or prod_col not in full.columns or col not in full.columns:
        return None
    match = full["match"].astype(object).to_numpy()
    names = full[col].astype(object).fillna("").to_numpy()
    if side == "bench":  # the bench run's name of the forward
        at = np.flatnonzero((full["call"].astype(object).to_numpy() == fwd) & (match == "matched"))
        if not len(at):
            return None
        fwd = names[at[0]]
    only = (match == label) & ~np.isin(names, names[match == "matched"])
    hit = only & (full[prod_col].astype(object).fillna("").to_numpy() == fwd) & \
        np.isin(full["io"].astype(object).to_numpy(), INPUT_IO)
    if not hit.any():
        return None
    idx = full["call_index" if side == "npu" else "bench_call_index"].to_numpy(dtype=np.int64, na_value=-1)
    return str(names[np.flatnonzero(hit)[np.argmin(idx[hit])]])


def _arg_label(g: pd.DataFrame, i: int) -> str:
    arg = str(g["arg"].iat[i]) if "arg" in g.columns else ""
    return f"argument {arg}" if arg else str(g["name"].iat[i])


def _side_value(g: pd.DataFrame, i: int, side: str) -> str:
    col = f"{side}_value"
    if col not in g.columns:
        return "?"
    if "match" in g.columns and g["match"].iat[i] == ("bench_only" if side == "npu" else "npu_only"):
        return "(not passed)"
    return repr(g[col].iat[i])


def _modules(g: pd.DataFrame, call: str) -> list[str]:
    """Enclosing module calls of ``call`` from the ``parent`` column, innermost first."""
    if "parent" not in g.columns:
        return []
    first = g.drop_duplicates("call")
    parent = dict(zip(first["call"].astype(object), first["parent"].astype(object).fillna("")))
    out: list[str] = []
    p = parent.get(call, "")
    while p and p not in out and p != call:
        out.append(p)
        p = parent.get(p, "")
    return out


def _chain(codes: np.ndarray, uniq: np.ndarray, c0: int, div: np.ndarray, is_in: np.ndarray,
           producer: np.ndarray | None, g: pd.DataFrame, ci: np.ndarray) -> tuple[list[str], list[dict]]:
    """Later calls with a diverging input that comes from the root or the chain (provenance when known)."""
    bad = div & is_in & (codes > c0)
    idx = np.flatnonzero(bad)
    if len(idx) == 0:
        return [], []
    err = g["err"].to_numpy(dtype=float, na_value=np.nan)
    names = g["name"].astype(object).to_numpy()  # one array, not a pandas lookup per chained call
    reached = {str(uniq[c0])}
    calls: list[str] = []
    rows: list[dict] = []
    last = -1
    for i in idx[np.argsort(codes[idx], kind="stable")]:
        c = int(codes[i])
        name = str(uniq[c])
        p = producer[i] if producer is not None else ""
        if c == last or not (not p or p in reached):
            continue
        last = c
        reached.add(name)
        calls.append(name)
        rows.append({"call": name, "call_index": int(ci[i]), "via": str(names[i]),
                     "producer": p, "err": float(err[i])})
    return calls, rows
