#!/usr/bin/env python3
"""PyTorch torch.distributed (backend="nccl") on liboxccl_nccl.so, for torchrun.

    torchrun --standalone --nproc_per_node=N ci/gpu/torch_nccl_api.py run --out DIR
    python3 ci/gpu/torch_nccl_api.py compare BASELINE_DIR OXCCL_DIR

`run` is a training-loop-like job: each step all-reduces seeded random "gradients" of many
sizes (1, 3, 1000, 12345, 2**20+7, 64Mi elements) in bf16, fp16 and fp32 in place (sum; avg
too for fp32), replays all-reduces captured in a torch.cuda.CUDAGraph, and runs the other collectives
oxccl serves: all_gather_into_tensor, broadcast and all_to_all_single (data movement,
checked bit for bit against the inputs), reduce_scatter_tensor and reduce (sum, checked
against the float64 reference), and integer and float64 all_reduce (int32 sum, int64 max,
uint8 sum: exact; float64 sum: within 2**-50 of the reference). Every all-reduce is
checked in the script against a float64 reference computed from every rank's seeded input; results (full tensors up to 2**20+7 elements, a strided sample and a hash of
larger ones) go to DIR/rank<r>.pt, allreduce timings (CUDA events: one eager call, a burst
of eager calls, the burst replayed from a CUDA graph) to DIR/timing.json. `compare` checks two runs: forwarded ops bit for bit, all-reduces within a
dtype tolerance (NCCL's ring order and oxccl's rank order may round differently; data
movement and integer results bit for bit), and prints
the timings side by side.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

SIZES = [1, 3, 1000, 12345, 2**20 + 7, 64 * 2**20]
FULL_LIMIT = 2**20 + 7  # tensors up to this many elements are saved whole
SAMPLE_STRIDE = 997
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Tolerance per element: RTOL[dtype] * world * sum_i |x_i| (every partial sum may round once).
RTOL = {"bf16": 2.0**-7, "fp16": 2.0**-10, "fp32": 2.0**-21, "fp64": 2.0**-50}
GRAPH_SIZES = [12345, 2**20 + 7]
STEPS = 2


def seed_of(*parts):
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def make_input(rank, n, dtype_name, tag):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed_of(rank, n, dtype_name, tag))
    return torch.randn(n, generator=g, dtype=torch.float32).to(DTYPES[dtype_name])


def reference(world, n, dtype_name, tag, device, avg=False):
    """float64 sum of every rank's input, and sum of absolute values (for the tolerance)."""
    total = torch.zeros(n, dtype=torch.float64, device=device)
    absum = torch.zeros(n, dtype=torch.float64, device=device)
    for r in range(world):
        x = make_input(r, n, dtype_name, tag).to(device=device, dtype=torch.float64)
        total += x
        absum += x.abs()
    if avg:
        total /= world
        absum /= world
    return total, absum


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def keep(results, key, t):
    t = t.detach()
    entry = {"hash": digest(t), "numel": t.numel()}
    if t.numel() <= FULL_LIMIT:
        entry["full"] = t.cpu().clone()
    else:
        entry["sample"] = t[::SAMPLE_STRIDE].cpu().clone()
    results[key] = entry


def check_against_reference(key, out, world, n, dtype_name, tag, device, avg, errors):
    ref, absum = reference(world, n, dtype_name, tag, device, avg)
    err = (out.to(torch.float64) - ref).abs()
    tol = RTOL[dtype_name] * world * absum + 1e-30
    bad = int((err > tol).sum().item())
    if bad:
        i = int(torch.argmax(err / tol).item())
        errors.append(f"{key}: {bad} of {n} elements off the float64 reference "
                      f"(worst at {i}: got {out[i].item()}, reference {ref[i].item()}, tol {tol[i].item():.3g})")
    return float((err / tol).max().item()) if n else 0.0


def cpu_list(text):
    """The CPUs of a list such as "0-3,8,10-11"."""
    cpus = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin_cpus(local):
    """OXCCL_TORCH_CPUS: one CPU list per local rank, separated by ';' (e.g. "0-7;8-15"),
    applied before any thread starts, so the rank and every thread it makes (PyTorch's
    watchdog, NCCL's and oxccl's) stay there. Eager small calls are bound by the host, whose
    speed per call differed by up to 1.5x between two runs of the same job when unpinned
    (2 H200s, 2026-11-28); both sides of a comparison get the same lists."""
    spec = os.environ.get("OXCCL_TORCH_CPUS", "")
    if not spec:
        return ""
    lists = [part for part in spec.split(";") if part.strip()]
    cpus = cpu_list(lists[local % len(lists)])
    os.sched_setaffinity(0, cpus)
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


