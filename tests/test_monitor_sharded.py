"""The monitor under FSDP2 (issue 32): two gloo ranks record the norms of the full parameters and gradients
(not of their shards), the same on both ranks, with NaN counts of the full tensor, and training is bitwise
the same with the monitor as without it. The ranks run in a child process (this file as a script) under a
timeout, so a hung collective fails the test instead of the suite."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORLD, STEPS = 2, 3
needs_gloo = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def _model():
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    for layer in model:
        fully_shard(layer)
    return fully_shard(model), full


def _train(rank, path, plant_nan):
    import msprobe_nb as mp

    model, full = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = mp.Monitor(model, opt, dump_path=path, alerts=False) if path else None
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))  # each rank its own data
    losses, grads = [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        grads.append({n: p.grad.full_tensor().norm().item() for n, p in model.named_parameters()})
        if plant_nan and step == STEPS - 1 and rank == 1:
            model[1].weight.grad._local_tensor[0, :2] = float("nan")  # in rank 1's shard only
        opt.step()
        losses.append(loss.detach().clone())
        if mon:
            mon.step(loss=loss)
    if mon:
        mon.close()
    shards = [p._local_tensor.detach().clone() for p in model.parameters()]
    return losses, shards, grads, {n: t.norm().item() for n, t in full.items()}


def _worker(rank, port, root):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        plain = _train(rank, None, False)
        watched = _train(rank, os.path.join(root, "mon"), False)
        _train(rank, os.path.join(root, "nan"), True)
        same = all(torch.equal(a, b) for a, b in zip(plain[0], watched[0], strict=True)) and \
            all(torch.equal(a, b) for a, b in zip(plain[1], watched[1], strict=True))
        out = {"bitwise": same, "grads": watched[2], "weights0": watched[3],
               "local_numel": [s.numel() for s in watched[1]]}
        Path(root, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@needs_gloo
def test_fsdp2_ranks_record_full_norms_and_train_bitwise_the_same(tmp_path):
    p = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    import msprobe_nb as mp

    runs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert all(r["bitwise"] for r in runs)
    assert sum(runs[0]["local_numel"]) < sum(16 * 16 + 16 for _ in range(3))  # each rank holds a shard only
    m = mp.load_monitor(tmp_path / "mon")
    s = m.stats.set_index(["rank", "step", "kind", "name"])["norm"]
    for rank, r in enumerate(runs):
        for name, norm in r["weights0"].items():  # the full parameters' norms, before any update
            assert s[(rank, 0, "weight", name)] == pytest.approx(norm, rel=1e-6), (rank, name)
        for step, norms in enumerate(r["grads"]):
            for name, norm in norms.items():
                assert s[(rank, step, "grad", name)] == pytest.approx(norm, rel=1e-6), (rank, step, name)
    assert (m.stats["numel"].isin([256, 16])).all()  # the full tensors' sizes
    n = mp.load_monitor(tmp_path / "nan").stats
    bad = n.loc[(n["step"] == STEPS - 1) & (n["kind"] == "grad") & (n["name"] == "1.weight")]
    assert list(bad["nan"]) == [2, 2]  # the full tensor's count, on both ranks (rank 0's shard has none)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    import torch.multiprocessing as tmp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    tmp.start_processes(_worker, args=(_free_port(), sys.argv[1]), nprocs=WORLD, join=True, start_method="spawn")
