"""oxccl for Python: GPU collectives (MSCCL++-style) over the Rust core.

One :class:`Communicator` per rank (one GPU per process), made from a unique id
(:func:`unique_id`, bytes shared any way), from the launcher environment
(:meth:`Communicator.from_env`: torchrun, mpirun, srun) or from a ``torch.distributed``
store (:meth:`Communicator.from_store`). Its collectives take torch tensors, CuPy arrays or
anything with DLPack / ``__cuda_array_interface__`` on GPUs, and numpy arrays (or CPU
tensors) on the host backend, which needs no GPU::

    import numpy as np, oxccl
    comm = oxccl.Communicator.from_env()           # RANK, WORLD_SIZE, MASTER_ADDR/PORT
    x = np.arange(1000, dtype=np.float32)
    comm.all_reduce(x)                             # in place: x = sum over the ranks
    comm.destroy()

On a GPU backend a call is queued on the caller's current stream (torch's or CuPy's, or the
``stream=`` given) and returns at once; on the host backend it is synchronous (the data is
staged through a buffer of the communicator's). Failures raise :class:`OxcclError` (or
``ValueError`` / ``TypeError`` for bad arguments) naming the call, the rank and the cause.
``oxccl.torch`` adds torch custom ops and the ``"oxccl"`` ``torch.distributed`` backend.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from ._oxccl import UNIQUE_ID_BYTES, OxcclError, backends, dtype_code, dtypes, unique_id
from ._oxccl import Communicator as _Raw

__all__ = [
    "Communicator",
    "OxcclError",
    "UNIQUE_ID_BYTES",
    "backends",
    "dtype_code",
    "dtypes",
    "unique_id",
]


def _stream_handle(stream: Any, array: Any) -> int:
    """The raw stream handle a call runs on: ``stream`` as given (an int, a
    ``torch.cuda.Stream`` or a CuPy stream), else the current stream of the library that
    made ``array`` (torch, CuPy), else 0 (the legacy default stream)."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(array, torch.Tensor) and array.is_cuda:
            return _torch_current_stream(torch, array.get_device())
        cupy = sys.modules.get("cupy")
        if cupy is not None and isinstance(array, cupy.ndarray):
            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"oxccl: stream {stream!r} is not a stream (an int handle, a torch.cuda.Stream or a CuPy stream)")


def _torch_current_stream(torch: Any, device: int) -> int:
    """The raw handle of torch's current stream on ``device``. ``torch.cuda.current_stream``
    builds a Stream object (3 us per call on the H100 machine); the private accessor torch's
    own generated code uses returns the handle directly, and is taken where it exists."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


# torch dtype -> oxccl's data type code, filled on first use (torch may be imported later).
_TORCH_CODES: Optional[dict] = None


def _torch_codes(torch: Any) -> dict:
    global _TORCH_CODES
    if _TORCH_CODES is None:
        names = {
            "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
            "int8": "i8", "uint8": "u8", "int32": "i32", "uint32": "u32", "int64": "i64",
            "uint64": "u64", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
            "float8_e4m3fnuz": "fp8_e4m3fnuz", "float8_e5m2fnuz": "fp8_e5m2fnuz",
        }
        _TORCH_CODES = {
            getattr(torch, t): dtype_code(o) for t, o in names.items() if hasattr(torch, t)
        }
    return _TORCH_CODES


def _array(array: Any) -> Any:
    """What the extension reads for ``array``. A contiguous torch CUDA tensor of a type
    oxccl serves goes as ``(address, elements, data type code, device)``, read with
    torch's own accessors: the DLPack export the extension makes otherwise (``__dlpack__``
    and ``__dlpack_device__``, twice for an in-place call) was about half of an eager
    call's host time. Anything else goes as it is; torch refuses DLPack export of a tensor
    that requires grad, and the collectives only move its data, so such a tensor is seen
    detached (same storage)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(array, torch.Tensor):
        if array.is_cuda and array.is_contiguous():
            code = _torch_codes(torch).get(array.dtype)
            if code is not None:
                return (array.data_ptr(), array.numel(), code, array.get_device())
        if array.requires_grad:
            return array.detach()
    return array


