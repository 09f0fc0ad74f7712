#!/usr/bin/env python
"""RecordWriter.emit_all against a loop of emit, and a keyed count through
a local exchange against the same count without one (conventions:
bench/run.py; every row of a group is measured in the same run).

Groups:

  * ``emit (int, int), round robin`` and ``emit (int, int), hash by the
    first field``: ``(i % 1000, i)`` records, typed codec, two channels;
    ``emit_loop`` is ``for r in records: writer.emit(r)``, ``emit_all``
    (the subject) is ``writer.emit_all(records)``.  The records go in
    batches of 20,000 and only the emitting is timed: between batches the
    gates are drained (untimed), so a consumer's work does not blur the
    ratio.  Target: emit_all at least 2x the loop.
  * ``keyed count``: N records ``(i % 1000, i)`` generated in Python and
    counted per key (the consumer of bench_spark.py).  ``python_floor``
    generates and counts in one loop, with no exchange at all: what any
    exchange in this process adds to; ``exchange_emit_loop`` has a producer
    thread emitting each record (hash by key, 2 channels) and a consumer
    thread iterating one gate over both; ``exchange_emit_all`` the same with
    ``emit_all`` (a consumer that counts in Python gains nothing from
    ``read_many``: it iterates the list).  Both threads share the GIL, so the
    exchange's own CPU per record adds to the floor's: ``read_alone`` is a
    gate yielding records already in its buffers, and the runner prints the
    bound ``floor / (floor + emit_all alone + read_alone)``.  Target:
    ``exchange_emit_all`` at least 0.95 of the floor's records/s.

``python bench/emit_all.py [--n N] [--rounds R] [--smoke]`` runs the rows
in turn round by round (each round in another order) and prints medians
and the ratios of the same run; ``python bench/run.py bench/emit_all.py``
runs the pytest-benchmark tests.  Compare release builds.
"""

import argparse
import collections
import functools
import itertools
import os
import statistics
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flinkbuf as fb  # noqa: E402
from conftest import scale  # noqa: E402

KEYS = 1000
BATCH = 20_000
SEGMENT = 32 * 1024
N = scale(1_000_000, 20_000)
SELECTORS = {"round robin": lambda: fb.RoundRobinSelector(start=0),
             "hash by the first field": fb.HashSelector.by_first_field}


def _exchange(selector, channels=2):
    nbp = fb.NetworkBufferPool(16 * channels + 64, SEGMENT)
    part = fb.create_partition(nbp, channels, min_buffers=8 * channels + 40)
    return nbp, part, fb.RecordWriter(part, selector, buffer_timeout=None)


def emit_ns(variant, selector, records):
    """Nanoseconds spent emitting ``records`` in batches (``emit_loop`` or
    ``emit_all``), the gates drained between batches."""
    nbp, part, writer = _exchange(selector)
    gates = [fb.InputGate([(part, c)]) for c in range(part.num_subpartitions)]
    emit, emit_all = writer.emit, writer.emit_all
    spent = 0
    for start in range(0, len(records), BATCH):
        chunk = records[start:start + BATCH]
        t0 = time.perf_counter_ns()
        if variant == "emit_all":
            emit_all(chunk)
        else:
            for r in chunk:
                emit(r)
        spent += time.perf_counter_ns() - t0
        writer.flush()
        for g in gates:
            while g.backlogs()[0]:
                g.read_many(BATCH)
    writer.close()
    for g in gates:
        assert g.read_many(BATCH) == []
        g.close()
    part.pool.destroy()
    nbp.destroy()
    return spent


def source(n):
    return ((i % KEYS, i) for i in range(n))


def python_floor(n):
    counts = collections.Counter()
    for k, _ in source(n):
        counts[k] += 1
    return counts


def keyed_count(variant, n):
    """The count through a local exchange: a producer thread, a consumer
    (this thread) reading one gate over both channels."""
    nbp, part, writer = _exchange(fb.HashSelector.by_first_field())
    gate = fb.InputGate([(part, c) for c in range(part.num_subpartitions)])

    def produce():
        with writer:
            if variant == "exchange_emit_all":
                writer.emit_all(source(n))
            else:
                emit = writer.emit
                for r in source(n):
                    emit(r)

    producer = threading.Thread(target=produce)
    producer.start()
    counts = collections.Counter()
    for k, _ in gate:
        counts[k] += 1
    producer.join()
    gate.close()
    part.pool.destroy()
    nbp.destroy()
    return counts


def read_ns(records):
    """Nanoseconds a gate takes to yield ``records``, each batch of them
    written beforehand (untimed) into its channel's buffers: decoding and
    making each record, consumed in C (no Python loop)."""
    nbp, part, writer = _exchange(fb.RoundRobinSelector(start=0), channels=1)
    gate = fb.InputGate([(part, 0)])
    spent = 0
    for start in range(0, len(records), BATCH):
        chunk = records[start:start + BATCH]
        writer.emit_all(chunk)
        writer.flush()
        t0 = time.perf_counter_ns()
        collections.deque(itertools.islice(gate, len(chunk)), maxlen=0)
        spent += time.perf_counter_ns() - t0
    writer.close()
    assert gate.read_many(BATCH) == []
    gate.close()
    part.pool.destroy()
    nbp.destroy()
    return spent


