"""Experiment 1: Flink's 2015 backpressure experiment (the blog post "How
Apache Flink handles backpressure").

One producer task and one consumer task in this process exchange ``(int,
int)`` records through a local channel; the producer's pool has 2 buffers of
4096 bytes (the consumer reads the producer's buffers by reference, so that
is all the memory between them).  Each task runs at a percentage of its
*full speed* (a token bucket with sleeps, like the blog's ``Thread.sleep()``);
the schedule of (producer, consumer) percentages is by default
(60, 100) -> (60, 30) -> (100, 100) -> (100, 30) -> (100, 100).  Every
``interval`` seconds both tasks' throughput is recorded as a percentage of
full speed, with the producer's back-pressure level from its
back-pressured milliseconds per second over exactly that interval (the
difference of the writer's cumulative ``back_pressured_time_ns``, read with
the record counts).

Full speed, the 100 % of the figure, is the producer's rate at 100 %: like
a source, it generates records at most that fast.  The consumer at 100 % is
not slowed at all (it processes what arrives, as fast as it can); below 100
% it is held to that percentage of full speed.  Full speed is measured
first: the unthrottled pipeline's rate (the lower quartile of
``calibration_intervals`` intervals after a one-interval warm-up), times
``full_speed_fraction`` (default 0.25).  The unthrottled rate of two
Python threads sharing the GIL swings by 2-5x between runs, and by up to 3x
within one for seconds at a time, when other processes share the CPU (each
buffer handed over waits for the other thread to be scheduled); at a
quarter of it the tasks hold full speed through that noise, so the figure
shows the tasks, not the machine.
``full_speed_fraction=1`` makes full speed the unthrottled rate itself.

Nothing but the blocking buffer request slows the producer when the
consumer is slow: it tracks the consumer, and both return to full speed
when the consumer is released.

With ``remote=True`` (``--remote``) the consumer runs in another process
and reads the producer's partition over a local connection (an
authenticated connection with Flink's credit-based flow control,
``buffers`` exclusive buffers and no floating ones): shared memory with
``transport="auto"`` where the network layer has it, else the transport
named (``"tcp"``, ``"unix"`` or ``"shm"``).  The same schedule, outputs
and expectations, the backpressure now travelling back across the
connection; the outputs say which transport the connection used.

Outputs in ``out_dir``: ``backpressure.csv`` (one row per interval:
``t_seconds,producer_limit_pct,consumer_limit_pct,producer_pct,consumer_pct,
backpressure_level``), ``backpressure.json`` (configuration, calibration, the
rows with more metrics, and the checks) and, with matplotlib,
``backpressure.png``.
"""

import math
import os
import resource
import statistics
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.experiments.arguments import (
    MAX_SECONDS,
    check_int,
    check_pool_fits,
    check_real,
    check_seconds,
    fail,
)
from flinkbuf.experiments.failures import RunFailed
from flinkbuf.experiments.output import (
    VERDICT,
    load_plotting,
    prepare_out_dir,
    write_table_and_doc,
)
from flinkbuf.experiments.remote import (
    MetricsProxy,
    RemoteConsumers,
    buffers_not_returned,
    check_transport,
    describe_transport,
    new_secret,
    transport_in_use,
)
from flinkbuf.io import task_segments
from flinkbuf.io.metrics import TaskMetrics, backpressure_level

DEFAULT_SCHEDULE = ((60, 100), (60, 30), (100, 100), (100, 30), (100, 100))
CSV_COLUMNS = ("t_seconds", "producer_limit_pct", "consumer_limit_pct", "producer_pct",
               "consumer_pct", "backpressure_level")
