"""Model layer of the viewers: filter, sort, page, highlight and render call tables. No widgets here.

Works on a calls table (``Dump.calls``, see :mod:`msprobe_nb.store.schema`) and on a compare table
(``CompareResult``). Columns a table lacks (``family``, ``direction``, ``module_path`` on a compare table)
are derived from the call names. Everything is vectorised over integer codes that :class:`TableIndex`
computes once per column, so filtering and sorting 10^5+ rows take milliseconds; only one page is rendered.
"""
from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

# the colours and the orders are theirs; re-exported here, where the viewers' colours were first defined
from .ordering import ASCENDING_FIRST, descending_first, reason_rank, reasons_by_severity  # noqa: F401
from .palette import DIVERGENCE_CSS, FLAG_CSS, RESULT_COLOURS, VERDICT_COLOURS, result_css  # noqa: F401

__all__ = [
    "CRITERIA", "DIRECTIONS", "IOS", "VERDICTS", "TableIndex", "cell_flags", "cell_styles", "check_pattern",
    "derive_direction", "derive_family", "derive_module_path", "descending_first", "filter_mask", "filter_rows",
    "format_number", "reason_rank", "reasons_by_severity", "result_css",
    "format_value", "grid_columns", "n_pages", "page_payload", "page_rows", "render_html", "row_verdicts",
    "sort_rows",
]

DIRECTIONS = ("forward", "recompute", "backward", "parameters_grad")
IOS = ("input", "output", "parameters", "parameters_grad")
VERDICTS = ("pass", "warning", "error")
#: filter criteria :func:`filter_rows` understands (besides ``regex``)
CRITERIA = ("call", "family", "module", "direction", "io", "verdict", "step", "rank", "kind", "match", "diverges")
#: criterion -> column it filters
_COLUMN = {"family": "family", "direction": "direction", "io": "io", "verdict": "result", "step": "step",
           "rank": "rank", "kind": "kind", "match": "match"}
_ALL = ("", "all", "All", "*")

_DIR_RE = re.compile(r"\.(forward|backward|parameters_grad)(?:\.|$)")



# ------------------------------------------------------------------------------------------ derived columns
def derive_family(call: str) -> str:
    """API family of a call name: the text before the first dot (``Functional``, ``Module``...)."""
    return call.split(".", 1)[0] if call else ""


def derive_direction(call: str) -> str:
    """forward | backward | parameters_grad from a call name ("" when none)."""
    m = _DIR_RE.search(call or "")
    return m.group(1) if m else ""


def derive_module_path(call: str) -> str:
    """Dotted module path of a ``Module.<path>.<Class>.<direction>.<n>`` call ("" for other calls)."""
    if not call or not call.startswith("Module."):
        return ""
    m = _DIR_RE.search(call)
    if not m:
        return ""
    head = call[len("Module."):m.start()]  # <path>.<Class>
    return head.rsplit(".", 1)[0] if "." in head else ""


_DERIVE = {"family": derive_family, "direction": derive_direction, "module_path": derive_module_path}


def _values(v: Any) -> list | None:
    """A criterion as a list of accepted values, or None for "no filter"."""
    if v is None:
        return None
    if isinstance(v, str):
        return None if v in _ALL else [v]
    if isinstance(v, Iterable):
        out = [x for x in v if not (isinstance(x, str) and x in _ALL)]
        return out or None
    return [v]


def check_pattern(pattern: str) -> str | None:
    """None when ``pattern`` is a valid regular expression, else a message saying why not."""
    try:
        re.compile(pattern)
    except re.error as e:
        return f"invalid regular expression {pattern!r}: {e}; matched as plain text"
    return None


