"""flinkbuf.spark: records exchanged between the tasks of a PySpark barrier
stage, in local mode (each task in its own Python worker process, so every
exchange crosses processes).  arrow_exchange's own tests run on both kinds
of session, classic and Spark Connect, in test_spark_sessions.py."""

import collections
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_helpers import leftovers, spark_session, stop

from flinkbuf.io import assign_key_to_operator
from flinkbuf.spark import ExchangeTask, current_task, pipelined_exchange

SLOTS = 4          # local[4]: a barrier stage of up to 4 tasks gets its slots


@pytest.fixture(scope="module")
def spark():
    from pyspark import cloudpickle

    import spark_helpers

    # Functions of this module travel to the workers by value.
    cloudpickle.register_pickle_by_value(spark_helpers)
    cloudpickle.register_pickle_by_value(__import__(__name__))
    session = spark_session(f"local[{SLOTS}]")
    yield session
    stop(session)


@pytest.fixture(scope="module")
def sc(spark):
    return spark.sparkContext


def _by_key(n):
    return lambda k: assign_key_to_operator(k, n)


def _count_per_key(records):
    counts = collections.Counter(k for k, _ in records)
    return sorted(counts.items())


def _multisets(parts):
    return [collections.Counter(p) for p in parts]


@pytest.mark.parametrize("rendezvous", ["driver", "barrier"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_hash_exchange_matches_partition_by(sc, n, rendezvous):
    data = [(i % 37, i) for i in range(20_000)]
    rdd = sc.parallelize(data, n)
    ours = pipelined_exchange(rdd, _count_per_key, rendezvous=rendezvous).glom().collect()
    spark = rdd.partitionBy(n, _by_key(n)).mapPartitions(_count_per_key).glom().collect()
    assert len(ours) == n
    assert ours == spark
    assert sum(c for part in ours for _, c in part) == len(data)


@settings(max_examples=6, deadline=None)
@given(records=st.lists(st.tuples(st.one_of(st.integers(-2**40, 2**40), st.text(max_size=4)),
                                  st.integers()), max_size=60),
       n=st.integers(1, 3))
def test_any_small_input_lands_where_partition_by_puts_it(sc, records, n):
    rdd = sc.parallelize(records, n)
    ours = pipelined_exchange(rdd, segment_size=64).glom().collect()
    spark = rdd.partitionBy(n, _by_key(n)).glom().collect()
    assert _multisets(ours) == _multisets(spark)


def test_key_by_index_and_by_function(sc):
    data = [("x", i % 5, str(i)) for i in range(3000)]
    rdd = sc.parallelize(data, 2)
    by_index = pipelined_exchange(rdd, key=1).glom().collect()
    by_fn = pipelined_exchange(rdd, key=lambda r: r[1]).glom().collect()
    expected = rdd.keyBy(lambda r: r[1]).partitionBy(2, _by_key(2)).values().glom().collect()
    assert _multisets(by_index) == _multisets(expected) == _multisets(by_fn)


def test_round_robin_and_rebalance_deliver_each_record_once(sc):
    data = list(range(10_000))
    rdd = sc.parallelize(data, 3)
    for selector in ("round_robin", "rebalance"):
        parts = pipelined_exchange(rdd, selector=selector).glom().collect()
        assert sorted(x for p in parts for x in p) == data
        assert all(len(p) > 1000 for p in parts), [len(p) for p in parts]


def test_round_robin_spreads_each_producer_evenly(sc):
    rdd = sc.parallelize(range(3 * 999), 3)
    parts = pipelined_exchange(rdd, selector="round_robin").glom().collect()
    # Each producer's 999 records: 333 to each consumer.
    assert [len(p) for p in parts] == [999, 999, 999]


def test_broadcast_gives_every_partition_everything(sc):
    data = [(i, str(i)) for i in range(500)]
    parts = pipelined_exchange(sc.parallelize(data, 3), selector="broadcast").glom().collect()
    assert len(parts) == 3
    for p in parts:
        assert sorted(p) == data


def test_callable_selector(sc):
    parts = pipelined_exchange(sc.parallelize(range(100), 2),
                               selector=lambda r, n: r % n).glom().collect()
    assert sorted(parts[0]) == list(range(0, 100, 2))
    assert sorted(parts[1]) == list(range(1, 100, 2))


def _first_three(records):
    for i, r in enumerate(records):
        if i == 3:
            return
        yield r


def test_fn_that_stops_early_still_lets_the_exchange_end(sc):
    rdd = sc.parallelize([(i % 2, i) for i in range(50_000)], 2)
    parts = pipelined_exchange(rdd, _first_three, selector="round_robin").glom().collect()
    assert [len(p) for p in parts] == [3, 3]


def test_other_codecs(sc):
    data = [bytes([i % 256]) * (i % 50) for i in range(2000)]
    parts = pipelined_exchange(sc.parallelize(data, 2), selector="round_robin",
                               codec="bytes").glom().collect()
    assert sorted(x for p in parts for x in p) == sorted(data)
    objs = [(i, frozenset([i])) for i in range(100)]          # not a typed-codec type
    parts = pipelined_exchange(sc.parallelize(objs, 2), codec="pickle").glom().collect()
    assert sorted((x for p in parts for x in p), key=lambda r: r[0]) == objs


def test_the_exchange_feeds_a_shuffle(sc):
    rdd = sc.parallelize([(i % 10, 1) for i in range(10_000)], 2)
    counts = pipelined_exchange(rdd).reduceByKey(lambda a, b: a + b).collectAsMap()
    assert counts == {k: 1000 for k in range(10)}


# ---- pipelining and backpressure ----------------------------------------------


def _slow_source(index, _):
    for i in range(40):
        yield (time.time(), index, i)
        time.sleep(0.025)                  # one second of input per task


def _arrival_times(records):
    first = None
    last_produced = 0.0
    for produced, _, _ in records:
        if first is None:
            first = time.time()
        last_produced = max(last_produced, produced)
    yield (first, last_produced)


def test_records_arrive_while_they_are_produced(sc):
    rdd = sc.parallelize(range(2), 2).mapPartitionsWithIndex(_slow_source)
    parts = pipelined_exchange(rdd, _arrival_times, selector="round_robin",
                               buffer_timeout=0.01).collect()
    for first, last_produced in parts:
        # The first record arrived long before the last one was produced.
        assert last_produced - first > 0.5, parts


def _big_source(index, _):
    payload = b"x" * 1000
    for i in range(20_000):
        yield (i, payload)


def _slow_sink(records):
    task = current_task()
    assert isinstance(task, ExchangeTask)
    n = 0
    for _ in records:
        n += 1
        if n % 500 == 0:
            time.sleep(0.01)
    stats = task.stats()
    yield (task.index, n, stats)


def test_a_slow_consumer_backpressures_its_producers(sc):
    rdd = sc.parallelize(range(2), 2).mapPartitionsWithIndex(_big_source)
    out = pipelined_exchange(rdd, _slow_sink, segment_size=4096,
                             buffers_per_channel=2, floating_buffers=2).collect()
    assert sorted(i for i, _, _ in out) == [0, 1]
    assert sum(n for _, n, _ in out) == 40_000
    for _, n, stats in out:
        assert stats["records_in"] == n
        assert stats["records_out"] == 20_000
        # 20 MB per task through 5 buffers of 4 KiB: the producers waited for
        # the consumers (about 0.4 s of sleeping) most of the time.
        assert stats["back_pressured_seconds"] > 0.1, stats
        assert stats["out_pool_size"] == 2 * 2 + 1
        assert stats["first_record_seconds"] is not None


def test_monitor_sees_each_task(sc):
    def monitor(task):
        assert task.num_tasks == 2 and task.address.count(":") == 1
        assert task.environment.address[0] == "127.0.0.1"     # the executor's address

    out = pipelined_exchange(sc.parallelize(range(100), 2), monitor=monitor,
                             selector="round_robin").count()
    assert out == 100
    assert current_task() is None


# ---- the live view -----------------------------------------------------------------


def _paced_source(flags, rate):
    """Records at ``rate`` per second per task until the file ``stop`` appears."""
    def source(index, _):
        i, started = 0, time.monotonic()
        while not os.path.exists(os.path.join(flags, "stop")):
            for _ in range(100):
                yield (i % 64, i)
                i += 1
            ahead = i / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return source


def _slowed_in_task_1(flags):
    """Task 1's consumer takes 1 ms per record while the file ``slow`` exists."""
    def consume(records):
        task = current_task()
        slow = os.path.join(flags, "slow")
        for n, _ in enumerate(records, 1):
            if task.index == 1 and n % 50 == 0 and os.path.exists(slow):
                time.sleep(0.05)
        yield task.stats()
    return consume


def _levels(doc, exchange):
    (e,) = [e for e in doc["exchanges"] if e["id"] == exchange]
    return ({t["task"]: t["metrics"] and t["metrics"]["backPressureLevel"]
             for t in e["tasks"] if t["latest"]}, [b["task"] for b in e["bottleneck"]])


def _count_per_string_key(batches):
    import collections

    import pyarrow as pa

    counts = collections.Counter()
    for batch in batches:
        counts.update(batch.column(0).to_pylist())
    yield pa.RecordBatch.from_pydict({"name": list(counts), "n": list(counts.values())})


def test_the_live_view_names_the_slowed_consumer_in_a_browser(spark, sc, tmp_path, request):
    """A real headless Chromium reads the page while task 1's consumer is
    slowed: task 1 is named the bottleneck and the producers feeding it
    (both tasks) are HIGH; once released, both are OK and nothing is
    named.  At the end the JSON and the Prometheus text hold the tasks'
    own totals; strangers' reports were refused meanwhile; no thread is
    left in the workers."""
    import socket
    import threading

    from live_helpers import Rendered, browse, chromium, get, get_json, prometheus_values, \
        wait_for

    from flinkbuf.errors import AuthenticationError
    from flinkbuf.network import handshake
    from flinkbuf.spark import arrow_exchange, live_view

    chromium()                          # skips, saying why, where there is none
    view = live_view(spark)
    request.addfinalizer(view.close)    # a failure here leaves no view to the next test
    assert live_view(sc) is view and view.url.startswith("http://127.0.0.1:")
    with pytest.raises(ValueError, match="live view runs at"):
        live_view(spark, port=view.address[1] + 1 if view.address[1] < 65535 else 1)
    rdd = sc.parallelize(range(2), 2).mapPartitionsWithIndex(
        _paced_source(str(tmp_path), 10_000))
    for bad, error in ((object(), TypeError), ("no-port", ValueError), (70000, ValueError)):
        with pytest.raises(error, match="live_view"):
            pipelined_exchange(rdd, live_view=bad)
    slow, stop = tmp_path / "slow", tmp_path / "stop"
    slow.touch()
    exchanged = pipelined_exchange(rdd, _slowed_in_task_1(str(tmp_path)), segment_size=1024,
                                   floating_buffers=0, live_view=True)
    out = {}
    job = threading.Thread(target=lambda: out.update(stats=exchanged.collect()), daemon=True)
    job.start()
    try:
        exchange = wait_for(lambda: [e["id"] for e in view.snapshot()["exchanges"]
                                     if e["name"] == f"pipelined_exchange of RDD {rdd.id()} "
                                                     f"into consume"], 60, "the exchange")[0]
        wait_for(lambda: _levels(view.snapshot(), exchange) == ({0: "HIGH", 1: "HIGH"}, [1]),
                 60, "task 1 named the bottleneck")
        # Strangers meanwhile: refused, the tasks report on.
        refused = view.refused
        with socket.create_connection(view.report_address, timeout=10) as s:
            s.sendall(b"\x00\x00\x00\x05hello")
        with pytest.raises(AuthenticationError):
            with socket.create_connection(view.report_address, timeout=10) as s:
                handshake.client(s, b"x" * 32, "127.0.0.1:1", 0, 10)
        page = Rendered(browse(view.url)).exchanges[exchange]
        assert page["bottleneck"] == [1], page
        assert page["banner"].startswith("Bottleneck: task 1 "), page["banner"]
        assert {i: r["data-level"] for i, r in page["rows"].items()} == {0: "HIGH", 1: "HIGH"}
        assert page["rows"][1]["data-bottleneck"] == "true"
        assert page["rows"][0]["data-bottleneck"] == "false"
        assert "bottleneck" in page["rows"][1]["text"] and "HIGH" in page["rows"][0]["text"]

        slow.unlink()                   # released
        wait_for(lambda: _levels(view.snapshot(), exchange) == ({0: "OK", 1: "OK"}, []),
                 60, "both tasks OK")
        # The page reads the view again, a moment later: on a loaded machine a
        # level may swing back for a sample meanwhile, so the page is read until
        # it shows what the view settled on.
        def settled_page():
            page = Rendered(browse(view.url)).exchanges[exchange]
            levels = {i: r["data-level"] for i, r in page["rows"].items()}
            return page if levels == {0: "OK", 1: "OK"} else None

        page = wait_for(settled_page, 60, "the page showing both tasks OK")
        assert page["bottleneck"] == [] and page["banner"].startswith("No bottleneck")
        assert view.refused >= refused + 2
    finally:
        stop.touch()
        job.join(120)
    assert not job.is_alive() and "stats" in out
    stats = {s.pop("task"): s for s in out["stats"]}
    wait_for(lambda: view.snapshot()["exchanges"][0]["state"] == "FINISHED", 30, "the end")
    doc = get_json(view.url + "api/view")
    tasks = {t["task"]: t for e in doc["exchanges"] if e["id"] == exchange for t in e["tasks"]}
    assert sorted(tasks) == [0, 1]
    status, _, text = get(view.url + "metrics")
    assert status == 200
    records_out = prometheus_values(text, "flinkbuf_task_numRecordsOut")
    records_in = prometheus_values(text, "flinkbuf_task_numRecordsIn")
    for i, task in tasks.items():
        assert task["state"] == "FINISHED" and task["stats"] == stats[i]
        key = (exchange, i, task["attempt"])
        assert records_out[key] == stats[i]["records_out"] > 0
        assert records_in[key] == stats[i]["records_in"] > 0
    assert sum(s["records_in"] for s in stats.values()) == \
        sum(s["records_out"] for s in stats.values())
    # arrow_exchange takes the option too (its tasks run the same body): the
    # exchange registers with the view when it is made, before any job.
    df = spark.range(0, 30, numPartitions=2).selectExpr("concat('k', id % 5) AS name", "id")
    arrow_exchange(df, _count_per_string_key, "name", "name string, n long", live_view=view,
                   rendezvous="barrier")
    assert view.snapshot()["exchanges"][0]["name"] == \
        "arrow_exchange by 'name' into _count_per_string_key"
    assert view.snapshot()["exchanges"][0]["state"] == "WAITING"
    with pytest.raises(TypeError, match="live_view"):
        arrow_exchange(df, _count_per_string_key, "name", "name string, n long",
                       live_view=1.5)
    assert not leftovers(sc, 2)         # the reporters' threads ended with their tasks
    view.close()


# ---- failures ----------------------------------------------------------------------


def _raise_mid_stream(records):
    for i, r in enumerate(records):
        if i == 1000:
            raise ValueError("fn-failed-mid-stream")
        yield r


def _failing_source(index, _):
    for i in range(100_000):
        if index == 1 and i == 5000:
            raise KeyError("source-failed-mid-stream")
        yield (i, i)


class _Message(str):
    """A job's error message whose repr shows only its Python errors (the
    JVM's stack traces run to pages)."""

    def __repr__(self):
        errors = [ln.strip() for ln in self.splitlines()
                  if "Error" in ln and not ln.lstrip().startswith(("at ", "File "))]
        return repr(errors[:12])


def _job_error(job):
    from py4j.protocol import Py4JJavaError

    start = time.monotonic()
    with pytest.raises(Py4JJavaError) as info:
        job()
    return _Message(str(info.value)), time.monotonic() - start


def test_errors_that_only_say_a_peer_went_away():
    from flinkbuf.errors import (
        PartitionReleasedError,
        ProducerFailedError,
        RemoteConnectionError,
        RemoteError,
    )
    from flinkbuf.spark._task_peers import is_consequence as _is_consequence

    def failed(cause):
        err = ProducerFailedError("the producer failed")
        err.__cause__ = cause
        return err

    assert _is_consequence(PartitionReleasedError("released"))
    assert _is_consequence(RemoteConnectionError("dropped"))
    assert _is_consequence(failed(PartitionReleasedError("released")))
    assert _is_consequence(failed(RemoteError("PartitionReleasedError", "released")))
    assert not _is_consequence(failed(RemoteError("ValueError", "boom")))
    assert not _is_consequence(failed(None))
    assert not _is_consequence(ValueError("boom"))


class _FakeBarrierContext:
    """What run_task asks of Spark's BarrierTaskContext, for tasks run as
    threads of this process: their index and an allGather among them."""

    def __init__(self, index, n, gather):
        self.index, self.n, self.gather = index, n, gather

    def partitionId(self):
        return self.index

    def taskAttemptId(self):
        return 100 + self.index

    def stageId(self):
        return 1

    def getTaskInfos(self):
        return [collections.namedtuple("Info", "address")("127.0.0.1:0")] * self.n

    def allGather(self, message):
        self.gather[self.index] = message
        self.gather["barrier"].wait(10)
        return [self.gather[i] for i in range(self.n)]


def _threaded_spec(monkeypatch, fn, monitor, **options):
    """What run_task needs for two tasks run as threads of this process:
    the spec (addresses through the fake allGather) and the thread-local
    in which each thread sets its _FakeBarrierContext."""
    import threading

    from pyspark import BarrierTaskContext

    from flinkbuf.spark._spec import check_options, make_spec

    kw = {"num_partitions": None, "key": None, "selector": "hash", "codec": "typed",
          "segment_size": 4096, "buffers_per_channel": 2, "floating_buffers": 0,
          "buffer_timeout": 0.01, "max_record_size": 1 << 20, "max_parallelism": None,
          "host": "127.0.0.1", "timeout": 10.0, "monitor": monitor}
    kw.update(options)
    spec = make_spec(check_options(2, fn, **kw))          # no rendezvous: allGather
    contexts = threading.local()
    monkeypatch.setattr(BarrierTaskContext, "get", staticmethod(lambda: contexts.ctx))
    return spec, contexts


def _reads_for(args):
    """The task whose gate connects: the subpartition its channels read
    (update_input_channel's channel)."""
    return args[0].subpartition


@pytest.mark.parametrize("monitor", [None, lambda task: None], ids=["no-monitor", "monitor"])
def test_a_peer_gone_while_connecting_is_reported_after_the_peers_own_error(monkeypatch,
                                                                          monitor):
    """Task 1's fn raises at once; task 0 connects only after task 1 has
    closed, and meets "cannot connect".  That error only says a peer went
    away: task 0 holds it back for the consequence delay, whatever phase
    it came in, so that Spark hears of task 1's ValueError first.  Without
    a monitor the gate's channels to peers are connected while records
    flow, with one before; either way one by one (update_input_channel,
    so that an error names the peer dialed)."""
    import threading

    from pyspark import BarrierTaskContext

    from flinkbuf.errors import RemoteConnectionError
    from flinkbuf.network import NetworkEnvironment
    from flinkbuf.spark import _task, _task_peers

    def fn(records):
        if BarrierTaskContext.get().partitionId() == 1:
            raise ValueError("fn-raised-at-once")
        yield from records

    spec, contexts = _threaded_spec(monkeypatch, fn, monitor)
    task1_done = threading.Event()
    gate_failed_at = []
    connects = "update_input_channel"
    connect = getattr(NetworkEnvironment, connects)

    def late(env, *args, **kwargs):                    # task 0 connects after task 1 ended
        if _reads_for(args) == 0:
            assert task1_done.wait(10)
            # Task 1 may have dialed task 0 already (its gate reads task 0's
            # output), and reads would reuse that connection: wait until task 0
            # has seen it close, so that task 0 has to dial the closed peer.
            deadline = time.monotonic() + 10
            while env.connections() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not env.connections(), env.connections()
        try:
            return connect(env, *args, **kwargs)
        except RemoteConnectionError:
            gate_failed_at.append(time.monotonic())
            raise
    monkeypatch.setattr(NetworkEnvironment, connects, late)
    gather = {"barrier": threading.Barrier(2)}
    raised = {}

    def run(index):
        contexts.ctx = _FakeBarrierContext(index, 2, gather)
        try:
            for _ in _task.run_task(spec, iter([(index, i) for i in range(10)])):
                pass
        except BaseException as exc:   # noqa: BLE001 - what the task reports to Spark
            raised[index] = (exc, time.monotonic())
        finally:
            if index == 1:
                task1_done.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(raised[1][0], ValueError)
    assert isinstance(raised[0][0], RemoteConnectionError), raised[0]
    assert gate_failed_at, "task 0 did not meet the closed peer while connecting"
    assert raised[0][1] - gate_failed_at[0] >= _task_peers.CONSEQUENCE_DELAY * 0.9
    assert raised[0][1] > raised[1][1]


@pytest.mark.parametrize("monitor", [None, lambda task: None], ids=["no-monitor", "monitor"])
def test_a_task_reads_its_own_records_before_its_peer_has_started(monkeypatch, monitor):
    """Task 0 runs alone at first (its peer starts late, as Spark may start
    it): without a monitor its fn gets the records it produced for itself
    at once, and the peer's once the peer runs; with one (which sees a
    connected task before records flow) nothing flows until the peer is
    there.  Either way every record arrives once."""
    import threading

    from pyspark import BarrierTaskContext

    from flinkbuf.spark import _task

    first_own = threading.Event()

    def fn(records):
        mine = BarrierTaskContext.get().partitionId()
        got = []
        for r in records:
            if not got and r[0] == mine:
                first_own.set()
            got.append(r)
        yield from got

    spec, contexts = _threaded_spec(monkeypatch, fn, monitor, selector="round_robin",
                                    floating_buffers=2, buffer_timeout=0.001, timeout=20.0)
    gather = {"barrier": threading.Barrier(2)}
    out, raised = {}, {}

    def run(index):
        contexts.ctx = _FakeBarrierContext(index, 2, gather)
        try:
            out[index] = list(_task.run_task(spec, iter([(index, i) for i in range(200)])))
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            raised[index] = exc

    early = threading.Thread(target=run, args=(0,))
    early.start()
    flowed = first_own.wait(5 if monitor is None else 1)
    late = threading.Thread(target=run, args=(1,))
    late.start()
    for t in (early, late):
        t.join(30)
    assert raised == {}
    assert flowed is (monitor is None)
    got = sorted(r for index in (0, 1) for r in out[index])
    assert got == sorted((i, j) for i in range(2) for j in range(200))
    for index in (0, 1):
        for producer in (0, 1):
            mine = [r[1] for r in out[index] if r[0] == producer]
            assert mine == sorted(mine)           # each producer's records in order


def test_a_task_is_registered_at_the_rendezvous_before_its_first_record(monkeypatch):
    """Records flow before the peers are known, but never before the task
    has registered with the driver's rendezvous: a task that fails on its
    first record is known to its stage attempt, so the tasks of a retried
    attempt cannot join the failed one (Spark numbers them next to the
    failed one's)."""
    import dataclasses
    import threading

    from flinkbuf.spark import _rendezvous, _task

    seen = {}

    def fn(records):
        for r in records:
            with server._lock:
                attempt = server._attempts.get(1)
                seen["tids"] = None if attempt is None else list(attempt.tids)
            raise ValueError("fails on its first record")
        yield from ()

    spec, contexts = _threaded_spec(monkeypatch, fn, None, timeout=5.0, selector="round_robin")
    server = _rendezvous.RendezvousServer(spec.secret, 2, timeout=5.0)
    spec = dataclasses.replace(spec, rendezvous=server.address)
    raised = {}

    def run():
        contexts.ctx = _FakeBarrierContext(0, 2, {})
        try:
            list(_task.run_task(spec, iter([(0, i) for i in range(10)])))
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            raised[0] = exc

    try:
        t = threading.Thread(target=run)
        t.start()
        t.join(20)
        assert not t.is_alive()
    finally:
        server.close()
    assert isinstance(raised[0], ValueError)
    assert seen["tids"] == [100, None]           # task 0 (attempt 100), alone


def test_a_task_that_raises_fails_the_job_with_its_error(sc):
    rdd = sc.parallelize([(i, i) for i in range(200_000)], 2)
    message, took = _job_error(lambda: pipelined_exchange(rdd, _raise_mid_stream).count())
    assert "fn-failed-mid-stream" in message
    assert took < 30
    rdd = sc.parallelize(range(2), 2).mapPartitionsWithIndex(_failing_source)
    message, took = _job_error(lambda: pipelined_exchange(rdd).count())
    assert "source-failed-mid-stream" in message
    assert took < 30
    assert leftovers(sc, SLOTS) == []


def _die_mid_stream(records):
    from pyspark import BarrierTaskContext

    for i, r in enumerate(records):
        if i == 1000 and BarrierTaskContext.get().partitionId() == 1:
            os._exit(17)
        yield r


def test_a_worker_that_dies_fails_its_peers_in_bounded_time(sc):
    rdd = sc.parallelize([(i, i) for i in range(300_000)], 2)
    start = time.monotonic()
    message, took = _job_error(
        lambda: pipelined_exchange(rdd, _die_mid_stream, timeout=20).count())
    assert took < 45
    assert leftovers(sc, SLOTS) == []
    # The workers that are left serve the next exchange.
    assert pipelined_exchange(sc.parallelize(range(10), 2), selector="rebalance").count() == 10
    assert time.monotonic() - start < 90


def _fail_first_attempt(marker):
    """An fn whose task 0 fails on its first attempt (``marker`` is made then)."""

    def fn(records):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        for i, r in enumerate(records):
            if i == 100 and ctx.partitionId() == 0 and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("first attempt fails")
            yield r

    return fn


def test_a_failed_exchange_that_feeds_a_shuffle_is_retried_whole(sc, tmp_path):
    from flinkbuf.spark import close_rendezvous

    close_rendezvous()             # the lingering ones of earlier tests
    rdd = sc.parallelize([(i % 10, 1) for i in range(10_000)], 2)
    marker = str(tmp_path / "failed-once")
    counts = (pipelined_exchange(rdd, _fail_first_attempt(marker), timeout=30)
              .reduceByKey(lambda a, b: a + b).collectAsMap())
    assert os.path.exists(marker)
    assert counts == {k: 1000 for k in range(10)}
    # The driver's rendezvous served both attempts of the stage (the result
    # was gone on the driver once reduceByKey had made its shuffle); on a
    # loaded machine a retried attempt whose second task starts later than
    # the exchange's timeout fails too, and Spark tries once more.
    [server] = _servers()
    assert server.attempts_started >= 2
    close_rendezvous()


def test_a_retried_exchange_with_the_barrier_rendezvous(sc, tmp_path):
    rdd = sc.parallelize([(i % 10, 1) for i in range(10_000)], 2)
    marker = str(tmp_path / "failed-once")
    counts = (pipelined_exchange(rdd, _fail_first_attempt(marker), rendezvous="barrier")
              .reduceByKey(lambda a, b: a + b).collectAsMap())
    assert os.path.exists(marker)
    assert counts == {k: 1000 for k in range(10)}


def test_a_failed_exchange_as_last_stage_aborts_the_job(sc, tmp_path):
    rdd = sc.parallelize([(i % 10, 1) for i in range(10_000)], 2)
    marker = str(tmp_path / "failed-once")
    message, _ = _job_error(
        lambda: pipelined_exchange(rdd, _fail_first_attempt(marker)).collect())
    assert "first attempt fails" in message
    assert "Could not recover from a failed barrier ResultStage" in message


# ---- arguments ---------------------------------------------------------------------


def test_bad_arguments_are_refused_on_the_driver(sc):
    rdd = sc.parallelize(range(10), 2)
    with pytest.raises(TypeError, match="RDD"):
        pipelined_exchange([1, 2, 3])
    with pytest.raises(TypeError, match="fn"):
        pipelined_exchange(rdd, 42)
    with pytest.raises(ValueError, match="repartition"):
        pipelined_exchange(rdd, num_partitions=3)
    with pytest.raises(ValueError, match="selector"):
        pipelined_exchange(rdd, selector="zigzag")
    with pytest.raises(ValueError, match="key applies"):
        pipelined_exchange(rdd, key=0, selector="round_robin")
    with pytest.raises(ValueError, match="codec"):
        pipelined_exchange(rdd, codec="json")
    with pytest.raises(ValueError, match="segment_size"):
        pipelined_exchange(rdd, segment_size=0)
    with pytest.raises(TypeError, match="buffers_per_channel"):
        pipelined_exchange(rdd, buffers_per_channel=2.0)
    with pytest.raises(ValueError, match="timeout"):
        pipelined_exchange(rdd, timeout=-1)
    with pytest.raises(ValueError, match="max_parallelism"):
        pipelined_exchange(rdd, max_parallelism=1)
    with pytest.raises(TypeError, match="host"):
        pipelined_exchange(rdd, host=127)
    with pytest.raises(TypeError, match="monitor"):
        pipelined_exchange(rdd, monitor="yes")
    with pytest.raises(ValueError, match="rendezvous"):
        pipelined_exchange(rdd, rendezvous="zookeeper")
    assert pipelined_exchange(rdd, num_partitions=2, selector="round_robin").count() == 10


def test_key_none_keys_pairs_by_their_first_field_and_other_records_whole(sc):
    """An RDD of strings is hashed by the whole string (not its first
    character), an RDD of pairs by the pair's first field."""
    words = [f"w{i % 50}" for i in range(2000)] + ["a", "ab", "abc"]
    ours = pipelined_exchange(sc.parallelize(words, 3), sorted).glom().collect()
    for j, part in enumerate(ours):
        assert part and all(assign_key_to_operator(w, 3) == j for w in part)
    assert sorted(w for part in ours for w in part) == sorted(words)
    pairs = [(f"k{i % 7}", i) for i in range(500)] + [[f"k{i % 7}", -i] for i in range(50)]
    ours = pipelined_exchange(sc.parallelize(pairs, 2)).glom().collect()
    for j, part in enumerate(ours):
        assert all(assign_key_to_operator(r[0], 2) == j for r in part)


def test_a_key_index_the_records_lack_fails_the_job_with_a_clear_error(sc):
    """key=5 on pairs: every task raises IndexError naming the key and the
    record's length; no Python worker crashes (they are reused after)."""
    rdd = sc.parallelize([(i, i) for i in range(1000)], 2)
    message, took = _job_error(lambda: pipelined_exchange(rdd, key=5).count())
    assert "IndexError: key index 5 is out of range for a record of length 2 (tuple)" \
        in message, message
    assert "Segmentation fault" not in message and took < 30
    assert pipelined_exchange(rdd, key=1).count() == 1000
    assert leftovers(sc, SLOTS) == []


def test_too_few_slots_fail_at_once_with_what_to_set(sc):
    from flinkbuf.spark import InsufficientSlotsError, arrow_exchange

    rdd = sc.parallelize(range(10), SLOTS + 1)
    start = time.monotonic()
    with pytest.raises(InsufficientSlotsError,
                       match=rf"{SLOTS + 1} tasks at once .* master local\[{SLOTS}\] has "
                             rf"{SLOTS} task slots: use a master such as "
                             rf"local\[{SLOTS + 1}\], or repartition the input to "
                             rf"{SLOTS} partitions or fewer"):
        pipelined_exchange(rdd)
    df = rdd.map(lambda i: (i,)).toDF(["k"])
    with pytest.raises(InsufficientSlotsError, match="task slots"):
        arrow_exchange(df, iter, "k", "k long")
    assert time.monotonic() - start < 10
    assert isinstance(InsufficientSlotsError("x"), RuntimeError)


# ---- the driver's rendezvous ----------------------------------------------------------


def _rendezvous_threads():
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("flinkbuf-rendezvous")]


def _servers():
    import gc

    from flinkbuf.spark import _rendezvous

    gc.collect()
    return list(_rendezvous._LIVE)


def test_the_driver_rendezvous_lives_as_long_as_the_result(sc):
    import gc
    import socket

    from flinkbuf.spark import close_rendezvous

    close_rendezvous()             # the lingering ones of earlier tests
    assert _servers() == []
    result = pipelined_exchange(sc.parallelize(range(1000), 2), selector="round_robin",
                                timeout=2)
    [server] = _servers()
    host, port = server.address
    assert host == "127.0.0.1"                     # spark.driver.host
    counted = result.map(lambda x: 1)              # an RDD made from the result keeps it up
    del result
    assert _servers() == [server]
    assert counted.count() == 1000
    assert counted.count() == 1000                 # a second job: another stage, served too
    time.sleep(3)
    assert not server.closed                       # still referenced
    del counted
    gc.collect()
    # Released: it closes once no task has registered for the timeout (2 s).
    deadline = time.monotonic() + 10
    while _rendezvous_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.closed and _servers() == [] and _rendezvous_threads() == []
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=1).close()
    # The barrier rendezvous starts no server.
    assert pipelined_exchange(sc.parallelize(range(10), 2), selector="round_robin",
                              rendezvous="barrier").count() == 10
    assert _servers() == []


