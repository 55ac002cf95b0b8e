"""The backward of one API call, read from the autograd nodes the call made.

A call's backward input is the gradient of each of its outputs; its backward output is the gradient of
each of its tensor inputs (weights and biases included) that flows from this call alone. One call often
makes several nodes (``F.linear`` on a 3-d input: a view, an addmm, a transpose, another view), so the
first output's node alone would show the gradient of an internal view. Instead the call's subgraph is
walked right after the forward: from the outputs' nodes back to the edges that leave it, into the nodes
of its inputs (their ``grad_fn`` before the call, or the ``AccumulateGrad`` of a leaf). Post-hooks on
the nodes that own those edges read the gradients as autograd computes them. Only node hooks are used:
no identity node is inserted and no gradient is changed, so the model's results stay bitwise the same.

Nodes made by the call have sequence numbers from the one the thread had when the call began on
(``torch._C._autograd._get_sequence_nr``); the walk never enters an older node, so a tensor the call
captured from elsewhere does not drag the rest of the graph in.

``capture/_api_backward.c`` does the same walk and hooks where it is built (``grad_hooks`` takes it); these
classes are the fallback and the reference its tests diff against.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from msprobe_nb.capture.leaves import POSITIONS, leaves

_sequence_nr = torch._C._autograd._get_sequence_nr
_AccumulateGrad = torch._C._functions.AccumulateGrad  # type: ignore[attr-defined]  # not in torch's stubs
_Tensor = torch.Tensor
_NESTED = (list, tuple, dict)
#: the most nodes one call's subgraph may have before the walk gives up on its input gradients
MAX_NODES = 256


def grad_inputs(args: tuple, kwargs: dict) -> list[tuple[str, Any]] | None:
    """(row path, key) of every tensor input that requires grad, taken before the call runs (an in-place
    call replaces its input's ``grad_fn``); None when none does. A key is (id of the gradient edge's node or
    leaf, output_nr or -1, the node or None, the tensor). Paths are the forward input rows' paths, so
    ``backward.output.1`` is the gradient of ``forward.input.1``."""
    out = None
    for items in (args, kwargs):
        if not items:
            continue
        # flat tensor arguments (the common case) need no walk: their paths are positions, as leaves() gives
        # them; nested ones (namedtuples too: leaves() walks their fields) and long ones go through leaves()
        pairs: Iterable[tuple[str, Any]]
        if type(items) is dict or len(items) > len(POSITIONS) or any(isinstance(a, _NESTED) for a in items):
            pairs = leaves(items)
        else:
            pairs = zip(POSITIONS, items)
        for path, t in pairs:
            if isinstance(t, _Tensor) and t.requires_grad:
                fn = t.grad_fn
                key = (id(fn), t.output_nr, fn, t) if fn is not None else (id(t), -1, None, t)
                if out is None:
                    out = []
                out.append((path, key))
    return out


def edge_key(node: Any, output_nr: int) -> tuple[int, int]:
    """The key of the edge (``node``, ``output_nr``): a leaf's accumulator stands for the leaf."""
    if type(node) is _AccumulateGrad:
        return id(node.variable), -1
    return id(node), output_nr


