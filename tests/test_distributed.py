"""Two ranks (gloo on the CPU) record into one dump folder: one file per rank, the same folder for both."""
from __future__ import annotations

import gc
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msprobe_nb.store.dump import load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, dump: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import msprobe_nb
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 4)
        for _ in range(2):  # twice: the second run must go to a fresh folder, the same one on both ranks
            with msprobe_nb.record(dump_path=dump, level="mix", model=lin):
                lin(torch.full((2, 4), float(rank))).sum().backward()
        gc.collect()  # what the run left in reference cycles is freed while the group lives
        dist.barrier()  # no rank tears its group down while the other still talks to it (gloo aborts then)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available in this build")
def test_two_ranks_write_one_dump_folder(tmp_path):
    dump = tmp_path / "runs" / "npu"
    mp.start_processes(_worker, args=(2, _free_port(), str(dump)), nprocs=2, join=True, start_method="spawn")
    for folder in (dump, dump.parent / "npu_1"):
        assert sorted(p.name for p in folder.glob("rank*.h5")) == ["rank0.h5", "rank1.h5"], folder
        d = load(folder)
        assert d.ranks == [0, 1]
        inputs = d.calls[d.calls.name == "Functional.linear.0.forward.input.0"].set_index("rank")
        assert inputs.loc[0, "max"] == 0.0 and inputs.loc[1, "max"] == 1.0
