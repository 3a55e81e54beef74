#!/usr/bin/env python3
"""Summarizes gpu_trace.c timelines: for every large copy, how much of it ran beside a
kernel of the same process on the same device, and on which work queues each ran.

    python3 ci/gpu/probe/trace_summary.py TRACE_DIR_OR_FILE... [--min-mib 1]

Line format of a trace (gpu_trace.c): start_ns end_ns kind device stream channel_type
channel what...
"""
import argparse
import os
import sys


def records(path):
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 7:
                continue
            start, end, kind, dev, stream, ctype, chan = parts[:7]
            what = " ".join(parts[7:])
            out.append((int(start), int(end), kind, int(dev), int(stream), ctype, chan, what))
    return out


def copy_bytes(what):
    for word in what.split():
        if word.startswith("bytes="):
            return int(word[len("bytes="):])
    return 0


def overlap(a, b):
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def summarize(path, min_bytes):
    recs = records(path)
    copies = [r for r in recs if r[2] in ("C", "P") and copy_bytes(r[7]) >= min_bytes]
    if not copies:
        return
    print(f"== {path}")
    kernels = [r for r in recs if r[2] == "K"]
    for c in copies:
        dur = c[1] - c[0]
        beside = [k for k in kernels if k[3] == c[3] and overlap(c, k) > 0]
        covered = sum(overlap(c, k) for k in beside)
        names = sorted({k[7].split()[0] for k in beside})
        gbps = copy_bytes(c[7]) / dur if dur else 0.0
        print(
            f"  {c[2]} dev {c[3]} stream {c[4]} queue {c[5]}/{c[6]} {c[7]}: {dur / 1e3:.1f} us "
            f"({gbps:.1f} GB/s), kernels beside it {covered / 1e3:.1f} us "
            f"({100.0 * covered / dur if dur else 0:.0f}%): {', '.join(names) or '-'}"
        )
    queues = {}
    for r in recs:
        queues.setdefault((r[3], r[4]), set()).add(f"{r[5]}/{r[6]}")
    print("  streams -> queues: " + "; ".join(
        f"dev {d} stream {s}: {','.join(sorted(q))}" for (d, s), q in sorted(queues.items())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--min-mib", type=float, default=1.0)
    args = ap.parse_args()
    min_bytes = int(args.min_mib * (1 << 20))
    for p in args.paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                if name.startswith("trace-"):
                    summarize(os.path.join(p, name), min_bytes)
        elif os.path.exists(p):
            summarize(p, min_bytes)
        else:
            print(f"trace_summary: no such file {p}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
