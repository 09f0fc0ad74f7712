"""flinkbuf.spark on ``local-cluster[2,1,1024]``: two executor JVMs on this
machine, each with its own Python workers, so the tasks of an exchange run
under different executors (one Spark start for the whole module)."""

import collections
import os

import pytest

from spark_helpers import leftovers, spark_session, stop, wait_for_executors

from flinkbuf.io import assign_key_to_operator
from flinkbuf.spark import current_task, pipelined_exchange

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sc():
    from pyspark import cloudpickle

    import spark_helpers

    cloudpickle.register_pickle_by_value(spark_helpers)
    cloudpickle.register_pickle_by_value(__import__(__name__))
    spark = spark_session("local-cluster[2,1,1024]", **{"spark.executor.memory": "768m"})
    wait_for_executors(spark.sparkContext, 2)
    yield spark.sparkContext
    stop(spark)


def _count_with_origin(records):
    task = current_task()
    counts = collections.Counter(k for k, _ in records)
    # The worker's parent is its executor's Python daemon: one per executor.
    yield ("where", task.index, os.getpid(), os.getppid(), task.environment.address[0])
    for kv in sorted(counts.items()):
        yield kv


def test_exchange_between_executors(sc):
    data = [(i % 101, i) for i in range(50_000)]
    rdd = sc.parallelize(data, 2)
    out = pipelined_exchange(rdd, _count_with_origin).glom().collect()
    where = [p[0] for p in out]
    assert [w[1] for w in where] == [0, 1]
    assert where[0][2] != where[1][2]                   # two worker processes
    assert where[0][3] != where[1][3]                   # under two executors
    assert all(w[4] == "127.0.0.1" for w in where)      # bound to the executor's address
    ours = [p[1:] for p in out]
    expected = (rdd.partitionBy(2, lambda k: assign_key_to_operator(k, 2))
                .mapPartitions(lambda it: sorted(collections.Counter(k for k, _ in it).items()))
                .glom().collect())
    assert ours == expected
    assert leftovers(sc, 2) == []
