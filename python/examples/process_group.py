"""The torch.distributed route: importing oxccl.torch registers the "oxccl" backend; CUDA
tensors go to oxccl, CPU tensors to gloo.

    torchrun --standalone --nproc_per_node=2 python/examples/process_group.py
"""

import os

import torch
import torch.distributed as dist

import oxccl.torch  # noqa: F401  (registers the backend)


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("cpu:gloo,cuda:oxccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    t = torch.full((1 << 20,), float(rank + 1), device="cuda", dtype=torch.bfloat16)
    dist.all_reduce(t)  # oxccl
    assert t[0].item() == world * (world + 1) / 2

    out = torch.empty(world * 4, device="cuda")
    dist.all_gather_into_tensor(out, torch.full((4,), float(rank), device="cuda"))  # oxccl
    c = torch.ones(3)
    dist.all_reduce(c)  # gloo (CPU tensor)
    try:
        dist.gather(torch.ones(2, device="cuda"), dst=0)  # not served: a clear error
    except NotImplementedError as e:
        if rank == 0:
            print("as expected:", e)
    if rank == 0:
        print("all_reduce", t[0].item(), "all_gather", out.tolist(), "cpu", c.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