# ------------------------------------------------------------------------------------------ index
class TableIndex:
    """Integer codes of a table's columns, computed lazily and cached; answers filters and sorts fast.

    Build one per table and reuse it (the viewers do); the table must not change afterwards.
    """

    def __init__(self, df: pd.DataFrame):
        self.df = df
        self._codes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._tree: dict[str, str] | None = None
        self._children: dict[str, list[str]] | None = None

    def __len__(self) -> int:
        return len(self.df)

    def has(self, col: str) -> bool:
        return col in self.df.columns or (col in _DERIVE and "call" in self.df.columns)

    def codes(self, col: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes, sorted uniques) of a column; code -1 is a missing value."""
        if col in self._codes:
            return self._codes[col]
        if col in self.df.columns:
            s = self.df[col]
            if isinstance(s.dtype, pd.CategoricalDtype):
                codes, uniq = s.cat.codes.to_numpy(), s.cat.categories.to_numpy(dtype=object)
                if not s.cat.ordered:
                    order = np.argsort(uniq.astype(str), kind="stable")
                    rank = np.empty(len(order), dtype=np.int64)
                    rank[order] = np.arange(len(order))
                    codes = np.where(codes < 0, -1, rank[np.maximum(codes, 0)])
                    uniq = uniq[order]
            else:
                try:
                    codes, uniq = pd.factorize(s, sort=True)
                except TypeError:  # unhashable or unorderable values (lists, mixed tuples/None)
                    codes, uniq = pd.factorize(s.map(lambda x: "" if x is None else str(x)), sort=True)
                uniq = np.asarray(uniq, dtype=object)
        elif col in _DERIVE and "call" in self.df.columns:
            ccodes, cuniq = self.codes("call")
            derived = np.array([_DERIVE[col](str(c)) for c in cuniq] + [""], dtype=object)
            dcodes, uniq = pd.factorize(derived, sort=True)
            codes = dcodes[ccodes]  # -1 (missing call) picks the trailing "" entry
            uniq = np.asarray(uniq, dtype=object)
        else:
            raise KeyError(f"no column {col!r} in this table")
        out = (np.asarray(codes, dtype=np.int64), uniq)
        self._codes[col] = out
        return out

    def uniques(self, col: str) -> list:
        """Sorted distinct non-missing values of a column (derived columns included)."""
        if not self.has(col):
            return []
        return [u for u in self.codes(col)[1].tolist() if u is not None and u == u and u != ""]

    def column(self, col: str) -> np.ndarray:
        """A column's values as an object array (derived columns included)."""
        codes, uniq = self.codes(col)
        return np.append(uniq, [None])[codes]

    def isin(self, col: str, values: Iterable) -> np.ndarray:
        """Boolean mask of rows whose ``col`` is one of ``values`` (numbers compare by value)."""
        codes, uniq = self.codes(col)
        want = set()
        for v in values:
            want.add(v)
            if isinstance(v, str):
                try:
                    want.add(int(v))
                except ValueError:
                    pass
        lut = np.zeros(len(uniq) + 1, dtype=bool)
        if len(want) < 64:  # a few values (a call, a module's calls): look their codes up
            where = self._where(col)
            hit = [i for v in want for i in [where.get(v)] if i is not None]
            lut[hit] = True
        else:
            lut[:-1] = [u in want for u in uniq]
        return lut[codes]

    def _where(self, col: str) -> dict:
        """value -> code of a column (cached); equal values (``3`` and ``np.int64(3)``) find the same code."""
        cache = self.__dict__.setdefault("_where_cache", {})
        if col not in cache:
            cache[col] = {u: i for i, u in enumerate(self.codes(col)[1].tolist())}
        return cache[col]

    def text_mask(self, col: str, pattern: str, regex: bool = False) -> tuple[np.ndarray, str | None]:
        """Rows whose ``col`` contains ``pattern`` (a regex when ``regex``; an invalid one falls back to text)."""
        codes, uniq = self.codes(col)
        msg = None
        strs = [str(u) for u in uniq]
        if regex:
            msg = check_pattern(pattern)
        if regex and msg is None:
            rx = re.compile(pattern)
            hit = [rx.search(s) is not None for s in strs]
        else:
            low = pattern.lower()
            hit = [low in s.lower() for s in strs]
        lut = np.array(hit + [False], dtype=bool)
        return lut[codes], msg

    # -- module tree
    @property
    def tree(self) -> dict[str, str]:
        """call -> enclosing module call, from the ``parent`` column (first row of each call)."""
        if self._tree is None:
            if "parent" not in self.df.columns:
                self._tree = {}
            else:
                ccodes, cuniq = self.codes("call")
                pcodes, puniq = self.codes("parent")
                first = np.full(len(cuniq), -1, dtype=np.int64)
                valid = ccodes >= 0
                idx = np.flatnonzero(valid)[::-1]
                first[ccodes[idx]] = idx  # reversed assignment: the first row of each call wins
                pn = np.append(puniq, "")
                self._tree = {str(c): str(pn[pcodes[i]] or "") if i >= 0 else "" for c, i in zip(cuniq, first)}
        return self._tree

    def set_tree(self, tree: dict[str, str]) -> None:
        """Use a module tree from elsewhere (``Dump.tree``) merged over the one the table implies."""
        merged = dict(self.tree)
        merged.update({k: v or "" for k, v in tree.items()})
        self._tree, self._children = merged, None

    def subtree(self, module: str) -> set[str]:
        """Calls under a module call (itself included), or under every call of a module path (``net1.ln1``)."""
        if self._children is None:
            ch: dict[str, list[str]] = {}
            for c, p in self.tree.items():
                if p:
                    ch.setdefault(p, []).append(c)
            self._children = ch
        if module.startswith("Module.") and module in self.tree:
            roots = [module]
        elif self.has("module_path"):
            path = module[len("Module."):] if module.startswith("Module.") else module
            mcodes, muniq = self.codes("module_path")
            under = np.array([isinstance(p, str) and p != "" and (p == path or p.startswith(path + "."))
                              for p in muniq] + [False], dtype=bool)
            ccodes, cuniq = self.codes("call")
            hit = np.unique(ccodes[under[mcodes] & (ccodes >= 0)])
            roots = [str(c) for c in cuniq[hit]]
        else:
            roots = []
        out: set[str] = set()
        todo = list(roots)
        while todo:
            c = todo.pop()
            if c in out:
                continue
            out.add(c)
            todo.extend(self._children.get(c, ()))
        return out

    def module_choices(self) -> list[str]:
        """Module paths and module calls present in the table, for a module picker."""
        paths = self.uniques("module_path") if self.has("module_path") else []
        calls = [c for c in self.uniques("call") if str(c).startswith("Module.") and ".parameters_grad" not in c]
        return paths + calls

    # -- filter and sort
    def mask(self, **criteria: Any) -> tuple[np.ndarray, list[str]]:
        """Boolean mask of rows meeting every criterion, and messages (bad regex, unknown column)."""
        regex = bool(criteria.pop("regex", False))
        unknown = set(criteria) - set(CRITERIA)
        if unknown:
            raise TypeError(f"unknown filter criteria {sorted(unknown)}; use {', '.join(CRITERIA)}")
        n = len(self.df)
        m = np.ones(n, dtype=bool)
        msgs: list[str] = []
        call = criteria.get("call")
        if call:
            cm, msg = self.text_mask("call", str(call), regex)
            m &= cm
            if msg:
                msgs.append(msg)
        module = criteria.get("module")
        if module and str(module) not in _ALL:
            sub = self.subtree(str(module))
            if not sub:
                msgs.append(f"no module call or module path {module!r} in this table")
            m &= self.isin("call", sub)
        for key, col in _COLUMN.items():
            vals = _values(criteria.get(key))
            if vals is None:
                continue
            if not self.has(col):
                msgs.append(f"this table has no {col!r} column: filter {key}={vals} ignored")
                continue
            m &= self.isin(col, vals)
        div = criteria.get("diverges")
        if div is not None and div != "" and "diverges" in self.df.columns:
            d = self.df["diverges"].to_numpy(dtype=bool, na_value=False)
            m &= d if bool(div) else ~d
        return m, msgs

    def order(self, positions: np.ndarray, by: str | None = None, ascending: bool = True) -> np.ndarray:
        """``positions`` reordered by column ``by`` (stable, missing values last); table order when None.

        The whole table's order for (``by``, ``ascending``) is computed once and cached; a subset is that order
        restricted to it (the same as a stable sort of the subset, in O(n))."""
        if not by:
            return positions if ascending else positions[::-1]
        if not self.has(by):
            raise KeyError(f"cannot sort: no column {by!r}")
        full = self._full_order(by, bool(ascending))
        n = len(self.df)
        positions = np.asarray(positions)
        if len(positions) == n:
            return full
        keep = np.zeros(n, dtype=bool)
        keep[positions] = True
        return full[keep[full]]

    def _full_order(self, by: str, ascending: bool) -> np.ndarray:
        cache = self.__dict__.setdefault("_order_cache", {})
        if (by, ascending) in cache:
            return cache[(by, ascending)]
        s = self.df[by] if by in self.df.columns else None
        if s is not None and (pd.api.types.is_numeric_dtype(s.dtype) or pd.api.types.is_bool_dtype(s.dtype)) \
                and not isinstance(s.dtype, pd.CategoricalDtype):
            v = s.to_numpy(dtype=float, na_value=np.nan)
            nan = np.isnan(v)
            key = np.where(nan, np.inf, v if ascending else -v)
            o = np.argsort(key, kind="stable")
            if nan.any():  # missing values last, after any +inf (in table order, like the rest)
                o = np.concatenate([o[~nan[o]], o[nan[o]]])
        else:
            codes = self.codes(by)[0]
            big = np.iinfo(np.int64).max
            o = np.argsort(np.where(codes < 0, big, codes if ascending else -codes), kind="stable")
        cache[(by, ascending)] = o
        return o


