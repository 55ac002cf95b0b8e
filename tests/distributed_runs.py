"""Multi-rank runs on gloo (CPU) for the distributed tests, and dumps other tests can reuse.

``run_ranks(world, scenarios, root)`` starts ``world`` processes once (one process group) and runs the
named scenarios in order on every rank; each writes under ``root/<scenario>/`` (``monitor_ddp``: a DDP run
with gradient accumulation under ``Monitor``, and without it). Reusable dumps:

* :func:`planted_change` -- two L1 runs of a 2-rank data-parallel step (gradients all-reduced by hand),
  identical except that rank 1 scales its batch at step 1: the runs first part on rank 1, step 1, at
  ``Functional.linear.0.forward``, and the difference reaches rank 0 through ``Distributed.all_reduce``;
* :func:`planted_overflow` -- one L1 statistics run of 2 ranks where rank 1 overflows at step 0
  (``Torch.mul.1.forward``: finite inputs, infinite output) and all-reduces the result, so rank 0's
  ``Distributed.all_reduce.0.forward`` has finite inputs and an infinite output too. Rank 0 reaches that
  all-reduce as its 4th call while rank 1 first runs a dozen other calls: by call index, and on rank 0's
  clock, rank 0's all-reduce output is the first non-finite value, yet the overflow started on rank 1.
"""
from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: what planted_change plants and where the runs first part
CHANGE = {"rank": 1, "step": 1, "call": "Functional.linear.0.forward"}
#: where planted_overflow's overflow starts, and the collective that spreads it to rank 0
OVERFLOW = {"rank": 1, "step": 0, "call": "Torch.mul.1.forward", "spread_by": "Distributed.all_reduce.0.forward"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settle() -> None:
    """End a scenario on every rank: free what it left while the process group is alive (DDP's reducer and
    FSDP2's modules sit in reference cycles, which a later collection would tear down after the group, or at
    the interpreter's exit, where gloo aborts the process: 'terminate called without an active exception'),
    then meet the other ranks, so that none tears its group down while another still talks to it."""
    gc.collect()
    dist.barrier()


def run_ranks(world: int, scenarios: list[str], root: str | os.PathLike) -> Path:
    """Run ``scenarios`` (names of functions in :data:`SCENARIOS`) on ``world`` gloo ranks; returns root."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(world, free_port(), str(root), list(scenarios)), nprocs=world, join=True,
                       start_method="spawn")
    return root


def planted_change(root: str | os.PathLike) -> dict:
    """Write the bench and npu dumps of :data:`CHANGE`; returns their folders and what was planted."""
    root = run_ranks(2, ["planted_change"], root)
    return {"bench": root / "planted_change" / "bench", "npu": root / "planted_change" / "npu", **CHANGE}


def planted_overflow(root: str | os.PathLike) -> dict:
    """Write the dump of :data:`OVERFLOW`; returns its folder and where the overflow starts."""
    root = run_ranks(2, ["planted_overflow"], root)
    return {"dump": root / "planted_overflow" / "dump", **OVERFLOW}


def _worker(rank: int, world: int, port: int, root: str, scenarios: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name in scenarios:
            out = Path(root) / name
            out.mkdir(parents=True, exist_ok=True)
            SCENARIOS[name](rank, world, out)
            settle()
    finally:
        dist.destroy_process_group()


def _note(out: Path, rank: int, **facts) -> None:
    """What a rank saw that the test process cannot (errors, results), as JSON."""
    (out / f"facts{rank}.json").write_text(json.dumps(facts))


# ----------------------------------------------------------------------------- scenarios

def _collectives(rank: int, world: int, out: Path) -> None:
    """Every kind of collective once, at L1, with values that tell the ranks apart."""
    import msprobe_nb
    functional = torch.ops._c10d_functional
    pair = dist.new_group([0, 1])  # every rank creates it; only ranks 0 and 1 use it
    with msprobe_nb.record(dump_path=str(out / "dump"), level="L1") as dbg:
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        s = torch.full((3,), float(rank) * 10)
        dist.broadcast(s, 0)
        parts = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(parts, torch.full((2,), float(rank)))
        a = torch.full((5,), float(rank + 1))
        work = dist.all_reduce(a, async_op=True)
        work.wait()
        a.mul_(100)  # after completion: the recorded output is the reduced value, not this
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        box = torch.zeros(3)
        if rank % 2 == 0:
            dist.send(torch.full((3,), float(rank)), nxt)
            dist.recv(box, prev)
        else:
            dist.recv(box, prev)
            dist.send(torch.full((3,), float(rank)), nxt)
        got = torch.zeros(2)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), nxt),
                                       dist.P2POp(dist.irecv, got, prev)])
        for r in reqs:
            r.wait()
        got.add_(1000)  # after completion: the recorded irecv output is what arrived
        # the functional op and its explicit wait: fc.all_reduce's AsyncCollectiveTensor wrapper builds a
        # custom op on its first call, which costs more than this whole module (its wait is handled alike)
        f = functional.all_reduce(torch.full((2,), float(rank + 1)), "sum", dist.group.WORLD.group_name)
        functional.wait_tensor(f)
        if rank < 2:
            p = torch.full((2,), float(rank + 1))
            dist.all_reduce(p, op=dist.ReduceOp.MAX, group=pair)
        errors = dbg.errors
    _note(out, rank, errors=errors, async_after=a.tolist(), recv_after=got.tolist())


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))


def _train_ddp(rank: int, level: str | None, out: Path, steps: int = 2) -> tuple[list, list]:
    import msprobe_nb
    model = torch.nn.parallel.DistributedDataParallel(_tiny_model(), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    dbg = msprobe_nb.Debugger(dump_path=str(out / f"ddp_{level}"), level=level, model=model) if level else None
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 6, generator=gen)
        y = torch.randint(0, 3, (4,), generator=gen)
        if dbg:
            dbg.start()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
        losses.append(loss.detach().clone())
    if dbg:
        dbg.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def _ddp(rank: int, world: int, out: Path, levels: tuple = (None, "L1", "mix")) -> None:
    """Two DDP steps without the kit, then recorded at each level: losses and parameters, for the test."""
    runs = {level or "off": _train_ddp(rank, level, out) for level in levels}
    torch.save(runs, out / f"ddp{rank}.pt")


def _monitor_ddp(rank: int, world: int, out: Path) -> None:
    """Two DDP steps of two micro-batches each (the first under ``no_sync``), each rank on its own data, run
    without and with ``Monitor``: losses, gradients and parameters for the bitwise check, and the norms of
    the gradients the optimizer got (all-reduced, so alike on every rank) for the record."""
    import contextlib

    import msprobe_nb
    runs = {}
    for watched in ("off", "on"):
        model = torch.nn.parallel.DistributedDataParallel(_tiny_model(), bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        mon = msprobe_nb.Monitor(model, opt, dump_path=str(out / "mon"), alerts=False) if watched == "on" else None
        losses, norms = [], []
        for _ in range(2):
            opt.zero_grad()
            for micro in range(2):
                x = torch.randn(4, 6, generator=gen)
                y = torch.randint(0, 3, (4,), generator=gen)
                with model.no_sync() if micro == 0 else contextlib.nullcontext():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
            norms.append({n: p.grad.norm().item() for n, p in model.module.named_parameters()})
            opt.step()
            if mon is not None:
                mon.step(loss=loss)
            losses.append(loss.detach().clone())
        if mon is not None:
            mon.close()
        runs[watched] = {"losses": losses, "grads": [p.grad.clone() for p in model.parameters()],
                         "params": [p.detach().clone() for p in model.parameters()], "norms": norms}
    torch.save(runs, out / f"monitor{rank}.pt")


def _overflow_check(rank: int, world: int, out: Path) -> None:
    """The overflow_check task: rank 1 overflows at step 1 and all-reduces it; steps 0 and 2 are clean."""
    import msprobe_nb
    lin = torch.nn.Linear(4, 4)
    dbg = msprobe_nb.Debugger(dump_path=str(out / "dump"), task="overflow_check", level="L1", model=lin)
    for step in range(3):
        dbg.start()
        h = lin(torch.ones(2, 4))
        for _ in range(12):
            h = torch.tanh(h)
        if rank == 1 and step == 1:
            h = torch.mul(torch.mul(h, 1e30), 1e30)
        dist.all_reduce(h)
        h.sum()
        dbg.stop()
        dbg.step()
    dbg.close()


def _planted_change(rank: int, world: int, out: Path) -> None:
    import msprobe_nb
    for side in ("bench", "npu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(7 + rank)
        dbg = msprobe_nb.Debugger(dump_path=str(out / side), level="L1", model=model)
        for step in range(2):
            x = torch.randn(3, 4, generator=gen)
            y = torch.randn(3, 2, generator=gen)
            if side == "npu" and rank == CHANGE["rank"] and step == CHANGE["step"]:
                x.mul_(1.001)  # before recording: the first recorded call that sees it is the first linear
            dbg.start()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            dbg.stop()
            dbg.step()
        dbg.close()


def _planted_overflow(rank: int, world: int, out: Path) -> None:
    import msprobe_nb
    with msprobe_nb.record(dump_path=str(out / "dump"), level="L1"):
        h = torch.full((4,), 0.5)
        if rank == OVERFLOW["rank"]:
            for _ in range(12):  # rank 1 gets to its overflow later, by call index, than rank 0 to the all-reduce
                h = torch.tanh(h)
            h = torch.mul(torch.mul(h, 1e30), 1e30)  # Torch.mul.1: finite in, inf out
        else:
            h = torch.add(h, 1.0)
            h = torch.tanh(h)
            h = torch.sub(h, 0.5)
        dist.all_reduce(h)
        torch.sum(h)


def _setup_ranks(rank: int, world: int, out: Path) -> None:
    """One DDP step recorded by the Debugger, then one watched by the Monitor: each rank on its own batch."""
    import msprobe_nb
    for kind in ("dump", "mon"):
        msprobe_nb.seed_all(0, verbose=False)  # Python's and numpy's generators too: else each process its own
        model = torch.nn.parallel.DistributedDataParallel(_tiny_model(), bucket_cap_mb=1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 + rank))
        if kind == "dump":
            with msprobe_nb.record(dump_path=str(out / kind), level="L0", model=model):
                model(x).sum().backward()
                opt.step()
        else:
            with msprobe_nb.Monitor(model, opt, dump_path=str(out / kind), alerts=False) as mon:
                model(x).sum().backward()
                opt.step()
                mon.step()


SCENARIOS = {f.__name__[1:]: f for f in (_collectives, _ddp, _monitor_ddp, _overflow_check, _planted_change,
                                         _planted_overflow, _setup_ranks)}
