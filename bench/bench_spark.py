"""flinkbuf.spark against Spark's own exchanges, the same job in the same run
(conventions: bench/run.py).

The job: N ``(int, int)`` records in 2 partitions (``(i % 1000, i)``,
generated in the Python workers), keyed by the first field, counted per key
in the consumer; local[2].  Rows:

  * ``flinkbuf``: :func:`flinkbuf.spark.pipelined_exchange` (hash by key,
    32 KiB buffers, the driver's address rendezvous), the consumer a
    ``Counter`` over the keys;
  * ``flinkbuf_barrier``: the same with ``rendezvous="barrier"`` (the
    addresses through Spark's ``allGather``, answered on a 1 s poll);
  * ``flinkbuf_live_view``: ``flinkbuf`` with its tasks reporting to the
    session's live view (``live_view=``, a report per task every 0.5 s):
    its cost is the difference to ``flinkbuf``;
  * ``rdd_shuffle``: ``partitionBy(2).mapPartitions`` with the same
    consumer (Spark's blocking RDD shuffle);
  * ``dataframe_arrow``: ``spark.range`` -> ``repartition(2, "k")`` ->
    ``mapInArrow`` counting with numpy (rows made in the JVM, not in Python);
  * ``arrow_barrier_floor``: the same DataFrame straight into
    ``mapInArrow(barrier=True)`` counting, with no exchange at all: what
    Spark itself takes to run a barrier ``mapInArrow`` stage over it (the
    floor under any exchange made in one);
  * ``flinkbuf_arrow``: the same DataFrame through
    :func:`flinkbuf.spark.arrow_exchange` (``mapInArrow(barrier=True)``),
    RecordBatches routed by a vectorized hash of ``k``;
    ``flinkbuf_arrow_barrier`` the same with ``rendezvous="barrier"``,
    ``flinkbuf_arrow_unsealed`` the same with ``encryption=False`` (between
    hosts the exchange seals its frames by default: what that costs).

Time per op = the job's wall time / N.  ``extra_info`` has, per row, the
time from the job's start to the consumer's first record
(``first_record_s``) and the peak RSS of each Python worker during the job
(``worker_peak_rss_mb``: VmHWM, reset when the task starts; Python workers
are reused, so it includes what earlier jobs left in them) and how much it
grew over the worker's RSS at the task's start (``worker_rss_growth_mb``).  Running the
file as a script prints all three for each N::

    python bench/bench_spark.py --records 1000000 10000000

and ``--live-view-overhead ROUNDS`` measures what the live view costs
instead: ``flinkbuf`` with the live view off and on, alternately, ROUNDS
times each per N, the medians, the median of the pairs' ratios and the CPU
time the tasks' reporter threads used::

    python bench/bench_spark.py --records 10000000 --live-view-overhead 9

N: ``FLINKBUF_BENCH_SPARK_N`` (comma-separated; default 1 M and 10 M, or
20 k in smoke runs).

``--cluster`` (as root, Linux) runs the same rows on a Spark standalone
cluster of simulated hosts instead of local[2] (tests/netns_cluster.py:
network namespaces joined by a bridge; the master and the driver on one
host, a worker of one core on each of two others), so each of the two
tasks runs on a host of its own and every record crosses between hosts
over TCP::

    python bench/bench_spark.py --cluster --records 1000000 10000000

It checks the cluster targets of the same run: ``flinkbuf`` at least 2x
``rdd_shuffle``'s records/s and its first record at least 10x sooner,
``flinkbuf_arrow`` at least 0.95 of ``arrow_barrier_floor`` at 10 M.  The
rows take turns round by round (each round in the other order), so that a
slow spell of the machine falls on every row, and the run prints
``flinkbuf_arrow`` / ``arrow_barrier_floor`` round by round too.

The table's ``CPU core-s`` is the machine's busy CPU during a run (median;
every process, Spark's JVMs and, with ``--cluster``, every simulated host:
they share this machine's cores) and ``idle`` the share of its CPU left
idle.  Where a row leaves next to nothing idle, its time follows its CPU,
and the run prints, for the Arrow rows, the core-seconds
``flinkbuf_arrow`` adds to ``arrow_barrier_floor`` next to what 0.95 of
the floor allows.  It also times a barrier job of tasks that do nothing,
from its submission to the first task running Python: the floor under any
row's first record.  Before Spark starts, ``--cluster`` measures what moving
the bytes that cross between the hosts in the Arrow rows (half the rows,
8 bytes a record) costs over plain TCP with nothing else running: a floor
under what any exchange adds.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

import pytest

from conftest import scale

KEYS = 1000
TASKS = 2
ROUNDS = scale(3, 1)
ROWS = ("rdd_shuffle", "dataframe_arrow", "arrow_barrier_floor", "flinkbuf",
        "flinkbuf_barrier", "flinkbuf_live_view", "flinkbuf_arrow",
        "flinkbuf_arrow_barrier", "flinkbuf_arrow_unsealed")   # peers first
_ROWS_RUN = ROWS
CLUSTER_ROWS = ("rdd_shuffle", "arrow_barrier_floor", "flinkbuf", "flinkbuf_arrow")
# The rows a Spark Connect session runs (no RDDs there).
CONNECT_ROWS = ("dataframe_arrow", "arrow_barrier_floor", "flinkbuf_arrow",
                "flinkbuf_arrow_barrier")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sizes():
    text = os.environ.get("FLINKBUF_BENCH_SPARK_N")
    if text:
        return [int(x) for x in text.split(",") if x.strip()]
    return [scale(1_000_000, 20_000)] + ([10_000_000] if scale(True, False) else [])


# ---- in the Python workers ---------------------------------------------------------------

def _start_key(outdir):
    # In the environment: one value per worker process, whatever module copy
    # (functions of this file travel by value) marks or reports.
    return "FLINKBUF_BENCH_START_RSS_" + os.path.basename(outdir).replace("-", "_")


def _status_mb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _mark(outdir):
    """A task starts: reset this worker's peak RSS (VmHWM) to its RSS now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    os.environ[_start_key(outdir)] = str(_status_mb("VmRSS"))


