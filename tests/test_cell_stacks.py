"""Stacks of calls made in a notebook cell name the cell as IPython does (``Cell In[2], line 4``), not the
temporary file ipykernel compiled it into, and keep the whole source line."""
from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the [test] extra brings it)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (the [test] extra brings it)")


def test_a_cell_call_names_its_cell_and_line(tmp_path):
    code = f"""m = nn.Linear(4, 4)
dbg = mp.Debugger(dump_path={str(tmp_path / 'd')!r}, level='L1')
dbg.start(m)
y = m(torch.randn(2, 4, device='cpu', dtype=torch.float32, requires_grad=False))  # a long line, kept whole
dbg.stop()
r = mp.compare(mp.load({str(tmp_path / 'd')!r}), mp.load({str(tmp_path / 'd')!r}))
print([f for f in mp.load({str(tmp_path / 'd')!r}).stack('Functional.linear.0.forward') if 'Cell' in f])"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch, msprobe_nb as mp\nfrom torch import nn"),
                nbformat.v4.new_code_cell(code)]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("name") == "stdout")
    assert "File Cell In[2], line 4, in <module>" in text, text
    assert "requires_grad=False))  # a long line, kept whole" in text
    assert "ipykernel_" not in text


def test_the_detail_shows_a_long_source_line_whole():
    import pandas as pd

    from msprobe_nb.viewers.detail import frames_html
    code = "x = torch.randint(0, 1000, (x0.shape[0],), device=x0.device, generator=None)  # the key is at the end"
    html = frames_html(pd.DataFrame([{"file": "Cell In[3]", "line": 12, "func": "<module>", "code": code,
                                      "user": True}]))
    assert "device=x0.device, generator=None)  # the key is at the end" in html
    assert "white-space:pre-wrap" in html  # wrapped, not cut with an ellipsis by the table's cell style
