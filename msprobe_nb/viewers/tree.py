"""The model tree of a run: its module calls nested as they ran, each with the worst verdict beneath it.

:func:`module_tree` builds it from a calls table or a compare table (pure pandas/numpy, no widgets). A node
is one module call (``Module.<path>.<Class>.forward.<n>``, or ``backward``); its parent is the module call
that encloses it (the ``parent`` column of its rows). A call's rows count for the node of the module call
around it; a ``parameters_grad`` call counts for the backward call of its module. Each node carries the
counts of its whole subtree and its worst verdict (``error`` > ``warning`` > ``unmatched`` > ``pass``;
``nan`` on a calls table where a statistic is NaN/inf). :func:`visible_nodes` flattens the tree the way
a collapsible view shows it; :func:`tree_payload` is what the tree widget draws.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .table import TableIndex, row_verdicts

__all__ = ["TreeNode", "VERDICT_RANK", "divergence_path", "module_tree", "tree_payload", "visible_nodes",
           "walk"]

#: how bad a verdict is (the node shows the worst of its subtree)
VERDICT_RANK = {"": -1, "pass": 0, "unmatched": 1, "nan": 2, "warning": 2, "error": 3}
_SHORT = {"forward": "fwd", "backward": "bwd", "recompute": "re"}
_RANKED = ("", "pass", "unmatched", "warning", "error")
_MODULE_RE = re.compile(r"^Module\.(?P<head>.+)\.(?P<dir>forward|backward|recompute|parameters_grad)\.(?P<n>\d+)$")


@dataclass
class TreeNode:
    """One module call of the tree."""

    call: str                      #: the module call (the node's id)
    path: str                      #: dotted module path (``layers.0.attn``)
    cls: str                       #: module class
    direction: str                 #: forward | backward | recompute
    n: int                         #: the call's counter
    call_index: int                #: first call index (execution order)
    parent: str = ""               #: the enclosing module call ("" at the top)
    depth: int = 0
    children: list[TreeNode] = field(default_factory=list)
    verdict: str = ""              #: worst verdict of the subtree
    rows: int = 0                  #: rows in the subtree
    errors: int = 0
    warnings: int = 0
    unmatched: int = 0
    on_path: bool = False          #: encloses the first divergence
    divergence: bool = False       #: the innermost module call around the first divergence

    @property
    def label(self) -> str:
        return f"{self.path or '(root)'} · {self.cls} · {self.direction}.{self.n}"


def parse_module_call(call: str) -> tuple[str, str, str, int] | None:
    """(path, class, direction, n) of a ``Module.<path>.<Class>.<direction>.<n>`` call, else None."""
    m = _MODULE_RE.match(call or "")
    if not m:
        return None
    head = m.group("head")
    path, _, cls = head.rpartition(".")
    return path, cls, m.group("dir"), int(m.group("n"))


def _divergence_parts(divergence: Any) -> tuple[str, list[str]]:
    if divergence is None:
        return "", []
    get = divergence.get if isinstance(divergence, dict) else lambda k, d=None: getattr(divergence, k, d)
    return str(get("call", "") or ""), [str(m) for m in (get("modules", None) or [])]


def module_tree(table: pd.DataFrame, divergence: Any = None, index: TableIndex | None = None) -> list[TreeNode]:
    """The module calls of ``table`` as a forest (roots in execution order, children likewise).

    ``divergence``: the first divergence (an object or dict with ``call`` and ``modules``, innermost first):
    the nodes around it get ``on_path``, the innermost ``divergence``. Without a ``parent`` column every
    module call is a root.
    """
    ix = index or TableIndex(table)
    if "call" not in table.columns or not len(table):
        return []
    ccodes, cuniq = ix.codes("call")
    ncalls = len(cuniq)
    valid = ccodes >= 0
    cc = ccodes[valid]
    rank_of = pd.Series(row_verdicts(table), dtype=object).map(VERDICT_RANK).fillna(-1).to_numpy(
        dtype=np.int64)[valid]
    worst = np.full(ncalls, -1, dtype=np.int64)
    np.maximum.at(worst, cc, rank_of)
    n_rows = np.bincount(cc, minlength=ncalls)
    n_err = np.bincount(cc, weights=(rank_of == 3), minlength=ncalls).astype(np.int64)
    n_warn = np.bincount(cc, weights=(rank_of == 2), minlength=ncalls).astype(np.int64)
    n_um = np.bincount(cc, weights=(rank_of == 1), minlength=ncalls).astype(np.int64)
    ci = table["call_index"].to_numpy() if "call_index" in table.columns else np.arange(len(table))
    first_ci = np.full(ncalls, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_ci, cc, ci[valid].astype(np.int64))
    tree = ix.tree

    nodes: dict[str, TreeNode] = {}
    grads: dict[int, str] = {}  # call code of a parameters_grad call -> its module's backward call
    for code in np.flatnonzero(np.char.startswith(cuniq.astype(str), "Module.")):
        c = str(cuniq[code])
        p = parse_module_call(c)
        if p is None:
            continue
        if p[2] == "parameters_grad":
            grads[int(code)] = f"Module.{p[0]}.{p[1]}.backward.{p[3]}" if p[0] else f"Module.{p[1]}.backward.{p[3]}"
            continue
        nodes[c] = TreeNode(call=c, path=p[0], cls=p[1], direction=p[2], n=p[3], call_index=int(first_ci[code]),
                            parent=tree.get(c, ""))
    # each call's rows count for the node around it: the call itself, its module's backward, its parent
    names = list(nodes)
    slot = {c: i for i, c in enumerate(names)}
    cs = pd.Series(cuniq.astype(str), dtype=object)
    home_s = cs.map(slot)
    if grads:
        home_s = home_s.fillna(pd.Series({c: slot.get(b, np.nan) for c, b in grads.items()}, dtype=float))
    home_s = home_s.fillna(cs.map(tree).map(slot))
    home = home_s.fillna(-1).to_numpy(dtype=np.int64)
    has = home >= 0
    k = len(names)
    agg_w = np.full(k, -1, dtype=np.int64)
    np.maximum.at(agg_w, home[has], worst[has])
    sums = [np.bincount(home[has], weights=a[has], minlength=k).astype(np.int64) for a in (n_rows, n_err, n_warn, n_um)]
    own = {c: [int(agg_w[i]), *(int(a[i]) for a in sums)] for i, c in enumerate(names)}
    roots: list[TreeNode] = []
    for node in sorted(nodes.values(), key=lambda x: x.call_index):
        up = nodes.get(node.parent)
        if up is None or up is node:
            node.parent = ""
            roots.append(node)
        else:
            up.children.append(node)

    def fill(node: TreeNode, depth: int, seen: set[str]) -> int:
        seen.add(node.call)
        node.depth = depth
        w, node.rows, node.errors, node.warnings, node.unmatched = own[node.call]
        node.children = [ch for ch in node.children if ch.call not in seen]
        for ch in node.children:
            w = max(w, fill(ch, depth + 1, seen))
            node.rows += ch.rows
            node.errors += ch.errors
            node.warnings += ch.warnings
            node.unmatched += ch.unmatched
        node.verdict = _RANKED[w + 1]
        if w == 2 and node.warnings == 0:  # NaN/inf rows of a calls table (ranked like a warning)
            node.verdict = "nan"
        return w

    seen: set[str] = set()
    for r in roots:
        fill(r, 0, seen)
    dcall, modules = _divergence_parts(divergence)
    if modules or dcall:
        chain = set(modules)
        for node in walk(roots):
            node.on_path = node.call in chain or node.call == dcall
            node.divergence = bool(modules) and node.call == modules[0] or (not modules and node.call == dcall)
    return roots


def walk(nodes: list[TreeNode]):
    """Every node, depth first, in tree order."""
    stack = list(reversed(nodes))
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def divergence_path(nodes: list[TreeNode]) -> list[str]:
    """The module calls from the top down to the divergence's innermost module (the nodes to open)."""
    return [n.call for n in walk(nodes) if n.on_path]


def visible_nodes(nodes: list[TreeNode], expanded: set[str] | None = None) -> list[TreeNode]:
    """The nodes a collapsible tree shows: the roots, and the children of every expanded node."""
    expanded = expanded or set()
    out: list[TreeNode] = []
    stack = list(reversed(nodes))
    while stack:
        n = stack.pop()
        out.append(n)
        if n.call in expanded:
            stack.extend(reversed(n.children))
    return out


def tree_payload(nodes: list[TreeNode]) -> list[dict[str, Any]]:
    """The tree as flat JSON-able records in tree order (the tree widget nests them by ``parent``)."""
    out = []
    for n in walk(nodes):
        bad = n.errors + n.warnings
        tag = _SHORT.get(n.direction, n.direction) + (f".{n.n}" if n.n else "")
        out.append({"id": n.call, "parent": n.parent, "depth": n.depth, "label": n.label, "verdict": n.verdict,
                    "name": n.path or "(root)", "cls": n.cls, "tag": tag,
                    "kids": len(n.children), "rows": n.rows, "errors": n.errors, "warnings": n.warnings,
                    "unmatched": n.unmatched, "bad": bad, "on_path": n.on_path, "divergence": n.divergence})
    return out
