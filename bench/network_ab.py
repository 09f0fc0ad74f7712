#!/usr/bin/env python
"""Interleaved A/B measurements of flinkbuf.network against its peers (a
helper for comparing alternatives on a noisy, shared machine: every
variant once per round, rounds repeated, medians and ratios reported).

  python bench/network_ab.py latency [--rounds 5] [--pings 3000] VARIANT...
  python bench/network_ab.py bulk [--rounds 5] [--n 20000] [--cpu] VARIANT...
  python bench/network_ab.py records [--rounds 5] [--n 2000000] [--kind int64]
                             [--channels 1] [--flush-ms 100] [--cpu] VARIANT...

``--busy N`` (any of the three) runs N busy-loop processes beside every
measurement, started before it and stopped after it: a machine as a Spark
executor running other tasks beside the exchange has it (``--busy 1`` on
two cores: one core taken).

A VARIANT is a peer (``raw_tcp``, ``raw_uds``, ``pyzmq``, ``mp_queue``) or
``flinkbuf`` with spec options after colons, e.g. ``flinkbuf:transport=tcp``,
``flinkbuf:exclusive=8:floating=32`` or ``flinkbuf:direct_reads=0`` (also
``caller_sends=0``: NetworkEnvironment's switches); ``env.NAME=value`` sets
an environment variable for that variant's processes.  ``flinkbuf@DIR``
measures the flinkbuf built in place in checkout DIR instead of the one
this interpreter imports (in a child process with DIR first on its path),
so that two builds are compared round by round in one run, e.g.
``flinkbuf@../before:transport=auto flinkbuf:transport=shm``.  Run on
release builds.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import network_peers as np_  # noqa: E402


def parse(variant):
    impl, *opts = variant.split(":")
    impl, _, build = impl.partition("@")
    extra = {"build": os.path.abspath(build)} if build else {}
    for o in opts:
        k, _, v = o.partition("=")
        try:
            v = int(v)
        except ValueError:
            pass
        extra[k] = v
    return impl, extra


def measure(a, impl, extra):
    """One measurement of one variant in this process's flinkbuf: a tuple
    (MiB/s, Mrec/s, or p50 and p99 round trips in ns)."""
    env = {k[4:]: str(extra.pop(k)) for k in list(extra) if k.startswith("env.")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        if a.what == "latency":
            spec = {"n": a.pings, "warmup": 300, **extra}
            if a.pin:
                cpu = min(os.sched_getaffinity(0))
                spec["pin"] = {"pinger": {cpu}, "ponger": {cpu}}
            rtt = sorted(np_.run_ping_pong(impl, spec)["rtt_ns"])
            return (rtt[len(rtt) // 2], rtt[int(len(rtt) * 0.99)])
        if a.what == "records":
            spec = {"kind": a.kind, "n": a.n, "channels": a.channels, "batch": 1,
                    "buffer_timeout": a.flush_ms / 1e3, **extra}
            out = np_.run_pair(impl, spec)
            return (a.n / out["ns"] * 1e9 / 1e6, *_cpu_per_record(out, a.n))
        spec = {"kind": "bytes32k", "n": a.n, "channels": 1, "batch": 1,
                "buffer_timeout": 0.1, **extra}
        out = np_.run_pair(impl, spec)
        return (a.n * np_.SEGMENT / out["ns"] * 1e9 / 2**20, *_cpu_per_record(out, a.n))
    finally:
        for k, old in saved.items():
            if old is None:
                del os.environ[k]
            else:
                os.environ[k] = old


def _cpu_per_record(out, n):
    """CPU ns per record of the producer's and the consumer's processes
    (all their threads) over the measured part."""
    return tuple((out[side].get("cpu_ns") or 0) / n for side in ("producer", "consumer"))


def measure_in(build, a, variant):
    """One measurement of ``variant`` (``impl@build:opts``) by a child
    process that imports the flinkbuf built in place in ``build``."""
    impl, _, rest = variant.partition("@")
    rest = rest.partition(":")[2]
    one = impl + (":" + rest if rest else "")
    argv = [sys.executable, os.path.abspath(__file__), a.what, "--one", one,
            "--pings", str(a.pings), "--n", str(a.n), "--kind", a.kind,
            "--channels", str(a.channels), "--flush-ms", str(a.flush_ms)]
    if a.pin:
        argv.append("--pin")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [build] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run(argv, env=env, cwd=build, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{variant}: the measurement failed:\n{out.stderr[-3000:]}")
    return tuple(json.loads(out.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def busy(n):
    """``n`` processes that spin in a Python loop while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if procs:
            time.sleep(0.2)               # running, and spread over the cores
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["latency", "bulk", "records"])
    ap.add_argument("variants", nargs="*")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pings", type=int, default=3000)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--pin", action="store_true", help="latency: both processes on one CPU")
    ap.add_argument("--kind", default="int64", choices=["int64", "int_int"],
                    help="records: what each record is")
    ap.add_argument("--channels", type=int, default=1, help="records: channels")
    ap.add_argument("--flush-ms", type=float, default=100, help="records: buffer_timeout")
    ap.add_argument("--cpu", action="store_true",
                    help="bulk, records: also the CPU time per record of each side's process "
                         "(where two cores are both busy, no transport can go faster)")
    ap.add_argument("--busy", type=int, default=0, metavar="N",
                    help="N busy-loop processes beside each measurement (a loaded machine)")
    ap.add_argument("--one", help=argparse.SUPPRESS)   # a child's single measurement
    a = ap.parse_intermixed_args()
    if a.one:
        print(json.dumps(measure(a, *parse(a.one))))
        return
    if not a.variants:
        ap.error("name at least one variant")
    res = {v: [] for v in a.variants}
    for r in range(a.rounds):
        for v in a.variants:
            impl, extra = parse(v)
            build = extra.pop("build", None)
            with busy(a.busy):
                val = measure(a, impl, extra) if build is None else measure_in(build, a, v)
            res[v].append(val)
            shown = val if a.what == "latency" or a.cpu else val[:1]
            print(f"round {r}: {v:<40} " + " ".join(f"{x:,.2f}" if x < 100 else f"{x:,.0f}"
                                                    for x in shown), flush=True)
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
        cpu_head = f" {'cpu ns/rec: producer':>21} {'consumer':>9}" if a.cpu else ""
        print(f"{'variant':<40} {unit:>8} {'/' + base:>10}{cpu_head}  rounds ({unit})")
        b = statistics.median(x[0] for x in res[base])
        for v in a.variants:
            m = statistics.median(x[0] for x in res[v])
            cpu = "".join(f" {statistics.median(x[i] for x in res[v]):>{w}.0f}"
                          for i, w in ((1, 21), (2, 9))) if a.cpu else ""
            print(f"{v:<40} {m:8.2f} {m / b:10.2f}{cpu}  "
                  + " ".join(f"{x[0]:.2f}" for x in res[v]))


if __name__ == "__main__":
    main()
