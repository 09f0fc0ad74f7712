"""Experiment 2: one blocked subpartition hogging a shared output pool (seed 003).

A producer distributes ``(int, int)`` records over two subpartitions that
share one output pool; each subpartition has its own consumer task, and
each consumer processes at most ``consumer_rate`` records/s (its work).  In
every mode but the first, consumer 0 is blocked: it takes its first record
and then stops, like the seed's ``map`` that sleeps in subtask 0.

Modes:

* ``unimpeded``: plain round robin, nobody blocked (the fast consumer's
  reference throughput);
* ``shared-pool``: plain round robin: the blocked subpartition keeps every
  other record, its buffers pile up until they are all of the pool, and
  the producer, waiting for a buffer, starves the fast consumer too;
* ``per-channel-cap``: the pool caps the buffers one subpartition may hold
  (Flink's ``max-buffers-per-channel``: at the cap the pool turns
  unavailable), and the backlog-aware rebalance keeps each subpartition
  under its cap by sending records elsewhere (a cap alone cannot help round
  robin: the writer would wait for the blocked channel);
* ``backlog-aware``: no cap; the backlog-aware rebalance steers records away
  from a subpartition whose backlog shows it is blocked (the seed's
  proposal: backlog against the pool size).

Outputs in ``out_dir``: ``slow-subpartition.csv`` (columns
``mode,fast_consumer_records_per_s,slow_consumer_records_per_s``),
``slow-subpartition.json`` and ``slow-subpartition.png``.
"""

import os
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments._output import VERDICT, write_table_and_doc
from flinkbuf.experiments._throttle import Throttle

MODES = ("unimpeded", "shared-pool", "per-channel-cap", "backlog-aware")
CSV_COLUMNS = ("mode", "fast_consumer_records_per_s", "slow_consumer_records_per_s")
STARVED_MAX = 0.10     # shared pool: the fast consumer gets at most 10 % of its unimpeded rate
RESTORED_MIN = 0.90    # cap / backlog-aware: at least 90 %
_BATCH = 64
SLOW, FAST = 0, 1


def _run_mode(mode, measure_seconds, warmup, consumer_rate, segment_size, pool_buffers, cap):
    nbp = fb.NetworkBufferPool(pool_buffers, segment_size)
    partition = fb.create_partition(
        nbp, 2, min_buffers=pool_buffers,
        max_buffers_per_channel=cap if mode == "per-channel-cap" else None, name=mode)
    if mode in ("unimpeded", "shared-pool"):
        selector = fb.RoundRobinSelector()
    else:
        selector = fb.BacklogAwareRebalanceSelector()
    writer = fb.RecordWriter(partition, selector, name="producer")
    gates = [fb.InputGate([(partition, c)], name=f"consumer-{c}") for c in (SLOW, FAST)]
    blocked = mode != "unimpeded"
    release = threading.Event()
    stop = threading.Event()
    errors = []
    throttles = [Throttle(consumer_rate), Throttle(consumer_rate)]

    def produce():
        i = 0
        try:
            while not stop.is_set():
                for _ in range(_BATCH):
                    writer.emit((i, i % 5))
                    i += 1
            writer.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            writer.fail(exc)

    def consume(c):
        gate = gates[c]
        pace = throttles[c].pace
        n = 0
        try:
            for _ in gate:
                if c == SLOW and blocked and not release.is_set():
                    release.wait()        # stuck in its work, as in the seed
                n += 1
                if n == _BATCH:
                    pace(n)
                    n = 0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            gate.close()

    threads = [threading.Thread(target=produce, name=f"{mode}-producer", daemon=True)]
    threads += [threading.Thread(target=consume, args=(c,), name=f"{mode}-consumer-{c}",
                                 daemon=True) for c in (SLOW, FAST)]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup)
        counts0 = [g.num_records_in for g in gates]
        t0 = time.perf_counter()
        time.sleep(measure_seconds)
        counts1 = [g.num_records_in for g in gates]
        dt = time.perf_counter() - t0
        pool = partition.pool
        held_by_slow = pool.channel_count(SLOW)
        steered = getattr(selector, "num_steered", 0)
        bp_ms = writer.back_pressured_time_ns / 1e6
    finally:
        stop.set()
        release.set()
        for th in throttles:
            th.unthrottle()
        for t in threads:
            t.join(60)
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise RuntimeError(f"tasks did not stop: {alive}")
    if errors:
        raise errors[0]
    leaked = pool.num_requested - pool.num_available
    pool.destroy()
    return {
        "mode": mode,
        "fast_consumer_records_per_s": round((counts1[FAST] - counts0[FAST]) / dt, 1),
        "slow_consumer_records_per_s": round((counts1[SLOW] - counts0[SLOW]) / dt, 1),
        "buffers_held_by_blocked_subpartition": held_by_slow,
        "records_steered": steered,
        "producer_back_pressured_ms": round(bp_ms, 1),
        "buffers_leaked": leaked,
    }


