"""A torchrun training step whose gradient all-reduce is an oxccl custom op captured in a
CUDA graph together with the step's compute.

    torchrun --standalone --nproc_per_node=2 python/examples/graph_allreduce.py

The gradients live in one flat buffer registered with oxccl once (zero-copy on every replay);
the communicator joins through torch's own store (no other setup). Prints the loss per step.
"""

import os

import torch
import torch.distributed as dist

import oxccl
import oxccl.torch as oxt


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("cpu:gloo,cuda:oxccl")  # the store and ranks torchrun set up
    comm = oxt.process_group().comm  # the oxccl communicator behind the group
    h = oxt.handle(comm)

    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device="cuda")
    comm.register(flat)  # once; every replay is then zero-copy
    offsets, o = [], 0
    for p in params:  # each gradient is a view of the registered buffer
        p.grad = flat[o:o + p.numel()].view_as(p)
        offsets.append(o)
        o += p.numel()
    opt = torch.optim.SGD(params, lr=0.05)
    x = torch.randn(64, 512, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.ops.oxccl.all_reduce_(flat, h, "avg")  # gradients averaged across ranks
        opt.step()
        return loss.detach()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the graph (first calls are checked across ranks)
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            step()
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(g):
        static_loss = step()
    for it in range(10):
        flat.zero_()
        x.copy_(torch.randn(64, 512, device="cuda"))
        g.replay()
        if dist.get_rank() == 0:
            print(f"step {it}: loss {static_loss.item():.4f}")
    comm.deregister(flat)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
