"""The main demo on Spark: PySpark tasks exchange records through flinkbuf
under Flink's 2015 backpressure schedule, then the same keyed job runs
through flinkbuf and through Spark's own shuffle, side by side.

A PySpark job (local mode by default) of ``tasks`` barrier tasks runs
:func:`flinkbuf.spark.pipelined_exchange`: each task's producer thread
generates ``(key, i)`` records, hashed by key to the consumers, and each
task's consumer counts records per key.  Every task holds
``tasks * 2 + 1`` output buffers of ``segment_size`` bytes.  The driver
steers the tasks over a small control connection: the producers run at 60
% of full speed, the consumers are slowed to 30 %, released, slowed and
released (the blog post "How Apache Flink handles backpressure"); every
interval it prints both throughputs (the sum over the tasks, in % of full
speed) and the producers' backpressure level.  Full speed is measured
first, as in the in-process experiment: a fraction of the unthrottled
rate.

Then the keyed job itself (``records`` records, counted per key in the
consumer) runs unthrottled twice: through flinkbuf's pipelined exchange
and through Spark's shuffle (``partitionBy(tasks).mapPartitions``), and
both are printed side by side (records/s, time from the job's start to the
consumer's first record) with a check that they counted the same.

Outputs in ``out_dir``: ``spark-backpressure.csv`` (a row per interval, the
columns of the in-process experiment), ``spark-backpressure.json``
(configuration, rows, per-task metrics, the comparison, the checks) and,
with matplotlib, ``spark-backpressure.png``.
"""

import collections
import json
import os
import secrets
import socket
import sys
import threading
import time

from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments._args import check_int, check_real, check_seconds, fail
from flinkbuf.experiments._output import (
    VERDICT,
    load_plotting,
    prepare_out_dir,
    write_table_and_doc,
)
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.io.metrics import backpressure_level

NAME = "spark-backpressure"
OUTPUT_FILES = (f"{NAME}.csv", f"{NAME}.json", f"{NAME}.png")
DEFAULT_SCHEDULE = _bp.DEFAULT_SCHEDULE
_BATCH = 128
_KEYS = 10_000
_CONTROL_TIMEOUT = 120.0        # seconds for the tasks to start and call in


# ---- in the tasks ----------------------------------------------------------------------

class _TaskControl:
    """One task's end of the control connection (in its Python worker): the
    throttles of its producer and consumer, and a thread that answers the
    driver."""

    def __init__(self, task, address, token):
        self.task = task
        self.producer = Throttle()
        self.consumer = Throttle()
        self.stop = threading.Event()
        self.max_out_pool = 0.0
        self.sock = socket.create_connection(address, timeout=_CONTROL_TIMEOUT)
        self.sock.settimeout(None)
        self.file = self.sock.makefile("rw", encoding="utf-8", newline="\n")
        self._send({"hello": token, "task": task.index})
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"demo-control-{task.index}")
        self.thread.start()

    def _send(self, msg):
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()

    def _serve(self):
        try:
            for line in self.file:
                msg = json.loads(line)
                cmd = msg["cmd"]
                if cmd == "limits":
                    for throttle, pct in ((self.producer, msg["producer"]),
                                          (self.consumer, msg["consumer"])):
                        if pct is None:
                            throttle.unthrottle()
                        else:
                            throttle.set_limit(pct, msg["rate"])
                    self._send({"ok": True})
                elif cmd == "sample":
                    snap = self.task.metrics.snapshot()
                    self.max_out_pool = max(self.max_out_pool, snap["outPoolUsage"])
                    self._send({"out": self.task.writer.num_records_out,
                                "in": self.task.gate.num_records_in,
                                "bp": snap["backPressuredTimeMsPerSecond"],
                                "out_pool": snap["outPoolUsage"],
                                "in_pool": snap["inPoolUsage"]})
                elif cmd == "stop":
                    self.stop.set()
                    self.producer.unthrottle()
                    self.consumer.unthrottle()
                    self._send({"ok": True})
        except (OSError, ValueError):
            pass
        finally:
            self.stop.set()
            self.producer.unthrottle()
            self.consumer.unthrottle()

    def close(self):
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(5)
        self.file.close()
        self.sock.close()