def _report(outdir, tag, cpu_seconds=None):
    """A task ends: write this worker's peak RSS (MB) during the task, and
    how much it grew over the RSS at the task's start, under ``outdir``
    (and the CPU seconds the consumer's process used, if given)."""
    peak = _status_mb("VmHWM")
    start = os.environ.get(_start_key(outdir), "None")
    growth = None if peak is None or start == "None" else peak - float(start)
    with open(os.path.join(outdir, f"{tag}-{os.getpid()}-{time.monotonic_ns()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "peak_rss_mb": peak, "growth_mb": growth,
                   "cpu_seconds": cpu_seconds}, f)


def _source(n, outdir):
    def source(index, _):
        _mark(outdir)
        for i in range(index, n, TASKS):
            yield (i % KEYS, i)
        _report(outdir, "producer")
    return source


def _counting(outdir, tag):
    def count(records):
        _mark(outdir)
        cpu = time.process_time()          # the process: producer, consumer, any other thread
        first = None
        counts = collections.Counter()
        it = iter(records)
        for k, _ in it:
            first = time.time()
            counts[k] += 1
            break
        counts.update(k for k, _ in it)
        _report(outdir, tag, time.process_time() - cpu)
        yield (first, sum(counts.values()), len(counts))
    return count


def _arrow_counting(outdir, tag):
    def count(batches):
        import numpy as np
        import pyarrow as pa

        first = None
        counts = np.zeros(KEYS, dtype=np.int64)
        for batch in batches:
            if first is None and batch.num_rows:
                first = time.time()
            keys = batch.column(0).to_numpy(zero_copy_only=False)
            counts += np.bincount(keys, minlength=KEYS)[:KEYS]
        _report(outdir, tag)
        yield pa.RecordBatch.from_pydict({
            "first": [first or 0.0], "records": [int(counts.sum())],
            "keys": [int((counts > 0).sum())]})
    return count


