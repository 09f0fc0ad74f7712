"""Experiment 1: the backpressure experiment of the 2015 Flink blog post.

One producer task and one consumer task in this process exchange ``(int,
int)`` records through a local channel; the producer's pool has 2 buffers of
4096 bytes (the consumer reads the producer's buffers by reference, so that
is all the memory between them).  Each task can be slowed to a percentage of
the full speed measured first (a token bucket with sleeps, like the blog's
``Thread.sleep()``); the schedule of (producer, consumer) limits is by
default (60, 100) -> (60, 30) -> (100, 100) -> (100, 30) -> (100, 100).
Every ``interval`` seconds both tasks' throughput is recorded as a
percentage of that full speed, with the producer's back-pressure level from
its ``backPressuredTimeMsPerSecond``.

Nothing but the blocking buffer request slows the producer when the
consumer is slow: it tracks the consumer, and both return to full speed
when the consumer is released.

Outputs in ``out_dir``: ``backpressure.csv`` (one row per interval:
``t_seconds,producer_limit_pct,consumer_limit_pct,producer_pct,consumer_pct,
backpressure_level``), ``backpressure.json`` (configuration, the rows with
more metrics, and the checks) and ``backpressure.png``.
"""

import csv
import json
import os
import resource
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.metrics import TaskMetrics

DEFAULT_SCHEDULE = ((60, 100), (60, 30), (100, 100), (100, 30), (100, 100))
CSV_COLUMNS = ("t_seconds", "producer_limit_pct", "consumer_limit_pct", "producer_pct",
               "consumer_pct", "backpressure_level")
_BATCH = 128     # records between throttle checks


def _rss_mb():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Pipeline:
    """The two tasks, running until stopped."""

    def __init__(self, segment_size, buffers, buffer_timeout):
        self.nbp = fb.NetworkBufferPool(buffers, segment_size)
        self.partition = fb.create_partition(self.nbp, 1, min_buffers=buffers, name="producer")
        self.writer = fb.RecordWriter(self.partition, fb.ForwardSelector(),
                                      buffer_timeout=buffer_timeout, name="producer")
        self.gate = fb.InputGate([(self.partition, 0)], name="consumer")
        self.producer_throttle = Throttle(1.0)
        self.consumer_throttle = Throttle(1.0)
        self.stop = threading.Event()
        self.errors = []
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
        except BaseException as exc:  # noqa: BLE001 - reported by run()
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

    def set_limits(self, producer_pct, consumer_pct, full_rate):
        self.producer_throttle.set_limit(producer_pct, full_rate)
        self.consumer_throttle.set_limit(consumer_pct, full_rate)

    def shutdown(self, timeout=30.0):
        self.stop.set()
        self.set_limits(100, 100, 1.0)
        for t in self.threads:
            t.join(timeout)
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            self.writer.fail(RuntimeError("experiment shut down"))
            self.gate.close()
            raise RuntimeError(f"tasks did not stop: {alive}")
        pool = self.partition.pool
        leaked = pool.num_requested - pool.num_available
        pool.destroy()
        if self.errors:
            raise self.errors[0]
        return leaked


def _level_of(snapshot):
    return snapshot["backPressureLevel"]