def test_the_driver_prepares_an_exchange_in_one_sequence(sc):
    """What both exchanges run on the driver before their stage: the
    session's defaults resolved into the spec, made once (the session sets
    no spark.port.maxRetries: 16; no encryption of its own: None), the
    rendezvous started where the spec says; a stage that cannot be built
    closes the rendezvous at once; too few slots start nothing."""
    import dataclasses

    from flinkbuf.spark import InsufficientSlotsError, _prepare, close_rendezvous
    from flinkbuf.spark._session import session_of
    from flinkbuf.spark._spec import check_options

    close_rendezvous()
    session = session_of(sc)
    options = check_options(2, None, num_partitions=None, key=None, selector="hash",
                            codec="typed", segment_size=4096, buffers_per_channel=2,
                            floating_buffers=0, buffer_timeout=0.1, max_record_size=1 << 20,
                            max_parallelism=None, host=None, timeout=5.0, monitor=None)
    prepared = _prepare.prepare(session, 2, options, False, "a test exchange")
    spec, server = prepared.spec, prepared.server
    assert spec.options is options
    assert (spec.port_retries, spec.encryption, spec.live) == (16, None, None)
    assert spec.rendezvous == server.address and not server.closed
    assert _servers() == [server]
    with pytest.raises(ValueError, match="no stage"):
        prepared.launch(lambda: (_ for _ in ()).throw(ValueError("no stage")))
    assert server.closed and _servers() == []
    barrier = _prepare.prepare(session, 2,
                               dataclasses.replace(options, rendezvous="barrier",
                                                   port_retries=3, encryption=True),
                               False, "a test exchange")
    assert barrier.server is None and barrier.spec.rendezvous is None
    assert (barrier.spec.port_retries, barrier.spec.encryption) == (3, True)
    assert barrier.spec.secret != spec.secret and barrier.spec.exchange_id != spec.exchange_id
    with pytest.raises(InsufficientSlotsError):
        _prepare.prepare(session, SLOTS + 1, options, False, "a test exchange")
    assert _servers() == []


