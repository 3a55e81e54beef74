"""oxccl for PyTorch: collectives as torch custom ops, and the ``"oxccl"`` backend of
``torch.distributed``.

Custom ops (``torch.ops.oxccl.*``, each with a fake implementation, so they run eagerly,
inside ``torch.cuda.graph`` capture and under ``torch.compile(fullgraph=True)`` without
graph breaks); ``comm`` is the handle :func:`handle` gives for an :class:`oxccl.Communicator`:

- ``all_reduce(input, comm, op="sum") -> Tensor`` and ``all_reduce_(tensor, comm, op)``
  (in place, returns nothing);
- ``all_gather(input, comm) -> Tensor`` (concatenated along dim 0);
- ``reduce_scatter(input, comm, op="sum") -> Tensor`` (dim 0 split in world_size chunks);
- ``all_to_all(input, comm) -> Tensor`` (dim 0 in world_size chunks);
- ``broadcast_(tensor, comm, root)`` (in place).

Inputs that are not contiguous are copied to contiguous ones first (the raw
:class:`oxccl.Communicator` refuses them instead). Calls run on the current stream.

Importing this module registers the ``torch.distributed`` backend ``"oxccl"`` for CUDA
devices, so ``dist.init_process_group("cpu:gloo,cuda:oxccl")`` (or ``"oxccl"``) works: CUDA
tensors go to oxccl, CPU tensors to a gloo group the backend makes beside it. Collectives
oxccl does not serve (gather, scatter, send/recv, coalesced calls) raise
``NotImplementedError`` naming them, or go to a NCCL group made beside it when
``OXCCL_TORCH_FALLBACK=nccl`` is set.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd.graph import increment_version

import oxccl

__all__ = ["handle", "communicator", "mem_pool", "ProcessGroupOxccl", "BACKEND"]

#: The name of the torch.distributed backend.
BACKEND = "oxccl"

_COMMS: dict[int, "oxccl.Communicator"] = {}


def handle(comm: "oxccl.Communicator") -> int:
    """The integer that names ``comm`` in the custom ops (custom ops take no Python
    objects). The communicator stays known until :func:`forget`."""
    key = id(comm)
    _COMMS[key] = comm
    return key


def forget(comm: "oxccl.Communicator") -> None:
    """Drops ``comm``'s handle."""
    _COMMS.pop(id(comm), None)


def communicator(h: int) -> "oxccl.Communicator":
    """The communicator of handle ``h``."""
    try:
        return _COMMS[h]
    except KeyError:
        raise ValueError(f"oxccl.torch: {h} is not a communicator handle (oxccl.torch.handle(comm) makes one)") from None


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _gathered(input: torch.Tensor, world: int) -> torch.Tensor:
    shape = (world,) if input.dim() == 0 else (world * input.shape[0],) + tuple(input.shape[1:])
    return input.new_empty(shape)


def _chunks(t: torch.Tensor, world: int, call: str) -> int:
    if t.dim() == 0 or t.shape[0] % world:
        raise ValueError(f"oxccl.torch {call}: dim 0 of the input ({tuple(t.shape)}) is not a multiple of world_size {world}")
    return t.shape[0] // world


_ALLOCATOR = None


def mem_pool(device=None) -> "torch.cuda.MemPool":
    """A ``torch.cuda.MemPool`` whose tensors live in oxccl's own exportable allocations
    (``torch.cuda.memory.CUDAPluggableAllocator`` over this package's extension module):

        pool = oxccl.torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            grads = torch.empty(n, device="cuda")
        comm.register(grads)

    Needs a CUDA wheel (``--features cuda``)."""
    global _ALLOCATOR
    if "cuda" not in oxccl.backends():
        raise RuntimeError("oxccl.torch.mem_pool: this oxccl wheel was built without CUDA (maturin build --features cuda)")
    if _ALLOCATOR is None:
        from oxccl import _oxccl

        _ALLOCATOR = torch.cuda.memory.CUDAPluggableAllocator(_oxccl.__file__, "oxccl_torch_alloc", "oxccl_torch_free")
    return torch.cuda.MemPool(_ALLOCATOR.allocator())


