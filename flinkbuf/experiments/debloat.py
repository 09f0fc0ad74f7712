"""Experiment 3: buffer debloating (Flink's FLIP-183) under the backpressure
schedule, off and on, side by side.

A producer task and a consumer task exchange ``(emit ns, sequence)``
records through ``buffers`` buffers of ``segment_size`` bytes (32 KiB,
Flink's) in this process, or with ``remote=True`` with the consumer in
another process reading over a connection (``buffers`` exclusive buffers
of credit; ``transport`` as in the backpressure experiment).  Each task
runs at a percentage of full speed, as in
:mod:`~flinkbuf.experiments.backpressure`: the producer at 60 %, the
consumer not slowed, then slowed to 30 %, released (both at 100 %),
slowed again and released.  Full speed is measured first, on the
exchange without debloating (a fraction of its unthrottled rate), and is
the same for both runs.

The schedule runs twice in one run: debloating off, then on (the gate and
the partition with ``buffer_debloat=True``, ``target`` seconds of data in
flight, sampled every ``period`` seconds, smoothed over ``samples``
samples: quicker than Flink's 0.2 s and 20, so that the size settles
within a phase of a few seconds).  Every ``interval`` seconds it records:
both tasks' throughput, the sojourn of the records read in the interval
(read time minus emit time; p50 and p99), the bytes in flight toward the
consumer (with debloating the gate's own count, its buffers in use times
the debloated size; without, the same buffers counted from the channels
and the partition, times the segment size), the segments the exchange's
buffers hold, the debloated buffer size and the segments handed back to
the network pools (the gate's and the partition's).

Outputs in ``out_dir``: ``debloat.csv`` (a row per interval and run),
``debloat.json`` (configuration, calibration, rows, per-phase summary,
checks) and, with matplotlib, ``debloat.png``.  The summary printed at the
end compares, per phase, the p99 sojourn and the throughput off and on
(over the second half of each phase, once the size has settled) and the
memory handed back.
"""

import array
import os
import statistics

from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments.arguments import (
    check_int,
    check_pool_fits,
    check_real,
    check_seconds,
    fail,
)
from flinkbuf.experiments.debloat_pipeline import LocalPipeline, RemotePipeline
from flinkbuf.experiments.failures import RunFailed
from flinkbuf.experiments.output import (
    VERDICT,
    load_plotting,
    prepare_out_dir,
    write_table_and_doc,
)
from flinkbuf.experiments.remote import check_transport, describe_transport, transport_in_use

NAME = "debloat"
OUTPUT_FILES = (f"{NAME}.csv", f"{NAME}.json", f"{NAME}.png")
DEFAULT_SCHEDULE = _bp.DEFAULT_SCHEDULE
MODES = ("off", "on")
CSV_COLUMNS = ("t_seconds", "debloat", "phase", "producer_limit_pct", "consumer_limit_pct",
               "producer_records_per_s", "consumer_records_per_s", "sojourn_p50_ms",
               "sojourn_p99_ms", "sojourn_records", "in_flight_bytes", "held_bytes",
               "buffer_size", "given_back_segments")
DEFAULT_PHASE_SECONDS = 3.0
QUICK_PHASE_SECONDS = 1.5
MIN_BUFFERS = 2
THROUGHPUT_KEPT_MIN = 0.8       # debloating on keeps >= 80 % of each phase's throughput off
MAX_KEPT_SOJOURNS = 1 << 20     # per phase and run; beyond, every other one (uniformly)


