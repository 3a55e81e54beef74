"""What each rank runs in the host-backend tests (test_host.py). Every rank makes every
rank's input from a seed, so it checks its own output against a numpy reference: bit for
bit for data movement and the exact reductions, within a tolerance where the order of
rounding is not numpy's (avg, float16)."""

from __future__ import annotations

import numpy as np

import oxccl

POISON = {np.dtype(np.float32): np.float32(np.nan), np.dtype(np.float64): np.float64(np.nan)}


def data(rank: int, count: int, dtype, seed: int) -> np.ndarray:
    """Rank ``rank``'s input of a case: random, small enough that sums and products of a
    few ranks stay finite (integers wrap as in C either way)."""
    g = np.random.default_rng([seed, rank, count])
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return g.uniform(-2.0, 2.0, count).astype(dt)
    info = np.iinfo(dt)
    return g.integers(info.min, info.max, count, dtype=dt, endpoint=True)


def poisoned(count: int, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    out = np.empty(count, dt)
    if dt.kind == "f":
        out.fill(np.nan)
    else:
        out.fill(np.iinfo(dt).max // 3)
    return out


def reference(inputs, op: str) -> np.ndarray:
    """Reduction in rank order, in the element type (numpy wraps integers)."""
    acc = inputs[0].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for x in inputs[1:]:
            if op in ("sum", "avg"):
                acc = acc + x
            elif op == "prod":
                acc = acc * x
            elif op == "min":
                acc = np.minimum(acc, x)
            elif op == "max":
                acc = np.maximum(acc, x)
        if op == "avg":
            acc = (acc / len(inputs)).astype(inputs[0].dtype)
    return acc


def same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        bad = np.flatnonzero(got != want)
        raise AssertionError(f"{what}: {bad.size} elements differ, first at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}")


def close(got: np.ndarray, want: np.ndarray, what: str, rtol: float) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    ok = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=rtol)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise AssertionError(f"{what}: {bad.size} elements off, first at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}")


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.int64]
COUNTS = [0, 1, 7, 1000, 65537]


def collectives(comm: oxccl.Communicator, seed: int) -> int:
    """Every collective, every data type, sizes that are not powers of two, in and out of
    place, outputs poisoned first. Returns the number of checks."""
    r, n = comm.rank, comm.world_size
    checks = 0
    for dtype in DTYPES:
        for count in COUNTS:
            ins = [data(p, count, dtype, seed) for p in range(n)]
            mine = ins[r]
            tag = f"rank {r}/{n} {np.dtype(dtype).name} x{count}"
            ops = ["sum", "prod", "min", "max", "avg"] if dtype == np.float32 else ["sum"]
            for op in ops:
                if op == "avg" and np.dtype(dtype).kind != "f":
                    continue
                want = reference(ins, op)
                out = poisoned(count, dtype)
                ret = comm.all_reduce(mine.copy(), out, op=op)
                assert ret is out
                exact = op != "avg" and dtype != np.float16
                (same_bits(out, want, f"all_reduce {op} {tag}") if exact else close(out, want, f"all_reduce {op} {tag}", 1e-2 if dtype == np.float16 else 1e-6))
                buf = mine.copy()
                comm.all_reduce(buf, op=op)  # in place
                same_bits(buf, out, f"all_reduce {op} in place {tag}")
                checks += 2
            if dtype == np.float16:
                # Widened accumulation: f32 sums in rank order, rounded to f16 once.
                out = poisoned(count, dtype)
                comm.all_reduce(mine, out, accum="f32")
                wide = reference([t.astype(np.float32) for t in ins], "sum").astype(np.float16)
                same_bits(out, wide, f"all_reduce sum accum f32 {tag}")
                checks += 1
            # all_gather: out of place, then in place (input = this rank's slot).
            out = poisoned(n * count, dtype)
            comm.all_gather(mine, out)
            same_bits(out, np.concatenate(ins), f"all_gather {tag}")
            buf = poisoned(n * count, dtype)
            buf[r * count:(r + 1) * count] = mine
            comm.all_gather(buf[r * count:(r + 1) * count], buf)
            same_bits(buf, np.concatenate(ins), f"all_gather in place {tag}")
            # reduce_scatter: every rank's input is n*count elements.
            big = [np.concatenate([data(p, count, dtype, seed + 1 + q) for q in range(n)]) for p in range(n)]
            want = reference(big, "sum")[r * count:(r + 1) * count]
            out = poisoned(count, dtype)
            comm.reduce_scatter(big[r], out)
            (close if dtype == np.float16 else same_bits)(out, want, f"reduce_scatter {tag}", *([1e-2] if dtype == np.float16 else []))
            buf = big[r].copy()
            comm.reduce_scatter(buf, buf[r * count:(r + 1) * count])
            same_bits(buf[r * count:(r + 1) * count], out, f"reduce_scatter in place {tag}")
            # all_to_all: chunk p of rank q goes to slot q of rank p.
            out = poisoned(n * count, dtype)
            comm.all_to_all(big[r], out)
            want = np.concatenate([big[q][r * count:(r + 1) * count] for q in range(n)])
            same_bits(out, want, f"all_to_all {tag}")
            # all_to_all_v: rank q sends (q + 2p) % 3 * count elements to rank p, packed
            # in rank order; the output has a poisoned tail no range covers.
            size = lambda q, p: (q + 2 * p) % 3 * count  # noqa: E731
            sends = [np.concatenate([data(q, size(q, p), dtype, seed + 7 + p) for p in range(n)]) for q in range(n)]
            start = lambda q, p: sum(size(q, x) for x in range(p))  # noqa: E731
            want = np.concatenate([sends[q][start(q, r):start(q, r) + size(q, r)] for q in range(n)])
            out = poisoned(len(want) + 3, dtype)
            comm.all_to_all_v(sends[r], out, [size(r, p) for p in range(n)], [size(q, r) for q in range(n)])
            same_bits(out[:len(want)], want, f"all_to_all_v {tag}")
            same_bits(out[len(want):], poisoned(3, dtype), f"all_to_all_v tail {tag}")
            checks += 2
            # broadcast from the last rank, out of place and in place.
            root = n - 1
            out = poisoned(count, dtype)
            comm.broadcast(mine, out, root=root)
            same_bits(out, ins[root], f"broadcast {tag}")
            buf = mine.copy()
            comm.broadcast(buf, root=root)
            same_bits(buf, ins[root], f"broadcast in place {tag}")
            # reduce to rank 1: only the root's output is written.
            root = 1 % n
            out = poisoned(count, dtype)
            comm.reduce(mine, out, root=root)
            if r == root:
                want = reference(ins, "sum")
                (close if dtype == np.float16 else same_bits)(out, want, f"reduce {tag}", *([1e-2] if dtype == np.float16 else []))
            else:
                same_bits(out, poisoned(count, dtype), f"reduce leaves non-root output {tag}")
            checks += 9
    return checks


