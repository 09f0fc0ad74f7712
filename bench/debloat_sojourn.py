#!/usr/bin/env python
"""How long a record waits between its emit and its read (its sojourn) when
the consumer is slower than the producer, with buffer debloating off and
on, side by side.

An unthrottled producer writes ``(emit time, sequence)`` records through a
NetworkEnvironment (``sealed``: TCP with every frame sealed; ``local``: a
partition of the same process) to
one consumer held to a steady rate; every record's sojourn is the
consumer's clock at its read minus the emit time (CLOCK_MONOTONIC is one
clock for every process of the host).  The first ``--settle`` seconds are
left out: in-flight data fills up, and the debloated size settles.

  python bench/debloat_sojourn.py [--rates 200,2000,20000,200000]
         [--transports tcp,unix,shm,sealed,local] [--target 0.1] [--seconds 8]
         [--settle 3] [--busy N] [--smoke]

``--busy N`` runs N busy-loop processes beside every case (a Spark
executor's cores are never idle).  Prints, per transport and rate, the
sojourn p50 / p99 without and with debloating, the p99 against the
target, the debloated buffer size the consumer announced last, and the
records per second it read (the rate it was held to, if it kept up).
"""

import argparse
import sys
import time

from _debloat_pair import busy, debloated_size, paced, run_pair


def _record(seq):
    return (time.monotonic_ns(), seq)


def _consume(gate, rate, seconds, settle):
    """Read at ``rate`` records a second for ``seconds``: the sojourns (s)
    after ``settle`` seconds, the records read then, and the gate's last
    debloated size."""
    sojourns = []
    settled = time.monotonic_ns() + int(settle * 1e9)
    read_after = 0
    for (emitted, _), now in paced(gate, rate, seconds):
        if now >= settled:
            sojourns.append((now - emitted) / 1e9)
            read_after += 1
    return sojourns, read_after / max(1e-9, seconds - settle), debloated_size(gate)


def run_case(transport, rate, debloat, a):
    return run_pair(transport, debloat, a.target, _record,
                    lambda gate: _consume(gate, rate, a.seconds, a.settle))


def _pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="200,2000,20000,200000")
    ap.add_argument("--transports", default="tcp,unix,shm,sealed,local")
    ap.add_argument("--target", type=float, default=0.1)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="one short case per transport")
    a = ap.parse_args(argv)
    rates = [int(r) for r in a.rates.split(",")]
    transports = a.transports.split(",")
    if a.smoke:
        rates, a.seconds, a.settle = [20000], 1.5, 0.5
    print(f"sojourn of a record, consumer held to a rate; target {a.target} s; "
          f"{a.seconds - a.settle:.0f} s measured after {a.settle:.0f} s"
          f"{f'; {a.busy} busy process(es) beside' if a.busy else ''}")
    print(f"{'transport':>9} {'rate/s':>7} | {'off p50':>8} {'off p99':>8} | "
          f"{'on p50':>8} {'on p99':>8} {'p99/target':>10} {'size':>6} {'read/s':>8}")
    with busy(a.busy):
        for transport in transports:
            for rate in rates:
                off, _, _ = run_case(transport, rate, False, a)
                on, got, size = run_case(transport, rate, True, a)
                p99 = _pct(on, 0.99)
                print(f"{transport:>9} {rate:>7} | {_pct(off, 0.5):8.3f} {_pct(off, 0.99):8.3f} |"
                      f" {_pct(on, 0.5):8.3f} {p99:8.3f} {p99 / a.target:10.2f} "
                      f"{size if size is not None else '-':>6} {got:8.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
