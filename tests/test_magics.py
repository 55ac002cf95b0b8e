"""The magics in a real IPython kernel: load, record, step, stop, cell magic, unload removes every hook."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

CELLS = [
    "import torch, torch.nn as nn\n%load_ext msprobe_nb\n"
    "torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
    "%msprobe_start --level mix --dump-path 'runs/npu 1' --model model",
    "for _ in range(2):\n    loss = model(torch.randn(3, 4)).sum()\n    loss.backward()\n    opt.step()\n"
    "    opt.zero_grad()\n    %msprobe_step",
    "%msprobe_stop --as npu",
    "assert sorted(npu.steps) == [0, 1], npu.steps\n"
    "names = set(npu.calls.call)\n"
    "assert 'Module.0.Linear.forward.0' in names and 'Functional.linear.0.forward' in names, names\n"
    "assert 'Module.2.Linear.parameters_grad.0' in names\n",
    "%%msprobe --level L1 -o runs/cell\ny = torch.relu(torch.randn(5))",
    "assert 'Torch.relu.0.forward' in set(msprobe_dump.calls.call)",
    "%msprobe_start --level L9",
    "from torch.nn.modules import module as m\n%unload_ext msprobe_nb\n"
    "assert not m._global_forward_pre_hooks and not m._global_forward_hooks\n"
    "assert torch._C._len_torch_function_stack() == 0\n"
    "print('UNLOADED-CLEAN')",
    "%msprobe_start --level L9",
]


def test_magics_in_a_real_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.cells[-1].metadata["tags"] = ["raises-exception"]
    nb.cells[7].metadata["tags"] = ["raises-exception"]
    client = NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except Exception as exc:  # show which cell failed and why
        pytest.fail(f"notebook failed: {exc}")
    outputs = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "UNLOADED-CLEAN" in outputs
    # after unload the magic is gone: the last cell fails as a usage error, not a traceback from torch
    last = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "UsageError" in last and "not found" in last, last
    assert (tmp_path / "runs" / "npu 1" / "rank0.h5").exists()
    bad = "".join(o.get("text", "") for o in nb.cells[7].outputs)
    assert bad.startswith("UsageError") and "level" in bad and "L0" in bad, bad
