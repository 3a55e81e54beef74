"""Runs a function on N ranks, each in its own process (spawned, so nothing of the parent's
threads is inherited), joined by a unique id the parent makes. Each rank checks its own
results (every rank can compute every rank's input from the seeds), so a failure names the
rank. Bounded: a rank that does not finish within the time limit fails the test (the
processes are killed), never a hang."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback

import oxccl

#: Bound of one multi-process test (seconds).
LIMIT_S = float(os.environ.get("OXCCL_PYTEST_LIMIT_S", "120"))


def _worker(fn, uid, rank, world, args, results):
    try:
        os.environ.setdefault("OXCCL_BACKEND", "host")
        comm = oxccl.Communicator(uid, rank, world, backend="host", timeout_ms=int(os.environ.get("OXCCL_TIMEOUT_MS", "20000")))
        try:
            out = fn(comm, *args)
        finally:
            if not comm.destroyed:
                comm.destroy()
        results.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the parent with the rank
        results.put((rank, "error", traceback.format_exc()))


def _entry(fn, args, results):
    try:
        results.put((-1, "ok", fn(*args)))
    except BaseException:  # noqa: BLE001
        results.put((-1, "error", traceback.format_exc()))


def _collect(procs, results, n, limit):
    got = {}
    try:
        for _ in range(n):
            rank, status, value = results.get(timeout=limit)
            got[rank] = (status, value)
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return got


def run(world: int, fn, *args, limit: float = LIMIT_S):
    """Runs ``fn(comm, *args)`` on ``world`` ranks; returns their results by rank, or
    raises AssertionError naming the ranks that failed or did not finish."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    uid = oxccl.unique_id()
    procs = [ctx.Process(target=_worker, args=(fn, uid, r, world, args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got = _collect(procs, results, world, limit)
    missing = [r for r in range(world) if r not in got]
    errors = {r: v for r, (s, v) in got.items() if s != "ok"}
    if missing or errors:
        msg = [f"ranks {missing} did not finish within {limit} s"] if missing else []
        msg += [f"--- rank {r} failed:\n{v}" for r, v in sorted(errors.items())]
        raise AssertionError("\n".join(msg))
    return [got[r][1] for r in range(world)]


def run_each(fns_args, limit: float = LIMIT_S):
    """Runs ``fn(*args)`` for each (fn, args) in its own spawned process (for routes that
    make their own communicator, e.g. the launcher environment); returns the results or
    raises AssertionError. A failed process's traceback is in the message."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for i, (fn, args) in enumerate(fns_args):
        q = ctx.Queue()
        p = ctx.Process(target=_entry, args=(fn, args, q), daemon=True)
        procs.append((p, q))
        p.start()
    out = []
    for i, (p, q) in enumerate(procs):
        got = _collect([p], q, 1, limit)
        if -1 not in got:
            raise AssertionError(f"process {i} did not finish within {limit} s")
        status, value = got[-1]
        if status != "ok":
            raise AssertionError(f"--- process {i} failed:\n{value}")
        out.append(value)
    del results
    return out