def check_slow_subpartition(results):
    """The expectations, from the results: with a plain shared pool the
    fast consumer starves (at most ``STARVED_MAX`` of its unimpeded rate);
    with the per-channel cap and with the backlog-aware rebalance it gets
    at least ``RESTORED_MIN`` of it.  A check whose modes did not run is
    None (and does not fail)."""
    fast = {r["mode"]: r["fast_consumer_records_per_s"] for r in results}
    base = fast.get("unimpeded")
    ratios = {m: round(v / base, 3) for m, v in fast.items()} if base else {}

    def ratio_check(mode, ok):
        return None if mode not in ratios else ok(ratios[mode])

    checks = {
        "fast_vs_unimpeded": ratios,
        "shared_pool_starves": ratio_check("shared-pool", lambda x: x <= STARVED_MAX),
        "per_channel_cap_restores": ratio_check("per-channel-cap", lambda x: x >= RESTORED_MIN),
        "backlog_aware_restores": ratio_check("backlog-aware", lambda x: x >= RESTORED_MIN),
        "no_leaks": all(r["buffers_leaked"] == 0 for r in results),
        "thresholds": {"starved_max": STARVED_MAX, "restored_min": RESTORED_MIN},
    }
    checks["passed"] = all(checks[k] is not False for k in (
        "shared_pool_starves", "per_channel_cap_restores", "backlog_aware_restores", "no_leaks"))
    return checks


def run_slow_subpartition(out_dir, phase_seconds=3.0, *, consumer_rate=50_000,
                          segment_size=4096, pool_buffers=16, cap=6, modes=MODES, plot=True,
                          printer=print):
    """Run every mode for ``phase_seconds`` (a quarter of it, at most 0.5 s,
    is warm-up), write the outputs to ``out_dir`` and return the JSON
    document (``doc["checks"]["passed"]``: whether the expectations held)."""
    if not phase_seconds > 0:
        raise ValueError(f"phase_seconds must be > 0, got {phase_seconds}")
    for name, value in (("consumer_rate", consumer_rate), ("segment_size", segment_size),
                        ("pool_buffers", pool_buffers), ("cap", cap)):
        if not value >= 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; the modes are {list(MODES)}")
    os.makedirs(out_dir, exist_ok=True)
    warmup = min(0.5, phase_seconds / 4)
    measure = phase_seconds - warmup
    printer(f"2 consumers at most {consumer_rate:,} records/s each; shared pool of "
            f"{pool_buffers} x {segment_size} bytes; cap {cap} buffers per subpartition "
            f"(per-channel-cap mode); consumer {SLOW} blocked except when unimpeded")
    printer(f"{'mode':<16} {'fast rec/s':>12} {'blocked rec/s':>14} {'fast vs unimpeded':>18}")
    results = []
    base = None                 # the unimpeded fast consumer's rate, once measured
    for mode in modes:
        r = _run_mode(mode, measure, warmup, consumer_rate, segment_size, pool_buffers, cap)
        results.append(r)
        if mode == "unimpeded":
            base = r["fast_consumer_records_per_s"] or 1.0
        vs = f"{r['fast_consumer_records_per_s'] / base:17.0%}" if base else f"{'n/a':>17}"
        printer(f"{mode:<16} {r['fast_consumer_records_per_s']:12,.0f} "
                f"{r['slow_consumer_records_per_s']:14,.0f} {vs}")
    checks = check_slow_subpartition(results)
    doc = {
        "experiment": "slow-subpartition",
        "config": {
            "phase_seconds": phase_seconds,
            "warmup_seconds": warmup,
            "consumer_rate": consumer_rate,
            "segment_size": segment_size,
            "pool_buffers": pool_buffers,
            "max_buffers_per_channel": cap,
            "record": "(int, int), typed codec",
            "blocked_consumer": SLOW,
        },
        "results": results,
        "checks": checks,
    }
    write_table_and_doc(out_dir, "slow-subpartition", CSV_COLUMNS, results, doc)
    if plot:
        from flinkbuf.experiments.plotting import plot_slow_subpartition
        plot_slow_subpartition(results, doc, os.path.join(out_dir, "slow-subpartition.png"))
    printer(f"shared pool starves the fast consumer (<= {STARVED_MAX:.0%} of unimpeded): "
            f"{VERDICT[checks['shared_pool_starves']]}; restored (>= {RESTORED_MIN:.0%}) by the "
            f"per-channel cap: {VERDICT[checks['per_channel_cap_restores']]}, by the backlog-aware "
            f"rebalance: {VERDICT[checks['backlog_aware_restores']]}")
    if not checks["passed"]:
        printer("FAILED: the expectations above marked NO did not hold")
    printer(f"wrote {os.path.join(out_dir, 'slow-subpartition.csv')}"
            + (f" and {os.path.join(out_dir, 'slow-subpartition.png')}" if plot else ""))
    return doc
