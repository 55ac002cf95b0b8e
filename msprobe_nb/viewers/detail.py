"""The detail of one selected call (:class:`Detail`) and its stack frames as a table and as HTML."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from msprobe_nb.analysis.divergence import is_user_file, parse_frame

__all__ = ["Detail", "frames_html", "parse_frames"]


@dataclass
class Detail:
    """One selected call: its rows (inputs, outputs, parameters, with statistics), stack and reasons."""

    call: str
    step: int
    rank: int
    rows: pd.DataFrame
    stack: list[str] = field(default_factory=list)
    frames: pd.DataFrame = field(default_factory=pd.DataFrame)
    bench_stack: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    tensor_rows: list[str] = field(default_factory=list)  #: rows with a whole tensor to plot
    html: str = ""

    @property
    def inputs(self) -> pd.DataFrame:
        return self.rows[self.rows["io"].isin(["input", "parameters"])]

    @property
    def outputs(self) -> pd.DataFrame:
        return self.rows[self.rows["io"].isin(["output", "parameters_grad"])]

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        user = self.frames[self.frames["user"]] if len(self.frames) and "user" in self.frames else self.frames
        where = f", at {user.iloc[0]['file']}:{user.iloc[0]['line']}" if len(user) else ""
        return (f"<Detail {self.call} (step {self.step}, rank {self.rank}): {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs{where}{'; ' + '; '.join(self.reasons[:3]) if self.reasons else ''}>")


def parse_frames(stack: list[str]) -> pd.DataFrame:
    """Stack frames as a table: ``file``, ``line``, ``func``, ``code``, ``user`` (outside torch/site-packages)."""
    rows = []
    for fr in stack or []:
        parsed = parse_frame(fr)
        if parsed is None:
            code = fr.split("\n", 1)[1].strip() if "\n" in fr else ""
            rows.append({"file": "", "line": -1, "func": "", "code": code or fr, "user": False})
            continue
        f, line, func, code = parsed
        rows.append({"file": f, "line": line, "func": func, "code": code, "user": is_user_file(f)})
    return pd.DataFrame(rows, columns=["file", "line", "func", "code", "user"])


def frames_html(frames: pd.DataFrame, title: str = "stack") -> str:
    """User frames in full, internal frames folded away."""
    if frames.empty:
        return f"<p><b>{html.escape(title)}</b>: none recorded</p>"
    out = [f"<p><b>{html.escape(title)}</b> ({int(frames['user'].sum())} user frames, "
           f"{int((~frames['user']).sum())} internal)</p><table class='msnb-t'>"]
    internal = []
    for r in frames.itertuples():
        row = (f"<tr><td>{html.escape(str(r.file))}:{r.line}</td><td>{html.escape(str(r.func))}</td>"
               # the source line is shown whole (wrapped), never cut: its end is often the cause
               f"<td style='white-space:pre-wrap;overflow-wrap:anywhere;max-width:none'>"
               f"<code>{html.escape(str(r.code))}</code></td></tr>")
        if r.user:
            out.append(row.replace("<tr>", "<tr style='font-weight:bold'>"))
        else:
            internal.append(row)
    out.append("</table>")
    if internal:
        out.append("<details><summary>internal frames</summary><table class='msnb-t' style='color:#777'>"
                   + "".join(internal) + "</table></details>")
    return "".join(out)
