"""arrow_exchange on either kind of Spark session: a classic one (a
SparkContext in this process) and Spark Connect (a client, no SparkContext).
One driver serves both: a local[2] session of this process that serves
Spark Connect on loopback, and a Connect session on it.  The driver
encrypts its own traffic (``spark.network.crypto.enabled``), as a cluster's
may."""

import gc
import time

import pytest

from spark_helpers import leftovers, spark_session, stop

from flinkbuf.errors import InsufficientSlotsError


@pytest.fixture(scope="module")
def sessions():
    import warnings

    from pyspark import cloudpickle

    import spark_helpers

    cloudpickle.register_pickle_by_value(spark_helpers)
    cloudpickle.register_pickle_by_value(__import__(__name__))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Spark's own barrier check as it is by default (40 tries, 15 s apart).
        classic, connect = spark_session(
            "local[2]", connect=True,
            **{"spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "40",
               "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "15s",
               "spark.authenticate": "true", "spark.network.crypto.enabled": "true"})
    yield {"classic": classic, "connect": connect}
    stop(connect, classic)


@pytest.fixture(scope="module", params=["classic", "connect"])
def spark(request, sessions):
    return sessions[request.param]


@pytest.fixture(scope="module")
def connect(sessions):
    return sessions["connect"]


def _rows_with_task(batches):
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    from flinkbuf.spark import current_task

    index = BarrierTaskContext.get().partitionId()
    segment = current_task().environment.network_buffer_pool.segment_size
    for batch in batches:
        assert isinstance(batch, pa.RecordBatch)
        yield pa.RecordBatch.from_arrays(
            [batch.column(0), batch.column(1), pa.array([index] * batch.num_rows, pa.int32()),
             pa.array([segment] * batch.num_rows, pa.int32())],
            names=["k", "v", "task", "segment"])


def _count_per_key(batches):
    import collections

    import pyarrow as pa

    counts = collections.Counter()
    for batch in batches:
        counts.update(batch.column(0).to_pylist())
    yield pa.RecordBatch.from_pydict({"name": list(counts), "n": list(counts.values())})


def _names(spark, rows, keys, partitions=2):
    # Expressions as SQL text: pyspark.sql.functions makes the columns of
    # one kind of session per process.
    return spark.range(0, rows, numPartitions=partitions).selectExpr(
        f"concat('k', CAST(id % {keys} AS STRING)) AS name", "id")


def test_rows_reach_their_key_s_task(spark):
    from flinkbuf.spark import arrow_exchange, key_partitions
    from flinkbuf.spark.arrow import default_segment_size

    df = spark.range(0, 20_000, numPartitions=2).selectExpr("id % 101 AS k", "id AS v")
    out = arrow_exchange(df, _rows_with_task, "k",
                         "k long, v long, task int, segment int").toPandas()
    assert sorted(out["v"]) == list(range(20_000))
    assert (out["task"].to_numpy() == key_partitions(out["k"].to_numpy(), 2)).all()
    assert set(out["task"]) == {0, 1}
    assert set(out["segment"]) == {default_segment_size(2)}     # the default buffers


def _keyed_squares(batches):
    """map_input: each input row's square, keyed, made where it is exchanged."""
    import os

    import pyarrow as pa

    for batch in batches:
        ids = batch.column(0).to_numpy()
        yield pa.RecordBatch.from_arrays(
            [pa.array(ids % 7), pa.array(ids * ids), pa.array([os.getpid()] * len(ids))],
            names=["k", "square", "made_in"])


def _with_reader(batches):
    import os

    import pyarrow as pa

    from flinkbuf.spark import current_task

    segment = current_task().environment.network_buffer_pool.segment_size
    for batch in batches:
        yield pa.RecordBatch.from_arrays(
            batch.columns + [pa.array([os.getpid()] * batch.num_rows),
                             pa.array([segment] * batch.num_rows)],
            names=batch.schema.names + ["read_in", "segment"])


