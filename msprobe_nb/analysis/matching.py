"""Pairing the rows of two dumps: (step, rank) groups, then rows by name.

Rules (docs/compare.md): exact row names, except that backward calls are renumbered by their order among
backward calls of the same API/module (so activation recomputation lines up); ``fuzzy`` drops the call
counter and pairs the k-th call of a name with the k-th on the other side; a user :class:`Mapping` renames
NPU calls, rows or module-path prefixes. Everything is an outer join: rows without a partner are kept.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

_PGRAD = re.compile(r"^(.+)\.parameters_grad(?:\.(\d+))?$")


class MatchError(ValueError):
    """Two dumps cannot be paired (no common step/rank, bad mapping file, ...)."""


@dataclass
class Mapping:
    """User renames applied to NPU names before matching.

    ``names``: exact NPU call or row name -> bench name (``Functional.linear.3.forward`` ->
    ``Functional.matmul.1.forward``, or one row ``...forward.input.0`` -> another row).
    ``modules``: NPU module-path prefix -> bench prefix for ``Module.*`` calls (``encoder.layers`` ->
    ``model.layers``; the longest matching prefix wins, on dot boundaries).
    """

    names: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, src: Any) -> Mapping | None:
        """A Mapping from None, a Mapping, a dict, or a JSON/YAML file path.

        A dict (or file) may have ``names:`` and ``modules:`` sections; a flat dict is all ``names``
        (msprobe's data_mapping.yaml layout).
        """
        if src is None or isinstance(src, Mapping):
            return src
        if isinstance(src, (str, Path)):
            src = _read_mapping_file(Path(src))
        if not isinstance(src, dict):
            raise MatchError(f"mapping must be a dict or a JSON/YAML file, got {type(src).__name__}")
        sections = {"names", "modules"}
        if src and set(src) <= sections and all(isinstance(v, dict) or v is None for v in src.values()):
            names, modules = src.get("names") or {}, src.get("modules") or {}
        else:
            names, modules = src, {}
        for what, d in (("names", names), ("modules", modules)):
            bad = [k for k, v in d.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad:
                raise MatchError(f"mapping {what}: every key and value must be a string (bad key {bad[0]!r})")
        return cls(dict(names), {k.strip("."): v.strip(".") for k, v in modules.items()})

    def rename_call(self, call: str) -> str:
        """The bench-side name of an NPU call (call-level names, then module prefixes)."""
        if call in self.names:
            return self.names[call]
        if self.modules and call.startswith("Module."):
            rest = call[len("Module."):]
            best = max((p for p in self.modules if rest == p or rest.startswith(p + ".")), key=len, default=None)
            if best is not None:
                return "Module." + self.modules[best] + rest[len(best):]
        return call


def _read_mapping_file(path: Path) -> dict:
    if not path.is_file():
        raise MatchError(f"mapping file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise MatchError(f"mapping file {path}: invalid JSON ({e})") from None
    try:
        import yaml
    except ImportError:
        return _mini_yaml(text, path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MatchError(f"mapping file {path}: invalid YAML ({e})") from None
    return data or {}


def _mini_yaml(text: str, path: Path) -> dict:
    """``key: value`` lines with at most one level of indented sections (no PyYAML needed)."""
    out: dict[str, Any] = {}
    section: dict | None = None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip() or line.strip() == "---":
            continue
        key, sep, val = line.strip().partition(":")
        if not sep:
            raise MatchError(f"mapping file {path}, line {no}: expected 'key: value' (install PyYAML for full YAML)")
        key, val = key.strip().strip("'\""), val.strip().strip("'\"")
        if line[0] in " \t":
            if section is None:
                raise MatchError(f"mapping file {path}, line {no}: indented entry outside a section")
            section[key] = val
        elif val:
            out[key], section = val, None
        else:
            section = out.setdefault(key, {})
    return out


@dataclass
class Matched:
    """Result of :func:`match_rows`: aligned row positions (``-1`` = no row on that side)."""

    npu_idx: np.ndarray
    bench_idx: np.ndarray
    pair: np.ndarray
    mapped: np.ndarray
    notes_by_row: dict[int, str]
    pairs: pd.DataFrame
    unpaired: pd.DataFrame
    notes: list[str]


def parse_calls(calls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split call names into (name without counter, counter or -1, direction)."""
    n = len(calls)
    base = np.empty(n, dtype=object)
    counter = np.full(n, -1, dtype=np.int64)
    direction = np.empty(n, dtype=object)
    for i, c in enumerate(calls):
        parts = c.rsplit(".", 2)
        if len(parts) == 3:
            pre, a, b = parts
            if b in ("forward", "backward") and a.isdigit():  # API: Family.op.N.forward
                base[i], counter[i], direction[i] = f"{pre}.{b}", int(a), b
                continue
            if a in ("forward", "backward") and b.isdigit():  # module: Module.path.Class.forward.N
                base[i], counter[i], direction[i] = f"{pre}.{a}", int(b), a
                continue
        m = _PGRAD.match(c)
        if m:
            base[i], direction[i] = f"{m.group(1)}.parameters_grad", "parameters_grad"
            counter[i] = int(m.group(2)) if m.group(2) else 0
            continue
        base[i], direction[i] = c, ""
    return base, counter, direction


def _strs(s: pd.Series) -> np.ndarray:
    return s.to_numpy(dtype=object, na_value="")


def _suffixes(df: pd.DataFrame, sel: np.ndarray, call: np.ndarray, name: np.ndarray) -> np.ndarray:
    """Row name minus its call name ('.input.0'): from the io/arg columns where they agree with the name."""
    n = len(sel)
    if n < 5000:
        return np.array([a[len(c):] if a.startswith(c) else a for a, c in zip(name, call)] + [""], dtype=object)[:-1]
    io, arg = _strs(df["io"])[sel], _strs(df["arg"])[sel]
    ic, iu = pd.factorize(io)
    ac, au = pd.factorize(arg)
    codes, uniq = pd.factorize(ic.astype(np.int64) * (len(au) + 1) + ac)
    first = np.zeros(len(uniq), dtype=np.int64)
    first[codes[::-1]] = np.arange(n)[::-1]
    labels = np.array([f".{io[j]}.{arg[j]}" for j in first] + [""], dtype=object)[:-1]
    fast = labels[codes]
    # rows whose name is not call + label (a renamed row, a reader that leaves io/arg empty) take the slow way;
    # a length check finds them, a sample guards against same-length disagreements
    lens = np.fromiter(map(len, name), np.int64, n) - np.fromiter(map(len, call), np.int64, n)
    odd = lens != np.array([len(x) for x in labels] + [0], dtype=np.int64)[:-1][codes]
    probe = np.linspace(0, n - 1, num=2000).astype(np.int64)
    if any(not odd[i] and name[i] != call[i] + fast[i] for i in probe):
        return np.array([a[len(c):] if a.startswith(c) else a for a, c in zip(name, call)], dtype=object)
    fast[odd] = [a[len(c):] if a.startswith(c) else a for a, c in zip(name[odd], call[odd])]
    return fast


def pair_groups(npu: pd.DataFrame, bench: pd.DataFrame, rank_map: dict | None = None,
                step_map: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Pair (step, rank) groups: same step and same rank *number* (``rank_map``/``step_map`` rename NPU ones).

    Returns (pairs, unpaired, notes); raises :class:`MatchError` when nothing pairs.
    """
    notes: list[str] = []
    ng = npu.groupby(["step", "rank"], sort=True).size()
    bg = bench.groupby(["step", "rank"], sort=True).size()
    n_steps = sorted({int(s) for s, _ in ng.index})
    b_steps = sorted({int(s) for s, _ in bg.index})
    step_map = dict(step_map or {})
    if not step_map and len(n_steps) == 1 and len(b_steps) == 1 and n_steps != b_steps:
        step_map = {n_steps[0]: b_steps[0]}
        notes.append(f"NPU step {n_steps[0]} compared with bench step {b_steps[0]} (each dump has one step)")
    rank_map = {int(k): int(v) for k, v in (rank_map or {}).items()}
    rows, used_b = [], set()
    for (s, r), cnt in ng.items():
        t = (int(step_map.get(int(s), s)), int(rank_map.get(int(r), r)))
        if t in bg.index:
            rows.append((int(s), int(r), t[0], t[1], int(cnt), int(bg[t])))
            used_b.add(t)
    pairs = pd.DataFrame(rows, columns=["step", "rank", "bench_step", "bench_rank", "npu_rows", "bench_rows"])
    paired_n = set(zip(pairs["step"], pairs["rank"]))
    un = [("npu", int(s), int(r), int(c)) for (s, r), c in ng.items() if (int(s), int(r)) not in paired_n]
    un += [("bench", int(s), int(r), int(c)) for (s, r), c in bg.items() if (int(s), int(r)) not in used_b]
    unpaired = pd.DataFrame(un, columns=["side", "step", "rank", "rows"])
    desc = (f"NPU has steps {n_steps} ranks {sorted({int(r) for _, r in ng.index})}, "
            f"bench has steps {b_steps} ranks {sorted({int(r) for _, r in bg.index})}")
    if pairs.empty:
        raise MatchError(f"no (step, rank) of the NPU dump has a counterpart in the bench dump: {desc}. "
                         "Pass rank_map={npu_rank: bench_rank} / step_map to pair them explicitly.")
    for side in ("npu", "bench"):
        u = unpaired[unpaired.side == side]
        if len(u):
            what = ", ".join(f"step {s} rank {r} ({c} rows)" for s, r, c in zip(u.step, u["rank"], u.rows))
            notes.append(f"{side} groups without a counterpart, not compared: {what} ({desc})")
    return pairs, unpaired, notes


def match_rows(npu: pd.DataFrame, bench: pd.DataFrame, *, fuzzy: bool = False, mapping: Mapping | None = None,
               rank_map: dict | None = None, step_map: dict | None = None) -> Matched:
    """Align the rows of two calls tables (outer join, NPU execution order, bench-only rows interleaved)."""
    pairs, unpaired, notes = pair_groups(npu, bench, rank_map, step_map)
    n_sels: list[np.ndarray] = []
    b_sels: list[np.ndarray] = []
    n_pairs: list[np.ndarray] = []
    b_pairs: list[np.ndarray] = []
    n_groups = npu.groupby(["step", "rank"], sort=False).indices
    b_groups = bench.groupby(["step", "rank"], sort=False).indices
    n_ci, b_ci = npu["call_index"].to_numpy(), bench["call_index"].to_numpy()
    for p, (s, r, bs, br) in enumerate(zip(pairs.step, pairs["rank"], pairs.bench_step, pairs.bench_rank)):
        ni, bi = n_groups[(s, r)], b_groups[(bs, br)]
        ni = ni[np.lexsort((ni, n_ci[ni]))]  # execution order, recorded order on ties
        bi = bi[np.lexsort((bi, b_ci[bi]))]
        n_sels.append(ni)
        b_sels.append(bi)
        n_pairs.append(np.full(len(ni), p))
        b_pairs.append(np.full(len(bi), p))
    n_sel, b_sel = np.concatenate(n_sels), np.concatenate(b_sels)
    n_pair, b_pair = np.concatenate(n_pairs), np.concatenate(b_pairs)

    n_call, b_call = _strs(npu["call"])[n_sel], _strs(bench["call"])[b_sel]
    n_name, b_name = _strs(npu["name"])[n_sel], _strs(bench["name"])[b_sel]
    n_suf, b_suf = _suffixes(npu, n_sel, n_call, n_name), _suffixes(bench, b_sel, b_call, b_name)

    # call instances: (pair, call) in order of first appearance = execution order
    n_inst, n_uc = _instances(n_pair, n_call)
    b_inst, b_uc = _instances(b_pair, b_call)
    n_upair = n_pair[_first_rows(n_inst, len(n_uc))]
    b_upair = b_pair[_first_rows(b_inst, len(b_uc))]
    mapped_call = np.zeros(len(n_uc), dtype=bool)
    if mapping is not None:
        renamed = np.array([mapping.rename_call(c) for c in n_uc], dtype=object)
        mapped_call = renamed != n_uc
    else:
        renamed = n_uc
    nb, nc, nd = parse_calls(renamed)
    bb, bc, bd = parse_calls(b_uc)
    base_codes, _ = pd.factorize(np.concatenate([nb, bb]))
    nbc, bbc = base_codes[: len(nb)], base_codes[len(nb):]
    nctr = _renumber(n_upair, nbc, nc, nd, fuzzy)
    bctr = _renumber(b_upair, bbc, bc, bd, fuzzy)
    if mapped_call.any():  # an explicitly mapped call takes the bench call's key as is
        bkey = {(int(p), c): (int(x), int(y)) for p, c, x, y in zip(b_upair, b_uc, bbc, bctr)}
        for ci in np.flatnonzero(mapped_call):
            hit = bkey.get((int(n_upair[ci]), renamed[ci]))
            if hit is not None:
                nbc[ci], nctr[ci] = hit

    suf_codes, _ = pd.factorize(np.concatenate([n_suf, b_suf]))
    n_key, b_key = _combine([n_pair, nbc[n_inst], nctr[n_inst], suf_codes[: len(n_suf)]],
                            [b_pair, bbc[b_inst], bctr[b_inst], suf_codes[len(n_suf):]])

    notes_by_row: dict[int, str] = {}
    mapped_row = mapped_call[n_inst]
    if mapping is not None and mapping.names:
        row_targets = [(i, mapping.names[nm]) for i, nm in enumerate(n_name) if nm in mapping.names]
        if row_targets:
            b_pos = {(int(p), nm): j for j, (p, nm) in enumerate(zip(b_pair, b_name))}
            fresh = max(int(n_key.max(initial=0)), int(b_key.max(initial=0))) + 1
            for i, target in row_targets:
                j = b_pos.get((int(n_pair[i]), target))
                mapped_row[i] = True
                if j is None:
                    n_key[i], fresh = fresh, fresh + 1
                    notes_by_row[i] = f"mapped to bench row {target}, which is not in the bench dump"
                else:
                    n_key[i] = b_key[j]
    # a name recorded twice on one side pairs with the other side's second one, never a cross product
    n_key, b_key = _combine([n_key, _repeats(n_key)], [b_key, _repeats(b_key)])
    pos = pd.Index(b_key).get_indexer(n_key)
    for row in np.flatnonzero(mapped_call[n_inst]):  # a call renamed by names or by a module prefix
        target = renamed[n_inst[row]]
        notes_by_row.setdefault(int(row), f"matched through the mapping as {target}" if pos[row] >= 0 else
                                f"mapped to bench call {target}, which has no such row in the bench dump")
    matched_b = np.zeros(len(b_key), dtype=bool)
    matched_b[pos[pos >= 0]] = True

    # order: NPU rows as recorded; a bench-only row goes right after the last matched bench row before it
    n_order = np.arange(len(n_key), dtype=np.float64)
    b_anchor = np.full(len(b_key), -np.inf)
    b_anchor[pos[pos >= 0]] = n_order[pos >= 0]
    b_anchor = np.maximum.accumulate(b_anchor) if len(b_anchor) else b_anchor
    only_b = np.flatnonzero(~matched_b)
    all_pair = np.concatenate([n_pair, b_pair[only_b]])
    primary = np.concatenate([n_order, b_anchor[only_b] + 0.5])
    secondary = np.concatenate([np.zeros(len(n_key)), only_b + 1.0])
    order = np.lexsort((secondary, primary, all_pair))
    npu_idx = np.concatenate([n_sel, np.full(len(only_b), -1)])[order]
    bench_idx = np.concatenate([np.where(pos >= 0, b_sel[np.maximum(pos, 0)], -1), b_sel[only_b]])[order]
    mapped = np.concatenate([mapped_row, np.zeros(len(only_b), dtype=bool)])[order]
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = np.arange(len(order))
    notes_by_row = {int(inv[i]): v for i, v in notes_by_row.items()}
    if fuzzy:
        notes.append("fuzzy matching: call counters ignored, k-th call of a name paired with the k-th")
    return Matched(npu_idx, bench_idx, all_pair[order], mapped, notes_by_row, pairs, unpaired, notes)


def _instances(pair: np.ndarray, call: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Code each row by its (pair, call) instance, numbered in order of first appearance."""
    ccode, _ = pd.factorize(call)
    inst, _ = pd.factorize(pair.astype(np.int64) * (int(ccode.max(initial=0)) + 1) + ccode)
    first = _first_rows(inst, int(inst.max(initial=-1)) + 1)
    return inst, call[first]


def _first_rows(codes: np.ndarray, n: int) -> np.ndarray:
    first = np.full(n, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes)))
    return first