TRACKING_TOLERANCE_PCT = 10.0   # slowed consumer: |producer - consumer| <= 10 % of consumer
SETTLE_SECONDS = 0.5            # ... from this long after each change
RELEASED_MIN_PCT = 85.0         # released: each task's median interval >= 85 % of full speed
RSS_GROWTH_MAX_MB = 50.0        # memory stays bounded: the process does not grow meanwhile
_BATCH = 128                    # records between throttle checks
MIN_BUFFERS = 2                 # one being filled, one in flight to the consumer
MIN_INTERVAL = 0.05             # the window of the tasks' metrics
MIN_FULL_SPEED_FRACTION = 0.01
OUTPUT_FILES = ("backpressure.csv", "backpressure.json", "backpressure.png")


def ms_per_second(delta_ns, dt_ns):
    """Milliseconds per second of ``delta_ns`` nanoseconds (of a cumulative
    time counter) over ``dt_ns``, in [0, 1000]."""
    if not dt_ns > 0:
        return 0.0
    return min(1000.0, max(0.0, delta_ns / dt_ns * 1000.0))


def _rss_mb():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Pipeline:
    """The two tasks, unthrottled until :meth:`set_limits`, running until
    :meth:`shutdown`."""

    transport = None

    def __init__(self, segment_size, buffers, buffer_timeout):
        self.buffers = buffers
        self.nbp = fb.NetworkBufferPool(task_segments([buffers]), segment_size)
        self.partition = fb.create_partition(self.nbp, 1, min_buffers=buffers, name="producer")
        self.writer = fb.RecordWriter(self.partition, fb.ForwardSelector(),
                                      buffer_timeout=buffer_timeout, name="producer")
        self.gate = fb.InputGate([(self.partition, 0)], name="consumer")
        self.producer_throttle = Throttle()
        self.consumer_throttle = Throttle()
        self.stop = threading.Event()
        self.errors = []
        self.max_in_use = 0
        self.producer_metrics = TaskMetrics("producer", writers=[self.writer], window=0.05)
        self.consumer_metrics = TaskMetrics("consumer", gates=[self.gate], window=0.05)
        self.threads = [threading.Thread(target=self._produce, name="bp-producer", daemon=True),
                        threading.Thread(target=self._consume, name="bp-consumer", daemon=True)]

    def _produce(self):
        emit = self.writer.emit
        pace = self.producer_throttle.pace
        stop = self.stop
        i = 0
        try:
            while not stop.is_set():
                for _ in range(_BATCH):
                    emit((i, i))
                    i += 1
                pace(_BATCH)
            self.writer.close()
        except BaseException as exc:  # noqa: BLE001 - raised by run_backpressure
            self.errors.append(exc)
            self.writer.fail(exc)

    def _consume(self):
        pace = self.consumer_throttle.pace
        n = 0
        try:
            for _ in self.gate:
                n += 1
                if n == _BATCH:
                    pace(n)
                    n = 0
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            self.gate.close()

    def start(self):
        for t in self.threads:
            t.start()

    def counts(self):
        """(now, records out, records in, the producer's back-pressured ns so
        far, now in ns): cumulative, read together."""
        return (time.perf_counter(), self.writer.num_records_out, self.gate.num_records_in,
                self.writer.back_pressured_time_ns, time.monotonic_ns())

    def wait_until(self, deadline):
        """Sleep until ``deadline`` (perf_counter), watching the pool's
        buffers in use; raises the first error of a task."""
        pool = self.partition.pool
        while True:
            if self.errors:
                raise RunFailed.because("a task of the experiment failed", self.errors[0])
            now = time.perf_counter()
            if now >= deadline:
                return
            time.sleep(min(0.01, deadline - now))
            self.max_in_use = max(self.max_in_use, pool.num_requested - pool.num_available)

    def set_limits(self, producer_pct, consumer_pct, full_rate):
        self.producer_throttle.set_limit(producer_pct, full_rate)
        if consumer_pct >= 100:
            self.consumer_throttle.unthrottle()
        else:
            self.consumer_throttle.set_limit(consumer_pct, full_rate)

    def shutdown(self, timeout=30.0):
        """Stop both tasks; returns the number of buffers not given back."""
        self.stop.set()
        self.producer_throttle.unthrottle()
        self.consumer_throttle.unthrottle()
        for t in self.threads:
            t.join(timeout)
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            self.writer.fail(RuntimeError("experiment shut down"))
            self.gate.close()
            raise RuntimeError(f"tasks did not stop within {timeout} s: {alive}")
        pool = self.partition.pool
        leaked = pool.num_requested - pool.num_available
        pool.destroy()
        return leaked