def _arrow_marked(outdir, inner):
    def fn(batches):
        _mark(outdir)
        yield from inner(batches)
    return fn


# ---- on the driver -------------------------------------------------------------------------

def _session(rows=ROWS, master="local[2]", connect=False):
    """local[2] (or the cluster at ``master``), warmed up: every row once on
    a few records (Python workers started, the JVM's code compiled).
    ``connect``: a Spark Connect session on a local[2] driver of this
    process (its ``stop()`` stops both)."""
    from flinkbuf.experiments.spark_launcher import (
        connect_session,
        spark_session,
        wait_for_executors,
    )

    if connect:
        classic, spark = connect_session(master)
        stop = spark.stop

        def stop_both():
            stop()
            classic.stop()

        spark.stop = stop_both
    elif master.startswith("local"):
        spark = spark_session(master)
    else:
        spark = _cluster_session(master)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
    if not master.startswith("local") and not connect:
        wait_for_executors(spark.sparkContext, TASKS, timeout=120)
    for row in rows:
        measure(spark, row, 20_000)
    return spark


def _cluster_session(master):
    """A session on the cluster at ``master`` (run in the driver's host,
    ``SPARK_LOCAL_IP`` its address): executors that import this checkout's
    flinkbuf, barrier settings that fail fast."""
    from flinkbuf.experiments.spark_launcher import spark_session

    return spark_session(master, app="flinkbuf-bench-cluster",
                         host=os.environ["SPARK_LOCAL_IP"], log_level="ERROR",
                         conf={"spark.executor.memory": "1g",
                               "spark.executorEnv.PYTHONPATH": ROOT})


def _job(spark, row, n, outdir):
    from flinkbuf.spark import pipelined_exchange

    rendezvous = "barrier" if row.endswith("_barrier") else None
    if row in ("flinkbuf", "flinkbuf_barrier", "flinkbuf_live_view", "rdd_shuffle"):
        sc = spark.sparkContext
        source = sc.parallelize(range(TASKS), TASKS).mapPartitionsWithIndex(_source(n, outdir))
        if row != "rdd_shuffle":
            view = False
            if row == "flinkbuf_live_view":
                from flinkbuf.spark import live_view

                view = live_view(spark)
            rdd = pipelined_exchange(source, _counting(outdir, "consumer"),
                                     rendezvous=rendezvous or "driver", live_view=view)
        else:
            rdd = source.partitionBy(TASKS).mapPartitions(_counting(outdir, "consumer"))
        return lambda: [(f, c, k) for f, c, k in rdd.collect()]
    schema = "first double, records long, keys long"
    # SQL text: pyspark.sql.functions makes one kind of session's columns
    df = spark.range(0, n, numPartitions=TASKS).selectExpr(f"id % {KEYS} AS k", "id AS v")
    if row == "dataframe_arrow":
        out = df.repartition(TASKS, "k").mapInArrow(
            _arrow_marked(outdir, _arrow_counting(outdir, "consumer")), schema)
    elif row == "arrow_barrier_floor":
        out = df.mapInArrow(_arrow_marked(outdir, _arrow_counting(outdir, "consumer")), schema,
                            barrier=True)
    else:
        from flinkbuf.spark import arrow_exchange
        out = arrow_exchange(df, _arrow_marked(outdir, _arrow_counting(outdir, "consumer")),
                             "k", schema, rendezvous=rendezvous, live_view=False,
                             encryption=False if row.endswith("_unsealed") else None)
    return lambda: [(r["first"] or None, r["records"], r["keys"]) for r in out.collect()]