def _renumber(pair: np.ndarray, base: np.ndarray, counter: np.ndarray, direction: np.ndarray,
              fuzzy: bool) -> np.ndarray:
    """Counters used for matching: backward (or, fuzzy, every) call numbered by order within its name."""
    occ = pd.DataFrame({"p": pair, "b": base}).groupby(["p", "b"], sort=False).cumcount().to_numpy()
    if fuzzy:
        return occ.astype(np.int64)
    out = counter.copy()
    bw = direction == "backward"
    if bw.any():
        occ_bw = pd.DataFrame({"p": pair[bw], "b": base[bw]}).groupby(["p", "b"], sort=False).cumcount()
        out[bw] = occ_bw.to_numpy()
    return out


def _combine(npu_parts: list[np.ndarray], bench_parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """One int64 key per row from several integer columns, coded jointly over both sides."""
    n = len(npu_parts[0])
    key: np.ndarray | None = None
    for a, b in zip(npu_parts, bench_parts):
        col = np.concatenate([a, b]).astype(np.int64)
        col = col - col.min(initial=0)
        if key is None:
            key = col
        else:
            key, _ = pd.factorize(key * (int(col.max(initial=0)) + 1) + col)
    assert key is not None, "_combine needs at least one column"
    return key[:n].astype(np.int64), key[n:].astype(np.int64)


def _repeats(key: np.ndarray) -> np.ndarray:
    """0 for the first occurrence of a key, 1 for the second, ..."""
    if len(key) == 0:
        return key
    return pd.Series(key).groupby(key, sort=False).cumcount().to_numpy().astype(np.int64)
