"""The driver program of the multi-host tests (netns_cluster.py starts it in
the driver's namespace).  It makes the Spark session on the cluster's
master, then runs calls that arrive on stdin, one JSON line each
(``{"id", "fn", "kwargs"}``), each in a thread of its own, and answers on
the pipe named by ``FLINKBUF_DRIVER_REPLIES`` with ``{"id", "result"}``
or ``{"id", "error", "message", "seconds"}``.  The calls are the public
functions below; what runs in the tasks is defined here too (it travels by
value)."""

import collections
import json
import os
import sys
import threading
import time
import traceback

SC = None
SPARK = None
_REPLY_LOCK = threading.Lock()


# ---- in the tasks ---------------------------------------------------------------------------

def _where(task):
    """What a task says of itself: index, its stage attempt, the address
    its server bound, the one its environment gives peers and the one it
    published, its process, and the transport of each of its connections
    by peer."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    return {"index": task.index, "task_attempt": ctx.taskAttemptId(),
            "bound": "%s:%d" % task.environment.bound_address,
            "address": "%s:%d" % task.environment.address, "published": task.address,
            "pid": os.getpid(), "local_ip": os.environ.get("SPARK_LOCAL_IP"),
            "infos": [i.address for i in ctx.getTaskInfos()],
            "connections": sorted([c["peer"], c["transport"]]
                                  for c in task.environment.connection_stats())}


def _marking(marker_dir, inner=None):
    """A monitor that keeps what _where says of the task once it is
    connected and before any record flows (``task.where``: every
    connection is open then; a peer that has sent all it had may end
    before ``fn`` starts), and writes it with the pid into one file per
    task attempt in ``marker_dir``."""
    def monitor(task):
        doc = task.where = _where(task)
        if marker_dir:
            name = f"{doc['task_attempt']}-{doc['index']}-{doc['pid']}"
            tmp = os.path.join(marker_dir, "." + name)
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.rename(tmp, os.path.join(marker_dir, name))
        return inner(task) if inner is not None else None
    return monitor


def _pairs(keys, slow_seconds, marker_dir):
    """Records ``(i % keys, 1)`` for the i of this partition, spread over
    ``slow_seconds`` until the file ``fast`` appears in ``marker_dir``
    (time for a test to strike while the exchange runs)."""
    def gen(index, iterator):
        items = list(iterator)
        step = max(1, len(items) // 100)
        fast = os.path.join(marker_dir, "fast") if marker_dir else None
        for j, i in enumerate(items):
            if slow_seconds and j % step == 0 and not (fast and os.path.exists(fast)):
                time.sleep(slow_seconds / 100)
            yield (i % keys, 1)
    return gen


def _count_with_where(records):
    from flinkbuf.spark import current_task

    task = current_task()
    yield ("where", task.where)
    counts = collections.Counter()
    for k, v in records:
        counts[k] += v
    yield from counts.items()


# ---- calls ----------------------------------------------------------------------------------

def ping():
    return "pong"


def executors():
    """The hosts of the registered executors (the driver left out)."""
    infos = SC._jsc.sc().statusTracker().getExecutorInfos()
    driver = SC.getConf().get("spark.driver.host")
    hosts = [i.host() for i in infos]
    hosts.remove(driver) if driver in hosts else None
    return sorted(hosts)


def wait_executors(hosts, timeout=60.0):
    """Wait until the executors are on exactly ``hosts``."""
    deadline = time.monotonic() + timeout
    while True:
        now = executors()
        if now == sorted(hosts):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"executors on {now}, not on {sorted(hosts)}, after {timeout} s")
        time.sleep(0.1)


def rendezvous_attempts():
    """The stage attempts each open rendezvous of this driver has seen."""
    from flinkbuf.spark import _rendezvous

    return sorted(s.attempts_started for s in list(_rendezvous._LIVE) if not s.closed)


def close_rendezvous():
    from flinkbuf.spark import close_rendezvous as close

    close()


def keyed(n, partitions, keys=101, shuffle=False, slow_seconds=0.0, marker_dir=None,
          opts=None):
    """The keyed count of ``n`` records through pipelined_exchange (then
    through reduceByKey if ``shuffle``); returns each task's where and
    whether the counts are exact."""
    from flinkbuf.io import assign_key_to_operator
    from flinkbuf.spark import pipelined_exchange

    opts = dict(opts or {})
    rdd = SC.parallelize(range(n), partitions).mapPartitionsWithIndex(
        _pairs(keys, slow_seconds, marker_dir))
    t0 = time.monotonic()
    out = pipelined_exchange(rdd, _count_with_where, monitor=_marking(marker_dir), **opts)
    if shuffle:
        rows = (out.map(lambda r: r if r[0] != "where" else (("where", json.dumps(r[1])), 1))
                .reduceByKey(lambda a, b: a + b).collect())
        where = [json.loads(k[1]) for k, _ in rows if isinstance(k, tuple)]
        counts = {k: v for k, v in rows if not isinstance(k, tuple)}
        placed = True
    else:
        parts = out.glom().collect()
        where = [p[0][1] for p in parts]
        counts = {}
        placed = True
        for j, part in enumerate(parts):
            for k, v in part[1:]:
                counts[k] = v
                placed = placed and assign_key_to_operator(k, partitions) == j
    seconds = time.monotonic() - t0
    expected = collections.Counter(i % keys for i in range(n))
    return {"where": sorted(where, key=lambda w: w["index"]), "exact": counts == expected,
            "placed": placed, "seconds": seconds}


def arrow(n, partitions, keys=101, opts=None):
    """The keyed count through arrow_exchange: per key, the count, and the
    partition that counted it."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from flinkbuf.spark import arrow_exchange, current_task, key_partitions

    def count(batches):
        import numpy as np

        task = current_task()
        where = json.dumps(task.where)
        totals = collections.Counter()
        for batch in batches:
            ks, cs = np.unique(batch.column(0).to_numpy(), return_counts=True)
            totals.update(dict(zip(ks.tolist(), cs.tolist())))
        yield pa.RecordBatch.from_pydict(
            {"k": list(totals), "c": list(totals.values()),
             "task": [task.index] * len(totals), "where": [where] * len(totals)},
            schema=pa.schema([("k", pa.int64()), ("c", pa.int64()), ("task", pa.int32()),
                              ("where", pa.string())]))

    df = SPARK.range(0, n, 1, partitions).select((F.col("id") % keys).alias("k"))
    t0 = time.monotonic()
    rows = arrow_exchange(df, count, "k", "k long, c long, task int, where string",
                          monitor=_marking(None), **(opts or {})).collect()
    seconds = time.monotonic() - t0
    counts = {r["k"]: r["c"] for r in rows}
    expected = collections.Counter(i % keys for i in range(n))
    ks = sorted(counts)
    owners = dict(zip(ks, key_partitions(ks, partitions).tolist()))
    placed = all(owners[r["k"]] == r["task"] for r in rows)
    where = {}
    for r in rows:
        where[r["task"]] = json.loads(r["where"])
    return {"where": [where[i] for i in sorted(where)], "exact": counts == expected,
            "placed": placed, "seconds": seconds}