_CONTROL: "dict[str, _TaskControl]" = {}   # in a Python worker: the running task's control


class _Monitor:
    """The exchange's monitor: calls the driver from each task.  A class at
    module level, so that it travels by reference and shares this module's
    state in the worker with the source and the consumer."""

    def __init__(self, address, token):
        self.address = tuple(address)
        self.token = token

    def __call__(self, task):
        control = _TaskControl(task, self.address, self.token)
        _CONTROL["current"] = control

        def done():
            _CONTROL.pop("current", None)
            control.close()
        return done


def _paced_source(index, _):
    """A producer's records until the driver says stop, paced by its throttle."""
    control = _CONTROL["current"]
    pace, stop = control.producer.pace, control.stop
    i = index
    step = control.task.num_tasks
    while not stop.is_set():
        for _ in range(_BATCH):
            yield (i % _KEYS, i)
            i += step
        pace(_BATCH)


def _paced_count(records):
    """A consumer: counts per key, paced by its throttle; yields its totals."""
    control = _CONTROL["current"]
    pace = control.consumer.pace
    counts = collections.Counter()
    n = 0
    for key, _ in records:
        counts[key] += 1
        n += 1
        if n == _BATCH:
            pace(n)
            n = 0
    stats = control.task.stats()
    stats["max_out_pool_usage"] = control.max_out_pool
    yield {"stats": stats, "keys": len(counts), "records": sum(counts.values())}


def _keyed_source(count, num_tasks):
    def source(index, _):
        for i in range(index, count, num_tasks):
            yield (i % _KEYS, i)
    return source


def _count_per_key(records):
    """The keyed job's consumer: (first record's time, counts per key)."""
    first = None
    counts = collections.Counter()
    for key, _ in records:
        if first is None:
            first = time.time()
        counts[key] += 1
    yield (first, dict(counts))


# ---- on the driver --------------------------------------------------------------------

class _Control:
    """The driver's end: accepts one connection per task and asks them."""

    def __init__(self, host, num_tasks):
        self.token = secrets.token_hex(16)
        self.server = socket.create_server((host, 0))
        self.server.settimeout(1.0)
        self.address = self.server.getsockname()[:2]
        self.num_tasks = num_tasks
        self.tasks = {}

    def accept(self, job, timeout=_CONTROL_TIMEOUT):
        deadline = time.monotonic() + timeout
        while len(self.tasks) < self.num_tasks:
            if job.error is not None:
                raise RuntimeError("the Spark job failed before its tasks started") \
                    from job.error
            if time.monotonic() > deadline:
                raise RuntimeError(f"the tasks did not start within {timeout:g} s")
            try:
                sock, _ = self.server.accept()
            except socket.timeout:
                continue
            sock.settimeout(_CONTROL_TIMEOUT)
            f = sock.makefile("rw", encoding="utf-8", newline="\n")
            hello = json.loads(f.readline())
            if hello.get("hello") != self.token:
                f.close()
                sock.close()
                continue
            self.tasks[hello["task"]] = (sock, f)

    def ask(self, msg):
        out = []
        for index in sorted(self.tasks):
            _, f = self.tasks[index]
            f.write(json.dumps(msg) + "\n")
            f.flush()
        for index in sorted(self.tasks):
            line = self.tasks[index][1].readline()
            if not line:
                raise RuntimeError(f"task {index} of the demo went away")
            out.append(json.loads(line))
        return out

    def close(self):
        for sock, f in self.tasks.values():
            try:
                f.close()
                sock.close()
            except OSError:
                pass
        self.server.close()


class _Job(threading.Thread):
    """A Spark action in a thread of its own (the driver steers meanwhile)."""

    def __init__(self, action):
        super().__init__(daemon=True, name="spark-demo-job")
        self._action = action
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self._action()
        except BaseException as exc:    # noqa: BLE001 - raised by the demo
            self.error = exc


