"""``flinkbuf spark-demo`` as a user runs it: a real local[2] Spark, the
command in a subprocess.  Ctrl-C at any moment (while Spark starts, during
the schedule, during the comparison) prints one line and exits with 130,
leaving no JVM or Python worker behind; a run that fails once Spark runs
is one line with its cause and exit status 1; Spark's own output goes to
its log file, not the terminal."""

import os
import subprocess
import sys

import pytest
from cli_helpers import ROOT, interrupt, marked_environment, none_left, processes_with

pytest.importorskip("pyspark")

SHORT = ["--phase-seconds", "1", "--interval", "0.25"]


@pytest.mark.parametrize("ready, delay, args", [
    ("starting Spark", 1.5, []),                         # the JVM is being launched
    ("limits P/C", 0.5, []),                             # during the schedule
    ("per task:", 0.2, ["--records", "3000000"]),        # during the keyed job
], ids=["while-spark-starts", "during-the-schedule", "during-the-comparison"])
def test_ctrl_c_is_one_line_and_status_130(tmp_path, ready, delay, args):
    env, marker = marked_environment()
    status, out, err = interrupt(["spark-demo", "--out", "o", *SHORT, *args], tmp_path, ready,
                                 delay=delay, env=env)
    assert (status, err) == (130, "flinkbuf: interrupted\n"), out
    assert "Traceback" not in out
    assert none_left(marker, timeout=30), processes_with(marker)   # Spark is stopped


def _run(args, cwd, env):
    env = dict(env, PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "flinkbuf", "spark-demo", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_failed_job_is_one_line_with_its_cause(tmp_path):
    """Python workers that cannot start: the job fails inside Spark."""
    worker = tmp_path / "python-that-fails"
    worker.write_text("#!/bin/sh\necho 'this python cannot run the workers' >&2\nexit 3\n")
    worker.chmod(0o755)
    env, marker = marked_environment()
    env["PYSPARK_PYTHON"] = str(worker)
    proc = _run(["--out", "o", *SHORT, "--records", "1000"], tmp_path, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = os.path.join("o", "spark-backpressure.log")
    assert proc.stderr == (
        "flinkbuf spark-demo: failed: the demo's Spark job failed: a Python worker did not "
        f"start: this python cannot run the workers (Spark's log: {log})\n"), proc.stderr
    assert "Traceback" not in proc.stdout
    assert (tmp_path / log).stat().st_size > 0          # what Spark printed went there
    assert none_left(marker, timeout=30), processes_with(marker)


def test_spark_that_does_not_start_is_one_line(tmp_path):
    """A java that passes the version check but cannot run Spark."""
    home = tmp_path / "java"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text('#!/bin/sh\nif [ "$1" = "-version" ]; then\n'
                    '  echo \'openjdk version "17.0.1" 2021-10-19\' >&2; exit 0\nfi\n'
                    "echo 'this java cannot start Spark' >&2\nexit 1\n")
    java.chmod(0o755)
    env, marker = marked_environment()
    env["JAVA_HOME"] = str(home)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    proc = _run(["--out", "o"], tmp_path, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("flinkbuf spark-demo: failed: Spark did not start: "), \
        proc.stderr
    assert "JAVA_GATEWAY_EXITED" in proc.stderr and "Spark's log: o/spark-backpressure.log" \
        in proc.stderr, proc.stderr
    assert "this java cannot start Spark" in (tmp_path / "o" / "spark-backpressure.log") \
        .read_text()
    assert none_left(marker), processes_with(marker)