def _unkeyed(batches):
    for batch in batches:
        yield batch.rename_columns(["not_k"])


def test_map_input_makes_the_batches_in_the_exchange_s_own_worker(spark):
    """map_input's batches are what the tasks exchange, made in the Python
    worker that exchanges them and runs fn (a key column the DataFrame
    lacks); a batch without the key fails the job saying so."""
    from flinkbuf.spark import arrow_exchange, key_partitions

    df = spark.range(0, 5000, numPartitions=2)
    out = arrow_exchange(df, _with_reader, "k",
                         "k long, square long, made_in long, read_in long, segment long",
                         map_input=_keyed_squares, segment_size=4096).toPandas()
    assert sorted(out["square"]) == [i * i for i in range(5000)]
    assert (out["k"].to_numpy() ** 2 % 7 == out["square"].to_numpy() % 7).all()
    tasks = key_partitions(out["k"].to_numpy(), 2)
    readers = {t: set(out["read_in"][tasks == t]) for t in (0, 1)}
    assert all(len(r) == 1 for r in readers.values()) and readers[0] != readers[1]
    # Every row read in a task's worker was made in one of the two tasks' workers.
    assert set(out["made_in"]) == readers[0] | readers[1]
    assert set(out["segment"]) == {4096}
    with pytest.raises(Exception, match="key 'k' names no single column of the batches to "
                                        r"exchange \(not_k\)"):
        arrow_exchange(df, _with_reader, "k", "id long, read_in long, segment long",
                       map_input=_unkeyed).collect()
    with pytest.raises(TypeError, match="map_input must be callable"):
        arrow_exchange(df, _with_reader, "k", "k long", map_input=1)


@pytest.mark.parametrize("rendezvous", [None, "barrier"])
def test_string_keys_count_like_group_by_with_either_rendezvous(spark, rendezvous):
    from flinkbuf.spark import arrow_exchange

    df = _names(spark, 10_000, 13)
    out = arrow_exchange(df, _count_per_key, "name", "name string, n long",
                         rendezvous=rendezvous).collect()
    assert len(out) == 13                       # each key counted in one task only
    expected = {r["name"]: r["count"] for r in df.groupBy("name").count().collect()}
    assert {r["name"]: r["n"] for r in out} == expected


def test_num_partitions_repartitions_first(spark):
    """A plan whose partitions only the server knows (a grouping) takes
    ``num_partitions``; any plan does."""
    from flinkbuf.spark import arrow_exchange

    grouped = _names(spark, 1000, 7).groupBy("name").count()
    out = arrow_exchange(grouped, _count_per_key, "name", "name string, n long",
                         num_partitions=2).collect()
    assert sorted((r["name"], r["n"]) for r in out) == [(f"k{k}", 1) for k in range(7)]


def _fail_in_task_1(batches):
    from pyspark import BarrierTaskContext

    if BarrierTaskContext.get().partitionId() == 1:
        raise ValueError("task-1-failed-here")
    yield from batches


def _fail_at_the_second_batch(batches):
    for i, batch in enumerate(batches):
        if i == 1:
            raise ValueError("fn-failed-mid-stream")
        yield batch


@pytest.mark.parametrize("fn, cause", [(_fail_in_task_1, "task-1-failed-here"),
                                       (_fail_at_the_second_batch, "fn-failed-mid-stream")],
                         ids=["one-task-at-its-start", "each-task-mid-stream"])
def test_a_failing_task_fails_the_job_with_its_cause(spark, sessions, fn, cause):
    """The job fails with the task's own error, at its start or while
    batches flow (small ones: the rows keep coming), without waiting for
    a timeout; nothing is left in the Python workers."""
    from flinkbuf.spark import arrow_exchange

    df = _names(spark, 200_000, 5)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    start = time.monotonic()
    try:
        with pytest.raises(Exception, match=cause):
            arrow_exchange(df, fn, "name", "name string, id long").collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert time.monotonic() - start < 60        # nothing waits for a timeout
    assert _names(spark, 10, 2).count() == 10   # the session runs on
    assert not leftovers(sessions["classic"].sparkContext, 2)