# -- custom ops ----------------------------------------------------------------------
#
# Defined through torch.library.Library with one CompositeExplicitAutograd kernel each, not
# torch.library.custom_op: custom_op wraps every call in Python layers of its own (autograd
# and version-counter kernels), which cost about 9 us per call against 2.5 us here on one
# CPU, and 40 of the 80 us of an eager 1 KB all_reduce_ on the H100 machine (the Python
# GPU suite's breakdown). The in-place ops bump the mutated tensor's version counter
# themselves, as custom_op's kernel did. Fake kernels keep them traceable by
# torch.compile(fullgraph=True); none of them is differentiable.

_LIB = torch.library.Library("oxccl", "DEF")


def _define(schema: str, impl, fake):
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"oxccl::{name}", fake, lib=_LIB)
    return getattr(torch.ops.oxccl, name)


def _all_reduce(input: torch.Tensor, comm: int, op: str = "sum") -> torch.Tensor:
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    communicator(comm).all_reduce(_dense(input), out, op=op)
    return out


def _all_reduce_(tensor: torch.Tensor, comm: int, op: str = "sum") -> None:
    if tensor.is_contiguous():
        communicator(comm).all_reduce(tensor, op=op)
    else:
        tensor.copy_(communicator(comm).all_reduce(tensor.contiguous(), op=op))
    increment_version(tensor)


def _all_gather(input: torch.Tensor, comm: int) -> torch.Tensor:
    c = communicator(comm)
    out = _gathered(input, c.world_size)
    c.all_gather(_dense(input).reshape(-1), out.reshape(-1))
    return out


def _reduce_scatter(input: torch.Tensor, comm: int, op: str = "sum") -> torch.Tensor:
    c = communicator(comm)
    n = _chunks(input, c.world_size, "reduce_scatter")
    out = input.new_empty((n,) + tuple(input.shape[1:]))
    c.reduce_scatter(_dense(input), out, op=op)
    return out


def _all_to_all(input: torch.Tensor, comm: int) -> torch.Tensor:
    c = communicator(comm)
    _chunks(input, c.world_size, "all_to_all")
    out = torch.empty_like(input, memory_format=torch.contiguous_format)
    c.all_to_all(_dense(input), out)
    return out


def _broadcast_(tensor: torch.Tensor, comm: int, root: int = 0) -> None:
    if tensor.is_contiguous():
        communicator(comm).broadcast(tensor, root=root)
    else:
        tensor.copy_(communicator(comm).broadcast(tensor.contiguous(), root=root))
    increment_version(tensor)


def _reduce_scatter_fake(input, comm, op="sum"):
    n = _chunks(input, communicator(comm).world_size, "reduce_scatter")
    return input.new_empty((n,) + tuple(input.shape[1:]))


def _all_to_all_fake(input, comm):
    _chunks(input, communicator(comm).world_size, "all_to_all")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


all_reduce = _define(
    "all_reduce(Tensor input, int comm, str op='sum') -> Tensor",
    _all_reduce,
    lambda input, comm, op="sum": torch.empty_like(input, memory_format=torch.contiguous_format),
)
all_reduce_ = _define(
    "all_reduce_(Tensor(a!) tensor, int comm, str op='sum') -> ()",
    _all_reduce_,
    lambda tensor, comm, op="sum": None,
)
all_gather = _define(
    "all_gather(Tensor input, int comm) -> Tensor",
    _all_gather,
    lambda input, comm: _gathered(input, communicator(comm).world_size),
)
reduce_scatter = _define(
    "reduce_scatter(Tensor input, int comm, str op='sum') -> Tensor",
    _reduce_scatter,
    _reduce_scatter_fake,
)
all_to_all = _define("all_to_all(Tensor input, int comm) -> Tensor", _all_to_all, _all_to_all_fake)
broadcast_ = _define(
    "broadcast_(Tensor(a!) tensor, int comm, int root=0) -> ()",
    _broadcast_,
    lambda tensor, comm, root=0: None,
)


# -- the torch.distributed backend -----------------------------------------------------


try:
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # older torch: a Python Work
    _create_work_from_future = None


def _completed_work(result):
    """A Work that is already complete: oxccl queued the call on the caller's current
    stream, which is where NCCL's work would be waited for anyway."""
    fut = torch.futures.Future()
    fut.set_result(result)
    if _create_work_from_future is not None:
        return _create_work_from_future(fut)
    return _FutureWork(fut)


class _FutureWork(dist._Work):
    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        return self._fut


_OPS = None


