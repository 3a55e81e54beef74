"""The Python package on the host backend (no GPU): every collective across 2 and 3
processes against numpy references, the DLPack route, registration, the launcher
environment, and bad input (each error must name the call and the rank)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import oxccl

import host_cases
import ranks


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_match_numpy(world):
    checks = ranks.run(world, host_cases.collectives, 11 * world)
    assert all(c == checks[0] and c > 300 for c in checks), checks


def test_dlpack_route():
    ranks.run(2, host_cases.dlpack)


def test_registration():
    ranks.run(2, host_cases.registration)


def test_mismatched_sizes_raise_on_every_rank():
    msgs = ranks.run(2, host_cases.mismatched_sizes)
    assert len(msgs) == 2


def test_launcher_environment():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = ranks.run_each([(host_cases.from_env_rank, (r, 3, port)) for r in range(3)])
    assert got == [[3] * 33] * 3


def test_store_route(tmp_path):
    got = ranks.run_each([(host_cases.from_store_rank, (r, 3, str(tmp_path))) for r in range(3)])
    assert got == [[0, 10, 1, 11, 2, 12]] * 3


@pytest.fixture(scope="module")
def solo():
    comm = oxccl.Communicator(oxccl.unique_id(), 0, 1, backend="host")
    yield comm
    comm.destroy()


def test_module_surface():
    assert "host" in oxccl.backends()
    assert "bf16" in oxccl.dtypes()
    codes = {oxccl.dtype_code(n) for n in oxccl.dtypes()}
    assert len(codes) == len(oxccl.dtypes())
    assert oxccl.dtype_code("bfloat16") == oxccl.dtype_code("bf16")
    with pytest.raises(ValueError, match="unknown data type"):
        oxccl.dtype_code("complex64")
    assert len(oxccl.unique_id()) == oxccl.UNIQUE_ID_BYTES


def test_bad_unique_id():
    with pytest.raises((oxccl.OxcclError, ValueError), match="Communicator"):
        oxccl.Communicator(b"not an id", 0, 2, backend="host")


def test_unknown_backend():
    with pytest.raises((oxccl.OxcclError, ValueError), match="backend"):
        oxccl.Communicator(oxccl.unique_id(), 0, 1, backend="tpu")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c, x: c.all_reduce(x[::2]), "not contiguous"),
        (lambda c, x: c.all_reduce(x.astype(np.complex64)), "data type"),
        (lambda c, x: c.all_reduce(x.astype(bool)), "data type"),
        (lambda c, x: c.all_reduce(x, x[:10]), "elements"),
        (lambda c, x: c.all_reduce(x, x.astype(np.float64)), "input is f32 but output is f64"),
        (lambda c, x: c.all_gather(x, np.empty(x.size + 1, x.dtype)), "world_size"),
        (lambda c, x: c.reduce_scatter(x, np.empty(x.size + 1, x.dtype)), "world_size"),
        (lambda c, x: c.broadcast(x, root=1), "root 1 is not a rank"),
        (lambda c, x: c.reduce(x, root=5), "root 5 is not a rank"),
        (lambda c, x: c.all_reduce(x, op="xor"), "op 'xor'"),
        (lambda c, x: c.all_reduce(x, accum="f8"), "accum 'f8'"),
        (lambda c, x: c.all_reduce([1.0, 2.0]), "not an array"),
        (lambda c, x: c.all_reduce(x, np.frombuffer(x.tobytes(), np.float32)), "read-only"),
        (lambda c, x: c.all_reduce(FakeCuda(x)), "is in cuda"),
        (lambda c, x: c.all_reduce(x, stream="s"), "not a stream"),
        # Described arrays (what the package passes for torch CUDA tensors).
        (lambda c, x: c.all_reduce((x.ctypes.data, x.size, oxccl.dtype_code("f32"), 0)), "is in cuda:0"),
        (lambda c, x: c.all_reduce((x.ctypes.data, x.size)), "a tuple is taken only as"),
        (lambda c, x: c.all_reduce((x.ctypes.data, x.size, 9999, 0)), "9999 is not a data type code"),
        (lambda c, x: c.all_reduce((x.ctypes.data, x.size, oxccl.dtype_code("f32"), -1)), "device -1"),
    ],
)
def test_bad_input_is_a_clear_error(solo, call, match):
    x = np.arange(100, dtype=np.float32)
    with pytest.raises((ValueError, TypeError)) as err:
        call(solo, x)
    assert match in str(err.value), str(err.value)
    if not isinstance(err.value, TypeError) or "stream" not in match:
        assert "rank 0" in str(err.value) or "stream" in str(err.value)


class FakeCuda:
    """Claims to be CUDA memory through the CUDA array interface."""

    def __init__(self, a):
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": "<f4", "data": (a.ctypes.data, False), "version": 3, "strides": None}


def test_use_after_destroy():
    comm = oxccl.Communicator(oxccl.unique_id(), 0, 1, backend="host")
    comm.destroy()
    comm.destroy()  # twice: nothing
    assert comm.destroyed
    with pytest.raises(oxccl.OxcclError, match="all_reduce .*destroyed"):
        comm.all_reduce(np.ones(4, np.float32))
    with pytest.raises(oxccl.OxcclError, match="destroyed"):
        comm.register(np.ones(4, np.float32))
