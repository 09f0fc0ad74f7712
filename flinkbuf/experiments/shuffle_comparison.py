"""The Spark demo's second part: the keyed job (``(key, i)`` records,
counted per key in the consumer) through flinkbuf's pipelined exchange
and through Spark's shuffle, side by side (:func:`compare_with_spark_shuffle`).
On a Spark Connect session the records are rows of a DataFrame, exchanged
by :func:`~flinkbuf.spark.arrow_exchange` and by Spark's shuffle
(``repartition(n, "key").mapInArrow``).
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


def count_batches_per_key(batches):
    """:func:`count_per_key` over Arrow batches (``key``, ``i``): a row per
    key counted (``key``, ``n``), each with the first record's time
    (``first``, NaN for a consumer without records)."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    first = None
    counts = np.zeros(KEYS, dtype=np.int64)
    for batch in batches:
        if first is None and batch.num_rows:
            first = time.time()
        np.add.at(counts, batch.column(0).to_numpy(), 1)
    keys = np.flatnonzero(counts)
    yield pa.RecordBatch.from_arrays(
        [pa.array(keys), pa.array(counts[keys]),
         pa.array(np.full(len(keys), np.nan if first is None else first))],
        names=["key", "n", "first"])


def _rdd_jobs(sc, records, tasks, segment_size, live_view):
    """The keyed job over an RDD through each exchange: ``(name, run)``,
    ``run()`` its output, as :func:`_rdd_tally` reads it."""
    from flinkbuf.io import assign_key_to_operator
    from flinkbuf.spark import pipelined_exchange

    source = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
        keyed_source(records, tasks))
    return (("flinkbuf", lambda: pipelined_exchange(source, count_per_key,
                                                    segment_size=max(segment_size, 32768),
                                                    live_view=live_view).collect()),
            ("Spark shuffle", lambda: source.partitionBy(
                tasks, lambda k: assign_key_to_operator(k, tasks)).mapPartitions(
                    count_per_key).collect()))


def _rdd_tally(out):
    """``(first record times, counts per key)`` of a run over an RDD."""
    counts = collections.Counter()
    for _, c in out:
        counts.update(c)
    return [f for f, _ in out if f is not None], counts


def _dataframe_jobs(spark, records, tasks, segment_size, live_view):
    """The keyed job over a DataFrame (rows ``key``, ``i``) through
    arrow_exchange (its own buffer size) and through Spark's shuffle."""
    from flinkbuf.spark import arrow_exchange

    source = spark.range(0, records, 1, tasks).selectExpr(f"id % {KEYS} AS key", "id AS i")
    schema = "key long, n long, first double"
    return (("flinkbuf", lambda: arrow_exchange(source, count_batches_per_key, "key", schema,
                                                live_view=live_view).collect()),
            ("Spark shuffle", lambda: source.repartition(tasks, "key").mapInArrow(
                count_batches_per_key, schema).collect()))


def _dataframe_tally(out):
    """``(first record times, counts per key)`` of a run over a DataFrame."""
    counts = collections.Counter()
    for row in out:
        counts[row["key"]] += row["n"]
    return sorted({row["first"] for row in out if row["first"] == row["first"]}), counts


def compare_with_spark_shuffle(sc, records, tasks, segment_size=32768, printer=print, *,
                               live_view=None):
    """The keyed job (``records`` ``(key, i)`` records in ``tasks``
    partitions, counted per key in the consumer) through flinkbuf's
    pipelined exchange and through Spark's shuffle; prints both side by
    side and returns them.  ``same_counts``: both counted every record,
    and the same per key.  ``sc``: a SparkContext, or a Spark Connect
    session (the records as rows of a DataFrame, through arrow_exchange)."""
    from flinkbuf.experiments.spark_launcher import is_connect

    connect = is_connect(sc)
    jobs, tally = ((_dataframe_jobs, _dataframe_tally) if connect else (_rdd_jobs, _rdd_tally))
    runs = {}
    for name, run in jobs(sc, records, tasks, segment_size, live_view):
        t0 = time.time()
        out = run()
        took = time.time() - t0
        firsts, counts = tally(out)
        runs[name] = {
            "seconds": round(took, 3),
            "records_per_s": round(records / took) if took > 0 else None,
            "first_record_seconds": round(min(firsts) - t0, 3) if firsts else None,
            "records": sum(counts.values()),
            "counts": counts,
        }
    f, s = runs["flinkbuf"], runs["Spark shuffle"]
    same = f["counts"] == s["counts"] and f["records"] == s["records"] == records > 0
    what = "(long, long) rows of a DataFrame" if connect else "(int, int) records"
    printer(f"the keyed job: {records:,} {what} in {tasks} partitions, counted per key in "
            f"the consumer")
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