def test_the_driver_rendezvous_refuses_strangers_and_keeps_serving(sc):
    from flinkbuf.errors import AuthenticationError
    from flinkbuf.spark import close_rendezvous
    from flinkbuf.spark._rendezvous import register

    close_rendezvous()             # the lingering ones of earlier tests
    result = pipelined_exchange(sc.parallelize([(i % 7, i) for i in range(5000)], 2),
                                _count_per_key)
    [server] = _servers()
    with pytest.raises(AuthenticationError):
        register(server.address, b"not the secret", stage=0, task_attempt_id=0, index=0,
                 num_tasks=2, address="127.0.0.1:1", timeout=5)
    with socket_to(server.address) as s:
        s.sendall(b"\x00\x00\x00\x08garbage!" * 100)
        s.settimeout(5)
        try:
            assert s.recv(10) == b""               # dropped
        except ConnectionResetError:
            pass                                   # dropped with data unread
    assert sorted(result.collect()) == sorted(collections.Counter(
        i % 7 for i in range(5000)).items())
    assert server.refused >= 2
    close_rendezvous()
    assert server.closed and _rendezvous_threads() == []


def socket_to(address):
    import socket

    return socket.create_connection(address, timeout=5)


def test_nothing_is_left_in_the_workers(sc):
    pipelined_exchange(sc.parallelize(range(1000), 2), selector="round_robin").count()
    assert leftovers(sc, SLOTS) == []


