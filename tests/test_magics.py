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


MESSAGE_CELLS = [
    "import torch, torch.nn as nn\n%load_ext msprobe_nb\nmodel = nn.Sequential(nn.Linear(4, 4), nn.ReLU())",
    # 1: every magic takes --help: it prints the usage, starts nothing
    "%msprobe_start --help\n%msprobe_stop --help\n%msprobe_step --help\n%msprobe_monitor --help\n"
    "from msprobe_nb import magics\nassert magics.current() is None\nprint('HELP-OK')",
    # 2: a mistyped flag gets a did-you-mean
    "%msprobe_start --levle mix",
    # 3: a dump folder that holds a dump: the real path, said once, no UserWarning
    "%%msprobe -o runs/a\ny = torch.relu(torch.randn(3))",
    "%msprobe_start -o runs/a --level L1\ny = torch.relu(torch.randn(3))\n%msprobe_stop --as second",
    # 5: --step 5 and one step run: nothing recorded, why, and the variable is not set
    "%msprobe_start --step 5 -o runs/s5 --level L1\ny = torch.relu(torch.randn(3))\n%msprobe_step\n"
    "%msprobe_stop --as d3",
    "print('D3-DEFINED' if 'd3' in dir() else 'D3-UNDEFINED')",
    # 7: --step 0,5: step 0 recorded, step 5 said missing
    "%msprobe_start --step 0,5 -o runs/s05 --level L1\ny = torch.relu(torch.randn(3))\n%msprobe_step\n"
    "%msprobe_stop --as d05",
]


def _text(cell) -> str:
    return "".join(o.get("text", "") + "".join(o.get("traceback", [])) + o.get("evalue", "")
                   for o in cell.get("outputs", []))


def test_magic_messages_in_a_real_kernel(tmp_path):
    """--help, did-you-mean, the real dump path said once, and what --step left unrecorded (issue 33)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in MESSAGE_CELLS]
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # every cell runs; each message is checked below, all the wrong ones reported together
    out = [_text(c) for c in nb.cells]
    checks = {
        "--help": "HELP-OK" in out[1] and "%msprobe_start [--config CONFIG]" in out[1] and "--level" in out[1]
        and "%msprobe_monitor [" in out[1] and "%msprobe_step" in out[1],
        "did-you-mean": "--levle" in out[2] and "did you mean '--level'?" in out[2],
        "path once, no warning": "Warning" not in out[4] and "warnings.warn" not in out[4]
        and "-> runs/a_1 (runs/a holds a dump already" in out[4] and out[4].count("runs/a_1") == 2
        and (tmp_path / "runs" / "a_1" / "rank0.h5").exists(),
        "--step never reached": "nothing was recorded: --step 5 asks for step(s) the run never reached" in out[5]
        and "stopped in step 1" in out[5] and "`d3` is not set" in out[5] and "D3-UNDEFINED" in out[6],
        "--step partly recorded": "steps [0]" in out[7] and "step(s) 5 asked for by --step were not recorded" in out[7],
    }
    wrong = [f"{name}: {out[i]!r}" for (name, ok), i in zip(checks.items(), (1, 2, 4, 5, 7)) if not ok]
    assert not wrong, "\n".join(wrong)