def _note_sealed(task):
    task.sealed = sorted({s["sealed"] for s in task.environment.connection_stats()})


def _sealed(batches):
    import pyarrow as pa

    from flinkbuf.spark import current_task

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows], "sealed": [str(current_task().sealed)]})


@pytest.mark.parametrize("encryption", [None, False])
def test_encryption_follows_the_session_unless_the_option_says(spark, encryption):
    """The server encrypts its own traffic (``spark.network.crypto.enabled``,
    read through ``spark.conf`` on Connect), so None seals every
    connection between the exchange's tasks, though they run on one host;
    False leaves them plain.  The rows are the same either way."""
    from flinkbuf.spark import arrow_exchange
    from flinkbuf.spark.driver import session_encryption

    assert spark.conf.get("spark.network.crypto.enabled") == "true"
    assert session_encryption(spark, None) is True
    out = arrow_exchange(_names(spark, 3000, 3), _sealed, "name", "rows long, sealed string",
                         encryption=encryption, monitor=_note_sealed).collect()
    assert sum(r["rows"] for r in out) == 3000
    assert {r["sealed"] for r in out} == {str([encryption is None])}


def _rendezvous_servers():
    from flinkbuf.spark import _rendezvous

    gc.collect()
    return set(_rendezvous._LIVE)


def test_the_rendezvous_serves_while_the_result_lives(spark):
    """The driver's rendezvous (this client's, on Connect) starts with the
    exchange and serves its jobs while the returned DataFrame is
    referenced, then until it has been idle for the timeout; the barrier
    rendezvous starts none."""
    import threading

    from flinkbuf.spark import arrow_exchange, close_rendezvous

    close_rendezvous()             # the lingering ones of earlier tests
    df = _names(spark, 10_000, 13)
    expected = sorted((f"k{k}", len(range(k, 10_000, 13))) for k in range(13))
    started = set()
    for rendezvous in ("driver", "barrier"):
        before = _rendezvous_servers()     # (the driver's lingers for its timeout)
        out = arrow_exchange(df, _count_per_key, "name", "name string, n long",
                             rendezvous=rendezvous, timeout=3)
        servers = _rendezvous_servers() - before
        assert len(servers) == (rendezvous == "driver")
        assert sorted((r["name"], r["n"]) for r in out.collect()) == expected
        assert sorted((r["name"], r["n"]) for r in out.collect()) == expected   # served again
        assert not any(server.closed for server in servers)
        started |= servers
        del out
    deadline = time.monotonic() + 15
    while (_rendezvous_servers() or [t for t in threading.enumerate()
                                     if t.name.startswith("flinkbuf-rendezvous")]):
        assert time.monotonic() < deadline, "the rendezvous outlived its result and timeout"
        time.sleep(0.1)
    assert len(started) == 1 and all(server.closed for server in started)


def test_bad_arguments_are_refused_before_anything_runs(spark):
    from flinkbuf.spark import arrow_exchange

    df = spark.range(0, 10, numPartitions=2).selectExpr("id AS k", "id AS v",
                                                        "array(id) AS a")
    with pytest.raises(ValueError, match=r"key 'nope' is not a column of the DataFrame "
                                         r"\(k, v, a\)"):
        arrow_exchange(df, iter, "nope", "k long")
    with pytest.raises(TypeError, match="cannot hash key column 'a' of type array"):
        arrow_exchange(df, iter, "a", "k long")
    with pytest.raises(TypeError, match="key must be a column name"):
        arrow_exchange(df, iter, 0, "k long")
    with pytest.raises(TypeError, match="df must be a pyspark DataFrame, got list"):
        arrow_exchange([1, 2], iter, "k", "k long")
    with pytest.raises(TypeError, match="fn must be callable"):
        arrow_exchange(df, None, "k", "k long")


