#!/usr/bin/env python
"""Where flinkbuf.network's time goes: the investigation behind the numbers of
bench/bench_network.py (not a benchmark run by bench/run.py, not a test).

  python bench/network_profile.py split   # producer back-pressured / consumer idle; placement
  python bench/network_profile.py counts  # syscalls and context switches per buffer (perf stat)
  python bench/network_profile.py model   # bench/netmodel.c: the engine's data path without Python
  python bench/network_profile.py raw     # raw sockets: TCP vs Unix socket, socket buffers, chunks
  python bench/network_profile.py all

``--reps N`` (default 3): each configuration N times, the median shown.
``counts`` needs ``perf`` with tracepoints (syscalls:*), which this machine's
kernel has even where hardware counters are not supported.  ``model`` needs
a C compiler (cc).  Run from the repository root on a release build.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import network_peers as np_  # noqa: E402

N_INT = 5_000_000
N_BULK = 50_000
N_PING = 10_000


def median_run(reps, fn):
    runs = sorted((fn() for _ in range(reps)), key=lambda r: r["ns"])
    return runs[len(runs) // 2]


def pin_of(place):
    return {"": None, "same": {"producer": {0}, "consumer": {0}, "pinger": {0}, "ponger": {0}},
            "split": {"producer": {0}, "consumer": {1}, "pinger": {0},
                      "ponger": {1}}}[place]


# ---- split: which side waits ------------------------------------------------------------------

def split(reps):
    print("\n## flinkbuf: end-to-end time, and how long each side waited for the other")
    print("   (producer: RecordWriter.back_pressured_time_ns; consumer: InputGate.idle_time_ns)")
    print(f"   {'case':<42} {'placement':<9} {'rec/s':>12} {'MB/s':>7} {'prod. waited':>13} "
          f"{'cons. waited':>13}")
    cases = [("int64", N_INT, {}), ("int_int", N_INT, {}), ("bytes32k", N_BULK, {}),
             ("bytes32k", N_BULK, {"exclusive": 8, "floating": 32, "out_buffers": 64})]
    if len(os.sched_getaffinity(0)) < 2:
        places = [""]
    else:
        places = ["", "same", "split"]
    for kind, n, extra in cases:
        for place in places:
            spec = {"kind": kind, "n": n, "channels": 1, "buffer_timeout": 0.1, "batch": 1,
                    **extra}
            if pin_of(place):
                spec["pin"] = pin_of(place)
            r = median_run(reps, lambda: np_.run_pair("flinkbuf", spec))
            s = r["ns"] / 1e9
            label = kind + (" " + " ".join(f"{k}={v}" for k, v in extra.items()) if extra else "")
            mbs = f"{n * np_.SEGMENT / s / 1e6:7.0f}" if kind == "bytes32k" else " " * 7
            print(f"   {label:<42} {place or 'sched':<9} {n / s:12,.0f} {mbs} "
                  f"{r['producer']['back_pressured_ns'] / r['ns']:12.0%} "
                  f"{r['consumer']['idle_ns'] / r['ns']:12.0%}")


# ---- counts: perf stat per side ------------------------------------------------------------

EVENTS = ["syscalls:sys_enter_sendmsg", "syscalls:sys_enter_sendto",
          "syscalls:sys_enter_recvfrom", "syscalls:sys_enter_futex", "syscalls:sys_enter_poll",
          "raw_syscalls:sys_enter", "context-switches", "cpu-migrations"]
SHORT = {"syscalls:sys_enter_sendmsg": "sendmsg", "syscalls:sys_enter_sendto": "send",
         "syscalls:sys_enter_recvfrom": "recv", "syscalls:sys_enter_futex": "futex",
         "syscalls:sys_enter_poll": "poll", "raw_syscalls:sys_enter": "all syscalls",
         "context-switches": "ctx switches", "cpu-migrations": "migrations"}


def perf_ok():
    if shutil.which("perf") is None:
        return False
    r = subprocess.run(["perf", "stat", "-e", EVENTS[0], "true"], capture_output=True, text=True)
    return r.returncode == 0 and "not supported" not in r.stderr


def counts(reps):
    del reps                                     # counts barely vary: one run each
    if not perf_ok():
        print("\n## counts: skipped (perf with syscall tracepoints is not available)")
        return
    tmp = tempfile.mkdtemp(prefix="netprofile-")
    cases = [("flinkbuf", "int64", N_INT), ("flinkbuf", "bytes32k", N_BULK),
             ("raw_tcp", "bytes32k", N_BULK), ("flinkbuf", "ping", N_PING),
             ("pyzmq", "ping", N_PING), ("raw_tcp", "ping", N_PING)]
    print("\n## syscalls and context switches, per side, per unit "
          "(32 KiB buffer for throughput, round trip for ping), perf stat attached for the "
          "measured part")
    cols = ["sendmsg", "send", "recv", "futex", "poll", "all syscalls", "ctx switches"]
    print(f"   {'impl':<9} {'case':<9} {'side':<9} {'units':>7} " +
          " ".join(f"{c:>12}" for c in cols))
    for impl, kind, n in cases:
        os.environ["NETBENCH_TOOL"] = ("perf stat -x, -e " + ",".join(EVENTS) +
                                       f" -p {{pid}} -o {tmp}/{impl}-{kind}.{{role}}")
        # -x, (CSV) lines: value,unit,event,...
        try:
            if kind == "ping":
                np_.run_ping_pong(impl, {"n": n, "warmup": 0})
                sides, units = ("pinger", "ponger"), n
            else:
                r = np_.run_pair(impl, {"kind": kind, "n": n, "channels": 1,
                                        "buffer_timeout": 0.1, "batch": 1})
                sides = ("producer", "consumer")
                stats = r["producer"].get("stats")
                units = sum(c["buffers_out"] for c in stats) if stats else n
        finally:
            del os.environ["NETBENCH_TOOL"]
        for side in sides:
            got = {}
            with open(f"{tmp}/{impl}-{kind}.{side}") as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) > 2 and parts[2] in SHORT and parts[0].isdigit():
                        got[SHORT[parts[2]]] = int(parts[0])
            print(f"   {impl:<9} {kind:<9} {side:<9} {units:7d} " +
                  " ".join(f"{got.get(c, 0) / units:12.2f}" for c in cols))
    shutil.rmtree(tmp, ignore_errors=True)


# ---- model: bench/netmodel.c -------------------------------------------------------------------

def build_model():
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = os.path.join(tempfile.mkdtemp(prefix="netmodel-"), "netmodel")
    subprocess.run([cc, "-O2", "-pthread", "-o", out, os.path.join(HERE, "netmodel.c")],
                   check=True)
    return out


def run_model(exe, reps, *args):
    lines = []
    for _ in range(reps):
        lines.append(subprocess.run([exe, *map(str, args)], capture_output=True, text=True,
                                    check=True).stdout.strip())

    def key(line):
        m = re.search(r"([\d.]+) MB/s", line) or re.search(r"p50\s+([\d.]+) us", line)
        return float(m.group(1))
    lines.sort(key=key)
    return lines[len(lines) // 2]


MODEL_BULK = [
    # (label, handoff, batch, staging, credit, family, sockbuf)
    ("direct: one thread per side does its I/O", 0, 1, 1, 0, "tcp", 0),
    ("engine: handoffs, 1 frame/sendmsg, staging, credit", 1, 1, 1, 1, "tcp", 0),
    ("engine + 8 frames (and control) per sendmsg", 1, 8, 1, 1, "tcp", 0),
    ("engine + body straight into the segment", 1, 1, 0, 1, "tcp", 0),
    ("engine + both", 1, 8, 0, 1, "tcp", 0),
    ("engine + 4 MiB SO_SNDBUF/SO_RCVBUF", 1, 1, 1, 1, "tcp", 4 << 20),
    ("engine over a Unix socket", 1, 1, 1, 1, "uds", 0),
    ("engine + both, over a Unix socket", 1, 8, 0, 1, "uds", 0),
    ("direct over a Unix socket", 0, 1, 1, 0, "uds", 0),
]
MODEL_PING = [
    ("direct: one thread per side does its I/O", 0, 1, 1, 0, "tcp", 0),
    ("engine: handoffs, credit frames on their own", 1, 1, 1, 1, "tcp", 0),
    ("engine, ADD_CREDIT in the data's sendmsg", 1, 8, 1, 1, "tcp", 0),
    ("engine without credit frames", 1, 1, 1, 0, "tcp", 0),
    ("engine over a Unix socket", 1, 1, 1, 1, "uds", 0),
    ("direct over a Unix socket", 0, 1, 1, 0, "uds", 0),
]


def model(reps):
    exe = build_model()
    if exe is None:
        print("\n## model: skipped (no C compiler)")
        return
    places = [0, 1, 2] if len(os.sched_getaffinity(0)) >= 2 else [0]
    names = {0: "sched", 1: "same CPU", 2: "split CPUs"}
    for kind, rows, n in (("bulk", MODEL_BULK, N_BULK), ("ping", MODEL_PING, N_PING)):
        print(f"\n## bench/netmodel.c {kind}: "
              + ("32 KiB frames one way, MB/s" if kind == "bulk" else
                 "16-byte frames there and back, round trip p50 / p99")
              + f"; median of {reps}")
        for label, handoff, batch, staging, credit, fam, sockbuf in rows:
            for place in places:
                line = run_model(exe, reps, kind, fam, n, handoff, batch, staging, credit,
                                 place, sockbuf)
                result, _, per = line.partition(": ")[2].partition("  | per frame: ")
                per = per.split(";")[0]
                print(f"   {label:<52} {names[place]:<10} {result.strip():>30}   {per}")
    shutil.rmtree(os.path.dirname(exe), ignore_errors=True)


# ---- raw: the kernel's options --------------------------------------------------------------

def raw(reps):
    print(f"\n## raw sockets, 32 KiB records one way (Python sendall/recv_into), MB/s, "
          f"median of {reps}")
    variants = [("defaults (autotuned buffers), 32 KiB per call", {}),
                ("SO_SNDBUF = SO_RCVBUF = 4 MiB", {"sndbuf": 4 << 20, "rcvbuf": 4 << 20}),
                ("SO_SNDBUF = SO_RCVBUF = 64 KiB", {"sndbuf": 1 << 16, "rcvbuf": 1 << 16}),
                ("256 KiB per call", {"chunk": 1 << 18})]
    places = ["", "same", "split"] if len(os.sched_getaffinity(0)) >= 2 else [""]
    for label, extra in variants:
        for impl in ("raw_tcp", "raw_uds"):
            cells = []
            for place in places:
                spec = {"kind": "bytes32k", "n": N_BULK, "channels": 1, "batch": 1,
                        "buffer_timeout": None, **extra}
                if pin_of(place):
                    spec["pin"] = pin_of(place)
                r = median_run(reps, lambda: np_.run_pair(impl, spec))
                cells.append(f"{place or 'sched'} {N_BULK * np_.SEGMENT / r['ns'] * 1e3:6.0f}")
            print(f"   {impl:<8} {label:<48} " + "   ".join(cells))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", default=["all"],
                    choices=["split", "counts", "model", "raw", "all"])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    todo = ["split", "counts", "model", "raw"] if "all" in args.what else args.what
    print(f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
    for what in todo:
        globals()[what](args.reps)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
