"""The Spark demo's second part: the keyed job (``(key, i)`` records,
counted per key in the consumer) through flinkbuf's pipelined exchange
and through Spark's shuffle, side by side (:func:`compare_with_spark_shuffle`).
"""

import collections
import time

from flinkbuf.experiments.output import VERDICT

KEYS = 10_000                   # keys of the records, i % KEYS


def keyed_source(count, num_tasks):
    """The keyed job's producer: ``count`` records over ``num_tasks``
    partitions (a function of ``mapPartitionsWithIndex``)."""
    def source(index, _):
        for i in range(index, count, num_tasks):
            yield (i % KEYS, i)
    return source


def count_per_key(records):
    """The keyed job's consumer: (first record's time, counts per key)."""
    first = None
    counts = collections.Counter()
    for key, _ in records:
        if first is None:
            first = time.time()
        counts[key] += 1
    yield (first, dict(counts))


def compare_with_spark_shuffle(sc, records, tasks, segment_size=32768, printer=print, *,
                               live_view=None):
    """The keyed job (``records`` ``(key, i)`` records in ``tasks``
    partitions, counted per key in the consumer) through flinkbuf's
    pipelined exchange and through Spark's shuffle; prints both side by
    side and returns them.  ``same_counts``: both counted every record,
    and the same per key."""
    from flinkbuf.io import assign_key_to_operator
    from flinkbuf.spark import pipelined_exchange

    source = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
        keyed_source(records, tasks))
    runs = {}
    for name, make in (
            ("flinkbuf", lambda: pipelined_exchange(source, count_per_key,
                                                    segment_size=max(segment_size, 32768),
                                                    live_view=live_view)),
            ("Spark shuffle", lambda: source.partitionBy(
                tasks, lambda k: assign_key_to_operator(k, tasks)).mapPartitions(
                    count_per_key))):
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
    f, s = runs["flinkbuf"], runs["Spark shuffle"]
    same = f["counts"] == s["counts"] and f["records"] == s["records"] == records > 0
    printer(f"the keyed job: {records:,} (int, int) records in {tasks} partitions, counted "
            f"per key in the consumer")
    printer(f"{'':>22} {'flinkbuf':>14} {'Spark shuffle':>14}")

    def rate(r):
        return "-" if r["records_per_s"] is None else f"{r['records_per_s']:,}"

    def first(r):
        return "-" if r["first_record_seconds"] is None else f"{r['first_record_seconds']:.3f}"
    printer(f"{'records/s':>22} {rate(f):>14} {rate(s):>14}")
    printer(f"{'seconds':>22} {f['seconds']:>14.2f} {s['seconds']:>14.2f}")
    printer(f"{'first record after s':>22} {first(f):>14} {first(s):>14}")
    printer(f"{'records counted':>22} {f['records']:>14,} {s['records']:>14,}")
    printer(f"same counts per key, every record counted: {VERDICT[same]}")
    for r in runs.values():
        del r["counts"]
    return {"records": records, "tasks": tasks, "runs": runs, "same_counts": same}