class CallGraph:
    """The autograd subgraph of one call: which node gives each output's gradient, which node edges carry
    each input's gradient. Built once, right after the call's forward."""

    __slots__ = ("outputs", "edges", "counts", "_nodes")

    def __init__(self) -> None:
        self.outputs: dict[int, tuple[Any, list[tuple[str, int]]]] = {}  # id(node) -> (node, [(path, nr)])
        self.edges: dict[int, tuple[Any, list[tuple[int, int]]]] = {}  # id(node) -> (node, [(edge, input)])
        self.counts: list[int] = []  # per input: edges that carry its gradient
        self._nodes: list[Any] | None = None

    @classmethod
    def of(cls, out: Any, inputs: list[tuple[str, Any]] | None, seq0: int) -> CallGraph | None:
        """The subgraph from ``out`` back to ``inputs`` (from :func:`grad_inputs`), or None when the call
        made no node (its outputs are inputs passed through, or need no gradient)."""
        g = cls()
        items = leaves(out) if isinstance(out, (tuple, list, dict)) else (("0", out),)
        for path, t in items:
            if isinstance(t, _Tensor):
                fn = t.grad_fn
                if fn is not None and fn._sequence_nr() >= seq0:
                    g.outputs.setdefault(id(fn), (fn, []))[1].append((path, t.output_nr))
        if not g.outputs:
            return None
        wanted: dict[tuple[int, int], int] = {}
        for j, (_, key) in enumerate(inputs or ()):
            wanted.setdefault(key[:2], j)
        g.counts = [0] * len(inputs or ())
        if not wanted:
            return g
        todo = [n for n, _ in g.outputs.values()]
        seen = {id(n) for n in todo}
        while todo:
            node = todo.pop()
            for i, (nxt, nr) in enumerate(node.next_functions):
                if nxt is None:
                    continue
                w = wanted.get(edge_key(nxt, nr))
                if w is not None:
                    g.edges.setdefault(id(node), (node, []))[1].append((i, w))
                    g.counts[w] += 1
                elif type(nxt) is not _AccumulateGrad and id(nxt) not in seen and nxt._sequence_nr() >= seq0:
                    seen.add(id(nxt))
                    todo.append(nxt)
            if len(seen) > MAX_NODES:  # not one call's graph: keep the output gradients only
                g.edges.clear()
                g.counts = [0] * len(g.counts)
                break
        return g

    def nodes(self) -> list[Any]:
        """Every node that needs a hook: the outputs' nodes and the nodes owning an input edge."""
        if self._nodes is None:
            out = {k: n for k, (n, _) in self.outputs.items()}
            for k, (n, _) in self.edges.items():
                out.setdefault(k, n)
            self._nodes = list(out.values())
        return self._nodes


class BackwardRows:
    """Turns the gradients a call's nodes see into the rows of that call's backward.

    ``open_call`` makes the backward :class:`Call` when the first of its nodes runs (so its index is where
    its backward begins); an input reached by several edges gets the sum of their gradients, recorded once
    the last of them has arrived. When every node has run, the next run of the graph (``retain_graph``)
    makes a new backward call.
    """

    __slots__ = ("recorder", "graph", "paths", "open_call", "share", "call", "pending", "acc", "left", "epoch")

    def __init__(self, recorder: Any, graph: CallGraph, paths: list[str], open_call: Any, share: bool):
        self.recorder = recorder
        self.graph = graph
        self.paths = paths
        self.open_call = open_call
        self.share = share  # the call keeps its input's elements (a view or copy): gradients share summaries
        self.epoch = recorder.backward_epoch  # its hooks do nothing once the step that made them is over
        self.call = None
        self.reset()

    def reset(self) -> None:
        self.call = None
        self.pending = list(self.graph.counts)
        self.acc: dict[int, torch.Tensor] = {}
        self.left = len(self.graph.nodes())

    def hook_for(self, node: Any):
        """The post-hook of one node of the call (``grad_inputs`` follow the node's ``next_functions``)."""
        key = id(node)
        outs = self.graph.outputs.get(key, (None, ()))[1]
        edges = self.graph.edges.get(key, (None, ()))[1]
        rows = self

        def hook(grad_inputs, grad_outputs):
            rec = rows.recorder
            if not rec.active or rec.backward_epoch is not rows.epoch:
                return
            with rec.working():
                try:
                    rows.on_node(outs, edges, grad_inputs, grad_outputs)
                except Exception as exc:  # never break the user's backward
                    rec.note_error("an API backward", exc)
        return hook

    def on_node(self, outs, edges, grad_inputs, grad_outputs) -> None:
        rec = self.recorder
        if self.call is None:
            self.call = self.open_call()
        b = self.call
        for path, nr in outs:
            g = grad_outputs[nr] if nr < len(grad_outputs) else None
            rec.add_rows(b, "backward", "input", g, prefix=path)
        for i, j in edges:
            g = grad_inputs[i] if i < len(grad_inputs) else None
            self.pending[j] -= 1
            if g is not None:
                if self.pending[j] == 0 and j not in self.acc:  # the only (or last, first) edge: no copy
                    self._emit(j, g, outs, grad_outputs)
                    continue
                prev = self.acc.get(j)
                self.acc[j] = g.detach().clone() if prev is None else prev + g
            if self.pending[j] == 0 and j in self.acc:
                self._emit(j, self.acc.pop(j), (), ())
        self.left -= 1
        if self.left <= 0:
            self.reset()

    def _emit(self, j: int, g: torch.Tensor, outs, grad_outputs) -> None:
        rec = self.recorder
        if self.share and len(outs) == 1 and isinstance(grad_outputs[outs[0][1]], torch.Tensor):
            rec.share_summary(g, grad_outputs[outs[0][1]])
        rec.add_rows(self.call, "backward", "output", g, prefix=self.paths[j])
