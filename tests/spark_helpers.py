"""Spark sessions for the tests of flinkbuf.spark: loopback only, no UI,
barrier settings that make a failing test fail fast, executors running this
interpreter (so that they import this checkout's flinkbuf)."""

import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spark_session(master, *, app="flinkbuf-tests", **conf):
    """A SparkSession on ``master`` for the tests (stop it when done)."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Executors import flinkbuf and these helpers from this checkout.
    tests = os.path.join(ROOT, "tests")
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, tests] + [p for p in path
                                                                 if p not in (ROOT, tests)])
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
               .config("spark.barrier.sync.timeout", "60s")
               .config("spark.python.worker.reuse", "true")
               .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"]))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")
    return spark


def wait_for_executors(sc, count, timeout=120.0):
    """Wait until ``count`` executors registered (a barrier job needs all
    its slots at once)."""
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while True:
        # The driver is listed too.
        if len(tracker.getExecutorInfos()) - 1 >= count:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{count} executors did not register within {timeout} s")
        time.sleep(0.2)


def _probe(_):
    """In a Python worker: what flinkbuf left behind there."""
    import gc
    import threading

    import flinkbuf.buffer as core
    from flinkbuf.network import environment

    gc.collect()
    threads = [t.name for t in threading.enumerate() if t.name.startswith("flinkbuf")]
    return [{"pid": os.getpid(), "threads": threads,
             "environments": len(list(environment._LIVE)),
             "counters": core.debug_counters()}]


def leftovers(sc, num_tasks):
    """Per Python worker that a job of ``num_tasks`` tasks reaches: the
    flinkbuf threads, open network environments and (debug builds) live
    buffers and segments left there.  Waits up to 10 s for them to go."""
    deadline = time.monotonic() + 10
    while True:
        found = sc.parallelize(range(num_tasks), num_tasks).mapPartitions(_probe).collect()
        bad = [w for w in found if w["threads"] or w["environments"]
               or (w["counters"] and any(w["counters"].values()))]
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(0.5)
