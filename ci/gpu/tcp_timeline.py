#!/usr/bin/env python3
"""Where a PortChannel call's time goes over TCP, from the channel timelines of the ranks
(OXCCL_CHANNEL_TIMELINE=<prefix>, one <prefix>.<pid>.csv per process; channels/src/timeline.rs).

    python3 ci/gpu/tcp_timeline.py out/timeline.*.csv

For every ordered pair of ranks (a -> b) it pairs a's k-th put to b (the proxy picked the
trigger up, its frames had left) with b's k-th write from a (the receiver had the header,
stored the signal), and b's next put, and prints the medians (p10-p90) of:

  proxy   a: picked -> sent          the proxy's operation (checks, framing, send)
  wire    a: sent -> b: header       the socket, and b's receiver noticing it
  apply   b: header -> signalled     reading the bytes into place, storing the signal
  gpu     b: signalled -> picked     b's GPU seeing the signal, finishing the call, the next
                                     call starting and pushing its trigger (the next put)
  period  a: picked -> next picked   one call

Every process writes one CLOCK_MONOTONIC timeline, so differences across files are exact on
one machine. The first tenth of the calls (warm-up) is left out.
"""
import collections
import csv
import statistics
import sys


def load(path):
    events = collections.defaultdict(list)  # (event, peer) -> [ns]
    rank = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = int(row["rank"])
            if r >= 0:
                rank = r
            events[(row["event"], int(row["peer"]))].append(int(row["ns"]))
    return rank, events


def spread(xs):
    if not xs:
        return "-"
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    return f"{statistics.median(xs) / 1000:7.2f} us ({q(0.1) / 1000:.2f}-{q(0.9) / 1000:.2f})"


def main(paths):
    ranks = {}
    for p in paths:
        rank, events = load(p)
        if rank is None:
            print(f"{p}: no receiver event (no TCP write arrived); skipped")
            continue
        ranks[rank] = events
    if len(ranks) < 2:
        print("need the timelines of at least two ranks")
        return 1
    for a in sorted(ranks):
        for b in sorted(ranks):
            if a == b:
                continue
            picked = ranks[a][("picked", b)]
            sent = ranks[a][("sent", b)]
            header = ranks[b][("header", a)]
            signalled = ranks[b][("signalled", a)]
            next_picked = ranks[b][("picked", a)]
            n = min(len(picked), len(sent), len(header), len(signalled))
            if n < 4:
                print(f"{a} -> {b}: {n} puts, too few")
                continue
            counts = (len(picked), len(sent), len(header), len(signalled))
            note = "" if len(set(counts)) == 1 else f" (counts differ: {counts}; paired by index)"
            ks = range(n // 10, n - 1)
            print(f"{a} -> {b}: {n} puts{note}")
            print(f"  proxy   {spread([sent[k] - picked[k] for k in ks])}")
            print(f"  wire    {spread([header[k] - sent[k] for k in ks])}")
            print(f"  apply   {spread([signalled[k] - header[k] for k in ks])}")
            print(f"  gpu     {spread([next_picked[k + 1] - signalled[k] for k in ks if k + 1 < len(next_picked)])}")
            print(f"  period  {spread([picked[k + 1] - picked[k] for k in ks])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