def run(args):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    pinned = pin_cpus(local)
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group(backend="nccl")
    os.makedirs(args.out, exist_ok=True)
    results, errors, worst = {}, [], {}
    sizes = [s for s in SIZES if s <= args.max_elems]
    if rank == 0:
        print(f"torch {torch.__version__}, NCCL version {torch.cuda.nccl.version()}, world {world}, "
              f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')}, rank 0 on CPUs {pinned or 'any'}", flush=True)

    # The training loop: every step all-reduces "gradients" of every size and dtype.
    for step in range(STEPS):
        for dname in DTYPES:
            for n in sizes:
                ops = [("sum", dist.ReduceOp.SUM)] + ([("avg", dist.ReduceOp.AVG)] if dname == "fp32" else [])
                for oname, op in ops:
                    tag = ("grad", step, oname)
                    x = make_input(rank, n, dname, tag).to(device)
                    dist.all_reduce(x, op=op)
                    torch.cuda.synchronize()
                    key = f"allreduce/{oname}/{dname}/{n}/step{step}"
                    worst[key] = check_against_reference(key, x, world, n, dname, tag, device, oname == "avg", errors)
                    keep(results, key, x)

    # CUDA graphs: capture one all-reduce per (dtype, size), replay with new inputs.
    for dname in DTYPES:
        for n in [s for s in GRAPH_SIZES if s <= args.max_elems]:
            static = torch.zeros(n, dtype=DTYPES[dname], device=device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the capture (creates the communicator)
                    dist.all_reduce(static)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                dist.all_reduce(static)
            for replay in range(3):
                tag = ("graph", replay)
                static.copy_(make_input(rank, n, dname, tag).to(device))
                graph.replay()
                torch.cuda.synchronize()
                key = f"graph/sum/{dname}/{n}/replay{replay}"
                worst[key] = check_against_reference(key, static, world, n, dname, tag, device, False, errors)
                keep(results, key, static)
            del graph

    # Forwarded collectives: all_gather_into_tensor and broadcast, compared bit for bit.
    for dname in DTYPES:
        for n in [s for s in (1, 1000, 2**20 + 7) if s <= args.max_elems]:
            x = make_input(rank, n, dname, ("gather",)).to(device)
            out = torch.empty(n * world, dtype=x.dtype, device=device)
            dist.all_gather_into_tensor(out, x)
            torch.cuda.synchronize()
            expect = torch.cat([make_input(r, n, dname, ("gather",)) for r in range(world)]).to(device)
            if not torch.equal(out, expect):
                errors.append(f"allgather/{dname}/{n}: result differs from the inputs")
            keep(results, f"allgather/{dname}/{n}", out)
            b = make_input(rank, n, dname, ("bcast",)).to(device)
            dist.broadcast(b, src=world - 1)
            torch.cuda.synchronize()
            if not torch.equal(b, make_input(world - 1, n, dname, ("bcast",)).to(device)):
                errors.append(f"broadcast/{dname}/{n}: result differs from the root's input")
            keep(results, f"broadcast/{dname}/{n}", b)

    # The other collectives oxccl serves.
    for dname in DTYPES:
        for n in [s for s in (1, 1000, 12345, 2**20 + 7) if s <= args.max_elems]:
            # all_to_all_single: slot r of the output is chunk `rank` of rank r's input.
            x = make_input(rank, n * world, dname, ("a2a",)).to(device)
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x)
            torch.cuda.synchronize()
            expect = torch.cat([make_input(r, n * world, dname, ("a2a",))[rank * n:(rank + 1) * n]
                                for r in range(world)]).to(device)
            if not torch.equal(out, expect):
                errors.append(f"alltoall/{dname}/{n}: result differs from the inputs")
            keep(results, f"alltoall/{dname}/{n}", out)
            # reduce_scatter_tensor: chunk `rank` of the sum.
            tag = ("rs",)
            x = make_input(rank, n * world, dname, tag).to(device)
            out = torch.empty(n, dtype=x.dtype, device=device)
            dist.reduce_scatter_tensor(out, x)
            torch.cuda.synchronize()
            key = f"reducescatter/sum/{dname}/{n}"
            ref, absum = reference(world, n * world, dname, tag, device)
            err = (out.to(torch.float64) - ref[rank * n:(rank + 1) * n]).abs()
            tol = RTOL[dname] * world * absum[rank * n:(rank + 1) * n] + 1e-30
            worst[key] = float((err / tol).max().item())
            if int((err > tol).sum().item()):
                errors.append(f"{key}: {int((err > tol).sum().item())} of {n} elements off the float64 reference")
            keep(results, key, out)
            # reduce: the sum at the last rank.
            tag = ("reduce",)
            x = make_input(rank, n, dname, tag).to(device)
            dist.reduce(x, dst=world - 1)
            torch.cuda.synchronize()
            key = f"reduce/sum/{dname}/{n}"
            if rank == world - 1:
                worst[key] = check_against_reference(key, x, world, n, dname, tag, device, False, errors)
                keep(results, key, x)

    # Integer and float64 all_reduce (counters, metrics): integers exact, float64 within
    # 2**-50. Inputs small enough that no integer sum wraps (so torch's own sum is exact).
    for n in [s for s in (1, 1000, 12345, 2**20 + 7) if s <= args.max_elems]:
        g = torch.Generator(device="cpu")
        ints = []
        for r in range(world):
            g.manual_seed(seed_of(r, n, "ints"))
            ints.append((torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32),
                         torch.randint(-2**40, 2**40, (n,), generator=g, dtype=torch.int64),
                         torch.randint(0, 30, (n,), generator=g, dtype=torch.uint8),
                         torch.randn(n, generator=g, dtype=torch.float64)))
        mine = [t.to(device) for t in ints[rank]]
        dist.all_reduce(mine[0])
        dist.all_reduce(mine[1], op=dist.ReduceOp.MAX)
        dist.all_reduce(mine[2])
        dist.all_reduce(mine[3])
        torch.cuda.synchronize()
        want = [sum(t[0] for t in ints), torch.stack([t[1] for t in ints]).max(0).values,
                sum(t[2] for t in ints)]
        for name, got, w in zip(("int32-sum", "int64-max", "uint8-sum"), mine, want):
            if not torch.equal(got.cpu(), w):
                errors.append(f"allreduce/{name}/{n}: differs from the exact result")
            keep(results, f"exact/{name}/{n}", got)
        key = f"allreduce/sum/fp64/{n}"
        ref = torch.zeros(n, dtype=torch.float64)
        absum = torch.zeros(n, dtype=torch.float64)
        for t in ints:
            ref += t[3]
            absum += t[3].abs()
        err = (mine[3].cpu() - ref).abs()
        tol = RTOL["fp64"] * world * absum + 1e-300
        worst[key] = float((err / tol).max().item())
        if int((err > tol).sum().item()):
            errors.append(f"{key}: {int((err > tol).sum().item())} of {n} elements off the float64 reference")
        keep(results, key, mine[3])

    # Timing: in-place all_reduce (sum) per size and dtype, three ways, each repeated in
    # `rounds` rounds that sweep every size and dtype, the fastest round counting, then the
    # slowest rank's figure:
    # - "single": CUDA events around one eager call, median of `iters` calls. It includes
    #   how far the other rank's host loop is behind, which settles at about 30 or 60 us
    #   per process on these machines, for plain NCCL as much as for the preload.
    # - "burst": `iters` eager calls back to back between two events, after a barrier: the
    #   per-call cost a training loop sees (host path or GPU time, whichever is longer);
    #   "host": the host time of those calls until the last one returned.
    # - "graph": the same `iters` calls captured in one CUDA graph and replayed.
    bufs = {}
    for dname in DTYPES:
        for n in sizes:
            # Zeros: repeated in-place sums stay finite (random data would overflow fp16).
            bufs[(dname, n)] = torch.zeros(n, dtype=DTYPES[dname], device=device)
            for _ in range(args.warmup):
                dist.all_reduce(bufs[(dname, n)])
    graphs = {}
    for key, x in bufs.items():
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.iters):
                dist.all_reduce(x)
        g.replay()  # the first replay registers what the capture recorded
        torch.cuda.synchronize()
        graphs[key] = g
    del g
    best = {}
    state = {"before": gpu_state() if rank == 0 else ""}

    def events():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    for _ in range(args.rounds):
        for key, x in bufs.items():
            samples = []
            for _ in range(args.iters):
                start, end = events()
                if args.barrier:
                    dist.barrier()
                start.record()
                dist.all_reduce(x)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000.0)
            measured = {"single": statistics.median(samples)}
            for mode in ("burst", "graph"):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = events()
                start.record()
                t0 = time.perf_counter()
                if mode == "graph":
                    graphs[key].replay()
                else:
                    for _ in range(args.iters):
                        dist.all_reduce(x)
                    # Host time per call until the last one returned (enqueue cost).
                    measured["host"] = (time.perf_counter() - t0) * 1e6 / args.iters
                end.record()
                end.synchronize()
                measured[mode] = start.elapsed_time(end) * 1000.0 / args.iters
            old = best.setdefault(key, measured)
            for mode, us in measured.items():
                old[mode] = min(old[mode], us)
    # NCCL's communicators must not outlive graphs that captured their kernels.
    graphs.clear()
    torch.cuda.synchronize()
    timing = {}
    for (dname, n), us in best.items():
        modes = sorted(us)
        t = torch.tensor([us[m] for m in modes], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's figures
        timing[f"{dname}/{n}"] = {m: v for m, v in zip(modes, t.tolist())}
        timing[f"{dname}/{n}"]["bytes"] = n * bufs[(dname, n)].element_size()

    torch.save({"results": results, "errors": errors, "worst": worst}, os.path.join(args.out, f"rank{rank}.pt"))
    if rank == 0:
        with open(os.path.join(args.out, "timing.json"), "w") as f:
            state["after"] = gpu_state()
            print(f"GPUs around the timing: before {state['before']} | after {state['after']}", flush=True)
            json.dump({"world": world, "timing": timing, "gpu_state": state}, f, indent=1)
    all_errors = [None] * world
    dist.all_gather_object(all_errors, errors)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        flat = [f"rank {r}: {e}" for r, es in enumerate(all_errors) for e in es]
        for e in flat:
            print("ERROR", e)
        print(f"run: {len(results)} results per rank, {len(flat)} errors; worst error/tolerance "
              f"{max(worst.values()) if worst else 0:.3f}", flush=True)
    return 1 if any(all_errors) else 0


def compare(args):
    base_dir, ox_dir = args.baseline, args.oxccl
    failures = 0
    ranks = sorted(f for f in os.listdir(base_dir) if f.startswith("rank") and f.endswith(".pt"))
    if not ranks:
        print(f"compare: no rank*.pt in {base_dir}")
        return 1
    for f in ranks:
        a = torch.load(os.path.join(base_dir, f))
        b = torch.load(os.path.join(ox_dir, f))
        for key, ea in a["results"].items():
            eb = b["results"].get(key)
            if eb is None:
                print(f"FAIL {f} {key}: missing in the oxccl run")
                failures += 1
                continue
            moved = key.startswith(("allgather/", "broadcast/", "alltoall/", "exact/"))
            if moved:
                if ea["hash"] != eb["hash"]:
                    print(f"FAIL {f} {key}: differs bit for bit from the run without the preload")
                    failures += 1
                continue
            dname = key.split("/")[2]
            ta = ea.get("full", ea.get("sample")).to(torch.float64)
            tb = eb.get("full", eb.get("sample")).to(torch.float64)
            # Both runs are checked against the float64 reference in the run itself; here
            # their difference may be up to twice that tolerance, with sum |x_i| bounded by
            # |result| + 6 per rank (randn inputs), divided by the world size for avg.
            world = args.world
            spread = 6.0 * (world if "/avg/" not in key else 1)
            tol = 2 * RTOL[dname] * world * (ta.abs() + spread)
            bad = int(((ta - tb).abs() > tol).sum().item())
            exact = ea["hash"] == eb["hash"]
            if bad:
                print(f"FAIL {f} {key}: {bad} elements differ beyond tolerance from the run without the preload")
                failures += 1
            elif args.verbose:
                print(f"ok   {f} {key}: {'bit-identical' if exact else 'within tolerance'}")
        for name, d in (("baseline", a), ("oxccl", b)):
            for e in d["errors"]:
                print(f"FAIL {f} ({name} run): {e}")
                failures += 1
    ta = json.load(open(os.path.join(base_dir, "timing.json")))["timing"]
    tb = json.load(open(os.path.join(ox_dir, "timing.json")))["timing"]
    print()
    modes = ("burst", "host", "graph", "single")
    head = " ".join(f"{m + ' NCCL':>11} {'oxccl':>7} {'x':>5}" for m in modes)
    print(f"{'dtype':>5} {'elements':>10} {'bytes':>11} {head}")
    for key in ta:
        dname, n = key.split("/")
        cells = []
        for m in modes:
            x, y = ta[key].get(m, float("nan")), tb.get(key, {}).get(m, float("nan"))
            cells.append(f"{x:>11.1f} {y:>7.1f} {x / y if y else float('nan'):>5.2f}")
        print(f"{dname:>5} {int(n):>10} {ta[key]['bytes']:>11} {' '.join(cells)}")
    print("(us per all_reduce; x = NCCL / oxccl. burst: back-to-back eager calls; host: the host"
          " time of those calls until the last returned; graph: the same calls replayed from one"
          " CUDA graph; single: one eager call between events)")
    print()
    print(f"compare: {failures} failures")
    return 1 if failures else 0


def gpu_state():
    """The GPUs' SM clock, temperature, power and active throttle reasons (nvidia-smi), to
    tell a slower run's GPUs apart; "" where nvidia-smi is missing."""
    query = "index,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip())
    except (OSError, subprocess.SubprocessError):
        return ""


def best(args):
    """Per cell, the fastest of several runs' timings (each run's own best round): runs of
    one side taken at different times, alternating with the other side's, so drift of the
    machine between two single runs does not decide a ratio."""
    runs = [json.load(open(os.path.join(d, "timing.json"))) for d in args.runs]
    merged = {}
    for r in runs:
        for key, cells in r["timing"].items():
            m = merged.setdefault(key, dict(cells))
            for mode, us in cells.items():
                if mode != "bytes":
                    m[mode] = min(m.get(mode, us), us)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "timing.json"), "w") as f:
        states = {d: r.get("gpu_state") for d, r in zip(args.runs, runs)}
        json.dump({"world": runs[0]["world"], "timing": merged, "runs": args.runs, "gpu_states": states}, f, indent=1)
    print(f"best: {len(args.runs)} runs -> {args.out}/timing.json")
    return 0