def _check(counts, n):
    assert sum(counts.values()) == n and len(counts) == min(n, KEYS)


# ---- pytest-benchmark --------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _records():
    return [(i % KEYS, i) for i in range(N)]


@pytest.mark.parametrize("selector", list(SELECTORS))
@pytest.mark.parametrize("variant", ["emit_loop", "emit_all"])
def test_emit(benchmark, variant, selector):
    benchmark.group = f"emit (int, int), {selector}"
    benchmark.extra_info.update(ops=N, subject=variant == "emit_all")
    if variant == "emit_all":
        benchmark.extra_info["target"] = ">= 2x emit_loop"
    spent = []
    benchmark.pedantic(lambda: spent.append(emit_ns(variant, SELECTORS[selector](), _records())),
                       rounds=scale(5, 1), iterations=1)
    benchmark.extra_info["ns_per_op"] = statistics.median(spent) / N


@pytest.mark.parametrize("variant", ["python_floor", "exchange_emit_loop", "exchange_emit_all"])
def test_keyed_count(benchmark, variant):
    benchmark.group = "keyed count"
    benchmark.extra_info.update(ops=N, subject=variant == "exchange_emit_all")
    if variant == "exchange_emit_all":
        benchmark.extra_info["target"] = ">= 0.95x python_floor's records/s"
    fn = python_floor if variant == "python_floor" else lambda n: keyed_count(variant, n)
    counts = benchmark.pedantic(fn, args=(N,), rounds=scale(5, 1), iterations=1)
    _check(counts, N)


# ---- the side-by-side runner ---------------------------------------------------------

def _rows(n):
    """Every row: (group, name, function -> ns per record)."""
    records = [(i % KEYS, i) for i in range(n)]
    rows = []
    for sel, make in SELECTORS.items():
        for variant in ("emit_loop", "emit_all"):
            rows.append((f"emit (int, int), {sel}", variant,
                         lambda v=variant, m=make: emit_ns(v, m(), records) / n))

    def timed(fn):
        t0 = time.perf_counter_ns()
        _check(fn(), n)
        return (time.perf_counter_ns() - t0) / n

    rows.append(("keyed count", "python_floor", lambda: timed(lambda: python_floor(n))))
    rows.append(("keyed count", "read_alone", lambda: read_ns(records) / n))
    for variant in ("exchange_emit_loop", "exchange_emit_all"):
        rows.append(("keyed count", variant, lambda v=variant: timed(lambda: keyed_count(v, n))))
    return rows


SUBJECTS = {"emit (int, int), round robin": ("emit_all", "emit_loop", 2.0),
            "emit (int, int), hash by the first field": ("emit_all", "emit_loop", 2.0),
            "keyed count": ("exchange_emit_all", "python_floor", 0.95)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="records a row (default 1 M)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--smoke", action="store_true", help="20,000 records, one round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.rounds = 20_000, 1
    rows = _rows(args.n)
    times = collections.defaultdict(list)
    for r in range(args.rounds):
        for group, name, fn in (rows if r % 2 == 0 else rows[::-1]):
            times[(group, name)].append(fn())
    print(f"N = {args.n:,} records a row, {args.rounds} round(s), median ns per record "
          f"(build: {'debug' if fb.buffer.debug_counters() is not None else 'release'})")
    for group, (subject, peer, target) in SUBJECTS.items():
        med = {name: statistics.median(t) for (g, name), t in times.items() if g == group}
        ratio = med[peer] / med[subject]
        print(f"\n== {group}")
        for name, ns in med.items():
            print(f"   {name:<20} {ns:9.1f} ns  {1e9 / ns:13,.0f} records/s")
        print(f"   {subject} / {peer}: {ratio:.2f}x the records/s (target >= {target}x): "
              f"{'met' if ratio >= target else 'NOT met'}")
        if group == "keyed count":
            _print_bound(times, med, ratio)


def _print_bound(times, med, ratio):
    """The keyed count's bound: the producer and the consumer share one
    GIL, so the exchange's own work per record, encoding (emit_all alone,
    hash selector) and decoding (read_alone), adds to the floor's."""
    emit = statistics.median(times[("emit (int, int), hash by the first field", "emit_all")])
    bound = med["python_floor"] / (med["python_floor"] + emit + med["read_alone"])
    print(f"   bound with one GIL: floor / (floor + emit_all alone {emit:.1f} ns + read_alone "
          f"{med['read_alone']:.1f} ns) = {bound:.2f}x; exchange_emit_all reaches "
          f"{ratio / bound:.0%} of it")


if __name__ == "__main__":
    main()