# ---- exchange inside one task ------------------------------------------------------


def _parse_then_sum(it):
    from flinkbuf.spark import local_pipeline

    def parse(lines):
        for line in lines:
            yield tuple(int(x) for x in line.split(","))

    def total(rows):
        yield sum(a * b for a, b in rows)

    return local_pipeline(it, parse, total, buffers=2, segment_size=512)


def test_local_pipeline_in_a_spark_task(sc):
    lines = [f"{i},{i % 7}" for i in range(20_000)]
    out = sc.parallelize(lines, 2).mapPartitions(_parse_then_sum).collect()
    assert sum(out) == sum(i * (i % 7) for i in range(20_000))
    assert len(out) == 2
    assert leftovers(sc, SLOTS) == []


# ---- the demo ----------------------------------------------------------------------


def test_spark_demo_with_short_phases(spark, tmp_path):
    import statistics
    import threading

    from flinkbuf.experiments.spark_demo import run_spark_demo

    lines = []
    doc = run_spark_demo(str(tmp_path), 1.0, interval=0.25, records=20_000, spark=spark,
                         printer=lines.append)
    for name in ("spark-backpressure.csv", "spark-backpressure.json", "spark-backpressure.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = doc["rows"]
    assert len(rows) == 5 * 4
    assert len([ln for ln in lines if ln.lstrip()[:1].isdigit() and "%" in ln]) == 20
    # Slowed consumers hold the producers (asked for 60 % and 100 %) near 30 %;
    # released, both run at full speed again.
    slowed = [r["producer_pct"] for r in rows if r["consumer_limit_pct"] == 30][1:]
    released = [r["producer_pct"] for r in rows[8:12] + rows[16:]][1:]
    assert statistics.median(slowed) < 45, rows
    assert statistics.median(released) > 70, rows
    assert any(r["backpressure_level"] == "HIGH" for r in rows
               if r["consumer_limit_pct"] == 30)
    # the records' sojourn, sampled through the side channel: records wait
    # longer behind the slowed consumers than when they are released
    assert all(r["sojourn_records"] > 0 for r in rows[1:]), rows
    assert all(0 <= r["sojourn_p50_ms"] <= r["sojourn_p99_ms"] for r in rows[1:])
    by_phase = doc["sojourn_by_phase"]
    assert [(p["producer_limit_pct"], p["consumer_limit_pct"]) for p in by_phase] == \
        [(60, 100), (60, 30), (100, 100), (100, 30), (100, 100)]
    assert min(by_phase[1]["sojourn_p99_ms"], by_phase[3]["sojourn_p99_ms"]) > \
        max(by_phase[2]["sojourn_p99_ms"], by_phase[4]["sojourn_p99_ms"]), by_phase
    assert any(ln.startswith("records' sojourn, p99 per phase") for ln in lines)
    tasks = doc["tasks"]
    assert [t["task"] for t in tasks] == [0, 1]
    assert sum(t["records_out"] for t in tasks) == sum(t["records_in"] for t in tasks) > 0
    assert all(t["back_pressured_seconds"] > 0 for t in tasks)
    comparison = doc["comparison"]
    assert comparison["same_counts"] is True
    assert comparison["runs"]["flinkbuf"]["records"] == 20_000
    assert any("Spark shuffle" in ln for ln in lines)
    # It served a live view while it ran, and closed it at the end.
    assert any(ln.startswith("live view: http://127.0.0.1:") for ln in lines), lines
    assert not [t for t in threading.enumerate() if t.name.startswith("flinkbuf-live")]
    assert leftovers(spark.sparkContext, SLOTS) == []


def test_the_launcher_starts_the_tests_session_with_their_settings(sc):
    """The tests start Spark as the demo does (flinkbuf.experiments.spark_launcher),
    their own settings over its defaults."""
    conf = sc.getConf()
    assert conf.get("spark.app.name") == "flinkbuf-tests"
    assert conf.get("spark.barrier.sync.timeout") == "60s"          # the launcher's is 120s
    assert conf.get("spark.python.worker.reuse") == "true"
    assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures") == "1"


def test_the_launcher_reads_what_a_master_url_gives():
    from flinkbuf.experiments import ExperimentArgumentError
    from flinkbuf.experiments.spark_launcher import executors_of, master_slots

    assert executors_of("local-cluster[3,2,1024]") == 3
    assert executors_of("local[4]") is None and executors_of("spark://h:7077") is None
    assert [master_slots(m) for m in ("local", "local[3]", "local[2,4]",
                                      "local-cluster[3,2,1024]", "yarn")] == [1, 3, 2, 6, None]
    with pytest.raises(ExperimentArgumentError, match="must be a Spark master URL"):
        master_slots("locale[2]")


@pytest.mark.parametrize("args, message", [
    (["--tasks", "0"], "--tasks must be >= 1"),
    (["--records", "-1"], "--records must be >= 1"),
    (["--interval", "0.01"], "--interval must be >= 0.05"),
    (["--phase-seconds", "0.1"], "--phase-seconds (0.1) must be >= --interval"),
    (["--segment-size", "8"], "--segment-size must be >= 64"),
])
def test_spark_demo_command_refuses_bad_arguments(args, message, capsys, tmp_path):
    from flinkbuf.cli import main

    with pytest.raises(SystemExit) as info:
        main(["spark-demo", "--out", str(tmp_path / "out")] + args)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- encryption --------------------------------------------------------------------


def _note_sealed(task):
    # Before records flow every connection is open: once they flow, a peer
    # that has sent all it had (and read all it gets) may end and close its
    # connections before this task's fn starts.
    task.sealed = sorted({s["sealed"] for s in task.environment.connection_stats()})
    task.num_connections = len(task.environment.connection_stats())


def _sealed_and_count(records):
    task = current_task()
    yield (sum(1 for _ in records), task.sealed, task.num_connections)


@pytest.mark.parametrize("encryption", [True, None])
def test_encryption_seals_the_exchange_between_tasks(sc, encryption):
    """encryption=True seals every connection between the tasks; None (this
    session does not encrypt its own traffic, and every task is on this
    host) leaves them plain.  The records are the same either way."""
    rdd = sc.parallelize(range(3000), 3)
    out = pipelined_exchange(rdd, _sealed_and_count, selector="round_robin",
                             encryption=encryption, monitor=_note_sealed).collect()
    assert sum(n for n, _, _ in out) == 3000
    assert {tuple(sealed) for _, sealed, _ in out} == {(encryption is True,)}
    assert all(n >= 2 for _, _, n in out)     # one to each of the two peers


def test_the_session_s_own_encryption_turns_the_exchange_s_on():
    from flinkbuf.spark.driver import session_encryption

    class Conf(dict):
        def get(self, key, default=None):
            return dict.get(self, key, default)

    class Context:
        def __init__(self, **conf):
            self.conf = Conf({k.replace("_", "."): v for k, v in conf.items()})

        def getConf(self):   # noqa: N802 - SparkContext's name
            return self.conf

    assert session_encryption(Context(), None) is None
    assert session_encryption(Context(spark_network_crypto_enabled="true"), None) is True
    assert session_encryption(Context(spark_ssl_enabled="TRUE"), None) is True
    assert session_encryption(Context(spark_ssl_enabled="false"), None) is None
    # What the caller says wins.
    assert session_encryption(Context(spark_network_crypto_enabled="true"), False) is False
    assert session_encryption(Context(), True) is True


def test_the_rendezvous_knows_which_task_attempt_ids_spark_has_issued(sc):
    """On a real SparkContext the driver's rendezvous can tell an id Spark
    issued from one it has not (a registration with a made-up id, such as
    2**63 - 1, would otherwise make every real task look older)."""
    from flinkbuf.spark.driver import issued_task_ids

    issued = issued_task_ids(sc)
    assert issued is not None
    before = issued()
    sc.parallelize(range(8), 4).count()
    after = issued()
    assert isinstance(before, int) and after >= before + 4
    assert 2**63 - 1 >= after