# Argument names of run_debloat (the command line names its options instead).
def check_arguments(phase_seconds, interval=0.1, segment_size=32768, buffers=16, target=0.1,
                    period=0.05, samples=10, full_speed_fraction=0.25, calibration_intervals=8,
                    remote=False, transport="auto", *, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_debloat` is in range; ``names`` maps parameter
    names to the names to report (say, command-line options)."""
    n = (names or {}).get
    check_real("interval", interval, ge=_bp.MIN_INTERVAL, le=10.0, names=names)
    check_seconds("phase_seconds", phase_seconds, names=names)
    if not phase_seconds >= 2 * interval:
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= twice "
             f"{n('interval', 'interval')} ({interval:g}): the summary takes the second half "
             "of each phase")
    check_int("segment_size", segment_size, ge=1024, le=1 << 20, names=names,
              why_low=" (debloating shrinks buffers from the segment size down to 256 bytes)")
    check_int("buffers", buffers, ge=MIN_BUFFERS, le=4096, names=names,
              why_low=" (one being filled, one in flight)")
    check_pool_fits(buffers, segment_size, count_param="buffers", size_param="segment_size",
                    names=names)
    check_real("target", target, gt=0, le=60.0, names=names)
    check_real("period", period, ge=0.001, le=10.0, names=names)
    check_int("samples", samples, ge=1, le=1000, names=names)
    check_real("full_speed_fraction", full_speed_fraction, ge=_bp.MIN_FULL_SPEED_FRACTION,
               le=1.0, names=names)
    check_int("calibration_intervals", calibration_intervals, ge=1, le=10_000, names=names)
    check_transport(transport, remote, names=names)


def run_debloat(out_dir, phase_seconds=DEFAULT_PHASE_SECONDS, *, interval=0.1,
                schedule=DEFAULT_SCHEDULE, segment_size=32768, buffers=16, target=0.1,
                period=0.05, samples=10, buffer_timeout=0.1, full_speed_fraction=0.25,
                calibration_intervals=8, remote=False, transport="auto", plot=True,
                printer=print):
    """Run the experiment, write its outputs to ``out_dir`` and return the
    JSON document (a dict; ``doc["checks"]["passed"]`` says whether the
    expectations held: in each slowed phase a lower p99 sojourn with
    debloating, in each phase at least ``THROUGHPUT_KEPT_MIN`` of the
    throughput, no buffer lost).  Every argument is checked, and
    ``out_dir`` made, before anything runs (:class:`ExperimentArgumentError`
    otherwise); without matplotlib the figure is skipped with a line saying
    how to get it."""
    check_arguments(phase_seconds, interval, segment_size, buffers, target, period, samples,
                    full_speed_fraction, calibration_intervals, remote, transport)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    ticks = max(2, round(phase_seconds / interval))
    options = {"target": target, "period": period, "samples": samples}
    config = {"phase_seconds": ticks * interval, "interval_seconds": interval,
              "schedule": [list(s) for s in schedule], "segment_size": segment_size,
              "buffers": buffers, "buffer_timeout": buffer_timeout,
              "full_speed_fraction": full_speed_fraction,
              "calibration_intervals": calibration_intervals,
              "buffer_debloat": {"target": target, "period": period, "samples": samples},
              "record": "(emit ns, sequence), typed codec"}

    def make(debloat):
        kw = dict(segment_size=segment_size, buffers=buffers, buffer_timeout=buffer_timeout)
        pipe = (RemotePipeline(debloat, options, transport=transport, **kw) if remote
                else LocalPipeline(debloat, options, **kw))
        pipe.start()
        return pipe

    runs, leaked = {}, {}
    pipe = make(False)
    try:
        unthrottled, calibration = _bp._calibrate(pipe, interval, calibration_intervals)
        full_rate = _bp._full_rate(unthrottled, None, full_speed_fraction, interval, schedule)
        used = transport_in_use(pipe.env) if remote else None
        config["exchange"] = _describe_exchange(remote, used, buffers, segment_size)
        config["transport"], config["transport_asked"] = used, transport if remote else None
        _print_start(printer, config, unthrottled, full_rate)
        runs["off"] = _run_schedule(pipe, "off", schedule, ticks, interval, full_rate, printer)
    finally:
        leaked["off"] = pipe.shutdown()
    _raise_errors(pipe)
    pipe = make(True)
    try:
        runs["on"] = _run_schedule(pipe, "on", schedule, ticks, interval, full_rate, printer)
    finally:
        leaked["on"] = pipe.shutdown()
    _raise_errors(pipe)
    phases = summarize(runs, schedule, ticks, interval)
    checks = check_debloat(phases, leaked)
    doc = {"experiment": NAME, "config": config, "unthrottled_records_per_s": round(unthrottled),
           "calibration_records_per_s": [round(s) for s in calibration],
           "full_speed_records_per_s": round(full_rate), "buffers_leaked": leaked,
           "rows": runs["off"]["rows"] + runs["on"]["rows"], "phases": phases,
           "checks": checks}
    drawn = write_outputs(out_dir, doc, plot=plot, printer=printer)
    print_summary(doc, printer)
    printer(f"wrote {os.path.join(out_dir, NAME + '.csv')}, {NAME}.json"
            + (f" and {NAME}.png" if drawn else ""))
    return doc


def _raise_errors(pipe):
    if pipe.errors:
        raise RunFailed.because("a task of the experiment failed", pipe.errors[0])


def _describe_exchange(remote, used, buffers, segment_size):
    if not remote:
        return (f"local: the consumer reads the producer's {buffers} buffers of {segment_size} "
                "bytes by reference")
    return (f"remote: the consumer in another process reads over {describe_transport(used)} "
            f"with {buffers} exclusive buffers of credit (and the producer's {buffers})")


def _print_start(printer, config, unthrottled, full_rate):
    d = config["buffer_debloat"]
    printer(f"exchange: {config['exchange']}")
    printer(f"debloating (on): target {d['target']:g} s in flight, a sample every "
            f"{d['period']:g} s, smoothed over {d['samples']}")
    printer(f"unthrottled: {unthrottled:,.0f} records/s; full speed (100 %): {full_rate:,.0f} "
            f"records/s = {config['full_speed_fraction']:g} x unthrottled (both runs)")
    printer(f"{'run':>3} {'t [s]':>6} {'limits P/C [%]':>15} {'consumer/s':>11} "
            f"{'sojourn p50':>11} {'p99 [ms]':>9} {'in flight':>10} {'size':>6} {'given back':>10}")


class _PhaseSojourns:
    """The sojourns (ns) of one phase, thinned uniformly (every other one
    kept, then every fourth, ...) past ``MAX_KEPT_SOJOURNS``; ``second_half``
    holds those of its second half alone."""

    def __init__(self):
        self.all = array.array("q")
        self.second_half = array.array("q")
        self._stride = 1
        self._seen = 0

    def add(self, values, second_half):
        kept = values[(-self._seen) % self._stride::self._stride] if self._stride > 1 \
            else values
        self._seen += len(values)
        self.all.extend(kept)
        if second_half:
            self.second_half.extend(kept)
        while len(self.all) > MAX_KEPT_SOJOURNS:
            self.all = self.all[::2]
            self.second_half = self.second_half[::2]
            self._stride *= 2


def percentile(sorted_values, q):
    """The ``q`` quantile (0..1) of ``sorted_values`` by rank (the value
    below which a fraction ``q`` lies); None for no values."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def _ms(ns):
    return None if ns is None else round(ns / 1e6, 3)


def _run_schedule(pipe, mode, schedule, ticks, interval, full_rate, printer):
    """One run of ``schedule``: a row per interval, and the sojourns of
    each phase (for the summary)."""
    pipe.set_limits(*schedule[0], full_rate)
    prev = pipe.sample()
    start = prev.t
    rows, kept = [], [_PhaseSojourns() for _ in schedule]
    for tick in range(1, ticks * len(schedule) + 1):
        phase = (tick - 1) // ticks
        pipe.wait_until(start + tick * interval)
        now = pipe.sample()
        sojourns = sorted(now.sojourns_ns)
        kept[phase].add(sojourns, (tick - 1) % ticks >= ticks // 2)
        row = _row(tick * interval, mode, phase, schedule[phase], prev, now, sojourns)
        prev = now
        rows.append(row)
        _print_row(printer, row)
        if tick % ticks == 0 and tick < ticks * len(schedule):
            pipe.set_limits(*schedule[phase + 1], full_rate)
    return {"rows": rows, "sojourns": kept}


def _row(t_seconds, mode, phase, limits, prev, now, sojourns):
    dt = now.t - prev.t
    return {
        "t_seconds": round(t_seconds, 3),
        "debloat": mode,
        "phase": phase + 1,
        "producer_limit_pct": limits[0],
        "consumer_limit_pct": limits[1],
        "producer_records_per_s": round((now.records_out - prev.records_out) / dt),
        "consumer_records_per_s": round((now.records_in - prev.records_in) / dt),
        "sojourn_p50_ms": _ms(percentile(sojourns, 0.5)),
        "sojourn_p99_ms": _ms(percentile(sojourns, 0.99)),
        "sojourn_records": len(sojourns),
        "in_flight_bytes": now.in_flight_bytes,
        "held_bytes": now.held_bytes,
        "buffer_size": now.buffer_size,
        "given_back_segments": now.given_back,
    }


def _print_row(printer, row):
    p50, p99 = row["sojourn_p50_ms"], row["sojourn_p99_ms"]
    printer(f"{row['debloat']:>3} {row['t_seconds']:6.1f} {row['producer_limit_pct']:>7g}/"
            f"{row['consumer_limit_pct']:<7g} {row['consumer_records_per_s']:>11,} "
            f"{'-' if p50 is None else f'{p50:.1f}':>11} "
            f"{'-' if p99 is None else f'{p99:.1f}':>9} "
            f"{row['in_flight_bytes'] / 1024:9.0f}K "
            f"{row['buffer_size'] if row['buffer_size'] is not None else '-':>6} "
            f"{row['given_back_segments']:>10}")


def summarize(runs, schedule, ticks, interval):
    """Per phase: its limits, and for each run the sojourn p50 / p99 over
    the whole phase and over its second half (ms), the consumer's median
    throughput over the second half, the median bytes in flight and the
    most segments handed back."""
    phases = []
    for k, limits in enumerate(schedule):
        entry = {"phase": k + 1, "producer_limit_pct": limits[0],
                 "consumer_limit_pct": limits[1],
                 "from_seconds": round(k * ticks * interval, 3),
                 "to_seconds": round((k + 1) * ticks * interval, 3)}
        for mode in MODES:
            rows = runs[mode]["rows"][k * ticks:(k + 1) * ticks]
            late = rows[ticks // 2:]
            kept = runs[mode]["sojourns"][k]
            whole, half = sorted(kept.all), sorted(kept.second_half)
            entry[mode] = {
                "sojourn_p50_ms": _ms(percentile(whole, 0.5)),
                "sojourn_p99_ms": _ms(percentile(whole, 0.99)),
                "settled_sojourn_p50_ms": _ms(percentile(half, 0.5)),
                "settled_sojourn_p99_ms": _ms(percentile(half, 0.99)),
                "consumer_records_per_s": round(statistics.median(
                    r["consumer_records_per_s"] for r in late)),
                "in_flight_bytes": round(statistics.median(r["in_flight_bytes"] for r in late)),
                "given_back_segments": max(r["given_back_segments"] for r in rows),
            }
        phases.append(entry)
    return phases


def check_debloat(phases, leaked):
    """The expectations, from the per-phase summary: in every slowed phase
    (consumer limit below the producer's) the settled p99 sojourn is lower
    with debloating than without (``sojourn_lower``); in every phase the
    consumer's settled throughput with debloating is at least
    ``THROUGHPUT_KEPT_MIN`` of the one without (``throughput_kept``); no
    buffer was lost (``no_buffer_lost``).  A check without such a phase is
    None (and does not fail)."""
    slowed = [p for p in phases if p["consumer_limit_pct"] < p["producer_limit_pct"]]
    lower = [(p["on"]["settled_sojourn_p99_ms"], p["off"]["settled_sojourn_p99_ms"])
             for p in slowed]
    sojourn_lower = (None if not lower or any(None in pair for pair in lower)
                     else all(on < off for on, off in lower))
    ratios = [p["on"]["consumer_records_per_s"] / p["off"]["consumer_records_per_s"]
              for p in phases if p["off"]["consumer_records_per_s"] > 0]
    kept = None if not ratios else min(ratios) >= THROUGHPUT_KEPT_MIN
    checks = {
        "sojourn_lower": sojourn_lower,
        "slowed_p99_ms": [{"phase": p["phase"], "off": off, "on": on}
                          for p, (on, off) in zip(slowed, lower)],
        "throughput_kept": kept,
        "min_throughput_ratio": round(min(ratios), 3) if ratios else None,
        "no_buffer_lost": all(n == 0 for n in leaked.values()),
        "thresholds": {"throughput_ratio": THROUGHPUT_KEPT_MIN},
    }
    checks["passed"] = all(checks[k] is not False
                           for k in ("sojourn_lower", "throughput_kept", "no_buffer_lost"))
    return checks


def print_summary(doc, printer):
    """The per-phase table (off vs on) and the verdict lines."""
    printer("per phase, over its second half (debloating off / on):")
    printer(f"{'phase':>5} {'limits P/C [%]':>15} {'p99 sojourn [ms]':>20} "
            f"{'consumer [records/s]':>25} {'in flight [KiB]':>17} {'given back':>10}")
    for p in doc["phases"]:
        off, on = p["off"], p["on"]
        p99 = f"{_fmt(off['settled_sojourn_p99_ms'])} / {_fmt(on['settled_sojourn_p99_ms'])}"
        rate = f"{off['consumer_records_per_s']:,} / {on['consumer_records_per_s']:,}"
        flight = f"{off['in_flight_bytes'] / 1024:.0f} / {on['in_flight_bytes'] / 1024:.0f}"
        printer(f"{p['phase']:>5} {p['producer_limit_pct']:>7g}/{p['consumer_limit_pct']:<7g} "
                f"{p99:>20} {rate:>25} {flight:>17} {on['given_back_segments']:>10}")
    c = doc["checks"]
    if c["sojourn_lower"] is not None:
        printer(f"slowed consumer: p99 sojourn lower with debloating: "
                f"{VERDICT[c['sojourn_lower']]}")
    if c["throughput_kept"] is not None:
        printer(f"throughput with debloating: at least {c['min_throughput_ratio']:.0%} of the "
                f"one without in every phase (>= {THROUGHPUT_KEPT_MIN:.0%}: "
                f"{VERDICT[c['throughput_kept']]})")
    printer(f"buffers lost: off {doc['buffers_leaked']['off']}, on "
            f"{doc['buffers_leaked']['on']} ({VERDICT[c['no_buffer_lost']]})")
    if not c["passed"]:
        printer("FAILED: the expectations above marked NO did not hold")


def _fmt(ms):
    return "-" if ms is None else f"{ms:.1f}"


def write_outputs(out_dir, doc, plot=True, printer=print):
    """The CSV table and the JSON document, then (with ``plot``) the figure
    if matplotlib is there.  True if the figure was drawn."""
    write_table_and_doc(out_dir, NAME, CSV_COLUMNS, doc["rows"], doc)
    plotting = load_plotting(printer) if plot else None
    if plotting is None:
        return False
    plotting.plot_debloat(doc, os.path.join(out_dir, f"{NAME}.png"))
    return True