def pairs(args):
    """Paired runs: each pair is a run of the real NCCL and a run of the preload made right
    after it. The host under these machines' PyTorch loops changes speed by up to 1.5x from
    one minute to the next, for both sides alike (2 H200s, 2026-11-28: pinned or not), so
    the best of each side's runs can pair a fast minute with a slow one. Here every ratio is
    taken within a pair, and a cell's verdict is the median ratio over the pairs."""
    if len(args.runs) % 2:
        print("pairs: give NCCL and preload run folders in pairs")
        return 1
    runs = [json.load(open(os.path.join(d, "timing.json")))["timing"] for d in args.runs]
    pairs_ = list(zip(runs[0::2], runs[1::2]))
    modes = ("burst", "host", "graph", "single")
    head = " ".join(f"{m + ' NCCL':>11} {'oxccl':>7} {'x':>5} {'x min':>5}" for m in modes)
    print(f"{'dtype':>5} {'elements':>10} {head}")
    table = {}
    for key in pairs_[0][0]:
        dname, n = key.split("/")
        cells, row = [], {}
        for m in modes:
            got = [(a[key][m], b[key][m]) for a, b in pairs_ if m in a.get(key, {}) and m in b.get(key, {})]
            if not got:
                continue
            ratios = [x / y for x, y in got if y]
            row[m] = {"nccl_us": statistics.median(x for x, _ in got),
                      "oxccl_us": statistics.median(y for _, y in got),
                      "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                      "ratios": ratios}
            c = row[m]
            cells.append(f"{c['nccl_us']:>11.1f} {c['oxccl_us']:>7.1f} {c['ratio_median']:>5.2f} {c['ratio_min']:>5.2f}")
        table[key] = row
        print(f"{dname:>5} {int(n):>10} {' '.join(cells)}")
    print(f"(us per all_reduce, medians over {len(pairs_)} pairs of runs; x = the median of NCCL / oxccl"
          " within each pair, x min the lowest pair)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": args.runs, "pairs": table}, f, indent=1)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--rounds", type=int, default=5, help="timing rounds; the fastest round's median counts")
    r.add_argument("--max-elems", type=int, default=64 * 2**20)
    r.add_argument("--barrier", action="store_true", help="barrier before each timed call")
    c = sub.add_parser("compare")
    c.add_argument("baseline")
    c.add_argument("oxccl")
    c.add_argument("--world", type=int, required=True)
    c.add_argument("--verbose", action="store_true")
    b = sub.add_parser("best", help="per cell, the fastest of several runs' timing.json")
    b.add_argument("out")
    b.add_argument("runs", nargs="+")
    q = sub.add_parser("pairs", help="per cell, the median NCCL / oxccl ratio over paired runs")
    q.add_argument("--out", help="write the table as JSON here")
    q.add_argument("runs", nargs="+", help="NCCL run, preload run, NCCL run, preload run, ...")
    args = p.parse_args()
    t0 = time.time()
    rc = {"run": run, "compare": compare, "best": best, "pairs": pairs}[args.cmd](args)
    if args.cmd == "compare" or int(os.environ.get("RANK", "0")) == 0:
        print(f"{args.cmd}: {time.time() - t0:.1f}s, exit {rc}", flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
