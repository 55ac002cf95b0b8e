"""seed_all makes two runs of a training step bitwise identical: each in its own interpreter (the string hash
seed is fixed at start-up), digest of every tensor, random number and data order compared."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msprobe_nb.config

REPO = Path(msprobe_nb.config.__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import hashlib, random, subprocess, sys
    import numpy as np, torch
    from msprobe_nb.seeding import seed_all

    seed_all(int(sys.argv[1]), mode=True, verbose=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 4))
    x = torch.randn(32, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    order = [int(i) for b in torch.utils.data.DataLoader(range(10), batch_size=3, shuffle=True) for i in b]
    child = subprocess.run([sys.executable, "-c", "print(hash('msprobe'))"], capture_output=True, text=True)
    h = hashlib.sha256()
    for t in (x, loss.detach(), *(p.grad for p in model.parameters()), torch.rand(5)):
        h.update(t.contiguous().numpy().tobytes())
    h.update(np.random.rand(5).tobytes())
    h.update(repr((random.random(), order, child.stdout)).encode())
    print(h.hexdigest())
""")


def run_script(tmp_path: Path, seed: int) -> str:
    script = tmp_path / "train_step.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONHASHSEED", None)
    out = subprocess.run([sys.executable, str(script), str(seed)], check=False, capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_two_runs_are_bitwise_identical(tmp_path: Path) -> None:
    first, second = run_script(tmp_path, 1234), run_script(tmp_path, 1234)
    assert len(first) == 64 and first == second
    assert run_script(tmp_path, 4321) != first  # the digest does depend on the seed