def run_backpressure(out_dir, phase_seconds=5.0, *, interval=0.5, schedule=DEFAULT_SCHEDULE,
                     segment_size=4096, buffers=2, buffer_timeout=0.1,
                     calibration_seconds=None, plot=True, printer=print):
    """Run the experiment, write its outputs to ``out_dir`` and return the
    JSON document (a dict)."""
    if phase_seconds < interval:
        raise ValueError(f"phase_seconds ({phase_seconds}) must be >= interval ({interval})")
    ticks_per_phase = max(1, round(phase_seconds / interval))
    if calibration_seconds is None:
        calibration_seconds = min(2.0, max(1.0, phase_seconds))
    os.makedirs(out_dir, exist_ok=True)
    pipe = _Pipeline(segment_size, buffers, buffer_timeout)
    pipe.start()
    try:
        # Full speed: both tasks unthrottled (the first bit is warm-up).
        time.sleep(min(0.3, calibration_seconds / 4))
        c0, t0 = pipe.gate.num_records_in, time.perf_counter()
        time.sleep(calibration_seconds)
        full_rate = (pipe.gate.num_records_in - c0) / (time.perf_counter() - t0)
        if full_rate <= 0:
            raise RuntimeError("no records flowed during calibration")
        printer(f"full speed: {full_rate:,.0f} records/s "
                f"({buffers} buffers of {segment_size} bytes, local exchange)")
        printer(f"{'t [s]':>6} {'limits P/C [%]':>15} {'producer':>9} {'consumer':>9} "
                f"{'backpressure':>12} {'bp ms/s':>8} {'outPool':>7}")
        rows = []
        max_in_use = 0
        rss = [_rss_mb()]
        pipe.set_limits(*schedule[0], full_rate)
        pipe.producer_metrics.snapshot()
        pipe.consumer_metrics.snapshot()
        start = time.perf_counter()
        prev = (start, pipe.writer.num_records_out, pipe.gate.num_records_in)
        total_ticks = ticks_per_phase * len(schedule)
        for tick in range(1, total_ticks + 1):
            limits = schedule[(tick - 1) // ticks_per_phase]
            deadline = start + tick * interval
            while True:
                now = time.perf_counter()
                if now >= deadline:
                    break
                time.sleep(min(0.01, deadline - now))
                pool = pipe.partition.pool
                max_in_use = max(max_in_use, pool.num_requested - pool.num_available)
            now = time.perf_counter()
            produced, consumed = pipe.writer.num_records_out, pipe.gate.num_records_in
            p_snap = pipe.producer_metrics.snapshot()
            c_snap = pipe.consumer_metrics.snapshot()
            dt = now - prev[0]
            producer_pct = (produced - prev[1]) / dt / full_rate * 100
            consumer_pct = (consumed - prev[2]) / dt / full_rate * 100
            prev = (now, produced, consumed)
            rss.append(_rss_mb())
            row = {
                "t_seconds": round(tick * interval, 3),
                "producer_limit_pct": limits[0],
                "consumer_limit_pct": limits[1],
                "producer_pct": round(producer_pct, 2),
                "consumer_pct": round(consumer_pct, 2),
                "backpressure_level": _level_of(p_snap),
                "producer_back_pressured_ms_per_s": round(p_snap["backPressuredTimeMsPerSecond"], 1),
                "producer_busy_ms_per_s": round(p_snap["busyTimeMsPerSecond"], 1),
                "consumer_idle_ms_per_s": round(c_snap["idleTimeMsPerSecond"], 1),
                "consumer_busy_ms_per_s": round(c_snap["busyTimeMsPerSecond"], 1),
                "out_pool_usage": round(p_snap["outPoolUsage"], 3),
                "in_pool_usage": round(c_snap["inPoolUsage"], 3),
                "rss_mb": round(rss[-1], 1),
            }
            rows.append(row)
            printer(f"{row['t_seconds']:6.1f} {limits[0]:>7}/{limits[1]:<7} "
                    f"{producer_pct:8.1f}% {consumer_pct:8.1f}% {row['backpressure_level']:>12} "
                    f"{row['producer_back_pressured_ms_per_s']:8.0f} {row['out_pool_usage']:7.2f}")
            if tick % ticks_per_phase == 0 and tick < total_ticks:
                pipe.set_limits(*schedule[tick // ticks_per_phase], full_rate)
    finally:
        leaked = pipe.shutdown()
    doc = {
        "experiment": "backpressure",
        "config": {
            "phase_seconds": ticks_per_phase * interval,
            "interval_seconds": interval,
            "schedule": [list(s) for s in schedule],
            "segment_size": segment_size,
            "buffers_per_task": buffers,
            "buffer_timeout": buffer_timeout,
            "calibration_seconds": calibration_seconds,
            "record": "(int, int), typed codec",
            "exchange": "local: the consumer reads the producer's buffers by reference",
        },
        "full_speed_records_per_s": full_rate,
        "max_buffers_in_use": max_in_use,
        "buffers_leaked": leaked,
        "rss_mb": {"min": round(min(rss), 1), "max": round(max(rss), 1)},
        "rows": rows,
        "checks": check_backpressure(rows, ticks_per_phase),
    }
    write_outputs(out_dir, rows, doc, plot=plot)
    c = doc["checks"]
    printer(f"producer tracks the slowed consumer within {c['max_tracking_error_pct']:.1f}% "
            f"(<= 10%: {'yes' if c['tracks_consumer'] else 'NO'}); released: "
            f"{c['released_min_pct']:.0f}% of full speed at least; "
            f"buffers in use at most {max_in_use} of {buffers}")
    printer(f"wrote {os.path.join(out_dir, 'backpressure.csv')}"
            + (f" and {os.path.join(out_dir, 'backpressure.png')}" if plot else ""))
    return doc


def _phases(rows, ticks_per_phase):
    return [rows[i:i + ticks_per_phase] for i in range(0, len(rows), ticks_per_phase)]


def check_backpressure(rows, ticks_per_phase):
    """The expectations, from the rows: in phases where the consumer is
    slower than the producer, every interval after the first (0.5 s after
    the change) has the producer within 10 % of the consumer; in phases with
    both at 100 % both run near full speed."""
    errors, released, slowed = [], [], []
    for phase in _phases(rows, ticks_per_phase):
        p_lim, c_lim = phase[0]["producer_limit_pct"], phase[0]["consumer_limit_pct"]
        settled = phase[1:] if len(phase) > 1 else phase
        if c_lim < p_lim:
            for r in settled:
                base = max(r["consumer_pct"], 1e-9)
                errors.append(abs(r["producer_pct"] - r["consumer_pct"]) / base * 100)
                slowed.append(r["consumer_pct"])
        if p_lim >= 100 and c_lim >= 100:
            released.extend(min(r["producer_pct"], r["consumer_pct"]) for r in settled)
    max_err = max(errors) if errors else 0.0
    return {
        "max_tracking_error_pct": round(max_err, 2),
        "tracks_consumer": max_err <= 10.0,
        "slowed_mean_pct": round(sum(slowed) / len(slowed), 2) if slowed else None,
        "released_min_pct": round(min(released), 2) if released else None,
        "released_mean_pct": round(sum(released) / len(released), 2) if released else None,
    }


def write_outputs(out_dir, rows, doc, plot=True):
    with open(os.path.join(out_dir, "backpressure.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([r[c] for c in CSV_COLUMNS])
    with open(os.path.join(out_dir, "backpressure.json"), "w") as f:
        json.dump(doc, f, indent=2)
    if plot:
        from flinkbuf.experiments.plotting import plot_backpressure
        plot_backpressure(rows, doc, os.path.join(out_dir, "backpressure.png"))
