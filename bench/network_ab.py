#!/usr/bin/env python
"""Interleaved A/B measurements of flinkbuf.network against its peers (a
helper for comparing alternatives on a noisy, shared machine: every
variant once per round, rounds repeated, medians and ratios reported).

  python bench/network_ab.py latency [--rounds 5] [--pings 3000] VARIANT...
  python bench/network_ab.py bulk [--rounds 5] [--n 20000] VARIANT...
  python bench/network_ab.py records [--rounds 5] [--n 2000000] [--kind int64]
                             [--channels 1] [--flush-ms 100] VARIANT...

A VARIANT is a peer (``raw_tcp``, ``raw_uds``, ``pyzmq``, ``mp_queue``) or
``flinkbuf`` with spec options after colons, e.g. ``flinkbuf:transport=tcp``,
``flinkbuf:exclusive=8:floating=32`` or ``flinkbuf:direct_reads=0`` (also
``caller_sends=0``: NetworkEnvironment's switches); ``env.NAME=value`` sets
an environment variable for that variant's processes.  Run on a release
build.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import network_peers as np_  # noqa: E402


def parse(variant):
    impl, *opts = variant.split(":")
    extra = {}
    for o in opts:
        k, _, v = o.partition("=")
        try:
            v = int(v)
        except ValueError:
            pass
        extra[k] = v
    return impl, extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["latency", "bulk", "records"])
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pings", type=int, default=3000)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--pin", action="store_true", help="latency: both processes on one CPU")
    ap.add_argument("--kind", default="int64", choices=["int64", "int_int"],
                    help="records: what each record is")
    ap.add_argument("--channels", type=int, default=1, help="records: channels")
    ap.add_argument("--flush-ms", type=float, default=100, help="records: buffer_timeout")
    a = ap.parse_args()
    res = {v: [] for v in a.variants}
    for r in range(a.rounds):
        for v in a.variants:
            impl, extra = parse(v)
            env = {k[4:]: str(extra.pop(k)) for k in list(extra) if k.startswith("env.")}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            if a.what == "latency":
                spec = {"n": a.pings, "warmup": 300, **extra}
                if a.pin:
                    cpu = min(os.sched_getaffinity(0))
                    spec["pin"] = {"pinger": {cpu}, "ponger": {cpu}}
                rtt = sorted(np_.run_ping_pong(impl, spec)["rtt_ns"])
                val = (rtt[len(rtt) // 2], rtt[int(len(rtt) * 0.99)])
            elif a.what == "records":
                spec = {"kind": a.kind, "n": a.n, "channels": a.channels, "batch": 1,
                        "buffer_timeout": a.flush_ms / 1e3, **extra}
                out = np_.run_pair(impl, spec)
                val = (a.n / out["ns"] * 1e9 / 1e6,)
            else:
                spec = {"kind": "bytes32k", "n": a.n, "channels": 1, "batch": 1,
                        "buffer_timeout": 0.1, **extra}
                out = np_.run_pair(impl, spec)
                val = (a.n * np_.SEGMENT / out["ns"] * 1e9 / 2**20,)
            for k, old in saved.items():
                if old is None:
                    del os.environ[k]
                else:
                    os.environ[k] = old
            res[v].append(val)
            print(f"round {r}: {v:<40} " + " ".join(f"{x:,.2f}" if x < 100 else f"{x:,.0f}"
                                                    for x in val), flush=True)
    base = a.variants[0]
    print()
    if a.what == "latency":
        print(f"{'variant':<40} {'p50 us':>8} {'p99 us':>8} {'p50/' + base:>14}  rounds p50 (us)")
        b50 = statistics.median(x[0] for x in res[base])
        for v in a.variants:
            p50 = statistics.median(x[0] for x in res[v])
            p99 = statistics.median(x[1] for x in res[v])
            print(f"{v:<40} {p50 / 1e3:8.1f} {p99 / 1e3:8.1f} {p50 / b50:14.2f}  "
                  + " ".join(f"{x[0] / 1e3:.1f}" for x in res[v]))
    else:
        unit = "MiB/s" if a.what == "bulk" else "Mrec/s"
        print(f"{'variant':<40} {unit:>8} {'/' + base:>10}  rounds ({unit})")
        b = statistics.median(x[0] for x in res[base])
        for v in a.variants:
            m = statistics.median(x[0] for x in res[v])
            print(f"{v:<40} {m:8.2f} {m / b:10.2f}  " + " ".join(f"{x[0]:.2f}" for x in res[v]))


if __name__ == "__main__":
    main()