def machine_cpu():
    """This machine's CPU seconds so far over all its cores: (busy, idle),
    from /proc/stat ((None, None) where there is none).  Every process
    counts, Spark's JVMs included, and every simulated host of
    ``--cluster``: they share this machine's cores."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None, None
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]                     # idle, iowait
    return (sum(fields) - idle) / hz, idle / hz


def measure(spark, row, n):
    """One run of ``row`` over ``n`` records: wall seconds, seconds to the
    consumer's first record, the Python workers' peak RSS (MB), and the
    machine's busy and idle CPU seconds during the job."""
    with tempfile.TemporaryDirectory(prefix="flinkbuf-bench-") as outdir:
        run = _job(spark, row, n, outdir)
        busy0, idle0 = machine_cpu()
        t0 = time.time()
        result = run()
        took = time.time() - t0
        busy1, idle1 = machine_cpu()
        from flinkbuf.spark import close_rendezvous

        close_rendezvous()          # the driver's rendezvous of this job, at once
        peaks, growths, cpu = [], [], []
        for path in glob.glob(os.path.join(outdir, "*.json")):
            with open(path) as f:
                doc = json.load(f)
            peaks.append(doc["peak_rss_mb"])
            growths.append(doc["growth_mb"])
            cpu.append(doc.get("cpu_seconds"))
    records = sum(c for _, c, _ in result)
    if records != n:
        raise AssertionError(f"{row}: {records} records counted, expected {n}")
    keys = {k for _, _, k in result}
    firsts = [f for f, _, _ in result if f]
    cpu = [c for c in cpu if c is not None]
    return {"seconds": took, "first_record_s": (min(firsts) - t0) if firsts else None,
            "task_cpu_seconds": sum(cpu) if cpu else None,
            "machine_busy_s": None if busy0 is None else busy1 - busy0,
            "machine_idle_s": None if idle0 is None else idle1 - idle0,
            "worker_peak_rss_mb": [round(p, 1) for p in peaks if p is not None],
            "worker_rss_growth_mb": [round(g, 1) for g in growths if g is not None],
            "keys_per_consumer": sorted(keys)}


@pytest.fixture(scope="module")
def spark():
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers lack bench/
    session = _session(_ROWS_RUN)
    yield session
    session.stop()


_measured = {}


def _median_of(runs, field):
    values = [r[field] for r in runs if r.get(field) is not None]
    return round(statistics.median(values), 3) if values else None


@pytest.mark.parametrize("n", _sizes())
@pytest.mark.parametrize("row", ROWS)
def test_spark_keyed_count(benchmark, spark, row, n):
    group = f"spark keyed count N={n:,} local[2]"
    benchmark.group = group
    runs = []
    benchmark.pedantic(lambda: runs.append(measure(spark, row, n)), rounds=ROUNDS,
                       iterations=1, warmup_rounds=0)
    secs = statistics.median(r["seconds"] for r in runs)
    first = [r["first_record_s"] for r in runs if r["first_record_s"] is not None]
    info = {
        "subject": row.startswith("flinkbuf"), "ops": n, "records": n,
        "ns_per_op": secs * 1e9 / n,
        "records_per_s": round(n / secs),
        "first_record_s": round(statistics.median(first), 3) if first else None,
        "worker_peak_rss_mb": max(max(r["worker_peak_rss_mb"], default=0) for r in runs),
        "worker_rss_growth_mb": max(max(r["worker_rss_growth_mb"], default=0) for r in runs),
        "machine_busy_s": _median_of(runs, "machine_busy_s"),
        "machine_idle_s": _median_of(runs, "machine_idle_s"),
    }
    _measured[(n, row)] = info
    base = _measured.get((n, "rdd_shuffle"))
    if row == "rdd_shuffle":
        info["target"] = f"first record {info['first_record_s']} s, " \
                         f"peak RSS {info['worker_peak_rss_mb']} MB"
    elif row == "flinkbuf_live_view" and (n, "flinkbuf") in _measured:
        off = _measured[(n, "flinkbuf")]["records_per_s"]
        info["target"] = (f"records/s with the live view vs flinkbuf's, want >= -1 %: "
                          f"{info['records_per_s'] / off - 1:+.1%} (see --live-view-overhead)")
    elif row.startswith("flinkbuf_arrow"):
        # The Arrow path runs in Spark's barrier mapInArrow stage: its floor.
        floor = _measured.get((n, "arrow_barrier_floor"))
        if floor is not None:
            ratio = info["records_per_s"] / floor["records_per_s"]
            info["target"] = (f">=0.95x arrow_barrier_floor (at 10 M): {ratio:.2f}x; peak RSS "
                              f"{info['worker_peak_rss_mb']} MB")
    elif base is not None and row.startswith("flinkbuf"):
        ratio = info["records_per_s"] / base["records_per_s"]
        sooner = (base["first_record_s"] / info["first_record_s"]
                  if info["first_record_s"] else float("nan"))
        info["target"] = (f">=2x rdd_shuffle: {ratio:.2f}x; first record "
                          f"{info['first_record_s']} s ({sooner:.1f}x sooner, want >=10x); "
                          f"peak RSS {info['worker_peak_rss_mb']} MB")
    benchmark.extra_info.update(info)


_RECEIVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
buf = memoryview(bytearray(1 << 16))
while True:
    conn, _ = server.accept()
    while conn.recv_into(buf):
        pass
    conn.close()
"""
_SENDER = """
import socket, sys, time
total, chunk = int(sys.argv[3]), bytes(32768)
deadline = time.monotonic() + 10
while True:
    try:
        conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
sent = 0
while sent < total:
    conn.sendall(chunk)
    sent += len(chunk)
conn.close()
"""


def _tcp_between_hosts(cluster, address, n, rounds=5, port=9555):
    """Print what moving the bytes that cross between the two hosts in the
    Arrow rows at ``n`` records (half the rows, two int64 columns: 8 bytes
    a record) costs the machine over plain TCP, with nothing else running:
    a floor under any exchange's added CPU.  Busy core-seconds of a sender
    process that sends them, less those of one that sends nothing (its
    start), medians of ``rounds``."""
    nbytes = n * 8
    receiver = cluster.spawn("h2", [sys.executable, "-c", _RECEIVER, address, str(port)],
                             f"tcp-receiver-{n}")
    try:
        costs = {0: [], nbytes: []}
        for _ in range(rounds):
            for size in costs:
                busy0, _ = machine_cpu()
                cluster.exec("h1", sys.executable, "-c", _SENDER, address, str(port),
                             str(size), timeout=120)
                busy1, _ = machine_cpu()
                if busy0 is not None:
                    costs[size].append(busy1 - busy0)
    finally:
        receiver.kill()
        receiver.wait()
    if costs[0]:
        cost = statistics.median(costs[nbytes]) - statistics.median(costs[0])
        print(f"reference at {n:,} records, no Spark: moving {nbytes / 1e6:.0f} MB from one "
              f"host to the other over plain TCP (32 KiB writes) takes {cost:.2f} core-s "
              f"({cost * 1e9 / n:.0f} ns a record)", flush=True)


def _run_cluster(args):
    """Build the cluster, run this script as its driver in the driver's
    host (``--master``), print what it prints, tear the cluster down."""
    import subprocess

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import netns_cluster

    why = netns_cluster.unavailable()
    if why is not None:
        raise SystemExit(f"bench_spark.py --cluster: {why}")
    logs = tempfile.mkdtemp(prefix="flinkbuf-bench-cluster-")
    cluster = netns_cluster.Cluster(logs)
    try:
        cluster.up()
        for n in args.records:
            _tcp_between_hosts(cluster, netns_cluster.ADDRESSES["h2"], n)
        cluster.start_spark(cores=1, registered=True)        # one task per host
        env = {"SPARK_LOCAL_IP": netns_cluster.ADDRESSES["h0"], "PYSPARK_PYTHON": sys.executable,
               "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "bench")]),
               "SPARK_HOME": netns_cluster.spark_home()}
        argv = [sys.executable, os.path.abspath(__file__), "--master", cluster.master_url,
                "--records", *map(str, args.records), "--rows", args.rows,
                "--rounds", str(args.rounds)]
        proc = cluster.spawn("h0", argv, "bench-driver", env, stdout=None)
        try:
            code = proc.wait(args.cluster_timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"bench_spark.py --cluster: the driver did not end within "
                             f"{args.cluster_timeout} s (its log: {proc.log})") from None
        if code != 0:
            raise SystemExit(f"bench_spark.py --cluster: the driver failed ({code}); its "
                             f"log: {proc.log}")
    finally:
        cluster.close()


def _cluster_targets(table):
    """The cluster targets of one run: (N, what, measured, wanted, met)."""
    out = []
    for n, rows in sorted(table.items()):
        base, ours = rows.get("rdd_shuffle"), rows.get("flinkbuf")
        if base and ours:
            ratio = ours["rate"] / base["rate"]
            out.append((n, "flinkbuf records/s vs rdd_shuffle", ratio, 2.0, ratio >= 2.0))
            if ours["first"] == ours["first"] and base["first"] == base["first"]:
                sooner = base["first"] / ours["first"]
                out.append((n, "flinkbuf first record, times sooner", sooner, 10.0,
                            sooner >= 10.0))
        floor, arrow = rows.get("arrow_barrier_floor"), rows.get("flinkbuf_arrow")
        if floor and arrow and n >= 10_000_000:
            ratio = arrow["rate"] / floor["rate"]
            out.append((n, "flinkbuf_arrow vs arrow_barrier_floor", ratio, 0.95,
                        ratio >= 0.95))
    return out


def paired_ratios(table, row, peer):
    """``row``'s records/s over ``peer``'s, round by round (the rounds ran
    in turns), per N: {N: ratios}, where both rows ran."""
    return {n: [a / b for a, b in zip(rows[row]["rates"], rows[peer]["rates"])]
            for n, rows in sorted(table.items())
            if row in rows and peer in rows and rows[row].get("rates")}


def launch_floor(spark, rounds):
    """Seconds from submitting a barrier job of ``TASKS`` tasks that do
    nothing to the first of them running Python (median of ``rounds``):
    what Spark takes before any task's code, the floor under any first
    record."""
    import time as clock        # by name: this runs in the Python workers too

    def started(_):
        yield clock.time()

    sc = spark.sparkContext
    runs = []
    for _ in range(rounds):
        t0 = clock.time()
        stamps = sc.parallelize(range(TASKS), TASKS).barrier().mapPartitions(started).collect()
        runs.append(min(stamps) - t0)
    return statistics.median(runs)


def _cpu_bounds(table):
    """What the machine's CPU says of the Arrow rows: the simulated hosts
    share its cores, so when it is (nearly) never idle, a row's time is
    about its CPU, and flinkbuf_arrow / arrow_barrier_floor is about the
    ratio of their core-seconds."""
    out = []
    for n, rows in sorted(table.items()):
        floor, arrow = rows.get("arrow_barrier_floor"), rows.get("flinkbuf_arrow")
        if n < 10_000_000 or not (floor and arrow and floor["busy"] and arrow["busy"]):
            continue                # the target's size: shorter runs are mostly Spark's
        out.append(f"{n:>11,} CPU a run: arrow_barrier_floor {floor['busy']:.2f} core-s "
                   f"(idle {floor['idle']:.0%}), flinkbuf_arrow {arrow['busy']:.2f} core-s "
                   f"(idle {arrow['idle']:.0%}): {arrow['busy'] - floor['busy']:+.2f} core-s, "
                   f"{(arrow['busy'] - floor['busy']) * 1e9 / n:.0f} ns a record; "
                   f"ratio of core-s {floor['busy'] / arrow['busy']:.2f}, 0.95 allows "
                   f"{floor['busy'] / 0.95 - floor['busy']:+.2f}")
    return out


def live_view_overhead(spark, n, rounds, printer=print):
    """``flinkbuf`` over ``n`` records with the live view off and on,
    alternately (off, on, on, off, ...: neither always goes first),
    ``rounds`` times each; prints and returns the medians, the median of
    the pairs' ratios (on / off records/s) and the reporters' CPU time."""
    from flinkbuf.spark import live_view

    view = live_view(spark)
    rates = {"flinkbuf": [], "flinkbuf_live_view": []}
    per_cpu = {"flinkbuf": [], "flinkbuf_live_view": []}
    cpu = []
    for k in range(rounds):
        order = ("flinkbuf", "flinkbuf_live_view")
        for row in order if k % 2 == 0 else order[::-1]:
            r = measure(spark, row, n)
            rates[row].append(n / r["seconds"])
            per_cpu[row].append(n / r["task_cpu_seconds"])
            if row == "flinkbuf_live_view":
                newest = view.snapshot()["exchanges"][0]
                cpu.append((sum(t["report_cpu_seconds"] for t in newest["tasks"]),
                            sum(t["reports"] for t in newest["tasks"]), r["seconds"]))
        printer(f"  round {k + 1}: off {rates['flinkbuf'][-1]:,.0f}, on "
                f"{rates['flinkbuf_live_view'][-1]:,.0f} records/s; per CPU second of the "
                f"tasks: off {per_cpu['flinkbuf'][-1]:,.0f}, on "
                f"{per_cpu['flinkbuf_live_view'][-1]:,.0f}", flush=True)
    off, on = (statistics.median(rates[row]) for row in ("flinkbuf", "flinkbuf_live_view"))
    pairs = statistics.median(b / a for a, b in zip(rates["flinkbuf"],
                                                    rates["flinkbuf_live_view"]))
    cpu_s, reports, seconds = (statistics.median(c[i] for c in cpu) for i in range(3))
    cpu_off, cpu_on = (statistics.median(per_cpu[row])
                       for row in ("flinkbuf", "flinkbuf_live_view"))
    printer(f"N={n:,}, {rounds} rounds: live view off {off:,.0f} records/s, on {on:,.0f} "
            f"records/s (medians): {on / off - 1:+.2%}; median of the pairs' ratios "
            f"{pairs - 1:+.2%}; the reporters used {cpu_s * 1e3:.1f} ms of CPU for {reports:.0f} "
            f"reports in a {seconds:.2f} s job ({cpu_s / (seconds * TASKS):.3%} of a task's "
            f"time); records per CPU second of the tasks' processes: off {cpu_off:,.0f}, on "
            f"{cpu_on:,.0f} ({cpu_on / cpu_off - 1:+.2%})", flush=True)
    return {"off": off, "on": on, "pairs": pairs, "cpu_seconds": cpu_s, "reports": reports,
            "seconds": seconds, "per_cpu_off": cpu_off, "per_cpu_on": cpu_on}


def main(argv=None):
    ap = argparse.ArgumentParser(description="flinkbuf.spark against Spark's exchanges: "
                                 "records/s, first record, Python worker peak RSS")
    ap.add_argument("--records", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--rows", default=None,
                    help="comma-separated rows (default: all, or with --cluster "
                         f"{','.join(CLUSTER_ROWS)}); the *_barrier rows take the addresses "
                         "through Spark's allGather instead of the driver's rendezvous")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cluster", action="store_true",
                    help="on a standalone cluster of simulated hosts (network namespaces; "
                         "root): two workers of one core, one task on each")
    ap.add_argument("--cluster-timeout", type=float, default=1800,
                    help="seconds the cluster run may take (default 1800)")
    ap.add_argument("--connect", action="store_true",
                    help="on a Spark Connect session (a local[2] Connect server started "
                         f"here): the rows {','.join(CONNECT_ROWS)}, against Spark's shuffle "
                         "(dataframe_arrow)")
    ap.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    ap.add_argument("--live-view-overhead", type=int, default=0, metavar="ROUNDS",
                    help="instead of the table: the flinkbuf row with the live view off and "
                         "on, alternately, ROUNDS times each per N")
    args = ap.parse_args(argv)
    if args.rows is None:
        args.rows = ",".join(CONNECT_ROWS if args.connect else CLUSTER_ROWS
                             if args.cluster or args.master != "local[2]" else ROWS)
    unknown = [r for r in args.rows.split(",") if r not in ROWS]
    if unknown:
        ap.error(f"unknown rows {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    if args.cluster:
        _run_cluster(args)
        return
    if args.live_view_overhead:
        spark = _session(("flinkbuf", "flinkbuf_live_view"))
        try:
            for n in args.records:
                live_view_overhead(spark, n, args.live_view_overhead)
        finally:
            spark.stop()
        return
    clustered = args.master != "local[2]"
    if clustered or args.connect:
        from pyspark import cloudpickle
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = _session(args.rows.split(","), args.master, connect=args.connect)
    base_row = "dataframe_arrow" if args.connect else "rdd_shuffle"
    table = {}
    try:
        where = "two hosts, one task each" if clustered else "local[2]"
        if args.connect:
            where += ", Spark Connect"
        print(f"keyed count, {TASKS} tasks, {where}", flush=True)
        print(f"{'N':>11} {'row':<22} {'records/s':>11} {'first rec s':>11} "
              f"{'worker peak RSS MB':>19} {'growth MB':>9} {'CPU core-s':>10} {'idle':>5} "
              f"{'vs ' + base_row:>14}")
        for n in args.records:
            base = base_first = None
            rows = args.rows.split(",")
            # The rows take turns, round by round (in turn reversed: none
            # always goes first), so that a slow spell of this shared
            # machine falls on all of them.
            by_row = {row: [] for row in rows}
            for k in range(args.rounds):
                for row in rows if k % 2 == 0 else rows[::-1]:
                    by_row[row].append(measure(spark, row, n))
            for row in rows:
                runs = by_row[row]
                secs = statistics.median(r["seconds"] for r in runs)
                rate = n / secs
                first = statistics.median(r["first_record_s"] or float("nan") for r in runs)
                rss = max(max(r["worker_peak_rss_mb"], default=0) for r in runs)
                growth = max(max(r["worker_rss_growth_mb"], default=0) for r in runs)
                busy = _median_of(runs, "machine_busy_s")
                idle = _median_of(runs, "machine_idle_s")
                idle_share = idle / (busy + idle) if busy is not None and busy + idle else None
                table.setdefault(n, {})[row] = {"rate": rate, "first": first, "busy": busy,
                                                "idle": idle_share,
                                                "rates": [n / r["seconds"] for r in runs]}
                if row == base_row:
                    base, base_first = rate, first
                ratio = f"{rate / base:.2f}x" if base else ""
                if row != base_row and base_first and first == first:
                    ratio += f", first {base_first / first:.1f}x sooner"
                floor = table[n].get("arrow_barrier_floor")
                if args.connect and row.startswith("flinkbuf") and floor:
                    ratio += f", {rate / floor['rate']:.2f}x the floor"
                cpu = "" if busy is None else f"{busy:.2f}"
                idle_text = "" if idle_share is None else f"{idle_share:.0%}"
                print(f"{n:>11,} {row:<22} {rate:>11,.0f} {first:>11.3f} {rss:>19.1f} "
                      f"{growth:>9.1f} {cpu:>10} {idle_text:>5} {ratio:>14}", flush=True)
        if clustered:
            print("targets (cluster, same run):")
            for n, what, got, want, met in _cluster_targets(table):
                print(f"{n:>11,} {what:<40} {got:>7.2f}  want >= {want:g}  "
                      f"{'met' if met else 'NOT MET'}", flush=True)
            for row in ("flinkbuf_arrow", "flinkbuf_arrow_unsealed"):
                for n, ratios in paired_ratios(table, row, "arrow_barrier_floor").items():
                    print(f"{n:>11,} {row} / arrow_barrier_floor round by round: "
                          f"{', '.join(f'{r:.2f}' for r in ratios)} (median "
                          f"{statistics.median(ratios):.2f})", flush=True)
            for line in _cpu_bounds(table):
                print(line, flush=True)
            launch = launch_floor(spark, max(args.rounds, 5))
            print(f"Spark runs the first Python task of a barrier job of {TASKS} tasks that do "
                  f"nothing {launch:.3f} s after its submission (median)", flush=True)
            for n, rows in sorted(table.items()):
                base = rows.get("rdd_shuffle")
                if base and base["first"] == base["first"]:
                    print(f"{n:>11,} a first record 10x sooner than rdd_shuffle's needs "
                          f"<= {base['first'] / 10:.3f} s", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