def spark_session(master="local[2]"):
    """A SparkSession for the demo: loopback addresses, no UI, executors
    running this interpreter, barrier settings that fail fast."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    host = os.environ["SPARK_LOCAL_IP"]
    spark = (SparkSession.builder.master(master).appName("flinkbuf-spark-demo")
             .config("spark.driver.host", host)
             .config("spark.driver.bindAddress", host)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
             .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
             .config("spark.barrier.sync.timeout", "120s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def check_arguments(phase_seconds, interval=0.5, tasks=2, records=1_000_000, segment_size=4096,
                    full_speed_fraction=0.25, *, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_spark_demo` is in range."""
    check_real("interval", interval, ge=_bp.MIN_INTERVAL, le=10.0, names=names)
    check_seconds("phase_seconds", phase_seconds, names=names)
    if not phase_seconds >= interval:
        n = (names or {}).get
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= "
             f"{n('interval', 'interval')} ({interval:g})")
    check_int("tasks", tasks, ge=1, le=64, names=names)
    check_int("records", records, ge=0, le=10**9, names=names)
    check_int("segment_size", segment_size, ge=64, le=1 << 20, names=names)
    check_real("full_speed_fraction", full_speed_fraction, ge=_bp.MIN_FULL_SPEED_FRACTION,
               le=1.0, names=names)


