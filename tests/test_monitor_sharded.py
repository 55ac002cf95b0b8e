"""The monitor under FSDP2 and DDP (issue 32): two gloo ranks record the norms of the full parameters and
gradients (not of their shards), the same on both ranks, with NaN counts of the full tensor, and training is
bitwise the same with the monitor as without it; under DDP, opt-in, each rank's own gradients before the
reduction, so that a rank whose gradients part is named. The ranks run in a child process (this file as a
script) under a timeout, so a hung collective fails the test instead of the suite."""
from __future__ import annotations

import gc
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


def _ddp(rank, path, plant):
    """Three DDP steps, each rank on its own data; ``plant``: rank 1's input changes at step 2."""
    import msprobe_nb as mp

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    with mp.Monitor(model, opt, dump_path=path, alerts=False, local_grads=True) as mon:
        for step in range(STEPS):
            opt.zero_grad()
            x = torch.randn(4, 6, generator=gen)
            if plant and rank == 1 and step == 2:
                x = x * 1.01
            model(x).square().mean().backward()
            opt.step()
            mon.step()


def _worker(rank, port, root):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        plain = _train(rank, None, False)
        watched = _train(rank, os.path.join(root, "mon"), False)
        _train(rank, os.path.join(root, "nan"), True)
        _ddp(rank, os.path.join(root, "ddp_a"), False)
        _ddp(rank, os.path.join(root, "ddp_b"), True)
        same = all(torch.equal(a, b) for a, b in zip(plain[0], watched[0], strict=True)) and \
            all(torch.equal(a, b) for a, b in zip(plain[1], watched[1], strict=True))
        out = {"bitwise": same, "grads": watched[2], "weights0": watched[3],
               "local_numel": [s.numel() for s in watched[1]]}
        Path(root, f"rank{rank}.json").write_text(json.dumps(out))
        gc.collect()  # FSDP2's modules and DDP's reducer sit in reference cycles: freed while the group lives
        dist.barrier()  # no rank tears its group down while the other still talks to it (gloo aborts then)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    p = subprocess.run([sys.executable, __file__, str(root)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return root


@needs_gloo
def test_fsdp2_ranks_record_full_norms_and_train_bitwise_the_same(ranks):
    import msprobe_nb as mp

    tmp_path = ranks
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


@needs_gloo
def test_ddp_ranks_local_gradients_name_the_rank_whose_gradients_part(ranks):
    import msprobe_nb as mp

    m = mp.load_monitor(ranks / "ddp_a")
    s = m.stats.set_index(["step", "name", "kind", "rank"])["norm"]
    grads = s.xs("grad", level="kind")
    assert grads.xs(0, level="rank").equals(grads.xs(1, level="rank"))  # all-reduced: alike on both ranks
    local = s.xs("local_grad", level="kind")
    assert (local.xs(0, level="rank") != local.xs(1, level="rank")).all()  # each rank's own data
    fd = mp.compare_monitors(ranks / "ddp_b", ranks / "ddp_a").first_divergence()
    assert (fd.step, fd.rank, fd.kind, fd.what) == (2, 1, "local_grad", "local gradient")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    import torch.multiprocessing as tmp

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    tmp.start_processes(_worker, args=(_free_port(), sys.argv[1]), nprocs=WORLD, join=True, start_method="spawn")