def _op_name(reduce_op) -> str:
    global _OPS
    if _OPS is None:
        R = dist.ReduceOp
        _OPS = [("sum", R.SUM), ("prod", R.PRODUCT), ("min", R.MIN), ("max", R.MAX), ("avg", R.AVG)]
    for name, value in _OPS:
        try:
            if reduce_op == value:
                return name
        except TypeError:
            pass
    raise NotImplementedError(f"oxccl process group: the reduction {reduce_op} is not served by oxccl (sum, product, min, max, avg are)")


SERVED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "broadcast", "reduce", "barrier")


class ProcessGroupOxccl(dist.ProcessGroup):
    """A process group in Python over oxccl's communicator (CUDA tensors), with a gloo
    group beside it for CPU tensors. Made by ``dist.init_process_group`` through the
    registered creator; every call runs on the current CUDA stream and returns a completed
    Work (waiting on it is free, the stream orders the rest)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        # The bound of oxccl's waits stays its own (OXCCL_TIMEOUT_MS, default 30 s): torch's
        # group timeout (minutes) would let a diverged peer stall that long.
        self.comm = oxccl.Communicator.from_store(dist.PrefixStore("oxccl", store), rank, size, device=device)
        self._h = handle(self.comm)
        self._gloo = None
        try:
            self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("oxccl-gloo", store), rank, size, timeout)
        except Exception:  # noqa: BLE001 - gloo not built: CPU tensors are then refused
            self._gloo = None
        self._nccl = None
        if os.environ.get("OXCCL_TORCH_FALLBACK", "").lower() == "nccl":
            self._nccl = dist.ProcessGroupNCCL(dist.PrefixStore("oxccl-nccl", store), rank, size)

    # -- identity
    def getBackendName(self):
        return BACKEND

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def __repr__(self):
        return f"ProcessGroupOxccl(rank {self._rank} of {self._size}, {self.comm!r})"

    # -- routing
    def _cpu(self, tensors, call):
        if all(not t.is_cuda for t in tensors):
            if self._gloo is None:
                raise NotImplementedError(f"oxccl process group: {call} on CPU tensors needs gloo, which this torch lacks")
            return True
        return False

    def _unserved(self, call, *args):
        if self._nccl is not None:
            return getattr(self._nccl, call)(*args)
        raise NotImplementedError(
            f"oxccl process group: {call} is not served by oxccl (served: {', '.join(SERVED)}); "
            "set OXCCL_TORCH_FALLBACK=nccl to send it to NCCL, or use a NCCL group for it"
        )

    # -- served collectives
    def allreduce(self, tensors, opts=None):
        if self._cpu(tensors, "all_reduce"):
            return self._gloo.allreduce(tensors, opts)
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        for t in tensors:
            torch.ops.oxccl.all_reduce_(t, self._h, op)
        return _completed_work(tensors)

    def broadcast(self, tensors, opts=None):
        if self._cpu(tensors, "broadcast"):
            return self._gloo.broadcast(tensors, opts)
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            torch.ops.oxccl.broadcast_(t, self._h, root)
        return _completed_work(tensors)

    def reduce(self, tensors, opts=None):
        if self._cpu(tensors, "reduce"):
            return self._gloo.reduce(tensors, opts)
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            if t.is_contiguous():
                self.comm.reduce(t, root=root, op=op)
            else:
                t.copy_(self.comm.reduce(t.contiguous(), root=root, op=op))
        return _completed_work(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if self._cpu(input_tensors, "all_gather"):
            return self._gloo.allgather(output_tensors, input_tensors, opts)
        for outs, inp in zip(output_tensors, input_tensors):
            flat = torch.ops.oxccl.all_gather(inp.reshape(1, -1), self._h)
            for o, row in zip(outs, flat):
                o.copy_(row.view_as(o))
        return _completed_work(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        if self._cpu([input], "all_gather_into_tensor"):
            return self._gloo._allgather_base(output, input, opts)
        if output.is_contiguous():
            self.comm.all_gather(_dense(input).reshape(-1), output.reshape(-1))
        else:
            output.copy_(torch.ops.oxccl.all_gather(input.reshape(1, -1), self._h).view_as(output))
        return _completed_work([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _completed_work(outputs)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if self._cpu(output_tensors, "reduce_scatter"):
            return self._gloo.reduce_scatter(output_tensors, input_tensors, opts)
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        for out, ins in zip(output_tensors, input_tensors):
            stacked = torch.cat([t.reshape(-1) for t in ins])
            out.copy_(torch.ops.oxccl.reduce_scatter(stacked, self._h, op).view_as(out))
        return _completed_work(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        if self._cpu([input], "reduce_scatter_tensor"):
            return self._gloo._reduce_scatter_base(output, input, opts)
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        if output.is_contiguous():
            self.comm.reduce_scatter(_dense(input).reshape(-1), output.reshape(-1), op=op)
        else:
            output.copy_(torch.ops.oxccl.reduce_scatter(input.reshape(-1), self._h, op).view_as(output))
        return _completed_work([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _completed_work(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if self._cpu([input], "all_to_all_single"):
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        even = lambda s: not s or len(set(s)) == 1  # noqa: E731
        if not (even(output_split_sizes) and even(input_split_sizes)):
            # Uneven splits (rows of dim 0 per rank): all_to_all_v on the contiguous tensors.
            n = self.comm.world_size
            src = _dense(input)
            dst = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            in_row = src.numel() // max(src.shape[0], 1) if src.dim() else 1
            out_row = dst.numel() // max(dst.shape[0], 1) if dst.dim() else 1
            ins = list(input_split_sizes) or [src.shape[0] // n] * n
            outs = list(output_split_sizes) or [dst.shape[0] // n] * n
            self.comm.all_to_all_v(src.reshape(-1), dst.reshape(-1), [s * in_row for s in ins], [s * out_row for s in outs])
            if dst is not output:
                output.copy_(dst)
            return _completed_work([output])
        if output.is_contiguous():
            self.comm.all_to_all(_dense(input).reshape(-1), output.reshape(-1))
        else:
            output.copy_(torch.ops.oxccl.all_to_all(input.reshape(-1), self._h).view_as(output))
        return _completed_work([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if self._cpu(input_tensors, "all_to_all"):
            return self._gloo.alltoall(output_tensors, input_tensors, opts)
        if len({t.numel() for t in input_tensors + output_tensors}) != 1:
            return self._unserved("alltoall", output_tensors, input_tensors, opts)
        flat = torch.ops.oxccl.all_to_all(torch.cat([t.reshape(-1) for t in input_tensors]), self._h)
        for o, chunk in zip(output_tensors, flat.chunk(len(output_tensors))):
            o.copy_(chunk.view_as(o))
        return _completed_work(output_tensors)

    def barrier(self, opts=None):
        one = torch.ones(1, device=torch.device("cuda", self.comm.device)) if self.comm.backend == "cuda" else torch.ones(1)
        if one.is_cuda:
            self.comm.all_reduce(one)
            torch.cuda.current_stream(one.device).synchronize()
        elif self._gloo is not None:
            return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()
        return _completed_work(None)

    # -- unserved: a clear error (or NCCL when asked)
    def allreduce_coalesced(self, tensors, opts=None):
        return self._unserved("allreduce_coalesced", tensors, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        if self._cpu(input_tensors, "gather"):
            return self._gloo.gather(output_tensors, input_tensors, opts)
        return self._unserved("gather", output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        if self._cpu(output_tensors, "scatter"):
            return self._gloo.scatter(output_tensors, input_tensors, opts)
        return self._unserved("scatter", output_tensors, input_tensors, opts)

    def send(self, tensors, dst, tag=0):
        if self._cpu(tensors, "send"):
            return self._gloo.send(tensors, dst, tag)
        return self._unserved("send", tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        if self._cpu(tensors, "recv"):
            return self._gloo.recv(tensors, src, tag)
        return self._unserved("recv", tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._unserved("recv_anysource", tensors, tag)

    def shutdown(self):
        if not self.comm.destroyed:
            if self.comm.backend == "cuda":
                torch.cuda.synchronize(self.comm.device)
            self.comm.destroy()
        forget(self.comm)

    def abort(self):
        self.shutdown()


def _create(store, rank: int, size: int, timeout: timedelta) -> ProcessGroupOxccl:
    return ProcessGroupOxccl(store, rank, size, timeout)


def _register() -> None:
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cuda"])


def process_group(group: Optional["dist.ProcessGroup"] = None) -> Optional[ProcessGroupOxccl]:
    """The oxccl process group behind ``group`` (default: the world), if it is one."""
    g = group or dist.group.WORLD
    return g if isinstance(g, ProcessGroupOxccl) else None


_register()