# ------------------------------------------------------------------------------------------ pure functions
def filter_mask(df: pd.DataFrame, index: TableIndex | None = None, **criteria: Any) -> tuple[np.ndarray, list[str]]:
    """(mask, messages) for ``criteria`` (see :func:`filter_rows`)."""
    return (index or TableIndex(df)).mask(**criteria)


def filter_rows(df: pd.DataFrame, index: TableIndex | None = None, **criteria: Any) -> pd.DataFrame:
    """Rows of ``df`` meeting every criterion; ``None``/"all"/"" means no filter on that criterion.

    Criteria: ``call`` (text, case-insensitive; a regex with ``regex=True``: an invalid one is matched as
    text and reported), ``family``, ``direction``, ``io``, ``verdict`` (the ``result`` column), ``step``,
    ``rank``, ``kind``, ``match`` (a value or a list of values), ``module`` (a module call such as
    ``Module.net1.Linear.forward.0`` or a module path such as ``net1``: the rows of its calls and of every
    call nested under them), ``diverges`` (bool). Messages land in ``result.attrs["filter_messages"]``.
    """
    m, msgs = filter_mask(df, index, **criteria)
    out = df.iloc[np.flatnonzero(m)]
    out.attrs = {**df.attrs, "filter_messages": msgs}
    return out


