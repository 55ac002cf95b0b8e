"""FSDP2 and DTensor tensor-parallel training on gloo ranks, with and without the kit, for the stack tests.

``run_sharded(world, root, scenarios)`` starts ``world`` processes (one process group) and runs each named
scenario of :data:`SCENARIOS` on every rank; a scenario trains without the kit, then under ``Debugger`` at
each of its levels, and saves per rank (``<scenario>/result<rank>.pt``) the losses and final parameters
(local shards) of every run, or the error a run raised. Dumps are written under ``<scenario>/<level>``.
``c_paths=False`` runs with every optional C path switched off (rows, stack keys, statistics kernels), the
code path a machine without a compiler takes.
"""
from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from distributed_runs import free_port, settle

#: the rank and step at which :func:`_fsdp_planted` changes one rank's input, and the first call it changes
PLANTED = {"rank": 1, "step": 1, "call": "Functional.linear.0.forward"}


def run_sharded(world: int, root: str | os.PathLike, scenarios: list[str], c_paths: bool = True) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp.start_processes(_worker, args=(world, free_port(), str(root), list(scenarios), c_paths), nprocs=world,
                        join=True, start_method="spawn")
    return root


def _worker(rank: int, world: int, port: int, root: str, scenarios: list[str], c_paths: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if not c_paths:
        from msprobe_nb.capture import api_mode, grad_hooks, module_hooks, recorder, stacks, stats
        api_mode._api_handler = grad_hooks._api_backward = module_hooks._module_hooks = None
        recorder._build_rows = None
        stacks._stack_key = None
        stats._fused_at = stats._int_at = stats._norms_into = None
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name in scenarios:
            out = Path(root) / name
            out.mkdir(parents=True, exist_ok=True)
            SCENARIOS[name](rank, world, out)
            settle()
    finally:
        dist.destroy_process_group()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(5)])


def _train(rank: int, build, level: str | None, out: Path, steps: int = 3, plant: dict | None = None):
    """Train ``steps`` AdamW steps of ``build()``; under ``Debugger(level)`` where level is given."""
    import msprobe_nb
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dbg = msprobe_nb.Debugger(dump_path=str(out / str(level)), level=level, model=model) if level else None
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(steps):
        x = torch.randn(8, 16, generator=gen)
        if plant and rank == plant["rank"] and step == plant["step"]:
            x = x * 1.001
        if dbg:
            dbg.start()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg:
            dbg.stop()
            dbg.step()
        losses.append(loss.detach().clone())
    if dbg:
        dbg.close()
    params = [getattr(p, "to_local", lambda p=p: p)().detach().clone() for p in model.parameters()]
    return losses, params


def _runs(rank: int, out: Path, build, levels: tuple, **kw) -> None:
    results = {}
    for level in (None, *levels):
        try:
            results[str(level)] = _train(rank, build, level, out, **kw)
        except Exception:  # noqa: BLE001 - the test reports what a rank raised
            results[str(level)] = traceback.format_exc()
        dist.barrier()
    torch.save(results, out / f"result{rank}.pt")


def _fsdp_model() -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard
    model = _mlp()
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def _tp_model() -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {str(i): (ColwiseParallel() if i % 2 == 0 else RowwiseParallel()) for i in range(4)}
    return parallelize_module(_mlp(), mesh, plan)


def _fsdp(rank: int, world: int, out: Path) -> None:
    _runs(rank, out, _fsdp_model, ("L0", "L1", "mix", "L2"))


def _fsdp_l1(rank: int, world: int, out: Path) -> None:
    _runs(rank, out, _fsdp_model, ("L1",))


def _fsdp_planted(rank: int, world: int, out: Path) -> None:
    """Two mix runs under FSDP2, the second with rank 1's input changed at step 1 (:data:`PLANTED`)."""
    for name, plant in (("bench", None), ("npu", PLANTED)):
        _train(rank, _fsdp_model, "mix", out / name, plant=plant)
        dist.barrier()


def _tp(rank: int, world: int, out: Path) -> None:
    _runs(rank, out, _tp_model, ("L1", "mix"))


SCENARIOS = {"fsdp": _fsdp, "fsdp_l1": _fsdp_l1, "fsdp_planted": _fsdp_planted, "tp": _tp}