def test_too_few_slots_fail_at_once_with_what_to_set(spark):
    from flinkbuf.spark import arrow_exchange

    start = time.monotonic()
    with pytest.raises(InsufficientSlotsError, match=r"3 tasks at once .* master local\[2\] "
                                                     r"has 2 task slots: use a master such "
                                                     r"as local\[3\]"):
        arrow_exchange(spark.range(0, 10, numPartitions=3), iter, "id", "id long")
    assert time.monotonic() - start < 10


def test_a_connect_job_without_its_slots_is_interrupted_within_the_timeout(connect,
                                                                            monkeypatch):
    """Where the settings do not tell the slots, the client watches the
    exchange's job (under its own tag): its tasks not started within the
    timeout, the job is interrupted and the action raises
    InsufficientSlotsError instead of Spark's ten minutes of retries."""
    from flinkbuf.spark import _session, arrow_exchange

    monkeypatch.setattr(_session.ConnectSession, "slots", lambda self: None)
    for rendezvous in (None, "barrier"):
        out = arrow_exchange(connect.range(0, 10, numPartitions=3), iter, "id", "id long",
                             timeout=3, rendezvous=rendezvous)
        start = time.monotonic()
        with pytest.raises(InsufficientSlotsError, match=r"3 tasks did not start within its "
                                                         r"timeout \(3 s\)"):
            out.collect()
        assert time.monotonic() - start < 30
    assert connect.range(0, 10, numPartitions=2).count() == 10   # nothing else was stopped
    assert connect.getTags() == set()


def _job_tags(batches):
    import pyarrow as pa
    from pyspark import BarrierTaskContext

    for _ in batches:
        pass
    tags = BarrierTaskContext.get().getLocalProperty("spark.job.tags") or ""
    yield pa.RecordBatch.from_pydict({"tags": [tags]})


def test_a_connect_job_runs_under_the_exchange_s_tag(connect):
    from flinkbuf.spark import arrow_exchange

    out = arrow_exchange(_names(connect, 100, 3), _job_tags, "name", "tags string")
    rows = out.select("tags").distinct().collect()       # a plan made from the result
    assert len(rows) == 1 and "_Tag_flinkbuf-exchange-" in rows[0]["tags"]
    # Other jobs carry no tag of flinkbuf's.
    assert connect.getTags() == set()


def test_rdd_entry_points_name_spark_connect(connect):
    from flinkbuf.spark import arrow_exchange, pipelined_exchange

    df = _names(connect, 100, 3)
    for given in (df, connect):
        with pytest.raises(TypeError, match="Spark Connect.*arrow_exchange"):
            pipelined_exchange(given)
    with pytest.raises(ValueError, match="num_partitions=N"):
        arrow_exchange(df.groupBy("name").count(), _count_per_key, "name", "name string")


def test_the_live_view_of_either_session(spark, sessions):
    """live_view takes a session of either kind; the tasks of a Connect
    session, whose server runs on this machine, report to this client."""
    from flinkbuf.spark import arrow_exchange, live_view

    view = live_view(spark)
    try:
        assert live_view(spark) is view and view.url.startswith("http://127.0.0.1:")
        out = arrow_exchange(_names(spark, 5000, 5), _count_per_key, "name",
                             "name string, n long", live_view=True).collect()
        assert sum(r["n"] for r in out) == 5000
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [(e["state"], [(t.get("stats") or {}).get("records_in", 0)
                                    for t in e["tasks"]])
                      for e in view.snapshot()["exchanges"]]
            if states and states[-1][0] == "FINISHED":
                break
            time.sleep(0.2)
        assert states[-1][0] == "FINISHED" and sum(states[-1][1]) > 0
    finally:
        view.close()
    assert not leftovers(sessions["classic"].sparkContext, 2)
