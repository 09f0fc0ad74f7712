"""One line for the error that ends a run (what the command line prints
instead of a traceback), from errors shaped like those of PySpark's JVM."""

from flinkbuf.experiments.failures import RunFailed, describe, one_line


class Py4JJavaError(Exception):
    """Shaped like py4j's: ``java_exception``, and the JVM's text as str()."""

    java_exception = object()


def _java(*lines):
    return Py4JJavaError("\n".join(("An error occurred while calling "
                                    "z:org.apache.spark.api.python.PythonRDD.collectAndServe.",)
                                   + lines))


STACK = ("\tat org.apache.spark.scheduler.DAGScheduler.runJob(DAGScheduler.scala:1549)",
         "\tat java.base/java.lang.Thread.run(Thread.java:840)")


def test_a_spark_error_is_its_first_line_without_the_package():
    exc = _java(": org.apache.spark.scheduler.BarrierJobSlotsNumberCheckFailed: [SPARK-24819]: "
                "Barrier execution mode does not allow run a barrier stage that requires more "
                "slots than the total number of slots in the cluster currently.", *STACK)
    assert describe(exc) == ("BarrierJobSlotsNumberCheckFailed: [SPARK-24819]: Barrier execution "
                             "mode does not allow run a barrier stage that requires more slots "
                             "than the total number of slots in the cluster currently.")


def test_a_failed_task_is_its_own_error_not_the_jobs():
    exc = _java(": org.apache.spark.SparkException: Job aborted due to stage failure: Could not "
                "recover from a failed barrier ResultStage.",
                "org.apache.spark.SparkException: EOFException occurred while reading the port "
                "number from pyspark.daemon's stdout and terminated with code: 3..", *STACK)
    assert describe(exc) == ("SparkException: EOFException occurred while reading the port "
                             "number from pyspark.daemon's stdout and terminated with code: 3..")
    caused = _java(": org.apache.spark.SparkException: Job aborted.", *STACK,
                   "Caused by: java.io.IOException: No space left on device", *STACK)
    assert describe(caused) == "IOException: No space left on device"


def test_what_a_python_worker_said_when_it_did_not_start():
    exc = _java(": org.apache.spark.SparkException: Job aborted due to stage failure: Could not "
                "recover from a failed barrier ResultStage.",
                "org.apache.spark.SparkException: ", "Error from python worker:",
                "  /usr/bin/python3: No module named pyspark", "PYTHONPATH was:", "  /x/y.zip",
                "org.apache.spark.SparkException: EOFException occurred while reading the port "
                "number", *STACK)
    assert describe(exc) == ("a Python worker did not start: /usr/bin/python3: No module named "
                             "pyspark")


def test_a_python_error_in_a_task():
    exc = _java(": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 "
                "failed: org.apache.spark.api.python.PythonException: Traceback (most recent "
                "call last):",
                '  File "worker.py", line 1, in main', "    process()",
                "KeyError: 3", "", "During handling of the above exception, another exception "
                "occurred:", "", "Traceback (most recent call last):",
                '  File "fn.py", line 2, in fn', "    raise ValueError('boom')",
                "ValueError: boom", "", *STACK)
    assert describe(exc) == "ValueError: boom (raised in a Spark task)"


def test_python_errors_and_their_causes():
    assert describe(OSError(28, "No space left on device")) == \
        "OSError: [Errno 28] No space left on device"
    assert describe(TimeoutError()) == "TimeoutError"
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError as inner:
            raise RuntimeError("the control connection failed") from inner
    except RuntimeError as exc:
        assert describe(exc) == "ConnectionResetError: reset by peer"
        assert one_line(exc) == "the control connection failed: ConnectionResetError: reset by peer"
    failed = RunFailed.because("Spark did not start", FileNotFoundError("no java"),
                               "Spark's log: out/x.log")
    assert str(failed) == "Spark did not start: FileNotFoundError: no java (Spark's log: out/x.log)"
    assert one_line(failed) == str(failed) and describe(RuntimeError("x")) == "RuntimeError: x"
    assert isinstance(failed.__cause__, FileNotFoundError)