class _RemotePipeline(_Pipeline):
    """The same two tasks with the consumer in another process, reading the
    producer's partition over a connection of ``transport``
    (:mod:`flinkbuf.network`)."""

    def __init__(self, segment_size, buffers, buffer_timeout, transport="auto"):
        from flinkbuf.network import NetworkEnvironment
        secret = new_secret()
        self.buffers = buffers
        self.transport = transport
        self.env = NetworkEnvironment(task_segments([buffers]), segment_size, secret=secret,
                                      transport=transport)
        self.nbp = self.env.network_buffer_pool
        self.partition = fb.create_partition(self.nbp, 1, min_buffers=buffers, name="producer")
        self.env.register_partition("producer", self.partition)
        self.writer = fb.RecordWriter(self.partition, fb.ForwardSelector(),
                                      buffer_timeout=buffer_timeout, name="producer")
        self.producer_throttle = Throttle()
        self.stop = threading.Event()
        self.errors = []
        self.max_in_use = 0
        self.producer_metrics = TaskMetrics("producer", writers=[self.writer], window=0.05)
        self.threads = [threading.Thread(target=self._produce, name="bp-producer", daemon=True)]
        try:
            self.consumers = RemoteConsumers(self.env, secret, [("producer", 0)],
                                             segment_size=segment_size, exclusive=buffers,
                                             transport=transport)
        except BaseException:
            self.writer.fail()
            self.env.close()
            raise
        self.consumer_metrics = MetricsProxy(self.consumers)

    def counts(self):
        consumed = self.consumers.counts()[0]
        return (time.perf_counter(), self.writer.num_records_out, consumed,
                self.writer.back_pressured_time_ns, time.monotonic_ns())

    def wait_until(self, deadline):
        self.consumers.counts()          # raises a remote consumer's error
        super().wait_until(deadline)

    def set_limits(self, producer_pct, consumer_pct, full_rate):
        self.producer_throttle.set_limit(producer_pct, full_rate)
        self.consumers.set_limit(0, None if consumer_pct >= 100 else consumer_pct, full_rate)

    def shutdown(self, timeout=30.0):
        self.stop.set()
        self.producer_throttle.unthrottle()
        self.consumers.set_limit(0, None)
        for t in self.threads:
            t.join(timeout)
        alive, errors, _ = self.consumers.stop(timeout)
        if self.threads[0].is_alive() or alive:
            self.writer.fail(RuntimeError("experiment shut down"))
            self.env.close()
            raise RuntimeError(f"tasks did not stop within {timeout} s")
        if errors:
            self.errors.append(RunFailed(f"the remote consumer failed: {errors[0]}"))
        leaked = buffers_not_returned(self.partition.pool)
        self.env.close()
        return leaked


