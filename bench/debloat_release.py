#!/usr/bin/env python
"""How soon throughput is back to full once a slow consumer is released,
with buffer debloating off and on, side by side.

An unthrottled producer writes ``(int, int)`` records through a
NetworkEnvironment (``sealed``: TCP with every frame sealed; ``local``: a
partition of the same process) to
one consumer, held to ``--slow-rate`` records a second for ``--slow``
seconds (debloating shrinks the buffers meanwhile), then released: it
reads as fast as it can for ``--fast`` seconds.  Full speed is the median
rate of the 50 ms windows of the released phase's second half without
debloating (over the rounds, interleaved with those with it); the time to
full is the first moment after the release at which a 100 ms window reads
at least ``--fraction`` of that full speed.

  python bench/debloat_release.py [--transports tcp,unix,shm,sealed,local]
         [--slow-rate 2000] [--slow 3] [--fast 3] [--target 0.1]
         [--rounds 3] [--busy N] [--smoke]

Prints per transport the median over rounds of the time to full (s)
without and with debloating, full speed (records a second), the rate of
the last second with debloating against it, and the buffer size the
consumer had announced when it was released and at the end.
"""

import argparse
import statistics
import sys
import time

from _debloat_pair import busy, debloated_size, paced, run_pair

WINDOW_NS = 50_000_000


def _record(seq):
    return (seq, seq)


def _consume(gate, a):
    """Held to the slow rate, then released: the records read per 50 ms
    window after the release, and the size announced at the release and
    at the end."""
    it = iter(gate)
    for _ in paced(it, a.slow_rate, a.slow):
        pass
    size = debloated_size(gate)
    windows = [0] * int(a.fast * 1e9 / WINDOW_NS)
    released = time.monotonic_ns()
    end = released + len(windows) * WINDOW_NS
    count, edge, w = 0, released + WINDOW_NS, 0
    for _ in it:
        count += 1
        if count & 63 == 0:
            now = time.monotonic_ns()
            while now >= edge and w < len(windows):
                windows[w] = count
                count = 0
                w += 1
                edge += WINDOW_NS
            if now >= end:
                break
    return windows, size, debloated_size(gate)


def full_speed(windows):
    """The median rate (records a second) of the second half's windows."""
    return statistics.median(windows[len(windows) // 2:]) / (WINDOW_NS / 1e9)


def last_second(windows):
    """The rate (records a second) of the last second's windows."""
    last = windows[-int(1e9 // WINDOW_NS):]
    return sum(last) / (len(last) * WINDOW_NS / 1e9)


def time_to_full(windows, full, fraction):
    """Seconds from the release to the first 100 ms (two windows) that
    read ``fraction`` of ``full`` records a second (inf: none did)."""
    need = fraction * full * 2 * WINDOW_NS / 1e9
    for i in range(len(windows) - 1):
        if windows[i] + windows[i + 1] >= need:
            return i * WINDOW_NS / 1e9
    return float("inf")


def run_case(transport, debloat, a):
    return run_pair(transport, debloat, a.target, _record, lambda gate: _consume(gate, a))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transports", default="tcp,unix,shm,sealed,local")
    ap.add_argument("--slow-rate", type=int, default=2000)
    ap.add_argument("--slow", type=float, default=3.0)
    ap.add_argument("--fast", type=float, default=4.0)
    ap.add_argument("--target", type=float, default=0.1)
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="one short round per transport")
    a = ap.parse_args(argv)
    if a.smoke:
        a.rounds, a.slow, a.fast = 1, 1.0, 1.0
    print(f"consumer held to {a.slow_rate} rec/s for {a.slow:g} s, then released; time until "
          f"100 ms read {a.fraction:.0%} of full speed; target {a.target} s"
          f"{f'; {a.busy} busy process(es) beside' if a.busy else ''}")
    print(f"{'transport':>9} | {'off: to full':>12} | {'on: to full':>11} {'full rec/s':>11} "
          f"{'on last 1 s':>13} {'size at release':>15} {'size at end':>11}  rounds (on, s)")
    with busy(a.busy):
        for transport in a.transports.split(","):
            runs = {False: [], True: []}
            sizes, ends = [], []
            for _ in range(a.rounds):
                for debloat in (False, True):
                    windows, size, at_end = run_case(transport, debloat, a)
                    runs[debloat].append(windows)
                    if debloat:
                        sizes.append(size)
                        ends.append(at_end)
            full = statistics.median(full_speed(w) for w in runs[False])
            off_t = statistics.median(time_to_full(w, full, a.fraction) for w in runs[False])
            on = [time_to_full(w, full, a.fraction) for w in runs[True]]
            tail = statistics.median(last_second(w) for w in runs[True]) / full
            rounds = " ".join(f"{t:.2f}" for t in on)
            print(f"{transport:>9} | {off_t:12.2f} | {statistics.median(on):11.2f} "
                  f"{full:11,.0f} {tail:13.2f} {statistics.median(sizes):>15} "
                  f"{statistics.median(ends):>11}  {rounds}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
