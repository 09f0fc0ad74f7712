#!/usr/bin/env python
"""Run the benchmarks under bench/ in one process and print a side-by-side table.

Conventions for bench/bench_*.py (pytest-benchmark):
  * ``benchmark.group`` names the comparison; every entry of a group is
    measured in the same run, so ratios between them are meaningful;
  * ``benchmark.extra_info["ops"]``: operations per measured call (the table
    shows time per op);
  * ``benchmark.extra_info["subject"] = True`` marks flinkbuf's entry, the
    one the others are compared with (ratio = peer time / subject time, so
    ratio > 1 means flinkbuf is faster);
  * ``benchmark.extra_info["ns_per_op"]`` overrides the time per op (loops
    timed inside C); ``extra_info["bytes"]`` per op adds a bandwidth column;
  * ``benchmark.extra_info["target"]``: the target for this entry, shown beside it.

Usage: python bench/run.py [--smoke] [--repeat N] [--json FILE] [-k EXPR] [files...]

``--repeat N`` runs the whole selection N times and shows every group from
one pass, the one whose rows are closest to their best times.  The machines
this runs on are shared: a slow spell of the host can make one row of a
group 1.5x slower than its peers measured a minute later; a few passes give
each group a chance at a pass without one, and the rows of a group still
come from the same run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def fmt_time(ns):
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.1f} ns"


def ns_per_op(b):
    """A benchmark's time per operation: timed inside C, or its median / ops."""
    info = b.get("extra_info", {})
    ns = info.get("ns_per_op")
    if ns is None:
        ns = b["stats"]["median"] * 1e9 / (info.get("ops", 1) or 1)
    return ns


def table(data):
    groups = defaultdict(list)
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        groups[b.get("group") or b["name"]].append((b["name"], ns_per_op(b), info))
    lines = []
    for group in sorted(groups):
        rows = groups[group]
        subject = next((ns for _, ns, info in rows if info.get("subject")), None)
        lines.append("")
        lines.append(f"== {group}")
        lines.append(f"   {'benchmark':<52} {'per op':>11} {'ops/s':>12} {'MB/s':>9} {'ratio':>8}  target")
        for name, ns, info in sorted(rows, key=lambda r: r[1]):
            short = name.split("[")[0].removeprefix("test_")
            if "[" in name:
                short += "[" + name.split("[", 1)[1]
            mark = "*" if info.get("subject") else " "
            bw = info.get("bytes")
            mbs = f"{bw / ns * 1e3:9.0f}" if bw else " " * 9
            ratio = f"{ns / subject:7.2f}x" if subject and not info.get("subject") else " " * 8
            ops_s = 1e9 / ns if ns > 0 else float("inf")
            lines.append(f" {mark} {short:<52} {fmt_time(ns):>11} {ops_s:12,.0f} {mbs} {ratio}  "
                         f"{info.get('target', '')}")
    lines.append("")
    lines.append("* = flinkbuf; ratio = that row's time per op / flinkbuf's (>1: flinkbuf faster)")
    return "\n".join(lines)


def best_of(passes):
    """One pytest-benchmark document per pass -> one document in which every
    group comes whole from one pass (its rows measured in the same run): the
    pass whose rows are, summed, closest to their own best times."""
    by_group = defaultdict(lambda: defaultdict(dict))     # group -> pass -> name -> bench
    for i, data in enumerate(passes):
        for b in data["benchmarks"]:
            by_group[b.get("group") or b["name"]][i][b["fullname"]] = b
    chosen = []
    for runs in by_group.values():
        best = {}
        for rows in runs.values():
            for name, b in rows.items():
                best[name] = min(best.get(name, float("inf")), ns_per_op(b))
        pick = min(runs.values(), key=lambda rows: sum(ns_per_op(b) / best[n]
                                                       for n, b in rows.items()))
        chosen.extend(pick.values())
    return {"benchmarks": chosen, "passes": len(passes)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="one short round each (CI)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run everything N times, show each group from its best pass")
    ap.add_argument("--json", help="also keep the (best-of) results as JSON here")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    files = args.files or sorted(
        os.path.join(HERE, f) for f in os.listdir(HERE) if f.startswith("bench_") and f.endswith(".py"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--benchmark-only", "--benchmark-disable-gc", "--benchmark-sort=name"]
    if args.smoke:
        cmd += ["--benchmark-min-rounds=1", "--benchmark-max-time=0.02", "--benchmark-warmup=off"]
    else:
        cmd += ["--benchmark-min-rounds=5", "--benchmark-max-time=1.0", "--benchmark-warmup=on"]
    if args.k:
        cmd += ["-k", args.k]
    env = dict(os.environ, FLINKBUF_BENCH_SMOKE="1" if args.smoke else "0")
    passes = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            out = os.path.join(tmp, f"pass{i}.json")
            rc = subprocess.call(cmd + [f"--benchmark-json={out}", "--benchmark-columns=median", *files],
                                 env=env, cwd=os.path.dirname(HERE))
            if rc != 0:
                return rc
            with open(out) as f:
                passes.append(json.load(f))
    data = best_of(passes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    print(table(data))
    if args.repeat > 1:
        print(f"each group: the best of {args.repeat} passes (closest to its rows' best times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
