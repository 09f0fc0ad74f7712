"""``flinkbuf spark-demo`` as a user runs it: a real local[2] Spark, the
command in a subprocess.  Ctrl-C at any moment (while Spark starts, during
the schedule, during the comparison) prints one line and exits with 130,
leaving no JVM or Python worker behind; a run that fails once Spark runs
is one line with its cause and exit status 1; Spark's own output goes to
its log file, not the terminal.  With ``--connect`` the same demo runs
through a Spark Connect server it starts."""

import json
import os
import statistics
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


def test_the_demo_through_spark_connect(tmp_path):
    """--connect: the schedule and the keyed job as a Spark Connect client
    (Arrow batches through arrow_exchange), with the classic demo's output."""
    env, marker = marked_environment()
    proc = _run(["--connect", "--out", "o", *SHORT, "--records", "20000"], tmp_path, env)
    out = proc.stdout
    assert proc.stderr == "" and "Traceback" not in out, out + proc.stderr
    doc = json.loads((tmp_path / "o" / "spark-backpressure.json").read_text())
    assert proc.returncode == (0 if doc["checks"]["passed"] else 1), out
    lines = out.splitlines()
    assert lines[0].startswith("starting Spark (local[2], serving Spark Connect; its log: ")
    assert lines[1].startswith("Spark ") and "local[2], through Spark Connect: 2 tasks " \
        "exchange records as Arrow batches through flinkbuf (arrow_exchange; 5 output buffers " \
        "of 4096 bytes per task)" in lines[1], lines[1]
    assert lines[2].startswith("live view: http://127.0.0.1:"), lines[2]
    assert doc["config"]["spark_connect"] is True and doc["config"]["master"] == "local[2]"
    # A line per interval, as the classic demo prints them: the slowed
    # consumers hold the producers near 30 %; released, both run at full speed.
    assert len([ln for ln in lines if ln.lstrip()[:1].isdigit() and "%" in ln]) == 20, out
    rows = doc["rows"]
    assert len(rows) == 20 and doc["unthrottled_records_per_s"] > 0
    slowed = [r["producer_pct"] for r in rows if r["consumer_limit_pct"] == 30][1:]
    released = [r["producer_pct"] for r in rows[8:12] + rows[16:]][1:]
    assert statistics.median(slowed) < 45 and statistics.median(released) > 70, rows
    assert any(r["backpressure_level"] == "HIGH" for r in rows if r["consumer_limit_pct"] == 30)
    by_phase = doc["sojourn_by_phase"]
    assert min(by_phase[1]["sojourn_p99_ms"], by_phase[3]["sojourn_p99_ms"]) > \
        max(by_phase[2]["sojourn_p99_ms"], by_phase[4]["sojourn_p99_ms"]), by_phase
    # Each task's rows: every row sent was read, and the producers waited.
    tasks = doc["tasks"]
    assert [t["task"] for t in tasks] == [0, 1]
    assert sum(t["records_out"] for t in tasks) == sum(t["records_in"] for t in tasks) > 0
    assert all(t["back_pressured_seconds"] > 0 and t["bytes_out"] > 0 for t in tasks)
    assert "per task:" in lines
    # The keyed job over a DataFrame, through arrow_exchange and Spark's shuffle.
    assert "the keyed job: 20,000 (long, long) rows of a DataFrame in 2 partitions, counted " \
        "per key in the consumer" in lines
    runs = doc["comparison"]["runs"]
    assert runs["flinkbuf"]["records"] == runs["Spark shuffle"]["records"] == 20_000
    assert doc["comparison"]["same_counts"] is True
    assert "same counts per key, every record counted: yes" in lines
    for name in ("csv", "png", "log"):
        assert (tmp_path / "o" / f"spark-backpressure.{name}").stat().st_size > 0
    assert none_left(marker, timeout=30), processes_with(marker)