def _packed(counts) -> list:
    """Displacements of ``counts`` laid end to end in rank order."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += int(c)
    return out


def _arrays(input: Any, output: Any, stream: Any) -> tuple:
    """``(input, output, stream handle)`` for the extension; an in-place call's one array
    is read once."""
    i = _array(input)
    o = i if output is input else _array(output)
    return i, o, _stream_handle(stream, output)


class Communicator:
    """One rank of an oxccl communicator (collective to create: every rank must).

    ``Communicator(unique_id, rank, world_size)`` joins the job named by ``unique_id``
    (bytes from :func:`unique_id` on one rank, handed to the others any way). ``device``:
    the device ordinal (default ``LOCAL_RANK``, else ``rank``); ``backend``: ``"host"``,
    ``"cuda"`` or ``"rocm"`` (default ``OXCCL_BACKEND``, else the first GPU backend built
    that finds a device, else the host); ``timeout_ms``: bound of every wait on a peer
    (default ``OXCCL_TIMEOUT_MS`` or 30 s). Other settings come from the ``OXCCL_*``
    environment (docs/python.md).
    """

    def __init__(
        self,
        unique_id: bytes,
        rank: int,
        world_size: int,
        *,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> None:
        self._c = _Raw.from_unique_id(bytes(unique_id), rank, world_size, device, backend, timeout_ms)

    @classmethod
    def _wrap(cls, raw: _Raw) -> "Communicator":
        self = cls.__new__(cls)
        self._c = raw
        return self

    @classmethod
    def from_env(
        cls,
        *,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> "Communicator":
        """Joins the job the launcher describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
        ``MASTER_ADDR``, ``MASTER_PORT``: torchrun, mpirun, srun). Rank 0 listens on
        ``MASTER_PORT``, so that port must not be taken (under torchrun, whose store is on
        ``MASTER_PORT``, use :meth:`from_store` or set ``OXCCL_...`` as docs/python.md says)."""
        return cls._wrap(_Raw.from_env(device, backend, timeout_ms))

    @classmethod
    def from_store(
        cls,
        store: Any,
        rank: int,
        world_size: int,
        *,
        key: str = "oxccl/unique_id",
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> "Communicator":
        """Joins through a key-value store with ``set(key, bytes)`` and a blocking
        ``get(key)`` (``torch.distributed.Store``: TCPStore, FileStore, ...): rank 0 makes
        the unique id and sets ``key``, the others wait for it. Use a fresh ``key`` per
        communicator on one store."""
        if rank == 0:
            uid = unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        return cls(uid, rank, world_size, device=device, backend=backend, timeout_ms=timeout_ms)

    @classmethod
    def from_process_group(
        cls,
        group: Any = None,
        *,
        device: Optional[int] = None,
        backend: Optional[str] = None,
        timeout_ms: Optional[int] = None,
    ) -> "Communicator":
        """Joins with the ranks of a ``torch.distributed`` process group (default: the
        world), exchanging the unique id through the group's own collective
        (``broadcast_object_list``), so torchrun users need nothing else."""
        import torch.distributed as dist

        group = group or dist.group.WORLD
        rank = dist.get_rank(group)
        world = dist.get_world_size(group)
        box = [unique_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
        if device is None:
            import torch

            if torch.cuda.is_available():
                device = torch.cuda.current_device()
        return cls(box[0], rank, world, device=device, backend=backend, timeout_ms=timeout_ms)

    # -- properties ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This rank."""
        return self._c.rank

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._c.world_size

    @property
    def backend(self) -> str:
        """``"host"``, ``"cuda"`` or ``"rocm"``."""
        return self._c.backend

    @property
    def device(self) -> int:
        """Device ordinal of this rank."""
        return self._c.device

    @property
    def registered(self) -> int:
        """Number of registered arrays."""
        return self._c.registered

    @property
    def destroyed(self) -> bool:
        """Whether :meth:`destroy` was called."""
        return self._c.destroyed

    def __repr__(self) -> str:
        return repr(self._c)

    # -- collectives -----------------------------------------------------------------
    def all_reduce(self, tensor, output=None, *, op: str = "sum", accum: str = "auto", stream=None):
        """``output = op(tensor of every rank)``, reduced in rank order (every rank gets the
        same bits). In place when ``output`` is omitted. ``op``: sum, prod, min, max, avg;
        ``accum``: auto, native, f16, f32 (the accumulation type of floating types).
        Returns the output."""
        out = tensor if output is None else output
        i, o, h = _arrays(tensor, out, stream)
        self._c.all_reduce(i, o, op, accum, h)
        return out

    def all_gather(self, input, output, *, stream=None):
        """Rank r's ``input`` lands at elements ``[r*n, (r+1)*n)`` of every rank's
        ``output`` (``world_size * n`` elements). In place when ``input`` is this rank's slot
        of ``output``. Returns the output."""
        self._c.all_gather(*_arrays(input, output, stream))
        return output

    def reduce_scatter(self, input, output, *, op: str = "sum", accum: str = "auto", stream=None):
        """Rank r's ``output`` (n elements) gets the reduction of elements ``[r*n, (r+1)*n)``
        of every rank's ``input`` (``world_size * n``). In place when ``output`` is this
        rank's chunk of ``input``. Returns the output."""
        i, o, h = _arrays(input, output, stream)
        self._c.reduce_scatter(i, o, op, accum, h)
        return output

    def all_to_all(self, input, output, *, stream=None):
        """Chunk p of rank r's ``input`` lands in chunk r of rank p's ``output`` (both
        ``world_size * n`` elements, not overlapping). Returns the output."""
        self._c.all_to_all(*_arrays(input, output, stream))
        return output

    def all_to_all_v(self, input, output, send_counts, recv_counts, send_displs=None, recv_displs=None, *, stream=None):
        """All-to-all with per-peer sizes (MPI's Alltoallv): ``send_counts[p]`` elements of
        this rank's ``input`` at ``send_displs[p]`` land at ``recv_displs[r]`` of rank p's
        ``output``, where ``recv_counts[r]`` must equal that count (a mismatch is an error
        on every rank). Counts and displacements are in elements, one per rank;
        displacements default to the counts packed in rank order. Output elements no range
        covers are left as they were. Returns the output."""
        sd = _packed(send_counts) if send_displs is None else [int(d) for d in send_displs]
        rd = _packed(recv_counts) if recv_displs is None else [int(d) for d in recv_displs]
        i, o, h = _arrays(input, output, stream)
        self._c.all_to_all_v(i, [int(c) for c in send_counts], sd, o, [int(c) for c in recv_counts], rd, h)
        return output

    def broadcast(self, tensor, output=None, *, root: int = 0, stream=None):
        """Every rank's ``output`` gets ``root``'s ``tensor``; in place when ``output`` is
        omitted. Returns the output."""
        out = tensor if output is None else output
        i, o, h = _arrays(tensor, out, stream)
        self._c.broadcast(i, o, root, h)
        return out

    def reduce(self, tensor, output=None, *, root: int = 0, op: str = "sum", accum: str = "auto", stream=None):
        """``root``'s ``output`` gets the reduction of every rank's ``tensor`` (other ranks'
        output is not written); in place when ``output`` is omitted. Returns the output."""
        out = tensor if output is None else output
        i, o, h = _arrays(tensor, out, stream)
        self._c.reduce(i, o, root, op, accum, h)
        return out

    # -- registration, errors, teardown ----------------------------------------------
    def register(self, array) -> None:
        """Registers ``array`` for zero-copy calls (collective: every rank, same order,
        same length). Calls on buffers inside registered arrays, at the same offsets on
        every rank, take the zero-copy algorithms. On the host backend it is only
        recorded (calls are staged there)."""
        self._c.register(_array(array))

    def deregister(self, array) -> None:
        """Undoes :meth:`register` (collective)."""
        self._c.deregister(_array(array))

    def check(self, stream=None) -> None:
        """Waits for ``stream`` (default: the current torch stream when torch is loaded)
        and raises a failure a kernel recorded (a peer's timeout, ...). Not while
        capturing a CUDA graph."""
        if stream is None and self.backend == "cuda":
            torch = sys.modules.get("torch")
            if torch is not None:
                stream = torch.cuda.current_stream(self.device)
        self._c.check(0 if stream is None else _stream_handle(stream, None))

    def destroy(self) -> None:
        """Tears down (collective: waits for every rank). Later calls raise; a second
        destroy does nothing."""
        self._c.destroy()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