# Argument names of run_backpressure (the command line names its options instead).
def check_arguments(phase_seconds, interval=0.5, schedule=DEFAULT_SCHEDULE, segment_size=4096,
                    buffers=2, full_speed=None, full_speed_fraction=0.25,
                    calibration_intervals=4, remote=False, transport="auto", *, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_backpressure` is in range; ``names`` maps
    parameter names to the names to report (say, command-line options)."""
    n = (names or {}).get
    check_real("interval", interval, ge=MIN_INTERVAL, le=MAX_SECONDS, names=names,
               why_low=f" (the task metrics average over {MIN_INTERVAL:g} s)")
    check_seconds("phase_seconds", phase_seconds, names=names)
    if not phase_seconds >= interval:
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= "
             f"{n('interval', 'interval')} ({interval:g}): each phase must be at least "
             f"{n('interval', 'interval')} long")
    check_settles(phase_seconds, interval, names=names)
    if not schedule:
        fail("schedule must have at least one phase")
    for phase in schedule:
        if (not isinstance(phase, (tuple, list)) or len(phase) != 2
                or not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                           and math.isfinite(p) and p > 0 for p in phase)):
            fail("schedule phases must be (producer %, consumer %) pairs of numbers > 0 "
                 f"(finite), got {phase!r}")
    check_int("segment_size", segment_size, ge=1, names=names)
    check_int("buffers", buffers, ge=MIN_BUFFERS, names=names,
              why_low=" (the producer's partition holds one buffer being filled while "
                  "another is in flight)")
    check_pool_fits(buffers, segment_size, count_param="buffers", size_param="segment_size",
                    names=names)
    lowest = min_full_speed(interval, schedule)
    if full_speed is not None:
        check_real("full_speed", full_speed, ge=lowest, names=names,
                   why_low=f" (records/s: each task paces batches of {_BATCH} records, and a "
                       "batch at the lowest limit must fit an interval)")
    check_real("full_speed_fraction", full_speed_fraction, ge=MIN_FULL_SPEED_FRACTION, le=1.0,
               names=names)
    check_int("calibration_intervals", calibration_intervals, ge=1, le=10_000, names=names)
    check_transport(transport, remote, names=names)


def settle_intervals(interval):
    """The intervals after each change that the checks leave out: those
    that begin less than ``SETTLE_SECONDS`` after it."""
    return math.ceil(SETTLE_SECONDS / interval - 1e-9)


def check_settles(phase_seconds, interval, *, names=None):
    """A phase lasts the intervals the checks leave out and one more: else
    they would judge only the moments right after a change."""
    n = (names or {}).get
    shortest = (settle_intervals(interval) + 1) * interval
    if phase_seconds < shortest - 1e-9:
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= "
             f"{shortest:g} with {n('interval', 'interval')} {interval:g}: the checks leave out "
             f"the first {SETTLE_SECONDS:g} s after each change, and need an interval after "
             "that")


def min_full_speed(interval, schedule=DEFAULT_SCHEDULE):
    """The lowest full speed (records/s) at which each task, at the lowest
    limit of ``schedule``, still finishes a batch of records within an
    interval (and within a second: shutdown waits for a batch to end)."""
    lowest_pct = min(min(phase) for phase in schedule)
    return math.ceil(_BATCH * 100.0 / (lowest_pct * min(interval, 1.0)))


def run_backpressure(out_dir, phase_seconds=5.0, *, interval=0.5, schedule=DEFAULT_SCHEDULE,
                     segment_size=4096, buffers=2, buffer_timeout=0.1, full_speed=None,
                     full_speed_fraction=0.25, calibration_intervals=4, remote=False,
                     transport="auto", plot=True, printer=print):
    """Run the experiment, write its outputs to ``out_dir`` and return the
    JSON document (a dict; ``doc["checks"]["passed"]`` says whether the
    expectations held).  ``full_speed`` (records/s) replaces the measured
    one.  Every argument is checked, and ``out_dir`` made, before anything
    runs (:class:`ExperimentArgumentError`, a ``ValueError``, otherwise).
    Without matplotlib the figure is skipped with a line saying how to get
    it.  ``remote``: the consumer in another process, over a connection of
    ``transport`` (``"auto"``: the fastest on this host, shared memory
    where the network layer has it; ``"shm"``, ``"unix"`` or ``"tcp"``)."""
    check_arguments(phase_seconds, interval, schedule, segment_size, buffers, full_speed,
                    full_speed_fraction, calibration_intervals, remote, transport)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    ticks_per_phase = max(1, round(phase_seconds / interval))
    if remote:
        pipe = _RemotePipeline(segment_size, buffers, buffer_timeout, transport)
    else:
        pipe = _Pipeline(segment_size, buffers, buffer_timeout)
    pipe.start()
    rss = [_rss_mb()]
    used = None
    try:
        unthrottled, samples = _calibrate(pipe, interval, calibration_intervals)
        full_rate = _full_rate(unthrottled, full_speed, full_speed_fraction, interval, schedule)
        if remote:
            used = transport_in_use(pipe.env)
        _print_calibration(printer, unthrottled, full_rate, full_speed, full_speed_fraction,
                           calibration_intervals, interval, buffers, segment_size, remote, used)
        rows = _run_schedule(pipe, schedule, ticks_per_phase, interval, full_rate, rss, printer)
    finally:
        leaked = pipe.shutdown()
    if pipe.errors:
        raise RunFailed.because("a task of the experiment failed", pipe.errors[0])
    checks = check_backpressure(rows, interval, ticks_per_phase)
    checks.update(_memory_checks(pipe.max_in_use, leaked, rss, buffers))
    checks["passed"] = all(checks[k] is not False for k in (
        "consumer_slowed", "tracks_consumer", "returns_to_full_speed", "memory_bounded"))
    doc = {
        "experiment": "backpressure",
        "config": _config(ticks_per_phase * interval, interval, schedule, segment_size, buffers,
                          buffer_timeout, full_speed, full_speed_fraction,
                          calibration_intervals, remote, transport, used),
        "unthrottled_records_per_s": round(unthrottled),
        "calibration_records_per_s": [round(s) for s in samples],
        "full_speed_records_per_s": round(full_rate),
        "max_measured_pct": max(max(r["producer_pct"], r["consumer_pct"]) for r in rows),
        "max_buffers_in_use": pipe.max_in_use,
        "buffers_leaked": leaked,
        "rss_mb": {"min": round(min(rss), 1), "max": round(max(rss), 1)},
        "rows": rows,
        "checks": checks,
    }
    drawn = write_outputs(out_dir, rows, doc, plot=plot, printer=printer)
    _print_summary(doc, printer)
    printer(f"wrote {os.path.join(out_dir, 'backpressure.csv')}, backpressure.json"
            + (" and backpressure.png" if drawn else ""))
    return doc


def _calibrate(pipe, interval, calibration_intervals):
    """The unthrottled pipeline, measured like the phases after a one-interval
    warm-up: (the lower quartile of the interval rates, every rate)."""
    start = time.perf_counter()
    pipe.wait_until(start + interval)
    samples = []
    prev = pipe.counts()
    for k in range(1, calibration_intervals + 1):
        pipe.wait_until(start + (k + 1) * interval)
        now = pipe.counts()
        samples.append((now[2] - prev[2]) / (now[0] - prev[0]))
        prev = now
    # the lower quartile by rank: one stalled or one lucky interval does not decide
    unthrottled = sorted(samples)[len(samples) // 4]
    if not unthrottled > 0:
        raise RunFailed("no records flowed through the unthrottled pipeline")
    return unthrottled, samples


def _full_rate(unthrottled, full_speed, full_speed_fraction, interval, schedule):
    """Full speed in records/s: as given, or the fraction of the unthrottled
    rate, which must still be paceable (see :func:`min_full_speed`;
    :class:`RunFailed` otherwise: a measurement, not an argument, says so)."""
    if full_speed:
        return float(full_speed)
    full_rate = full_speed_fraction * unthrottled
    lowest = min_full_speed(interval, schedule)
    if full_rate < lowest:
        raise RunFailed(f"full speed would be {full_rate:,.0f} records/s "
                        f"({full_speed_fraction:g} x the unthrottled {unthrottled:,.0f}), below "
                        f"the {lowest:,} records/s that intervals of {interval:g} s need: raise "
                        "the full-speed fraction or the interval")
    return full_rate


def _print_calibration(printer, unthrottled, full_rate, full_speed, full_speed_fraction,
                       calibration_intervals, interval, buffers, segment_size, remote,
                       transport=None):
    exchange = (f"the consumer in another process, over {describe_transport(transport)}"
                if remote else "local exchange")
    printer(f"unthrottled pipeline: {unthrottled:,.0f} records/s (lower quartile of "
            f"{calibration_intervals} intervals of {interval:g} s; {buffers} buffers of "
            f"{segment_size} bytes, {exchange})")
    if full_speed:
        printer(f"full speed (100 %): {full_rate:,.0f} records/s, as given")
    else:
        printer(f"full speed (100 %): {full_rate:,.0f} records/s = {full_speed_fraction:g} "
                f"x unthrottled")
    if full_rate > unthrottled:
        printer("warning: full speed is above what the unthrottled pipeline measured; "
                "released tasks may not reach it")
    printer(f"{'t [s]':>6} {'limits P/C [%]':>15} {'producer':>9} {'consumer':>9} "
            f"{'backpressure':>12} {'bp ms/s':>8} {'outPool':>7}")


def _run_schedule(pipe, schedule, ticks_per_phase, interval, full_rate, rss, printer):
    """Run every phase of ``schedule``, a row (and a printed line) per
    interval; appends the process's RSS of each interval to ``rss``."""
    pipe.set_limits(*schedule[0], full_rate)
    pipe.producer_metrics.snapshot()        # the other metrics' window starts here
    pipe.consumer_metrics.snapshot()
    start = time.perf_counter()
    prev = pipe.counts()
    total_ticks = ticks_per_phase * len(schedule)
    rows = []
    for tick in range(1, total_ticks + 1):
        phase = (tick - 1) // ticks_per_phase
        pipe.wait_until(start + tick * interval)
        now = pipe.counts()
        rss.append(_rss_mb())
        row = _interval_row(pipe, tick * interval, schedule[phase], prev, now, full_rate, rss[-1])
        prev = now
        rows.append(row)
        _print_row(printer, row)
        if tick % ticks_per_phase == 0 and tick < total_ticks:
            pipe.set_limits(*schedule[phase + 1], full_rate)
    return rows


def schedule_row(t_seconds, limits, producer_rate, consumer_rate, bp_ms, full_rate):
    """The columns of an interval that every run of the schedule has: the
    limits in force, both rates (records/s and % of ``full_rate``), and the
    producer's back-pressured ms per second ``bp_ms`` with its level."""
    return {
        "t_seconds": round(t_seconds, 3),
        "producer_limit_pct": limits[0],
        "consumer_limit_pct": limits[1],
        "producer_pct": round(producer_rate / full_rate * 100, 2),
        "consumer_pct": round(consumer_rate / full_rate * 100, 2),
        "backpressure_level": backpressure_level(bp_ms / 1000),
        "producer_records_per_s": round(producer_rate),
        "consumer_records_per_s": round(consumer_rate),
        "producer_back_pressured_ms_per_s": round(bp_ms, 1),
    }


def _interval_row(pipe, t_seconds, limits, prev, now, full_rate, rss_mb):
    """One interval's row: both tasks' rates and the producer's
    back-pressured time over exactly the interval (between the counts
    ``prev`` and ``now``), and their other metrics."""
    p_snap = pipe.producer_metrics.snapshot()
    c_snap = pipe.consumer_metrics.snapshot()
    dt = now[0] - prev[0]
    producer_rate = (now[1] - prev[1]) / dt
    consumer_rate = (now[2] - prev[2]) / dt
    bp = ms_per_second(now[3] - prev[3], now[4] - prev[4])
    return {
        **schedule_row(t_seconds, limits, producer_rate, consumer_rate, bp, full_rate),
        "producer_busy_ms_per_s": round(p_snap["busyTimeMsPerSecond"], 1),
        "consumer_idle_ms_per_s": round(c_snap["idleTimeMsPerSecond"], 1),
        "consumer_busy_ms_per_s": round(c_snap["busyTimeMsPerSecond"], 1),
        "out_pool_usage": round(p_snap["outPoolUsage"], 3),
        "in_pool_usage": round(c_snap["inPoolUsage"], 3),
        "rss_mb": round(rss_mb, 1),
    }


def _print_row(printer, row):
    printer(f"{row['t_seconds']:6.1f} {row['producer_limit_pct']:>7g}/"
            f"{row['consumer_limit_pct']:<7g} "
            f"{row['producer_pct']:8.1f}% {row['consumer_pct']:8.1f}% "
            f"{row['backpressure_level']:>12} "
            f"{row['producer_back_pressured_ms_per_s']:8.0f} {row['out_pool_usage']:7.2f}")


def _memory_checks(max_in_use, leaked, rss, buffers):
    growth = round(max(rss) - rss[0], 1)
    return {
        "max_buffers_in_use": max_in_use,
        "buffers_leaked": leaked,
        "rss_growth_mb": growth,
        "memory_bounded": max_in_use <= buffers and leaked == 0 and growth < RSS_GROWTH_MAX_MB,
    }


def _config(phase_seconds, interval, schedule, segment_size, buffers, buffer_timeout,
            full_speed, full_speed_fraction, calibration_intervals, remote=False,
            transport="auto", used=None):
    return {
        "phase_seconds": phase_seconds,
        "interval_seconds": interval,
        "schedule": [list(s) for s in schedule],
        "segment_size": segment_size,
        "buffers_per_task": buffers,
        "buffer_timeout": buffer_timeout,
        "full_speed": "given" if full_speed else "fraction of unthrottled",
        "full_speed_fraction": None if full_speed else full_speed_fraction,
        "calibration_intervals": calibration_intervals,
        "unthrottled_rate": "lower quartile (by rank) of the calibration intervals",
        "record": "(int, int), typed codec",
        "exchange": (f"remote: the consumer in another process reads over "
                     f"{describe_transport(used)} with {buffers} exclusive buffers of credit"
                     if remote else "local: the consumer reads the producer's buffers by "
                     "reference"),
        "transport": used if remote else None,
        "transport_asked": transport if remote else None,
        "backpressure": "per interval: the producer's back-pressured time over exactly that "
                        "interval",
    }


def _print_summary(doc, printer, *, tasks=1):
    """The verdict lines; ``tasks`` > 1 speaks of producers and consumers
    (the Spark demo, which reports no memory line of its own)."""
    c = doc["checks"]
    many = tasks > 1
    consumer, producer = ("consumers", "producers") if many else ("consumer", "producer")
    if c.get("consumer_slowed") is False:
        limit = "producers' limits" if many else "producer's limit"
        printer(f"slowed {consumer}: NO, {'they' if many else 'it'} ran at "
                f"{c['slowed_consumer_median_pct']:.0f} % of full speed (median), not below "
                f"midway to the {limit}: whether the {producer} follow{'' if many else 's'} "
                "is not shown")
    elif c["tracks_consumer"] is not None:
        printer(f"slowed {consumer}: the {producer} track{'' if many else 's'} "
                f"{'them' if many else 'it'} within "
                f"{c['max_tracking_error_pct']:.1f} % from {c['settle_seconds']:g} s after each "
                f"change (<= {TRACKING_TOLERANCE_PCT:g} %: {VERDICT[c['tracks_consumer']]})")
    if c["released_producer_median_pct"] is not None:
        printer(f"released: {producer} {c['released_producer_median_pct']:.0f} %, {consumer} "
                f"{c['released_consumer_median_pct']:.0f} % of full speed (lowest median of a "
                f"released phase; >= {RELEASED_MIN_PCT:g} %: "
                f"{VERDICT[c['returns_to_full_speed']]})")
    if "max_buffers_in_use" in c:
        printer(f"memory: at most {c['max_buffers_in_use']} of "
                f"{doc['config']['buffers_per_task']} buffers in use, {c['buffers_leaked']} "
                f"leaked; RSS grew {c['rss_growth_mb']:g} MB (bounded: "
                f"{VERDICT[c['memory_bounded']]})")
    if not c["passed"]:
        printer("FAILED: the expectations above marked NO did not hold")


def _phases(rows, ticks_per_phase):
    return [rows[i:i + ticks_per_phase] for i in range(0, len(rows), ticks_per_phase)]


def check_backpressure(rows, interval, ticks_per_phase):
    """The expectations, from the rows.  Slowed (consumer limit below the
    producer's): from ``SETTLE_SECONDS`` after the change the consumer's
    median interval is below midway between the two limits (it was slowed:
    else nothing is shown, ``consumer_slowed`` is False and tracking None),
    and the producer is within ``TRACKING_TOLERANCE_PCT`` % of the consumer
    in every interval.  Released (both limits >= 100): from then on, in
    every such phase, each task's median interval is at least
    ``RELEASED_MIN_PCT`` % of full speed.  A check without such a phase is
    None (and does not fail)."""
    settle = min(ticks_per_phase - 1, settle_intervals(interval))
    errors, slowed, released = [], [], []
    consumer_slowed = None
    for phase in _phases(rows, ticks_per_phase):
        p_lim, c_lim = phase[0]["producer_limit_pct"], phase[0]["consumer_limit_pct"]
        settled = phase[settle:]
        if c_lim < p_lim:
            median = statistics.median(r["consumer_pct"] for r in settled)
            consumer_slowed = (consumer_slowed is not False) and median <= (c_lim + p_lim) / 2
            for r in settled:
                errors.append(abs(r["producer_pct"] - r["consumer_pct"])
                              / max(r["consumer_pct"], 1e-9) * 100)
                slowed.append(r["consumer_pct"])
        if p_lim >= 100 and c_lim >= 100:
            medians = {f"{who}_median_pct": round(statistics.median(
                r[f"{who}_pct"] for r in settled), 2) for who in ("producer", "consumer")}
            released.append({"from_seconds": settled[0]["t_seconds"] - interval,
                             "to_seconds": settled[-1]["t_seconds"], **medians})
    max_err = round(max(errors), 2) if errors else None
    p_med = min((r["producer_median_pct"] for r in released), default=None)
    c_med = min((r["consumer_median_pct"] for r in released), default=None)
    return {
        "settle_seconds": round(settle * interval, 6),
        "consumer_slowed": consumer_slowed,
        "max_tracking_error_pct": max_err,
        "tracks_consumer": (None if max_err is None or not consumer_slowed
                            else max_err <= TRACKING_TOLERANCE_PCT),
        "slowed_consumer_median_pct": round(statistics.median(slowed), 2) if slowed else None,
        "released_phases": released,
        "released_producer_median_pct": p_med,
        "released_consumer_median_pct": c_med,
        "returns_to_full_speed": None if p_med is None else min(p_med, c_med) >= RELEASED_MIN_PCT,
        "thresholds": {"tracking_error_pct": TRACKING_TOLERANCE_PCT,
                       "released_median_pct": RELEASED_MIN_PCT},
    }


def write_outputs(out_dir, rows, doc, plot=True, printer=print):
    """The CSV table and the JSON document, then (with ``plot``) the figure
    if matplotlib is there.  True if the figure was drawn."""
    write_table_and_doc(out_dir, "backpressure", CSV_COLUMNS, rows, doc)
    plotting = load_plotting(printer) if plot else None
    if plotting is None:
        return False
    plotting.plot_backpressure(rows, doc, os.path.join(out_dir, "backpressure.png"))
    return True
