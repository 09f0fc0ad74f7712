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

Each interval's backpressure level comes from the producers' back-pressured
time over exactly that interval (the difference of each writer's
cumulative counter between two samples; the highest over the tasks), so
the levels change with the phases.

While it runs, the driver serves a live view of the exchanges
(:func:`flinkbuf.spark.live_view`, on ``live_view``, ``"HOST:PORT"``:
loopback and any free port by default) and prints its URL: each task's
backpressure level, the bottleneck named, charts over time.

Each interval also has the sojourn of the records (read time minus emit
time, p50 and p99), sampled through a side channel that leaves the records
as they are (see :mod:`~flinkbuf.experiments.spark_control`): the first
record of each producer batch.

With ``connect`` the demo runs through a local Spark Connect server (on
loopback, with a token) as a Spark Connect client would: Spark Connect has
no RDDs, so the tasks exchange Arrow batches of the same records through
:func:`flinkbuf.spark.arrow_exchange`, each task's producer making them in
its producer thread (the exchange's ``map_input``), and the keyed job runs
over a DataFrame through ``arrow_exchange`` and through Spark's shuffle
(``repartition(tasks, "key").mapInArrow``).

Outputs in ``out_dir``: ``spark-backpressure.csv`` (a row per interval, the
columns of the in-process experiment and the sojourn's), ``spark-backpressure.json``
(configuration, rows, per-task metrics, the comparison, the checks), with
matplotlib ``spark-backpressure.png``, and, when the demo starts Spark
itself, ``spark-backpressure.log``: what Spark's JVM and its Python workers
print (Spark's log), kept off the terminal.

The parts: this module runs the experiment (its checks, the schedule, the
document); :mod:`~flinkbuf.experiments.spark_control` is how the driver
steers the tasks, :mod:`~flinkbuf.experiments.shuffle_comparison` the keyed
job beside Spark's shuffle, :mod:`~flinkbuf.experiments.spark_launcher`
starts Spark.
"""

import os
import statistics
import time

from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments import spark_control
from flinkbuf.experiments.arguments import check_int, check_real, check_seconds, fail
from flinkbuf.experiments.debloat import percentile
from flinkbuf.experiments.failures import RunFailed
from flinkbuf.experiments.output import load_plotting, prepare_out_dir, write_table_and_doc
from flinkbuf.experiments.shuffle_comparison import compare_with_spark_shuffle
from flinkbuf.experiments.spark_launcher import (
    check_environment,
    check_slots,
    connect_session,
    executors_of,
    is_connect,
    spark_session,
    stop,
    wait_for_executors,
)

NAME = "spark-backpressure"
LOG_FILE = f"{NAME}.log"
OUTPUT_FILES = (f"{NAME}.csv", f"{NAME}.json", f"{NAME}.png", LOG_FILE)
DEFAULT_SCHEDULE = _bp.DEFAULT_SCHEDULE
CSV_COLUMNS = _bp.CSV_COLUMNS + ("sojourn_p50_ms", "sojourn_p99_ms", "sojourn_records")
SOJOURN_NOTE = ("per interval: read time minus emit time (wall clock) of the first record of "
                "each producer batch (1 in 128, the records unchanged: a side channel joins "
                "the producers' emit marks and the consumers' read marks by sequence number) "
                "whose marks the interval's sample completed; exact on one host, across "
                "hosts it includes the offset between their clocks")
CONNECT_RECORD = ("key and i (longs), hashed by key, in Arrow batches of 128 rows through "
                  "arrow_exchange on Spark Connect")
MAX_TASKS = 64
MAX_RECORDS = 10**9


# ---- checks ---------------------------------------------------------------------------

def check_arguments(phase_seconds, interval=0.5, tasks=2, records=1_000_000, segment_size=4096,
                    full_speed_fraction=0.25, master=None, *, live_view=None, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_spark_demo` is in range, ``master`` (if
    given) a Spark master URL with a slot for each task where it says, and
    ``live_view`` (if given) ``"HOST:PORT"``."""
    if live_view is not None:
        check_live_view(live_view, names=names)
    check_real("interval", interval, ge=_bp.MIN_INTERVAL, le=10.0, names=names)
    check_seconds("phase_seconds", phase_seconds, names=names)
    if not phase_seconds >= interval:
        n = (names or {}).get
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= "
             f"{n('interval', 'interval')} ({interval:g})")
    _bp.check_settles(phase_seconds, interval, names=names)
    check_int("tasks", tasks, ge=1, le=MAX_TASKS, names=names)
    check_int("records", records, ge=1, le=MAX_RECORDS, names=names,
              why_low=" (the keyed job compares the counts of at least one record)")
    check_int("segment_size", segment_size, ge=64, le=1 << 20, names=names)
    check_real("full_speed_fraction", full_speed_fraction, ge=_bp.MIN_FULL_SPEED_FRACTION,
               le=1.0, names=names)
    if master is not None:
        check_slots(tasks, master, names=names)


def check_live_view(text, *, names=None):
    """``(host, port)`` of ``text``, the live view's ``"HOST:PORT"`` (port 0:
    any free one), else :class:`ExperimentArgumentError`."""
    name = (names or {}).get("live_view", "live_view")
    host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        fail(f"{name} must be HOST:PORT (port 0: any free one), got {text!r}")
    return host, int(port)


# ---- on the driver --------------------------------------------------------------------

def run_spark_demo(out_dir, phase_seconds=4.0, *, interval=0.5, tasks=2, records=1_000_000,
                   segment_size=4096, full_speed_fraction=0.25, schedule=DEFAULT_SCHEDULE,
                   spark=None, master="local[2]", connect=False, plot=True, printer=print,
                   live_view="127.0.0.1:0"):
    """Run the demo and return its JSON document (``doc["checks"]["passed"]``
    says whether the expectations held).  ``spark``: a running SparkSession,
    classic or Spark Connect (its master needs ``tasks`` slots); else one is
    started on ``master`` (with ``connect``, serving Spark Connect on
    loopback, the demo a Connect client of it), its JVM's output going to
    ``out_dir/spark-backpressure.log``.  Arguments, the master's slots,
    PySpark (and with ``connect`` its Connect client's packages) and Java
    are checked and ``out_dir`` made before anything runs; a failure once
    Spark runs raises :class:`~flinkbuf.experiments.failures.RunFailed`,
    its cause in one line."""
    own = spark is None
    check_arguments(phase_seconds, interval, tasks, records, segment_size, full_speed_fraction,
                    master if own else _master(spark))
    if own:
        check_environment(master, connect=connect)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    log_path = os.path.join(out_dir, LOG_FILE) if own else None
    hint = f"Spark's log: {log_path}" if own else None
    started = time.monotonic()
    sessions = _start_spark(master, log_path, hint, printer, connect) if own else [spark]
    spark = sessions[-1]
    view = None
    try:
        sc = spark if is_connect(spark) else spark.sparkContext
        printer(_header(spark, tasks, segment_size))
        view = _start_live_view(sc, live_view, printer)
        rows, unthrottled, full_rate, per_task = _run_schedule(
            sc, tasks, segment_size, view, phase_seconds, interval, schedule,
            full_speed_fraction, printer, hint)
        _print_tasks(per_task, printer)
        try:
            comparison = compare_with_spark_shuffle(sc, records, tasks, segment_size, printer,
                                                    live_view=view if view is not None else False)
        except Exception as exc:
            raise RunFailed.because("the keyed job failed", exc, hint) from exc
        spark_master = _master(spark)
    finally:
        if view is not None:
            view.close()
        if own:
            for session in reversed(sessions):
                stop(session)
    ticks = max(1, round(phase_seconds / interval))
    doc = _document(spark_master, tasks, ticks, interval, schedule, segment_size,
                    full_speed_fraction, rows, unthrottled, full_rate, per_task, comparison)
    if is_connect(spark):
        doc["config"].update(record=CONNECT_RECORD, spark_connect=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    _write(out_dir, doc, plot, printer)
    return doc


def _master(spark):
    """The master URL of a session of either kind."""
    if is_connect(spark):
        return spark.conf.get("spark.master", None) or "(the Connect server's)"
    return spark.sparkContext.master


def _header(spark, tasks, segment_size):
    """The demo's first line: Spark, its master, the exchange."""
    buffers = f"{tasks * 2 + 1} output buffers of {segment_size} bytes per task"
    if is_connect(spark):
        return (f"Spark {spark.version}, {_master(spark)}, through Spark Connect: {tasks} tasks "
                f"exchange records as Arrow batches through flinkbuf (arrow_exchange; "
                f"{buffers})")
    return (f"Spark {spark.version}, {spark.sparkContext.master}: {tasks} tasks exchange "
            f"records through flinkbuf ({buffers})")


def _start_spark(master, log_path, hint, printer, connect=False):
    """The sessions started here on ``master``, the one to use last: a
    session, or with ``connect`` the session serving Spark Connect and a
    Connect session on it; its JVM's output in ``log_path``, with its
    executors (local-cluster starts them after the session)."""
    kind = ", serving Spark Connect" if connect else ""
    printer(f"starting Spark ({master}{kind}; its log: {log_path}) ...")
    try:
        sessions = list(connect_session(master, log_path)) if connect else \
            [spark_session(master, log_path)]
    except Exception as exc:
        raise RunFailed.because("Spark did not start", exc, hint) from exc
    sc = sessions[0].sparkContext
    executors = executors_of(sc.master)
    if executors is not None:
        try:
            wait_for_executors(sc, executors)
        except BaseException as exc:
            for session in reversed(sessions):
                stop(session)
            if not isinstance(exc, Exception):
                raise
            raise RunFailed.because("Spark did not start", exc, hint) from exc
    return sessions


def _exchange_job(sc, tasks, segment_size, view, control):
    """The job (not started) whose tasks exchange the paced records: over
    an RDD through pipelined_exchange, or, on a Spark Connect session
    ``sc``, as Arrow batches through arrow_exchange (each task's records
    made by its ``map_input``; its totals come back as JSON)."""
    import json

    from flinkbuf.spark import arrow_exchange, pipelined_exchange

    live_view = view if view is not None else False
    options = dict(segment_size=segment_size, buffers_per_channel=2, floating_buffers=0,
                   live_view=live_view)
    if not is_connect(sc):
        rdd = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
            spark_control.paced_source)
        exchanged = pipelined_exchange(
            rdd, spark_control.paced_count,
            monitor=spark_control.Monitor(control.address, control.token), **options)
        return spark_control.Job(exchanged.collect)
    exchanged = arrow_exchange(
        sc.range(0, tasks, 1, tasks), spark_control.paced_count_batches, "key", "totals string",
        map_input=spark_control.paced_batches,
        monitor=spark_control.Monitor(control.address, control.token, rows=True), **options)
    return spark_control.Job(lambda: [json.loads(r["totals"]) for r in exchanged.collect()])


def _driver_host(sc):
    """The address the tasks reach the driver at (on a Spark Connect
    session, this client's: its server runs on this machine)."""
    if is_connect(sc):
        return sc.conf.get("spark.driver.host", None) or "127.0.0.1"
    return sc.getConf().get("spark.driver.host", "127.0.0.1")


def _run_schedule(sc, tasks, segment_size, view, phase_seconds, interval, schedule, fraction,
                  printer, hint):
    """The exchange's job under the schedule, steered over the control
    connection: ``(rows, unthrottled, full_rate, per_task)``."""
    control = spark_control.Control(_driver_host(sc), tasks)
    job = None
    try:
        job = _exchange_job(sc, tasks, segment_size, view, control)
        job.start()
        control.accept(job)
        rows, unthrottled, full_rate = _steer(control, job, phase_seconds, interval, schedule,
                                              fraction, printer)
        control.ask({"cmd": "stop"})
        job.join(spark_control.CONTROL_TIMEOUT)
        if job.is_alive():
            raise RunFailed("the demo's Spark job did not end")
        if job.error is not None:
            raise RunFailed.because("the demo's Spark job failed", job.error)
    except Exception as exc:
        raise _failure(exc, job, hint) from exc
    finally:
        control.close()
    per_task = sorted((r["stats"] for r in job.result), key=lambda s: s["task"])
    return rows, unthrottled, full_rate, per_task


def _document(master, tasks, ticks, interval, schedule, segment_size, fraction, rows,
              unthrottled, full_rate, per_task, comparison):
    """The run's JSON document, its checks included."""
    checks = _bp.check_backpressure(rows, interval, ticks)
    checks["same_counts"] = comparison["same_counts"]
    checks["passed"] = all(checks[k] is not False for k in (
        "consumer_slowed", "tracks_consumer", "returns_to_full_speed", "same_counts"))
    return {
        "experiment": NAME,
        "config": {
            "master": master,
            "tasks": tasks,
            "phase_seconds": ticks * interval,
            "interval_seconds": interval,
            "schedule": [list(s) for s in schedule],
            "segment_size": segment_size,
            "buffers_per_task": tasks * 2 + 1,
            "full_speed_fraction": fraction,
            "record": "(int, int), hashed by the first field, typed codec",
            "backpressure": "per interval: the producers' back-pressured time over exactly that "
                            "interval, the highest of the tasks",
            "sojourn": SOJOURN_NOTE,
        },
        "unthrottled_records_per_s": round(unthrottled),
        "full_speed_records_per_s": round(full_rate),
        "rows": rows,
        "sojourn_by_phase": sojourn_by_phase(rows, ticks),
        "tasks": per_task,
        "comparison": comparison,
        "checks": checks,
    }


def _write(out_dir, doc, plot, printer):
    """The CSV, the JSON and (with matplotlib) the figure; the summary."""
    write_table_and_doc(out_dir, NAME, CSV_COLUMNS, doc["rows"], doc)
    drawn = False
    plotting = load_plotting(printer) if plot else None
    if plotting is not None:
        plotting.plot_backpressure(doc["rows"], doc, os.path.join(out_dir, f"{NAME}.png"))
        drawn = True
    _bp._print_summary(doc, printer, tasks=doc["config"]["tasks"])
    _print_sojourn(doc, printer)
    printer(f"wrote {os.path.join(out_dir, NAME + '.csv')}, {NAME}.json"
            + (f" and {NAME}.png" if drawn else ""))


def sojourn_by_phase(rows, ticks):
    """Per phase: its limits and the median over its intervals of their p99
    and p50 sojourns (ms; None for a phase without any)."""
    out = []
    for k in range(0, len(rows), ticks):
        phase = rows[k:k + ticks]
        entry = {"producer_limit_pct": phase[0]["producer_limit_pct"],
                 "consumer_limit_pct": phase[0]["consumer_limit_pct"]}
        for q in ("p50", "p99"):
            values = [r[f"sojourn_{q}_ms"] for r in phase
                      if r.get(f"sojourn_{q}_ms") is not None]
            entry[f"sojourn_{q}_ms"] = round(statistics.median(values), 3) if values else None
        out.append(entry)
    return out


def _print_sojourn(doc, printer):
    parts = [f"{p['producer_limit_pct']:g}/{p['consumer_limit_pct']:g}: "
             + ("-" if p["sojourn_p99_ms"] is None else f"{p['sojourn_p99_ms']:.1f}")
             for p in doc["sojourn_by_phase"]]
    printer("records' sojourn, p99 per phase [ms] (median of its intervals; limits P/C %): "
            + ", ".join(parts))


def _start_live_view(sc, address, printer):
    """The driver's live view of the demo's exchanges on ``address``
    (``"HOST:PORT"``; None: none), its URL printed (on a Spark Connect
    session, the session's view, served by this client)."""
    if address is None:
        return None
    from flinkbuf.spark import LiveView, live_view
    from flinkbuf.spark.driver import driver_addresses

    host, port = check_live_view(address)
    try:
        if is_connect(sc):
            view = live_view(sc, host=host, port=port)
        else:
            bind, advertised = driver_addresses(sc)
            view = LiveView(host, port, report_host=bind, report_advertise=advertised)
    except (OSError, ValueError) as exc:
        raise RunFailed(f"the live view did not start: {exc}") from exc
    printer(f"live view: {view.url}   (in a terminal: flinkbuf monitor {view.url})")
    return view


def _failure(exc, job, hint, grace=5.0):
    """The RunFailed for ``exc`` raised while steering the tasks: the Spark
    job's own error when it has one (a task that fails drops its control
    connection first; its error reaches the job a moment later)."""
    if job is not None and job.error is None:
        job.join(grace)
    if job is not None and job.error is not None:
        return RunFailed.because("the demo's Spark job failed", job.error, hint)
    if isinstance(exc, RunFailed):
        return RunFailed(f"{exc} ({hint})") if hint else exc
    return RunFailed.because("the control connection to the demo's tasks failed", exc, hint)


def _sample(control, sojourns):
    """((this moment, every task's counters), the sojourns (ns) that their
    marks complete in ``sojourns``)."""
    now = time.perf_counter(), control.ask({"cmd": "sample"})
    return now, sojourns.add(now[1])


def _rates(prev, now):
    """Records/s out and in, summed over the tasks, between two samples."""
    (t0, before), (t1, after) = prev, now
    dt = t1 - t0
    produced = sum(s["out"] for s in after) - sum(s["out"] for s in before)
    consumed = sum(s["in"] for s in after) - sum(s["in"] for s in before)
    return produced / dt, consumed / dt


def interval_row(t_seconds, limits, prev, now, full_rate):
    """One interval's row from two samples of every task (``(time, [the
    counters of each task])``, the tasks in the same order in both): both
    throughputs summed over the tasks, and the producers' back-pressured
    ms per second over exactly this interval, from each task's cumulative
    back-pressured time (the highest of the tasks, whose level it gives)."""
    produced, consumed = _rates(prev, now)
    bp = max(_bp.ms_per_second(a["bp_ns"] - b["bp_ns"], a["t_ns"] - b["t_ns"])
             for b, a in zip(prev[1], now[1]))
    return {
        **_bp.schedule_row(t_seconds, limits, produced, consumed, bp, full_rate),
        "out_pool_usage": round(max(s["out_pool"] for s in now[1]), 3),
        "in_pool_usage": round(max(s["in_pool"] for s in now[1]), 3),
    }


def _steer(control, job, phase_seconds, interval, schedule, fraction, printer):
    """Calibrate, then run the schedule: a row (and a line) per interval."""
    n = control.num_tasks
    sojourns = spark_control.Sojourns()
    control.ask({"cmd": "limits", "producer": None, "consumer": None, "rate": None})
    _warm_up(control, job, interval, sojourns)
    start = time.perf_counter()
    prev = _sample(control, sojourns)[0]
    samples = []
    for k in range(1, 5):
        _wait(job, start + (k + 1) * interval)
        now = _sample(control, sojourns)[0]
        samples.append(_rates(prev, now)[1])
        prev = now
    unthrottled = sorted(samples)[len(samples) // 4]
    if not unthrottled > 0:
        raise RunFailed("no records flowed between the tasks")
    full_rate = fraction * unthrottled
    printer(f"unthrottled: {unthrottled:,.0f} records/s over {n} tasks; full speed (100 %): "
            f"{full_rate:,.0f} records/s = {fraction:g} x unthrottled")
    printer(f"{'t [s]':>6} {'limits P/C [%]':>15} {'producers':>10} {'consumers':>10} "
            f"{'backpressure':>12} {'bp ms/s':>8} {'outPool':>7} {'sojourn p99 [ms]':>16}")

    def limits(p, c):
        control.ask({"cmd": "limits", "producer": p, "consumer": None if c >= 100 else c,
                     "rate": full_rate / n})

    rows = _run_phases(control, job, limits, max(1, round(phase_seconds / interval)),
                       interval, schedule, full_rate, sojourns, printer)
    return rows, unthrottled, full_rate


def _warm_up(control, job, interval, sojourns):
    """Until every task has read records (a task's first batch may take a
    while: its Python worker loads what it needs first), then an interval
    more; RunFailed if none flow within the control's timeout."""
    deadline = time.perf_counter() + spark_control.CONTROL_TIMEOUT
    while not all(s["in"] > 0 for s in _sample(control, sojourns)[0][1]):
        if time.perf_counter() > deadline:
            raise RunFailed("no records flowed between the tasks")
        _wait(job, time.perf_counter() + interval)
    _wait(job, time.perf_counter() + interval)


def _run_phases(control, job, limits, ticks, interval, schedule, full_rate, sojourns,
                printer):
    """Each phase of ``schedule`` for ``ticks`` intervals: a row and a line
    per interval, with the sojourns of the records whose marks it
    completed."""
    limits(*schedule[0])
    start = time.perf_counter()
    prev = _sample(control, sojourns)[0]
    rows = []
    for tick in range(1, ticks * len(schedule) + 1):
        phase = (tick - 1) // ticks
        _wait(job, start + tick * interval)
        now, done = _sample(control, sojourns)
        row = interval_row(tick * interval, schedule[phase], prev, now, full_rate)
        row.update(sojourn_columns(done))
        prev = now
        rows.append(row)
        p99 = row["sojourn_p99_ms"]
        printer(f"{row['t_seconds']:6.1f} {row['producer_limit_pct']:>7g}/"
                f"{row['consumer_limit_pct']:<7g} {row['producer_pct']:9.1f}% "
                f"{row['consumer_pct']:9.1f}% {row['backpressure_level']:>12} "
                f"{row['producer_back_pressured_ms_per_s']:8.0f} {row['out_pool_usage']:7.2f} "
                f"{'-' if p99 is None else f'{p99:.1f}':>16}")
        if tick % ticks == 0 and tick < ticks * len(schedule):
            limits(*schedule[phase + 1])
    return rows


def sojourn_columns(sojourns_ns):
    """An interval's sojourn columns from the sojourns (ns) completed in it:
    p50 and p99 in ms (None without any) and how many."""
    done = sorted(sojourns_ns)
    p50, p99 = percentile(done, 0.5), percentile(done, 0.99)
    return {"sojourn_p50_ms": None if p50 is None else round(p50 / 1e6, 3),
            "sojourn_p99_ms": None if p99 is None else round(p99 / 1e6, 3),
            "sojourn_records": len(done)}


def _wait(job, deadline):
    while True:
        if job.error is not None:
            raise RunFailed.because("the demo's Spark job failed", job.error)
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