class DLPackOnly:
    """Shows an array only through DLPack (as torch and CuPy do)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def dlpack(comm: oxccl.Communicator) -> None:
    """The DLPack route: a 2-D array, in and out of place."""
    r, n = comm.rank, comm.world_size
    ins = [data(p, 3 * 333, np.float32, 7).reshape(3, 333) for p in range(n)]
    out = np.full((3, 333), np.nan, np.float32)
    comm.all_reduce(DLPackOnly(ins[r]), DLPackOnly(out))
    same_bits(out, reference(ins, "sum"), f"dlpack all_reduce rank {r}")
    # A DLPack view that is not contiguous is refused, as numpy's is.
    try:
        comm.all_reduce(DLPackOnly(out[:, ::2]))
    except ValueError as e:
        assert "not contiguous" in str(e), e
    else:
        raise AssertionError("a strided DLPack view was accepted")


def registration(comm: oxccl.Communicator) -> None:
    r, n = comm.rank, comm.world_size
    buf = data(r, 4097, np.int32, 3)
    comm.register(buf)
    comm.register(buf)  # again: nothing new
    assert comm.registered == 1
    ins = [data(p, 4097, np.int32, 3) for p in range(n)]
    comm.all_reduce(buf)
    same_bits(buf, reference(ins, "sum"), f"registered all_reduce rank {r}")
    comm.deregister(buf)
    assert comm.registered == 0
    try:
        comm.deregister(buf)
    except ValueError as e:
        assert "not a registered array" in str(e) and f"rank {r}" in str(e), e
    else:
        raise AssertionError("deregistering twice was accepted")


def mismatched_sizes(comm: oxccl.Communicator) -> str:
    """Rank 0 reduces 1000 elements, the others 2000: every rank must raise (the first
    call of a signature is checked across ranks), never hang."""
    count = 1000 if comm.rank == 0 else 2000
    try:
        comm.all_reduce(np.ones(count, np.float32))
    except (oxccl.OxcclError, ValueError) as e:
        msg = str(e)
        assert "all_reduce" in msg and f"rank {comm.rank}" in msg, msg
        return msg
    raise AssertionError("mismatched sizes did not raise")


def from_env_rank(rank: int, world: int, port: int) -> list:
    """A rank that joins through the launcher environment and all-reduces its rank."""
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OXCCL_BACKEND="host")
    comm = oxccl.Communicator.from_env()
    assert (comm.rank, comm.world_size, comm.backend) == (rank, world, "host")
    x = np.full(33, rank, np.int64)
    comm.all_reduce(x)
    comm.destroy()
    return x.tolist()


class FileStore:
    """The smallest store ``Communicator.from_store`` needs: ``set`` and a blocking ``get``."""

    def __init__(self, path: str):
        self.path = path

    def set(self, key: str, value: bytes) -> None:
        import os

        tmp = f"{self.path}/{key.replace('/', '_')}.tmp"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, tmp[:-4])

    def get(self, key: str) -> bytes:
        import time

        name = f"{self.path}/{key.replace('/', '_')}"
        for _ in range(3000):
            try:
                with open(name, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                time.sleep(0.01)
        raise TimeoutError(key)


def from_store_rank(rank: int, world: int, path: str) -> list:
    comm = oxccl.Communicator.from_store(FileStore(path), rank, world, backend="host")
    out = np.empty(world * 2, np.uint64)
    comm.all_gather(np.array([rank, 10 + rank], np.uint64), out)
    comm.destroy()
    return out.tolist()
