"""Experiment 2: one slow subpartition hogging a shared output pool.

A producer distributes ``(int, int)`` records over two subpartitions that
share one output pool; each subpartition has its own consumer task, and
each consumer processes at most ``consumer_rate`` records/s (its work).  In
every mode but the first, consumer 0 is blocked: it takes its first record
and then stops, like a ``map`` function that sleeps forever in subtask 0.

Modes, and what each is expected to show:

* ``unimpeded``: plain round robin, nobody blocked: the fast consumer's
  reference throughput.
* ``shared-pool``: plain round robin: the blocked subpartition keeps every
  other record, its buffers pile up until they are all of the pool, and
  the producer, waiting for a buffer, starves the fast consumer too
  (expected: at most ``STARVED_MAX`` of the reference).
* ``per-channel-cap-only``: plain round robin, and the pool caps the
  buffers one subpartition may hold (Flink's ``max-buffers-per-channel``:
  at the cap the pool turns unavailable).  The blocked subpartition holds
  at most the cap, but round robin still waits for it: the fast consumer
  still starves (expected: at most ``STARVED_MAX``).  Not in the default
  modes; ask for it with ``modes``.
* ``per-channel-cap``: the same cap *with* the backlog-aware round robin,
  which keeps each subpartition under its cap by sending records
  elsewhere (expected: at least ``RESTORED_MIN`` of the reference).
* ``backlog-aware``: no cap; the backlog-aware round robin steers records away
  from a subpartition whose backlog shows it is blocked (backlog against
  the pool size; expected: at least ``RESTORED_MIN``).

With ``remote=True`` (``--remote``) both consumers run in another process
and read over a local connection (2 exclusive buffers of credit each, no
floating ones; shared memory with ``transport="auto"`` where the network
layer has it, else the transport named; the outputs say which): a blocked
consumer stops granting credit, its subpartition's buffers pile up in the
producer's pool the same way.

Outputs in ``out_dir``: ``slow-subpartition.csv`` (columns
``mode,fast_consumer_records_per_s,slow_consumer_records_per_s``),
``slow-subpartition.json`` and, with matplotlib, ``slow-subpartition.png``.
"""

import math
import os
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.experiments.arguments import (
    check_int,
    check_pool_fits,
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
    RemoteConsumers,
    buffers_not_returned,
    check_transport,
    describe_transport,
    new_secret,
    transport_in_use,
)
from flinkbuf.io import task_segments

DEFAULT_MODES = ("unimpeded", "shared-pool", "per-channel-cap", "backlog-aware")
MODES = ("unimpeded", "shared-pool", "per-channel-cap-only", "per-channel-cap", "backlog-aware")
CAPPED_MODES = ("per-channel-cap-only", "per-channel-cap")
ROUND_ROBIN_MODES = ("unimpeded", "shared-pool", "per-channel-cap-only")
CSV_COLUMNS = ("mode", "fast_consumer_records_per_s", "slow_consumer_records_per_s")
OUTPUT_FILES = ("slow-subpartition.csv", "slow-subpartition.json", "slow-subpartition.png")
STARVED_MAX = 0.10     # shared pool, cap alone: the fast consumer gets at most 10 % of unimpeded
RESTORED_MIN = 0.90    # cap with backlog-aware, backlog-aware: at least 90 %
MIN_POOL_BUFFERS = 3   # a partition of 2 subpartitions needs 2 + 1 buffers
MAX_CONSUMER_RATE = 10**9
_BATCH = 64
_STOP_TIMEOUT = 60.0
SLOW, FAST = 0, 1


def _warmup(phase_seconds):
    """The warm-up of each mode's run: a quarter of it, at most 0.5 s."""
    return min(0.5, phase_seconds / 4)


def min_consumer_rate(phase_seconds):
    """The lowest consumer rate (records/s) at which a consumer finishes a
    batch of records within the measured part of a mode's run, and within
    a second (a stopping consumer ends its batch first)."""
    measured = phase_seconds - _warmup(phase_seconds)
    return math.ceil(_BATCH / min(measured, 1.0))


