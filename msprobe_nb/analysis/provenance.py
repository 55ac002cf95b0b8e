"""Trace a divergence back to the random draws it came from, and say what to change.

Seed 003's story, automated: the first divergence is a ``Tensor.__getitem__`` whose input came from a
``torch.randint`` drawn on the device. Every recorded input knows the call that produced it (the
``producer`` column), so starting from the first divergence we walk producers backwards until we reach
calls that draw random numbers (their ``rng`` column names the generator). Each such draw is reported
with the user's file and line and a concrete fix.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from msprobe_nb.analysis.divergence import Divergence, forward_of, user_frame
from msprobe_nb.capture.random_apis import ATEN_DRAWS, DROPOUT_MODULES, LEFT_AS_DRAWN, NOT_DRAWN, RANDOM_APIS

if TYPE_CHECKING:
    from msprobe_nb.analysis.compare import CompareResult

TRACE_COLUMNS = ["step", "rank", "call", "role", "rng", "file", "line", "code", "note"]


@dataclass
class RandomTrace:
    """The random sources behind a divergence: ``sources`` (the draws) and ``chain`` (divergence -> source)."""

    divergence: Divergence | None
    sources: pd.DataFrame
    chain: pd.DataFrame
    message: str
    advice: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return not self.sources.empty

    def __str__(self) -> str:
        lines = [self.message]
        for r in self.sources.itertuples():
            where = f"{r.file}:{r.line}" if r.file else "(no stack recorded)"
            lines.append(f"  random draw {r.call} on {r.rng or 'unknown generator'} at {where}")
            if r.code:
                lines.append(f"      {r.code}")
            if r.note:
                lines.append(f"      {r.note}")
        lines += [f"  fix: {a}" for a in self.advice]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html
        body = "<br>".join(html.escape(x) for x in str(self).splitlines())
        return f"<div style='font-family:monospace'>{body}</div>"


def _advice(op: str, family: str, rng: str) -> str:
    if rng == "python" or rng == "numpy":
        return (f"{family}.{op}: seed Python's and numpy's generators identically on both machines "
                "(msprobe_nb.seed_all(seed)) or move the draw out of the compared region")
    if rng.endswith(LEFT_AS_DRAWN):
        return (f"{op}: drawn inside an activation checkpoint that dropout_off and host_random cannot reach; "
                "record at L1 or mix with use_reentrant=True, or without checkpointing, while aligning")
    if rng.startswith("custom"):
        return f"{op}: the draw uses your own torch.Generator: seed it identically on both machines"
    if op == "scaled_dot_product_attention":
        return (f"{op}: its dropout mask is drawn inside the attention kernel; switch dropout off while aligning "
                "(dropout_off=True / --dropout-off sets dropout_p=0)")
    if "dropout" in op.lower():
        return (f"{op}: switch dropout off while aligning (dropout_off=True / --dropout-off), or draw the masks "
                "on the host (host_random=True / --host-random)")
    if op in ("bernoulli", "bernoulli_"):  # a drop-path or hand-made mask: dropout_off does not reach it
        return (f"{op}: record with host_random=True (--host-random) so the mask comes from one seeded CPU "
                "generator on both machines (dropout_off only zeroes dropout APIs' p, not this draw)")
    if rng.startswith("host"):
        return f"{op}: already drawn on the host; check that both runs use the same seed"
    return (f"{op}: draw it on the host and move it, e.g. torch.{op}(..., device='cpu').to(device), or record "
            "with host_random=True (--host-random) so every device draw comes from one seeded CPU generator")


def _seed_of(state: str) -> str:
    return state.split()[0] if state else ""


def trace_randomness(result: CompareResult, divergence: Divergence | None = None,
                     max_calls: int = 10_000) -> RandomTrace:
    """Walk back from the first divergence of ``result`` (a CompareResult) to the random draws at its root."""
    d = divergence if divergence is not None else result.first_divergence()
    empty = pd.DataFrame(columns=TRACE_COLUMNS)
    if d is None:
        return RandomTrace(None, empty, empty, "the runs agree: nothing to trace")
    ctx = result._ctx
    npu = ctx.npu.calls
    g = npu[(npu["step"] == d.step) & (npu["rank"] == d.rank)]
    bench = ctx.bench.calls
    gb = bench[(bench["step"] == d.step) & (bench["rank"] == d.rank)] if "step" in bench else bench
    first = g.drop_duplicates("call").set_index("call")
    bench_first = gb.drop_duplicates("call").set_index("call") if len(gb) else None
    inputs = g[g["io"] == "input"]
    by_call: dict[str, list[tuple[str, str]]] = {}  # call -> [(row name, producer)], built once
    for call, name, producer in zip(inputs["call"], inputs["name"], inputs["producer"]):
        by_call.setdefault(call, []).append((name, producer or ""))
    diverging = set()
    if "diverges" in result.columns:
        t = result[(result["step"] == d.step) & (result["rank"] == d.rank) & result["diverges"]]
        diverging = set(t["name"])

    own = g[["call", "name", "io"]]
    diverging_io: dict[str, set[str]] = {}
    for call, name, io in zip(own["call"], own["name"], own["io"]):
        if name in diverging:
            diverging_io.setdefault(call, set()).add("output" if io in ("output", "parameters_grad") else "input")

    def is_random(call: str) -> bool:
        """A draw: the kit recorded its generator, or (msprobe dumps, which do not) its API draws."""
        if call not in first.index:
            return False
        rng = str(first.at[call, "rng"] or "")
        if rng:
            return rng not in NOT_DRAWN
        key = (str(first.at[call, "family"]), str(first.at[call, "op"]))
        return key in RANDOM_APIS or key in DROPOUT_MODULES or key in ATEN_DRAWS

    def state_differs(call: str) -> bool:
        ns = str(first.at[call, "rng_state"] or "")
        bs = str(bench_first.at[call, "rng_state"] or "") if bench_first is not None and call in bench_first.index \
            else ""
        return bool(ns and bs and ns != bs)

    def blamed(call: str) -> bool:
        """A draw is a source only where it makes the difference: its own output diverges while its inputs
        agree (a dropout fed diverging activations passes them on, whatever its mask), or its generator
        state differs between the runs (a permutation's statistics agree even when its order does not)."""
        if not is_random(call):
            return False
        io = diverging_io.get(call, set())
        return ("output" in io and "input" not in io) or state_differs(call)

    def preds(call: str) -> list[str]:
        """Producers of the call's diverging inputs (of all its inputs when none diverges or none is known)."""
        rows = by_call.get(call, [])
        bad = [p for name, p in rows if name in diverging and p]
        ps = list(dict.fromkeys(bad or [p for _, p in rows if p]))
        fwd = forward_of(call)
        if fwd and fwd in first.index:  # a backward call: its forward decides (dropout masks, ...)
            ps = [fwd] + ps
        return ps

    start = d.call
    parent: dict[str, str | None] = {start: None}
    queue = deque([start])
    found: list[str] = []
    while queue and len(parent) < max_calls:
        c = queue.popleft()
        if blamed(c):
            found.append(c)
            continue
        for p in preds(c):
            if p not in parent:
                parent[p] = c
                queue.append(p)

    frames = getattr(result, "_stack_of", None)

    def row(call: str, role: str, note: str = "") -> dict:
        stack = frames(call, d.step, d.rank) if frames else []
        if not stack and forward_of(call):
            stack = frames(forward_of(call), d.step, d.rank) if frames else []
        where, code = user_frame(stack)
        file, _, line = (where or "").rpartition(":")
        rng = str(first.at[call, "rng"]) if call in first.index else ""
        return {"step": d.step, "rank": d.rank, "call": call, "role": role, "rng": rng, "file": file,
                "line": int(line) if line.isdigit() else None, "code": code or "", "note": note}

    sources, advice = [], []
    for call in sorted(found, key=lambda c: int(first.at[c, "call_index"])):
        note = ""
        ns = str(first.at[call, "rng_state"] or "")
        if bench_first is not None and call in bench_first.index:
            bs = str(bench_first.at[call, "rng_state"] or "")
            if ns and bs and ns == bs:
                note = ("same generator seed and state on both machines, different numbers: the device "
                        "generators differ between machines (same seed, different hardware)")
            elif ns and bs and _seed_of(ns) != _seed_of(bs):
                note = f"generators seeded differently ({_seed_of(ns)} vs {_seed_of(bs)}): use one seed (seed_all)"
            elif ns and bs:
                note = "generator state differs before this draw: earlier draws or seeds differ between the runs"
        sources.append(row(call, "random draw", note))
        advice.append(_advice(str(first.at[call, "op"]), str(first.at[call, "family"]), sources[-1]["rng"]))

    chain: list[dict] = []
    for src in [s["call"] for s in sources][:1] or []:
        at: str | None = src
        path: list[str] = []
        while at is not None:
            path.append(at)
            at = parent.get(at)
        for i, call in enumerate(path):
            role = "random draw" if i == 0 else ("first divergence" if call == start else "carries it")
            chain.append(row(call, role))
    if not chain:
        chain = [row(start, "first divergence")]
    if sources:
        names = ", ".join(s["call"] for s in sources)
        msg = f"{d.call} diverges because of random draw(s): {names}"
    elif d.kind == "argument":
        msg = (f"{d.call} is called with a different non-tensor argument on the two sides and no random draw "
               "feeds it: a difference in the code or configuration, not randomness")
    elif d.kind == "call":
        msg = (f"{d.call} computes differently with agreeing inputs and no random draw feeds it: a numerical "
               "(precision or kernel) difference, not randomness")
    else:
        msg = (f"{d.call} receives diverging inputs, and no recorded random draw produced them: the difference "
               "comes from data, parameters or an unrecorded operation")
    return RandomTrace(d, pd.DataFrame(sources, columns=TRACE_COLUMNS), pd.DataFrame(chain, columns=TRACE_COLUMNS),
                       msg, list(dict.fromkeys(advice)))