def sort_rows(df: pd.DataFrame, by: str | None = None, ascending: bool = True,
              index: TableIndex | None = None) -> pd.DataFrame:
    """``df`` sorted by ``by`` (stable: ties keep execution order; missing values last)."""
    ix = index or TableIndex(df)
    return df.iloc[ix.order(np.arange(len(df)), by, ascending)]


def n_pages(n_rows: int, page_size: int) -> int:
    """Number of pages (at least 1)."""
    return max(1, math.ceil(n_rows / max(1, page_size)))


def page_rows(df: pd.DataFrame, page: int, page_size: int) -> pd.DataFrame:
    """Rows of page ``page`` (0-based, clamped to the valid range)."""
    page = min(max(0, int(page)), n_pages(len(df), page_size) - 1)
    return df.iloc[page * page_size:(page + 1) * page_size]


# ------------------------------------------------------------------------------------------ highlighting
def _thresholds(thresholds: Any = None) -> Any:
    if thresholds is not None:
        return thresholds
    try:
        from msprobe_nb.analysis.grading import Thresholds
    except ImportError:  # pragma: no cover - analysis layer absent
        return None
    return Thresholds()


def _limit(th: Any, field: str, default: float) -> float:
    return float(getattr(th, field, default)) if th is not None else default


def metric_rules(thresholds: Any = None) -> dict[str, tuple[str, float]]:
    """column -> (">" or "<", limit): a cell beyond its limit is flagged (limits from ``Thresholds``)."""
    th = _thresholds(thresholds)
    rel = _limit(th, "norm_rel_output_warning", 0.1)
    div = _limit(th, "diverge_rtol", 1e-3)
    return {
        "err": (">", div), "rel_l2_err": (">", div),
        "max_rel": (">", rel), "min_rel": (">", rel), "mean_rel": (">", rel), "norm_rel": (">", rel),
        "cosine": ("<", _limit(th, "cosine_input_ok", 0.9)),
        "one_thousandth": ("<", _limit(th, "one_thousandth_input_ok", 0.9)),
        "five_thousandths": ("<", _limit(th, "one_thousandth_input_ok", 0.9)),
        "nan_count": (">", 0.0), "posinf_count": (">", 0.0), "neginf_count": (">", 0.0),
    }


