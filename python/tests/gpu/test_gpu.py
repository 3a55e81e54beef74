"""oxccl's Python package on CUDA (torch tensors), run by ci/gpu/python.sh under torchrun:
every collective against a CPU reference (bit for bit: data movement, and reductions in
rank order with the element type's accumulation), registration, the custom ops eagerly,
inside CUDA graph capture and under torch.compile(fullgraph=True), the torch.distributed
backend, and bad input. Outputs are poisoned before each call."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import oxccl
import oxccl.torch as oxt

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]
COUNTS = [1, 999, 65537, (1 << 20) + 3]


def rank_data(rank: int, count: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rank ``rank``'s input (on the CPU): the same on every rank that makes it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + count)
    if dtype.is_floating_point:
        return (torch.rand(count, generator=g) * 4 - 2).to(dtype)
    return torch.randint(-(1 << 20), 1 << 20, (count,), generator=g, dtype=torch.int64).to(dtype)


def reduced(inputs, op: str) -> torch.Tensor:
    acc = inputs[0].clone()
    for x in inputs[1:]:
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "prod":
            acc = acc * x
        elif op == "min":
            acc = torch.minimum(acc, x)
        elif op == "max":
            acc = torch.maximum(acc, x)
    return acc


def poison(count: int, dtype: torch.dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full((count,), float("nan"), dtype=dtype, device=device)
    return torch.full((count,), 0x5A5A5A5A, dtype=dtype, device=device)


def same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    a, b = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    if not torch.equal(a, b):
        bad = (got != want).nonzero().flatten()[:5]
        raise AssertionError(f"{what}: {int((got != want).sum())} elements differ, first at {bad.tolist()}: got {got[bad].tolist()}, want {want[bad].tolist()}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("count", COUNTS)
def test_collectives_bit_for_bit(comm, dtype, count):
    r, n, dev = comm.rank, comm.world_size, torch.device("cuda", torch.cuda.current_device())
    ins = [rank_data(p, count, dtype, 1) for p in range(n)]
    x = ins[r].to(dev)
    ops = ["sum", "min", "max"] + (["prod"] if dtype != torch.int32 else [])
    for op in ops:
        out = poison(count, dtype, dev)
        comm.all_reduce(x, out, op=op)
        same_bits(out, reduced(ins, op), f"all_reduce {op} {dtype} x{count} rank {r}")
    buf = x.clone()
    comm.all_reduce(buf)
    same_bits(buf, reduced(ins, "sum"), f"all_reduce in place {dtype} x{count}")
    if dtype.is_floating_point:
        out = poison(count, dtype, dev)
        comm.all_reduce(x, out, op="avg")
        want = (reduced([t.float() for t in ins], "sum") / n)
        torch.testing.assert_close(out.cpu().float(), want, rtol=1e-2, atol=1e-2)
    out = poison(n * count, dtype, dev)
    comm.all_gather(x, out)
    same_bits(out, torch.cat(ins), f"all_gather {dtype} x{count}")
    big = [torch.cat([rank_data(p, count, dtype, 2 + q) for q in range(n)]) for p in range(n)]
    out = poison(count, dtype, dev)
    comm.reduce_scatter(big[r].to(dev), out)
    same_bits(out, reduced(big, "sum")[r * count:(r + 1) * count], f"reduce_scatter {dtype} x{count}")
    out = poison(n * count, dtype, dev)
    comm.all_to_all(big[r].to(dev), out)
    same_bits(out, torch.cat([big[q][r * count:(r + 1) * count] for q in range(n)]), f"all_to_all {dtype} x{count}")
    # all_to_all_v: rank q sends (q + 2p) % 3 * count elements to rank p, packed in rank
    # order; the poisoned tail of the output stays poisoned.
    size = lambda q, p: (q + 2 * p) % 3 * count  # noqa: E731
    start = lambda q, p: sum(size(q, x) for x in range(p))  # noqa: E731
    sends = [torch.cat([rank_data(q, size(q, p), dtype, 20 + p) for p in range(n)]) for q in range(n)]
    want = torch.cat([sends[q][start(q, r):start(q, r) + size(q, r)] for q in range(n)])
    out = poison(want.numel() + 3, dtype, dev)
    comm.all_to_all_v(sends[r].to(dev), out, [size(r, p) for p in range(n)], [size(q, r) for q in range(n)])
    same_bits(out[:want.numel()], want, f"all_to_all_v {dtype} x{count}")
    same_bits(out[want.numel():], poison(3, dtype, "cpu"), f"all_to_all_v tail {dtype} x{count}")
    root = n - 1
    out = poison(count, dtype, dev)
    comm.broadcast(x, out, root=root)
    same_bits(out, ins[root], f"broadcast {dtype} x{count}")
    out = poison(count, dtype, dev)
    comm.reduce(x, out, root=0)
    if r == 0:
        same_bits(out, reduced(ins, "sum"), f"reduce {dtype} x{count}")
    comm.check()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64], ids=str)
def test_dlpack_and_described_routes_agree(comm, dtype):
    """The package describes contiguous torch CUDA tensors itself (``oxccl._array``); the
    extension's DLPack route, which other producers (CuPy, JAX) take, stays checked here
    on the same data: both against the reference, bit for bit."""
    r, n, count = comm.rank, comm.world_size, 12345
    ins = [rank_data(p, count, dtype, 9) for p in range(n)]
    x = ins[r].cuda()
    stream = int(torch.cuda.current_stream().cuda_stream)
    for route, arr in (("DLPack", lambda t: t), ("described", oxccl._array)):
        out = poison(count, dtype, x.device)
        comm._c.all_reduce(arr(x), arr(out), "sum", "auto", stream)
        same_bits(out, reduced(ins, "sum"), f"all_reduce through {route} {dtype}")
        out = poison(n * count, dtype, x.device)
        comm._c.all_gather(arr(x), arr(out), stream)
        same_bits(out, torch.cat(ins), f"all_gather through {route} {dtype}")
    assert isinstance(oxccl._array(x[::2]), torch.Tensor)  # strided: left to the extension
    with pytest.raises(ValueError, match="not contiguous"):
        comm.all_reduce(x[::2])


def test_registered_buffer(comm):
    r, n = comm.rank, comm.world_size
    count = 3 << 20
    ins = [rank_data(p, count, torch.bfloat16, 5) for p in range(n)]
    buf = ins[r].cuda()
    comm.register(buf)
    try:
        assert comm.registered >= 1
        comm.all_reduce(buf)
        same_bits(buf, reduced(ins, "sum"), "registered all_reduce")
    finally:
        comm.deregister(buf)


def test_mem_pool_tensors(comm):
    """Tensors from oxccl.torch.mem_pool() live in oxccl's allocations: registered and
    reduced bit for bit."""
    r, n = comm.rank, comm.world_size
    pool = oxt.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        buf = torch.empty(5 << 20, dtype=torch.bfloat16, device="cuda")
    ins = [rank_data(p, buf.numel(), torch.bfloat16, 6) for p in range(n)]
    buf.copy_(ins[r])
    comm.register(buf)
    comm.all_reduce(buf)
    same_bits(buf, reduced(ins, "sum"), "mem_pool all_reduce")
    comm.deregister(buf)
    del buf


def test_custom_ops_eager(comm):
    h = oxt.handle(comm)
    r, n = comm.rank, comm.world_size
    ins = [rank_data(p, 4 * 1001, torch.bfloat16, 9).view(4, 1001) for p in range(n)]
    x = ins[r].cuda()
    same_bits(torch.ops.oxccl.all_reduce(x, h, "sum"), reduced(ins, "sum"), "op all_reduce")
    same_bits(torch.ops.oxccl.all_gather(x, h), torch.cat(ins), "op all_gather")
    xs = [torch.cat([ins[p]] * n) for p in range(n)]
    same_bits(torch.ops.oxccl.reduce_scatter(xs[r].cuda(), h, "sum"), reduced(xs, "sum")[r * 4:(r + 1) * 4], "op reduce_scatter")
    same_bits(torch.ops.oxccl.all_to_all(xs[r].cuda(), h), torch.cat([xs[q][r * 4:(r + 1) * 4] for q in range(n)]), "op all_to_all")
    y = x.clone()
    torch.ops.oxccl.all_reduce_(y, h, "max")
    same_bits(y, reduced(ins, "max"), "op all_reduce_ max")
    z = x.clone()
    torch.ops.oxccl.broadcast_(z, h, n - 1)
    same_bits(z, ins[n - 1], "op broadcast_")
    # A strided input is copied to a contiguous one by the op (documented), not refused.
    t = x.t()
    same_bits(torch.ops.oxccl.all_reduce(t, h, "sum"), reduced([i.t().contiguous() for i in ins], "sum"), "op all_reduce strided")


def test_graph_capture(comm):
    """A captured all_reduce_ (with compute around it) replayed on new data each time."""
    h = oxt.handle(comm)
    r, n = comm.rank, comm.world_size
    count = (1 << 20) + 5
    static = torch.zeros(count, dtype=torch.bfloat16, device="cuda")
    comm.register(static)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up: first call of the signature is checked across ranks
        torch.ops.oxccl.all_reduce_(static, h, "sum")
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.mul_(2)
        torch.ops.oxccl.all_reduce_(static, h, "sum")
        result = static + 1
    for it in range(3):
        ins = [rank_data(p, count, torch.bfloat16, 20 + it) for p in range(n)]
        static.copy_(ins[r].cuda())
        g.replay()
        torch.cuda.synchronize()
        want = reduced([t * 2 for t in ins], "sum") + 1
        same_bits(result, want, f"graph replay {it}")
    comm.check()
    comm.deregister(static)


@pytest.mark.parametrize("register", [False, True], ids=["unregistered", "registered"])
def test_all_to_all_v_in_a_graph(comm, register):
    """all_to_all_v captured in a CUDA graph (its layout exchanged at capture), replayed on
    new data: uneven chunks up to 3 MiB, the receive ranges in reverse rank order with a
    poisoned gap between them."""
    r, n = comm.rank, comm.world_size
    size = lambda q, p: 1000 * (q + 1) + 377 * p + (q * p) % 3 * 500_000  # noqa: E731
    sc = [size(r, p) for p in range(n)]
    rc = [size(q, r) for q in range(n)]
    sd, at = [], 0
    for c in sc:
        sd.append(at)
        at += c
    rd, at = [0] * n, 0
    for q in reversed(range(n)):
        rd[q] = at
        at += rc[q] + 11
    # Registration wants one length on every rank: the largest receive extent.
    longest = max(sum(size(q, p) + 11 for q in range(n)) for p in range(n))
    src = torch.zeros(sum(sc), dtype=torch.float32, device="cuda")
    out = poison(longest, torch.float32, "cuda")
    if register:
        comm.register(out)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        comm.all_to_all_v(src, out, sc, rc, sd, rd)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.all_to_all_v(src, out, sc, rc, sd, rd)
    for it in range(3):
        sends = [rank_data(q, sum(size(q, p) for p in range(n)), torch.float32, 60 + it) for q in range(n)]
        src.copy_(sends[r].cuda())
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        got = out.cpu()
        for q in range(n):
            start = sum(size(q, x) for x in range(r))
            same_bits(got[rd[q]:rd[q] + rc[q]], sends[q][start:start + rc[q]], f"graph replay {it} from rank {q}")
            gap = got[rd[q] + rc[q]:rd[q] + rc[q] + 11]
            assert torch.isnan(gap).all(), f"graph replay {it}: the gap after rank {q}'s range was written"
    comm.check()
    del g
    if register:
        comm.deregister(out)


def test_torch_compile_fullgraph(comm):
    h = oxt.handle(comm)
    r, n = comm.rank, comm.world_size

    @torch.compile(fullgraph=True)
    def step(x):
        y = torch.ops.oxccl.all_reduce(x * 3, h, "sum")
        g = torch.ops.oxccl.all_gather(y[:8], h)
        return y - 1, g

    for it in range(2):
        ins = [rank_data(p, 40000, torch.float32, 30 + it) for p in range(n)]
        y, g = step(ins[r].cuda())
        want = reduced([t * 3 for t in ins], "sum")
        same_bits(y, want - 1, f"compiled all_reduce {it}")
        same_bits(g, torch.cat([want[:8]] * n), f"compiled all_gather {it}")


def test_process_group_route(pg):
    r, n = dist.get_rank(), dist.get_world_size()
    assert pg.getBackendName() == "oxccl"
    ins = [rank_data(p, 12345, torch.float32, 40) for p in range(n)]
    t = ins[r].cuda()
    dist.all_reduce(t)
    same_bits(t, reduced(ins, "sum"), "dist.all_reduce")
    t = ins[r].cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    same_bits(t, reduced(ins, "max"), "dist.all_reduce max")
    out = poison(n * 12345, torch.float32, "cuda")
    dist.all_gather_into_tensor(out, ins[r].cuda())
    same_bits(out, torch.cat(ins), "dist.all_gather_into_tensor")
    outs = [poison(12345, torch.float32, "cuda") for _ in range(n)]
    dist.all_gather(outs, ins[r].cuda())
    for p in range(n):
        same_bits(outs[p], ins[p], f"dist.all_gather [{p}]")
    big = [torch.cat([rank_data(p, 1000, torch.float32, 41 + q) for q in range(n)]) for p in range(n)]
    out = poison(1000, torch.float32, "cuda")
    dist.reduce_scatter_tensor(out, big[r].cuda())
    same_bits(out, reduced(big, "sum")[r * 1000:(r + 1) * 1000], "dist.reduce_scatter_tensor")
    out = poison(n * 1000, torch.float32, "cuda")
    dist.all_to_all_single(out, big[r].cuda())
    same_bits(out, torch.cat([big[q][r * 1000:(r + 1) * 1000] for q in range(n)]), "dist.all_to_all_single")
    # Uneven splits (MoE token exchange): rank q sends 7 * (q + p + 1) rows of 3 to rank p.
    rows = lambda q, p: 7 * (q + p + 1)  # noqa: E731
    srcs = [rank_data(q, 3 * sum(rows(q, p) for p in range(n)), torch.float32, 50).view(-1, 3) for q in range(n)]
    starts = lambda q, p: sum(rows(q, x) for x in range(p))  # noqa: E731
    want = torch.cat([srcs[q][starts(q, r):starts(q, r) + rows(q, r)] for q in range(n)])
    out = torch.full_like(want, float("nan"), device="cuda")
    dist.all_to_all_single(out, srcs[r].cuda(), [rows(q, r) for q in range(n)], [rows(r, p) for p in range(n)])
    same_bits(out, want, "dist.all_to_all_single uneven")
    t = ins[r].cuda()
    dist.broadcast(t, src=n - 1)
    same_bits(t, ins[n - 1], "dist.broadcast")
    t = ins[r].cuda()
    dist.reduce(t, dst=0)
    if r == 0:
        same_bits(t, reduced(ins, "sum"), "dist.reduce")
    work = dist.all_reduce(ins[r].cuda(), async_op=True)
    work.wait()
    dist.barrier()
    # CPU tensors go to the gloo group beside it.
    c = torch.full((5,), float(r + 1))
    dist.all_reduce(c)
    assert c.tolist() == [float(n * (n + 1) // 2)] * 5
    # A collective oxccl does not serve names itself.
    with pytest.raises(Exception, match="gather is not served by oxccl"):
        dist.gather(torch.ones(3, device="cuda"), [torch.ones(3, device="cuda") for _ in range(n)] if r == 0 else None, dst=0)


def test_bad_input(comm):
    with pytest.raises(ValueError, match=r"all_reduce \(rank \d+ of \d+\): input is in host memory, but this communicator runs on cuda"):
        comm.all_reduce(torch.ones(10))
    with pytest.raises(ValueError, match="not contiguous"):
        comm.all_reduce(torch.ones(10, 10, device="cuda").t())
    with pytest.raises(TypeError, match="data type"):
        comm.all_reduce(torch.ones(10, device="cuda", dtype=torch.complex64))
    with pytest.raises(ValueError, match="elements"):
        comm.all_reduce(torch.ones(10, device="cuda"), torch.ones(11, device="cuda"))
    if torch.cuda.device_count() > 1:
        other = (torch.cuda.current_device() + 1) % torch.cuda.device_count()
        with pytest.raises(ValueError, match=f"is in cuda:{other}"):
            comm.all_reduce(torch.ones(10, device=f"cuda:{other}"))


def _per_call_us(fn, calls: int = 50) -> float:
    """Wall-clock microseconds per call of ``fn`` (warmed up, synchronized around)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _graphed_us(fn, per_graph: int = 20, replays: int = 5) -> float:
    """Microseconds per call of ``fn`` captured ``per_graph`` times in one CUDA graph."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per_graph):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (per_graph * replays) * 1e6


def test_timings(comm):
    """Not a pass/fail check: per-call times for the report, printed by rank 0, beside
    NCCL's in the same run (a second process group with the nccl backend, NVLS off):
    oxccl's custom op on a registered bf16 tensor eagerly and replayed from a graph, the
    same call through dist.all_reduce on the oxccl process group, and dist.all_reduce on
    NCCL eagerly and replayed from a graph."""
    h = oxt.handle(comm)
    nccl = dist.new_group(backend="nccl")
    rows = []
    for count in (1 << 9, 1 << 12, 1 << 15, 1 << 18, 1 << 19):
        x = torch.ones(count, dtype=torch.bfloat16, device="cuda")
        y = torch.ones(count, dtype=torch.bfloat16, device="cuda")
        comm.register(x)
        op = lambda: torch.ops.oxccl.all_reduce_(x, h, "sum")  # noqa: E731
        ours_eager = _per_call_us(op)
        ours_graph = _graphed_us(op)
        ours_pg = _per_call_us(lambda: dist.all_reduce(x))
        theirs = lambda: dist.all_reduce(y, group=nccl)  # noqa: E731
        nccl_eager = _per_call_us(theirs)
        nccl_graph = _graphed_us(theirs)
        rows.append((count * 2, ours_eager, ours_pg, ours_graph, nccl_eager, nccl_graph))
        comm.deregister(x)
    dist.destroy_process_group(nccl)
    if comm.rank == 0:
        print(
            "\n# bytes  oxccl_op_eager_us  oxccl_pg_eager_us  oxccl_graph_us  nccl_eager_us"
            "  nccl_graph_us  eager_speedup  graph_speedup (bf16 sum, registered for oxccl)"
        )
        for b, oe, op_, og, ne, ng in rows:
            print(
                f"# {b:>8} {oe:18.2f} {op_:18.2f} {og:15.2f} {ne:14.2f} {ng:14.2f}"
                f" {ne / oe:13.2f}x {ng / og:13.2f}x"
            )


def test_eager_overhead_breakdown(comm):
    """Not a pass/fail check: where an eager call's host time goes (printed by rank 0), one
    layer at a time on a registered 1 KB bf16 tensor: the custom op, the Python method, the
    extension's method with the stream handle given (the tensor described by the package, or
    exported through DLPack), and the pieces the Python layer adds (describing the tensor,
    the current stream lookup) or takes away (DLPack export)."""
    h = oxt.handle(comm)
    x = torch.ones(512, dtype=torch.bfloat16, device="cuda")
    comm.register(x)
    stream = int(torch.cuda.current_stream().cuda_stream)
    d = oxccl._array(x)
    assert d == (x.data_ptr(), x.numel(), oxccl.dtype_code("bf16"), x.get_device()), d
    layers = [
        ("torch.ops.oxccl.all_reduce_", lambda: torch.ops.oxccl.all_reduce_(x, h, "sum")),
        ("comm.all_reduce", lambda: comm.all_reduce(x)),
        ("comm._c.all_reduce (described, stream)", lambda: comm._c.all_reduce(d, d, "sum", "auto", stream)),
        ("comm._c.all_reduce (DLPack, stream)", lambda: comm._c.all_reduce(x, x, "sum", "auto", stream)),
        ("oxccl._array(x) (describe the tensor)", lambda: oxccl._array(x)),
        ("oxccl._stream_handle(None, x)", lambda: oxccl._stream_handle(None, x)),
        ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream(x.device).cuda_stream),
        ("x.__dlpack__(stream=-1)", lambda: x.__dlpack__(stream=-1)),
        ("x.__dlpack_device__()", lambda: x.__dlpack_device__()),
    ]
    rows = [(name, _per_call_us(fn, calls=200)) for name, fn in layers]
    torch.cuda.synchronize()
    comm.deregister(x)
    if comm.rank == 0:
        print("\n# eager host time per call, registered 1 KB bf16 (us)")
        for name, us in rows:
            print(f"# {name:<36} {us:8.2f}")