# ---- the loop -------------------------------------------------------------------------------

def _session(conf):
    global SC, SPARK
    from pyspark import cloudpickle

    from flinkbuf.experiments import spark_launcher

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    SPARK = spark_launcher.spark_session(
        conf["master"], app="flinkbuf-multihost", host=conf["host"],
        log_level=conf.get("log_level", "WARN"),
        conf={"spark.driver.port": str(conf["driver_port"]),
              "spark.blockManager.port": str(conf["block_manager_port"]),
              "spark.executor.memory": "1g",
              "spark.executor.extraJavaOptions": conf["java_opts"],
              "spark.driver.extraJavaOptions": conf["java_opts"],
              "spark.executor.heartbeatInterval": "1s",
              "spark.network.timeout": "10s",
              "spark.network.timeoutInterval": "1s",
              "spark.barrier.sync.timeout": "60s",
              "spark.python.worker.reuse": "true",
              "spark.executorEnv.PYTHONPATH": conf["python_path"],
              **conf.get("extra", {})})
    SC = SPARK.sparkContext


def _reply(fd, doc):
    data = (json.dumps(doc) + "\n").encode()
    with _REPLY_LOCK:
        while data:
            data = data[os.write(fd, data):]


def _run(fd, request):
    t0 = time.monotonic()
    try:
        fn = globals()[request["fn"]]
        if request["fn"].startswith("_") or not callable(fn):
            raise KeyError(request["fn"])
        doc = {"id": request["id"], "result": fn(**request["kwargs"])}
    except BaseException as exc:    # noqa: BLE001 - every error goes back to the test
        traceback.print_exc()
        doc = {"id": request["id"], "error": type(exc).__name__, "message": str(exc),
               "seconds": time.monotonic() - t0}
    _reply(fd, doc)


def main():
    fd = int(os.environ.pop("FLINKBUF_DRIVER_REPLIES"))
    conf = json.loads(os.environ.pop("FLINKBUF_DRIVER_CONF"))
    os.dup2(2, 1)                   # what Spark and its JVM print goes to the log
    _session(conf)
    _reply(fd, {"id": 0, "result": "ready"})
    for line in sys.stdin:
        request = json.loads(line)
        threading.Thread(target=_run, args=(fd, request), daemon=True).start()
    SPARK.stop()


if __name__ == "__main__":
    main()
