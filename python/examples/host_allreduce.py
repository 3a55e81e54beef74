"""No GPU needed: two processes all-reduce numpy arrays on the host backend, joined by a
unique id made in the parent.

    python python/examples/host_allreduce.py
"""

import multiprocessing as mp

import numpy as np

import oxccl


def rank_main(uid: bytes, rank: int, world: int) -> None:
    comm = oxccl.Communicator(uid, rank, world, backend="host")
    x = np.full(1000, rank + 1, dtype=np.float32)
    comm.all_reduce(x)  # in place: every element is 1 + 2 + ... + world
    gathered = np.empty(world * 3, dtype=np.int32)
    comm.all_gather(np.full(3, rank, dtype=np.int32), gathered)
    print(f"rank {rank}: sum {x[0]}, gathered {gathered.tolist()}")
    comm.destroy()


if __name__ == "__main__":
    world = 2
    uid = oxccl.unique_id()  # this process hosts the rendezvous until the ranks joined
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(uid, r, world)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
