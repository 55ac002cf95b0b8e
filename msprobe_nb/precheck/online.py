"""The online pre-check (config ``task: "acc_check"``): each recorded step is replayed on the bench as soon as
it ends, and only the verdicts and metrics are written, never a tensor.

The step is recorded as in the tensor task (the recorder keeps a copy of every input as it was before the
call), because a call's backward, needed to grade it, is only known once the step's backward has run; at
the step's end :meth:`OnlineAccCheck.check_step` turns the recorder's columns into a calls table, grades
every API with :func:`~msprobe_nb.precheck.acc_check.check_calls` and appends the rows to
``acc_check_rank<N>.csv`` in the dump folder. The tensors are then dropped with the step.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from msprobe_nb.precheck.acc_check import check_calls
from msprobe_nb.precheck.result import AccCheckResult
from msprobe_nb.store.dump import Dump
from msprobe_nb.store.schema import Coded, DumpParts, coerce_calls

__all__ = ["OnlineAccCheck", "calls_frame"]


def calls_frame(columns: dict[str, Any], step: int, rank: int) -> pd.DataFrame:
    """The calls table of one step from the recorder's materialized columns (``Coded`` columns expanded)."""
    cols: dict[str, Any] = {}
    n = 0
    for name, col in columns.items():
        if isinstance(col, Coded):
            values = np.empty(len(col.values), dtype=object)
            values[:] = list(col.values)
            col = values[np.asarray(col.codes, dtype=np.int64)]
        else:
            col = list(col) if not isinstance(col, np.ndarray) else col
        cols[name] = col
        n = len(col)
    frame = pd.DataFrame({k: pd.Series(v, dtype=object) if k == "shape" else v for k, v in cols.items()})
    frame["step"], frame["rank"] = np.full(n, step, np.int32), np.full(n, rank, np.int32)
    for f in ("numel", "tensor_id"):
        if f in frame:
            frame[f] = pd.array(np.where(np.isnan(frame[f].astype(float)), np.nan, frame[f]), dtype="Float64") \
                .astype("Int64")
    if "requires_grad" in frame:
        rg = frame["requires_grad"].astype(float)
        frame["requires_grad"] = pd.array([None if np.isnan(v) else bool(v) for v in rg], dtype="boolean")
    return coerce_calls(frame)


class OnlineAccCheck:
    """Grades each step the recorder hands over; ``result`` holds every step's rows so far."""

    def __init__(self, dump_dir: str | Path, *, rank: int = 0, device: str = "cpu", backward: bool = True,
                 apis: list[str] | None = None, skip: list[str] | None = None):
        self.dump_dir = Path(dump_dir)
        self.apis, self.skip = list(apis or []), list(skip or [])
        self.rank = rank
        self.device = device
        self.backward = backward
        self.path = self.dump_dir / f"acc_check_rank{rank}.csv"
        self._rows: list[dict[str, Any]] = []
        self._notes: list[str] = []

    @classmethod
    def from_config(cls, dump_dir: str | Path, cfg: Any, rank: int = 0) -> OnlineAccCheck:
        """The check a config asks for: msprobe's ``acc_check`` sub-dict ``white_list`` / ``black_list`` (API
        names, matched as substrings of the call names) select the calls graded."""
        sub = (getattr(cfg, "extra", None) or {}).get("acc_check") or {}
        names = {k: [str(x) for x in (sub.get(k) or [])] for k in ("white_list", "black_list")}
        return cls(dump_dir, rank=rank, apis=names["white_list"], skip=names["black_list"])

    def check_step(self, step: int, data: dict[str, Any]) -> AccCheckResult:
        """Grade one step (``data``: the recorder's ``materialize()``), append its rows to the CSV."""
        calls = calls_frame(data["columns"], step, self.rank)
        tensors = data.get("tensors") or {}

        def loader(name: str, step: int, rank: int) -> Any:
            return tensors[name]

        dump = Dump(DumpParts(calls=calls, meta={"task": "tensor", "level": "L1"}, tensor_loader=loader,
                              source=f"{self.dump_dir} (step {step}, online)"))
        rows, notes = check_calls(dump, device=self.device, backward=self.backward, apis=self.apis, skip=self.skip)
        part = AccCheckResult.from_rows(rows, notes=notes, bench_device=self.device)
        part.to_csv(self.path, mode="a", header=not self.path.exists())
        self._rows += rows
        self._notes += [n for n in notes if n not in self._notes]
        return part

    @property
    def result(self) -> AccCheckResult:
        """Every step graded so far."""
        return AccCheckResult.from_rows(self._rows, notes=self._notes, bench_device=self.device)
