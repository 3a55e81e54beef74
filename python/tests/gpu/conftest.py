"""The GPU suite runs under torchrun (ci/gpu/python.sh): every rank runs the same tests in
the same order. One process group for the session: ``cpu:gloo,cuda:oxccl``, so the
process-group route is set up by torch itself; its oxccl communicator serves the direct
calls too. Ranks beyond the GPU count share GPUs (two ranks time-sliced on one GPU)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch as oxt


@pytest.fixture(scope="session")
def pg():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("cpu:gloo,cuda:oxccl")
    group = oxt.process_group()
    assert group is not None, f"the world group is {dist.group.WORLD!r}, not oxccl's"
    yield group
    torch.cuda.synchronize()
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def comm(pg) -> oxccl.Communicator:
    assert pg.comm.backend == "cuda", pg.comm
    return pg.comm