def cell_flags(page: pd.DataFrame, thresholds: Any = None) -> pd.DataFrame:
    """Boolean frame like ``page``: True where a metric is beyond its threshold or a statistic is NaN/inf.

    Relative errors of statistics the ``near_zero`` column marks as ~0 on the bench side are not flagged.
    """
    out = pd.DataFrame(False, index=page.index, columns=page.columns)
    near = page["near_zero"].astype(object).fillna("").astype(str).to_numpy() if "near_zero" in page else None
    for col, (op, lim) in metric_rules(thresholds).items():
        if col not in page.columns:
            continue
        v = pd.to_numeric(page[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            f = v > lim if op == ">" else v < lim
        if col.endswith("_rel") and near is not None:
            stat = col[:-4]
            f &= np.array([stat not in x.split(",") for x in near], dtype=bool)
        out[col] = f
    for col in ("max", "min", "mean", "norm", "npu_max", "npu_min", "npu_mean", "npu_norm"):
        if col in page.columns:
            v = pd.to_numeric(page[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
            out[col] = np.isinf(v)
    if "diverges" in page.columns:
        out["diverges"] = page["diverges"].to_numpy(dtype=bool, na_value=False)
    if "nan_inf_match" in page.columns:
        out["nan_inf_match"] = np.array([v is False or v is np.False_ for v in page["nan_inf_match"]], dtype=bool)
    if "result" in page.columns:
        out["result"] = page["result"].astype(object).isin(["warning", "error"]).to_numpy()
    return out


def cell_styles(page: pd.DataFrame, thresholds: Any = None) -> pd.DataFrame:
    """CSS per cell: verdict colour on the whole row, :data:`FLAG_CSS` on flagged cells."""
    flags = cell_flags(page, thresholds)
    styles = pd.DataFrame("", index=page.index, columns=page.columns)
    if "result" in page.columns:
        bg = page["result"].astype(object).map(lambda r: VERDICT_COLOURS.get(r, "")).to_numpy()
        for col in page.columns:
            styles[col] = [f"background-color:{b}" if b else "" for b in bg]
    for col in page.columns:
        f = flags[col].to_numpy()
        if f.any():
            s = styles[col].to_numpy(dtype=object).copy()
            s[f] = FLAG_CSS
            styles[col] = s
    if "result" in page.columns:  # the verdict cell as the grid paints it: amber warning, red error
        styles["result"] = [result_css(r) or s for r, s in zip(page["result"].astype(object), styles["result"])]
    return styles


# ------------------------------------------------------------------------------------------ rendering
#: significant digits of every number the viewers show
SIGNIFICANT = 4


def format_number(v: Any, digits: int = SIGNIFICANT) -> str:
    """One format for every number: ``digits`` significant digits (``%g``), 0 as ``0``, whole floats as
    integers (``3.0`` -> ``3``), NaN empty, infinities as ``inf`` / ``-inf``."""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    x = float(v)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 10 ** digits:
        return str(int(x))
    return f"{x:.{digits}g}"


def format_value(v: Any) -> str:
    """Short text of a cell: numbers through :func:`format_number`, missing values empty, lists joined."""
    if v is None or v is pd.NA:
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (float, np.floating, int, np.integer)):
        return format_number(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(str(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, (list, np.ndarray)):
        return "; ".join(str(x) for x in v)
    return str(v)


# ------------------------------------------------------------------------------------------ the data grid
#: columns that say why a row is what it is: shown right after the row's name, in this order
CAUSE_COLUMNS = ("result", "reasons", "npu_dtype", "bench_dtype", "err")
#: the columns that may stay frozen at the left of the grid (the first one the table has)
NAME_COLUMNS = ("name", "call")


def grid_columns(columns: list[str], table_columns: Any) -> list[str]:
    """``columns`` reordered for the grid: the name column (frozen at the left), the cause columns (those the
    table has: result, reasons, npu_dtype/bench_dtype, err), ``call_index``, then the rest in their order."""
    have = set(table_columns)
    cols = [c for c in columns if c in have]
    name = next((c for c in NAME_COLUMNS if c in cols), None)
    head = [name] if name else []
    head += [c for c in CAUSE_COLUMNS if c in have and c not in head]
    head += [c for c in ("call_index",) if c in cols]
    return head + [c for c in cols if c not in head]


def row_verdicts(page: pd.DataFrame) -> list[str]:
    """Each row's colour class: ``error`` / ``warning`` / ``pass`` from ``result``, ``unmatched`` for a row
    one side lacks, ``nan`` for a calls-table row with NaN or inf, else ""."""
    n = len(page)
    out = np.full(n, "", dtype=object)
    if "result" in page.columns:
        res = page["result"].astype(object).to_numpy()
        out = np.where(np.isin(res, ["error", "warning", "pass"]), res, out)
    if "match" in page.columns:
        um = (page["match"].astype(object).to_numpy() != "matched") & (out != "error") & (out != "warning")
        out = np.where(um, "unmatched", out)
    elif "result" not in page.columns:
        bad = np.zeros(n, dtype=bool)
        for c in ("nan_count", "posinf_count", "neginf_count"):
            if c in page.columns:
                bad |= pd.to_numeric(page[c], errors="coerce").fillna(0).to_numpy(dtype=float) > 0
        for c in ("max", "min", "mean", "norm"):
            if c in page.columns:
                bad |= np.isinf(pd.to_numeric(page[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan))
        out = np.where(bad, "nan", out)
    return [str(x) for x in out]


def page_payload(page: pd.DataFrame, columns: list[str], *, start: int = 0, thresholds: Any = None,
                 selected: str | None = None, marked: str | None = None, sort_by: str | None = None,
                 ascending: bool = True, frozen: str | None = None,
                 numeric: set[str] | None = None) -> dict[str, Any]:
    """What the data grid draws for one page, as plain JSON-able data (no widgets).

    ``columns``: [{key, num, frozen}]; ``rows``: the cells as text (:func:`format_value`); ``pos``: each
    row's position in the filtered, sorted view (the ``#`` column); ``verdict``: :func:`row_verdicts`;
    ``flags``: per row, the indices of the cells beyond a threshold; ``selected`` / ``marked``: indices of the
    rows of the selected call / of the first divergence; ``sort``: [column, ascending] or None;
    ``numeric``: the columns to align as numbers (default: those of numeric dtype in ``page``).
    """
    cols = [c for c in columns if c in page.columns]
    frozen = frozen if frozen in cols else next((c for c in NAME_COLUMNS if c in cols), None)
    num = numeric if numeric is not None else {c for c in cols if pd.api.types.is_numeric_dtype(page[c].dtype)
                                               and not pd.api.types.is_bool_dtype(page[c].dtype)}
    fl = cell_flags(page, thresholds)[cols].to_numpy(dtype=bool)
    if "result" in cols:  # the verdict cell has its own colour (see grid_widget.GRID_CSS)
        fl[:, cols.index("result")] = False
    data = [[format_value(reasons_by_severity(x) if c == "reasons" else x) for x in page[c].to_numpy(dtype=object)]
            for c in cols]
    rows = [list(r) for r in zip(*data)] if cols else [[] for _ in range(len(page))]
    calls = page["call"].astype(object).to_numpy() if "call" in page.columns else np.full(len(page), None)
    return {
        "columns": [{"key": c, "num": c in num, "frozen": c == frozen} for c in cols],
        "rows": rows,
        "pos": list(range(start, start + len(page))),
        "verdict": row_verdicts(page),
        "flags": [np.flatnonzero(r).tolist() for r in fl],
        "result_col": cols.index("result") if "result" in cols else -1,
        "selected": np.flatnonzero(calls == selected).tolist() if selected else [],
        "marked": np.flatnonzero(calls == marked).tolist() if marked else [],
        "sort": [sort_by, bool(ascending)] if sort_by else None,
    }


_TABLE_CSS = ("<style>.msnb-t{border-collapse:collapse;font:12px monospace}"
              ".msnb-t th{position:sticky;top:0;background:#eee;text-align:left;padding:2px 6px;"
              "border-bottom:1px solid #999}.msnb-t td{padding:1px 6px;border-bottom:1px solid #eee;"
              "white-space:nowrap;max-width:40em;overflow:hidden;text-overflow:ellipsis}"
              ".msnb-t td.num{text-align:right}</style>")


def render_html(page: pd.DataFrame, columns: list[str] | None = None, styles: pd.DataFrame | None = None,
                start: int = 0, sort_by: str | None = None, ascending: bool = True, caption: str = "",
                marked: Any = None) -> str:
    """An HTML table of ``page`` (already one page): a ``#`` column (``start``-based), then ``columns``.

    ``marked``: booleans per row whose ``#`` cell is outlined (the first divergence, the selected call).
    """
    cols = [c for c in (columns or list(page.columns)) if c in page.columns]
    head = ["<th>#</th>"]
    for c in cols:
        arrow = (" ▲" if ascending else " ▼") if c == sort_by else ""
        head.append(f"<th>{html.escape(c)}{arrow}</th>")
    num = {c for c in cols if pd.api.types.is_numeric_dtype(page[c].dtype) and not pd.api.types.is_bool_dtype(
        page[c].dtype)}
    body = []
    data = {c: page[c].to_numpy(dtype=object) for c in cols}
    sty = {c: styles[c].to_numpy(dtype=object) for c in cols} if styles is not None else {}
    mark = np.zeros(len(page), dtype=bool) if marked is None else np.asarray(marked, dtype=bool)
    for i in range(len(page)):
        cells = [f"<td style=\"{DIVERGENCE_CSS}\">{start + i}</td>" if mark[i] else f"<td>{start + i}</td>"]
        for c in cols:
            text = html.escape(format_value(reasons_by_severity(data[c][i]) if c == "reasons" else data[c][i]))
            css = sty[c][i] if c in sty else ""
            cls = ' class="num"' if c in num else ""
            st = f' style="{css}"' if css else ""
            cells.append(f"<td{cls}{st} title=\"{text}\">{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption style='text-align:left'>{html.escape(caption)}</caption>" if caption else ""
    return (f"{_TABLE_CSS}<table class='msnb-t'>{cap}<thead><tr>{''.join(head)}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")
