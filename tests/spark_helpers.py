"""Spark sessions for the tests of flinkbuf.spark: loopback only, no UI,
barrier settings that make a failing test fail fast, executors running this
interpreter (so that they import this checkout's flinkbuf)."""

import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spark_session(master, *, app="flinkbuf-tests", connect=False, **conf):
    """A SparkSession on ``master`` for the tests (stop it with :func:`stop`
    when done), started as the demo starts its own
    (flinkbuf.experiments.spark_launcher); ``connect``: ``(classic,
    connect)``, the session serving Spark Connect and a Spark Connect
    session on it (stop both)."""
    from flinkbuf.experiments import spark_launcher

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Executors import flinkbuf and these helpers from this checkout.
    tests = os.path.join(ROOT, "tests")
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, tests] + [p for p in path
                                                                 if p not in (ROOT, tests)])
    start = spark_launcher.connect_session if connect else spark_launcher.spark_session
    return start(
        master, app=app, log_level="FATAL",
        conf={"spark.barrier.sync.timeout": "60s",
              "spark.python.worker.reuse": "true",
              "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"], **conf})


# What spark-submit sets in the JVM for itself, which every session takes.
_SUBMIT_PROPERTIES = ("spark.submit.", "spark.app.submitTime")


def stop(*sessions):
    """Stop ``sessions`` (a Spark Connect one before the session serving
    it), then clear the settings that the launch of this process's JVM
    left there: spark-submit makes the first session's settings the JVM's
    system properties, which every later session of this process would
    take as its defaults (a test module's encryption, say)."""
    from flinkbuf.experiments.spark_launcher import is_connect

    classic = [s for s in sessions if not is_connect(s)]
    jvm = classic[0].sparkContext._jvm if classic else None
    for session in sessions:
        session.stop()
    if jvm is None:
        return
    system = jvm.java.lang.System
    for key in [str(k) for k in system.getProperties().keySet().toArray()]:
        if key.startswith("spark.") and not key.startswith(_SUBMIT_PROPERTIES):
            system.clearProperty(key)


def wait_for_executors(sc, count, timeout=120.0):
    """Wait until ``count`` executors registered (a barrier job needs all
    its slots at once)."""
    from flinkbuf.experiments import spark_launcher
    from flinkbuf.experiments.failures import RunFailed

    try:
        spark_launcher.wait_for_executors(sc, count, timeout)
    except RunFailed as exc:
        pytest.fail(str(exc))


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