def run_spark_demo(out_dir, phase_seconds=4.0, *, interval=0.5, tasks=2, records=1_000_000,
                   segment_size=4096, full_speed_fraction=0.25, schedule=DEFAULT_SCHEDULE,
                   spark=None, master="local[2]", plot=True, printer=print):
    """Run the demo and return its JSON document (``doc["checks"]["passed"]``
    says whether the expectations held).  ``spark``: a running SparkSession
    (its master needs ``tasks`` slots); else one is started on ``master``.
    Arguments are checked and ``out_dir`` made before anything runs."""
    check_arguments(phase_seconds, interval, tasks, records, segment_size, full_speed_fraction)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    from flinkbuf.spark import pipelined_exchange

    started = time.monotonic()
    own = spark is None
    if own:
        printer(f"starting Spark ({master}) ...")
        spark = spark_session(master)
    try:
        sc = spark.sparkContext
        printer(f"Spark {spark.version}, {sc.master}: {tasks} tasks exchange records through "
                f"flinkbuf ({tasks * 2 + 1} output buffers of {segment_size} bytes per task)")
        host = sc.getConf().get("spark.driver.host", "127.0.0.1")
        control = _Control(host, tasks)
        try:
            rdd = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(_paced_source)
            exchanged = pipelined_exchange(
                rdd, _paced_count, segment_size=segment_size, buffers_per_channel=2,
                floating_buffers=0, monitor=_Monitor(control.address, control.token))
            job = _Job(exchanged.collect)
            job.start()
            control.accept(job)
            rows, unthrottled, full_rate = _steer(control, job, phase_seconds, interval,
                                                  schedule, full_speed_fraction, printer)
            control.ask({"cmd": "stop"})
            job.join(_CONTROL_TIMEOUT)
            if job.is_alive():
                raise RuntimeError("the demo's Spark job did not end")
            if job.error is not None:
                raise RuntimeError("the demo's Spark job failed") from job.error
        finally:
            control.close()
        per_task = sorted((r["stats"] for r in job.result), key=lambda s: s["task"])
        _print_tasks(per_task, printer)
        comparison = compare_with_spark_shuffle(sc, records, tasks, segment_size, printer)
    finally:
        if own:
            spark.stop()
    ticks = max(1, round(phase_seconds / interval))
    checks = _bp.check_backpressure(rows, interval, ticks)
    checks["same_counts"] = comparison["same_counts"]
    checks["passed"] = all(checks[k] is not False for k in (
        "tracks_consumer", "returns_to_full_speed", "same_counts"))
    doc = {
        "experiment": NAME,
        "config": {
            "master": sc.master if not own else master,
            "tasks": tasks,
            "phase_seconds": ticks * interval,
            "interval_seconds": interval,
            "schedule": [list(s) for s in schedule],
            "segment_size": segment_size,
            "buffers_per_task": tasks * 2 + 1,
            "full_speed_fraction": full_speed_fraction,
            "record": "(int, int), hashed by the first field, typed codec",
        },
        "unthrottled_records_per_s": round(unthrottled),
        "full_speed_records_per_s": round(full_rate),
        "rows": rows,
        "tasks": per_task,
        "comparison": comparison,
        "checks": checks,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_table_and_doc(out_dir, NAME, _bp.CSV_COLUMNS, rows, doc)
    drawn = False
    plotting = load_plotting(printer) if plot else None
    if plotting is not None:
        plotting.plot_backpressure(rows, doc, os.path.join(out_dir, f"{NAME}.png"))
        drawn = True
    _bp._print_summary(doc, printer, tasks=tasks)
    printer(f"wrote {os.path.join(out_dir, NAME + '.csv')}, {NAME}.json"
            + (f" and {NAME}.png" if drawn else ""))
    return doc


def _sample(control, prev):
    now = (time.perf_counter(), control.ask({"cmd": "sample"}))
    if prev is None:
        return now, None
    dt = now[0] - prev[0]
    produced = sum(s["out"] for s in now[1]) - sum(s["out"] for s in prev[1])
    consumed = sum(s["in"] for s in now[1]) - sum(s["in"] for s in prev[1])
    return now, (produced / dt, consumed / dt)


def _steer(control, job, phase_seconds, interval, schedule, fraction, printer):
    """Calibrate, then run the schedule: a row (and a line) per interval."""
    n = control.num_tasks
    control.ask({"cmd": "limits", "producer": None, "consumer": None, "rate": None})
    start = time.perf_counter()
    time.sleep(interval)                  # warm-up
    prev, _ = _sample(control, None)
    samples = []
    for k in range(1, 5):
        _wait(job, start + (k + 1) * interval)
        prev, rates = _sample(control, prev)
        samples.append(rates[1])
    unthrottled = sorted(samples)[len(samples) // 4]
    if not unthrottled > 0:
        raise RuntimeError("no records flowed between the tasks")
    full_rate = fraction * unthrottled
    printer(f"unthrottled: {unthrottled:,.0f} records/s over {n} tasks; full speed (100 %): "
            f"{full_rate:,.0f} records/s = {fraction:g} x unthrottled")
    printer(f"{'t [s]':>6} {'limits P/C [%]':>15} {'producers':>10} {'consumers':>10} "
            f"{'backpressure':>12} {'bp ms/s':>8} {'outPool':>7}")
    ticks = max(1, round(phase_seconds / interval))
    rows = []

    def limits(p, c):
        control.ask({"cmd": "limits", "producer": p, "consumer": None if c >= 100 else c,
                     "rate": full_rate / n})

    limits(*schedule[0])
    control.ask({"cmd": "sample"})         # the metrics' window starts here
    start = time.perf_counter()
    prev, _ = _sample(control, None)
    for tick in range(1, ticks * len(schedule) + 1):
        phase = (tick - 1) // ticks
        _wait(job, start + tick * interval)
        prev, (produced, consumed) = _sample(control, prev)
        bp = max(s["bp"] for s in prev[1])
        row = {
            "t_seconds": round(tick * interval, 3),
            "producer_limit_pct": schedule[phase][0],
            "consumer_limit_pct": schedule[phase][1],
            "producer_pct": round(produced / full_rate * 100, 2),
            "consumer_pct": round(consumed / full_rate * 100, 2),
            "backpressure_level": backpressure_level(min(1.0, bp / 1000)),
            "producer_records_per_s": round(produced),
            "consumer_records_per_s": round(consumed),
            "producer_back_pressured_ms_per_s": round(bp, 1),
            "out_pool_usage": round(max(s["out_pool"] for s in prev[1]), 3),
            "in_pool_usage": round(max(s["in_pool"] for s in prev[1]), 3),
        }
        rows.append(row)
        printer(f"{row['t_seconds']:6.1f} {row['producer_limit_pct']:>7g}/"
                f"{row['consumer_limit_pct']:<7g} {row['producer_pct']:9.1f}% "
                f"{row['consumer_pct']:9.1f}% {row['backpressure_level']:>12} "
                f"{bp:8.0f} {row['out_pool_usage']:7.2f}")
        if tick % ticks == 0 and tick < ticks * len(schedule):
            limits(*schedule[phase + 1])
    return rows, unthrottled, full_rate


def _wait(job, deadline):
    while True:
        if job.error is not None:
            raise RuntimeError("the demo's Spark job failed") from job.error
        now = time.perf_counter()
        if now >= deadline:
            return
        time.sleep(min(0.01, deadline - now))


def _print_tasks(per_task, printer):
    printer("per task:")
    printer(f"{'task':>4} {'records out':>12} {'MB out':>8} {'records in':>11} {'MB in':>7} "
            f"{'backpressured s':>15} {'idle s':>7} {'max outPool':>11}")
    for s in per_task:
        printer(f"{s['task']:>4} {s['records_out']:>12,} {s['bytes_out'] / 1e6:8.1f} "
                f"{s['records_in']:>11,} {s['bytes_in'] / 1e6:7.1f} "
                f"{s['back_pressured_seconds']:15.2f} {s['idle_seconds']:7.2f} "
                f"{s['max_out_pool_usage']:11.2f}")


def compare_with_spark_shuffle(sc, records, tasks, segment_size=32768, printer=print):
    """The keyed job (``records`` ``(key, i)`` records in ``tasks``
    partitions, counted per key in the consumer) through flinkbuf's
    pipelined exchange and through Spark's shuffle; prints both side by
    side and returns them."""
    from flinkbuf.io import assign_key_to_operator
    from flinkbuf.spark import pipelined_exchange

    source = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
        _keyed_source(records, tasks))
    runs = {}
    for name, make in (
            ("flinkbuf", lambda: pipelined_exchange(source, _count_per_key,
                                                    segment_size=max(segment_size, 32768))),
            ("Spark shuffle", lambda: source.partitionBy(
                tasks, lambda k: assign_key_to_operator(k, tasks)).mapPartitions(
                    _count_per_key))):
        t0 = time.time()
        out = make().collect()
        took = time.time() - t0
        firsts = [f for f, _ in out if f is not None]
        counts = collections.Counter()
        for _, c in out:
            counts.update(c)
        runs[name] = {
            "seconds": round(took, 3),
            "records_per_s": round(records / took) if took > 0 else None,
            "first_record_seconds": round(min(firsts) - t0, 3) if firsts else None,
            "records": sum(counts.values()),
            "counts": counts,
        }
    same = runs["flinkbuf"]["counts"] == runs["Spark shuffle"]["counts"] and \
        runs["flinkbuf"]["records"] == records
    printer(f"the keyed job: {records:,} (int, int) records in {tasks} partitions, counted "
            f"per key in the consumer")
    printer(f"{'':>22} {'flinkbuf':>14} {'Spark shuffle':>14}")
    f, s = runs["flinkbuf"], runs["Spark shuffle"]
    printer(f"{'records/s':>22} {f['records_per_s'] or 0:>14,} {s['records_per_s'] or 0:>14,}")
    printer(f"{'seconds':>22} {f['seconds']:>14.2f} {s['seconds']:>14.2f}")

    def first(r):
        return "-" if r["first_record_seconds"] is None else f"{r['first_record_seconds']:.3f}"
    printer(f"{'first record after s':>22} {first(f):>14} {first(s):>14}")
    printer(f"same counts per key: {VERDICT[same]}")
    for r in runs.values():
        del r["counts"]
    return {"records": records, "tasks": tasks, "runs": runs, "same_counts": same}