def check_arguments(phase_seconds, consumer_rate=50_000, segment_size=4096, pool_buffers=16,
                    cap=6, modes=DEFAULT_MODES, remote=False, transport="auto", *, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_slow_subpartition` is in range; ``names`` maps
    parameter names to the names to report (say, command-line options)."""
    check_seconds("phase_seconds", phase_seconds, names=names)
    check_int("consumer_rate", consumer_rate, ge=min_consumer_rate(phase_seconds),
              le=MAX_CONSUMER_RATE, names=names,
              why_low=f" (records/s: each consumer works in batches of {_BATCH} records, and a "
                  "batch must fit the measured part of a mode's run and a second)")
    check_int("segment_size", segment_size, ge=1, names=names)
    check_int("pool_buffers", pool_buffers, ge=MIN_POOL_BUFFERS, names=names,
              why_low=" (2 subpartitions each fill one buffer while another is in flight)")
    check_int("cap", cap, ge=1, le=pool_buffers, names=names,
              why_high=" (a cap above the pool size caps nothing)")
    check_pool_fits(pool_buffers, segment_size, count_param="pool_buffers",
                    size_param="segment_size", names=names)
    name = (names or {}).get("modes", "modes")
    modes = list(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        fail(f"unknown modes {unknown} in {name}; the modes are {list(MODES)}")
    if not modes:
        fail(f"{name} must name at least one mode")
    if len(set(modes)) != len(modes):
        fail(f"{name} must not repeat a mode, got {modes}")
    check_transport(transport, remote, names=names)


class _ModeRun:
    """One mode's pipeline: a producer and two consumers (consumer 0
    blocked unless unimpeded), running until :meth:`stop`."""

    def __init__(self, mode, consumer_rate, segment_size, pool_buffers, cap):
        self.mode = mode
        self.transport = None
        self.nbp = fb.NetworkBufferPool(task_segments([pool_buffers]), segment_size)
        self.partition = fb.create_partition(
            self.nbp, 2, min_buffers=pool_buffers,
            max_buffers_per_channel=cap if mode in CAPPED_MODES else None, name=mode)
        if mode in ROUND_ROBIN_MODES:
            self.selector = fb.RoundRobinSelector()
        else:
            self.selector = fb.BacklogAwareRebalanceSelector()
        self.writer = fb.RecordWriter(self.partition, self.selector, name="producer")
        self.gates = [fb.InputGate([(self.partition, c)], name=f"consumer-{c}")
                      for c in (SLOW, FAST)]
        self.blocked = mode != "unimpeded"
        self.release = threading.Event()
        self.stopping = threading.Event()
        self.errors = []
        self.throttles = [Throttle(consumer_rate), Throttle(consumer_rate)]
        self.threads = [threading.Thread(target=self._produce, name=f"{mode}-producer",
                                         daemon=True)]
        self.threads += [threading.Thread(target=self._consume, args=(c,),
                                          name=f"{mode}-consumer-{c}", daemon=True)
                         for c in (SLOW, FAST)]

    def _produce(self):
        writer, stopping = self.writer, self.stopping
        i = 0
        try:
            while not stopping.is_set():
                for _ in range(_BATCH):
                    writer.emit((i, i % 5))
                    i += 1
            writer.close()
        except BaseException as exc:  # noqa: BLE001 - raised by run_slow_subpartition
            self.errors.append(exc)
            writer.fail(exc)

    def _consume(self, c):
        gate = self.gates[c]
        pace = self.throttles[c].pace
        stuck = c == SLOW and self.blocked
        n = 0
        try:
            for _ in gate:
                if stuck and not self.release.is_set():
                    self.release.wait()        # stuck in its work
                n += 1
                if n == _BATCH:
                    pace(n)
                    n = 0
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            gate.close()

    def start(self):
        for t in self.threads:
            t.start()

    def _counts(self):
        return [g.num_records_in for g in self.gates]

    def measure(self, warmup, measure_seconds):
        """After ``warmup`` seconds, each consumer's rate over
        ``measure_seconds``, and what the blocked subpartition holds then."""
        time.sleep(warmup)
        counts0 = self._counts()
        t0 = time.perf_counter()
        time.sleep(measure_seconds)
        counts1 = self._counts()
        dt = time.perf_counter() - t0
        self._seen_transport()
        return {
            "mode": self.mode,
            "fast_consumer_records_per_s": round((counts1[FAST] - counts0[FAST]) / dt, 1),
            "slow_consumer_records_per_s": round((counts1[SLOW] - counts0[SLOW]) / dt, 1),
            "buffers_held_by_blocked_subpartition": self.partition.pool.channel_count(SLOW),
            "records_steered": getattr(self.selector, "num_steered", 0),
            "producer_back_pressured_ms": round(self.writer.back_pressured_time_ns / 1e6, 1),
        }

    def _seen_transport(self):
        """Local: there is no connection."""

    def stop(self):
        """Release the blocked consumer, stop every task and destroy the
        pool; returns the number of buffers not given back."""
        self.stopping.set()
        self.release.set()
        for th in self.throttles:
            th.unthrottle()
        for t in self.threads:
            t.join(_STOP_TIMEOUT)
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            raise RunFailed(f"tasks did not stop: {alive}")
        if self.errors:
            raise self.errors[0]
        pool = self.partition.pool
        leaked = pool.num_requested - pool.num_available
        pool.destroy()
        return leaked


class _RemoteModeRun(_ModeRun):
    """The same mode with both consumers in another process, reading the
    producer's partition over a connection of ``transport``
    (:mod:`flinkbuf.network`)."""

    def __init__(self, mode, consumer_rate, segment_size, pool_buffers, cap, transport="auto"):
        from flinkbuf.network import NetworkEnvironment
        secret = new_secret()
        self.mode = mode
        self.transport = None
        self.env = NetworkEnvironment(task_segments([pool_buffers]), segment_size,
                                      secret=secret, transport=transport)
        self.nbp = self.env.network_buffer_pool
        self.partition = fb.create_partition(
            self.nbp, 2, min_buffers=pool_buffers,
            max_buffers_per_channel=cap if mode in CAPPED_MODES else None, name=mode)
        self.env.register_partition(mode, self.partition)
        if mode in ROUND_ROBIN_MODES:
            self.selector = fb.RoundRobinSelector()
        else:
            self.selector = fb.BacklogAwareRebalanceSelector()
        self.writer = fb.RecordWriter(self.partition, self.selector, name="producer")
        self.blocked = mode != "unimpeded"
        self.stopping = threading.Event()
        self.errors = []
        self.threads = [threading.Thread(target=self._produce, name=f"{mode}-producer",
                                         daemon=True)]
        try:
            self.consumers = RemoteConsumers(
                self.env, secret, [(mode, SLOW), (mode, FAST)], segment_size=segment_size,
                blocked=[self.blocked, False], full_rates=[consumer_rate, consumer_rate],
                transport=transport)
        except BaseException:
            self.writer.fail()
            self.env.close()
            raise

    def _counts(self):
        return self.consumers.counts()

    def _seen_transport(self):
        self.transport = transport_in_use(self.env)

    def stop(self):
        self.stopping.set()
        self.consumers.release()
        for k in (SLOW, FAST):
            self.consumers.set_limit(k, None)
        for t in self.threads:
            t.join(_STOP_TIMEOUT)
        alive, errors, _ = self.consumers.stop(_STOP_TIMEOUT)
        if self.threads[0].is_alive() or alive:
            self.writer.fail(RuntimeError("experiment shut down"))
            self.env.close()
            raise RunFailed("tasks did not stop")
        if self.errors:
            raise self.errors[0]
        if errors:
            raise RunFailed(f"a remote consumer failed: {errors[0]}")
        leaked = buffers_not_returned(self.partition.pool)
        self.env.close()
        return leaked


def _run_mode(mode, measure_seconds, warmup, consumer_rate, segment_size, pool_buffers, cap,
              remote=False, transport="auto"):
    if remote:
        run = _RemoteModeRun(mode, consumer_rate, segment_size, pool_buffers, cap, transport)
    else:
        run = _ModeRun(mode, consumer_rate, segment_size, pool_buffers, cap)
    run.start()
    try:
        result = run.measure(warmup, measure_seconds)
    finally:
        leaked = run.stop()
    result["buffers_leaked"] = leaked
    if remote:
        result["transport"] = run.transport
    return result


def check_slow_subpartition(results, cap=None):
    """The expectations, from the results: with a plain shared pool, and
    with the per-channel cap alone, the fast consumer starves (at most
    ``STARVED_MAX`` of its unimpeded rate); with the cap and the
    backlog-aware round robin, and with the backlog-aware round robin alone, it
    gets at least ``RESTORED_MIN`` of it; given the ``cap``, the blocked
    subpartition holds at most that many buffers in the capped modes.  A
    check whose modes did not run is None (and does not fail)."""
    fast = {r["mode"]: r["fast_consumer_records_per_s"] for r in results}
    base = fast.get("unimpeded")
    ratios = {m: round(v / base, 3) for m, v in fast.items()} if base else {}
    # the reference: None when unimpeded did not run; False when it read nothing
    # (then no comparison can be made, and the run does not pass)
    reference = None if base is None else base > 0

    capped = [r for r in results if r["mode"] in CAPPED_MODES]

    def ratio_check(mode, ok):
        return None if mode not in ratios else ok(ratios[mode])

    checks = {
        "reference_measured": reference,
        "fast_vs_unimpeded": ratios,
        "shared_pool_starves": ratio_check("shared-pool", lambda x: x <= STARVED_MAX),
        "per_channel_cap_only_starves": ratio_check("per-channel-cap-only",
                                                    lambda x: x <= STARVED_MAX),
        "per_channel_cap_restores": ratio_check("per-channel-cap", lambda x: x >= RESTORED_MIN),
        "backlog_aware_restores": ratio_check("backlog-aware", lambda x: x >= RESTORED_MIN),
        "cap_bounds_blocked_subpartition": None if cap is None or not capped else all(
            r["buffers_held_by_blocked_subpartition"] <= cap for r in capped),
        "no_leaks": all(r["buffers_leaked"] == 0 for r in results),
        "thresholds": {"starved_max": STARVED_MAX, "restored_min": RESTORED_MIN},
    }
    checks["passed"] = all(checks[k] is not False for k in (
        "reference_measured", "shared_pool_starves", "per_channel_cap_only_starves",
        "per_channel_cap_restores", "backlog_aware_restores",
        "cap_bounds_blocked_subpartition", "no_leaks"))
    return checks


def run_slow_subpartition(out_dir, phase_seconds=3.0, *, consumer_rate=50_000,
                          segment_size=4096, pool_buffers=16, cap=6, modes=DEFAULT_MODES,
                          remote=False, transport="auto", plot=True, printer=print):
    """Run every mode of ``modes`` (see :data:`MODES`) for ``phase_seconds``
    (a quarter of it, at most 0.5 s, is warm-up), write the outputs to
    ``out_dir`` and return the JSON document (``doc["checks"]["passed"]``:
    whether the expectations held).  Every argument is checked, and
    ``out_dir`` made, before anything runs (:class:`ExperimentArgumentError`,
    a ``ValueError``, otherwise).  Without matplotlib the figure is skipped
    with a line saying how to get it.  ``remote``: the consumers in another
    process, over a connection of ``transport`` (``"auto"``: the fastest
    on this host, shared memory where the network layer has it; ``"shm"``,
    ``"unix"`` or ``"tcp"``)."""
    check_arguments(phase_seconds, consumer_rate, segment_size, pool_buffers, cap, modes,
                    remote, transport)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    warmup = _warmup(phase_seconds)
    measure = phase_seconds - warmup
    printer(f"2 consumers at most {consumer_rate:,} records/s each; shared pool of "
            f"{pool_buffers} x {segment_size} bytes; cap {cap} buffers per subpartition "
            f"(per-channel-cap modes); consumer {SLOW} blocked except when unimpeded"
            + ("; the consumers in another process" if remote else ""))
    printer(f"{'mode':<20} {'fast rec/s':>12} {'blocked rec/s':>14} {'fast vs unimpeded':>18}")
    results = []
    base = None                 # the unimpeded fast consumer's rate, once measured
    for mode in modes:
        r = _run_mode(mode, measure, warmup, consumer_rate, segment_size, pool_buffers, cap,
                      remote, transport)
        results.append(r)
        if mode == "unimpeded":
            base = r["fast_consumer_records_per_s"]
        vs = f"{r['fast_consumer_records_per_s'] / base:17.0%}" if base else f"{'n/a':>17}"
        printer(f"{mode:<20} {r['fast_consumer_records_per_s']:12,.0f} "
                f"{r['slow_consumer_records_per_s']:14,.0f} {vs}")
    used = sorted({r["transport"] or "" for r in results}) if remote else []
    used = (used[0] or None) if len(used) == 1 else None
    if remote:
        printer(f"the consumers read over {describe_transport(used)}")
    checks = check_slow_subpartition(results, cap)
    doc = {
        "experiment": "slow-subpartition",
        "config": {
            "phase_seconds": phase_seconds,
            "warmup_seconds": warmup,
            "consumer_rate": consumer_rate,
            "segment_size": segment_size,
            "pool_buffers": pool_buffers,
            "max_buffers_per_channel": cap,
            "modes": list(modes),
            "record": "(int, int), typed codec",
            "blocked_consumer": SLOW,
            "exchange": (f"remote: the consumers in another process, over "
                         f"{describe_transport(used)}" if remote else "local"),
            "transport": used if remote else None,
            "transport_asked": transport if remote else None,
        },
        "results": results,
        "checks": checks,
    }
    write_table_and_doc(out_dir, "slow-subpartition", CSV_COLUMNS, results, doc)
    png = os.path.join(out_dir, "slow-subpartition.png")
    plotting = load_plotting(printer) if plot else None
    if plotting is not None:
        plotting.plot_slow_subpartition(results, doc, png)
    _print_summary(checks, cap, printer)
    printer(f"wrote {os.path.join(out_dir, 'slow-subpartition.csv')}"
            + (f" and {png}" if plotting is not None else ""))
    return doc


def _print_summary(checks, cap, printer):
    if checks["reference_measured"] is None:
        printer("no comparison: the expectations compare the fast consumer with the unimpeded "
                "mode, which did not run")
    elif not checks["reference_measured"]:
        printer("inconclusive: the fast consumer read nothing in the unimpeded mode, so there "
                "is no reference to compare with")
    line = (f"shared pool starves the fast consumer (<= {STARVED_MAX:.0%} of unimpeded): "
            f"{VERDICT[checks['shared_pool_starves']]}")
    if checks["per_channel_cap_only_starves"] is not None:
        line += (f"; so does the per-channel cap alone: "
                 f"{VERDICT[checks['per_channel_cap_only_starves']]}")
    printer(line)
    printer(f"restored (>= {RESTORED_MIN:.0%}) by the per-channel cap with the backlog-aware "
            f"round robin: {VERDICT[checks['per_channel_cap_restores']]}, by the backlog-aware "
            f"round robin alone: {VERDICT[checks['backlog_aware_restores']]}")
    if checks["cap_bounds_blocked_subpartition"] is not None:
        printer(f"the blocked subpartition holds at most the cap of {cap} buffers in the "
                f"per-channel-cap modes: {VERDICT[checks['cap_bounds_blocked_subpartition']]}")
    if not checks["no_leaks"]:
        printer("every buffer given back after each mode: NO")
    if not checks["passed"]:
        printer("FAILED: the expectations above marked NO did not hold"
                if checks["reference_measured"] is not False else
                "FAILED: nothing to compare with")
