"""The command line fails clearly: every bad argument of every subcommand is
one line on stderr with exit status 2, before anything runs and before
anything is written.  Each case runs ``python -m flinkbuf`` in a
subprocess (the checks come first, so each takes a fraction of a second)."""

import json
import os
import subprocess
import sys

import pytest
from cli_helpers import interrupt, marked_environment, none_left, processes_with

import flinkbuf
from flinkbuf.experiments import ExperimentArgumentError, run_backpressure, run_slow_subpartition

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOO_BIG = str(2**31)          # past the C int32 of counts and sizes


def _cli(args, cwd, *, python_args=(), timeout=120):
    """Run ``python -m flinkbuf args`` from ``cwd`` with this checkout's package."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, *(python_args or ["-m", "flinkbuf"]), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _tree(path):
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, dirs, files in os.walk(path) for f in dirs + files)


def _assert_refused(args, tmp_path, message):
    before = _tree(tmp_path)
    proc = _cli(args, tmp_path)
    assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr
    assert err.endswith("\n") and err.count("\n") == 1, (args, err)   # exactly one line
    assert "Traceback" not in err and "error:" in err, (args, err)
    assert message in err, (args, message, err)
    assert proc.stdout == "", (args, proc.stdout)      # nothing ran
    assert _tree(tmp_path) == before, (args, _tree(tmp_path))   # nothing written
    return err


BP = ["experiment", "backpressure", "--out", "o"]
SS = ["experiment", "slow-subpartition", "--out", "o"]
SD = ["spark-demo", "--out", "o/deeper"]
DB = ["experiment", "debloat", "--out", "o"]
try:
    CPUS = len(os.sched_getaffinity(0))
except AttributeError:
    CPUS = os.cpu_count()

BAD_ARGUMENTS = [
    # top level
    ([], "required"),
    (["demos"], "invalid choice"),
    (["demo", "--bogus"], "unrecognized arguments"),
    (["experiment"], "required"),
    (["experiment", "fastest"], "invalid choice"),
    # demo: phases too short, or buffers too large, to show anything
    (["demo", "--seconds", "-1"], "--seconds must be >= 0.1"),
    (["demo", "--seconds", "0"], "--seconds must be >= 0.1"),
    (["demo", "--seconds", "1e-9"], "--seconds must be >= 0.1, got 1e-09 (a shorter phase"),
    (["demo", "--seconds", "0.05"], "--seconds must be >= 0.1"),
    (["demo", "--seconds", "inf"], "--seconds must be finite"),
    (["demo", "--seconds", "-inf"], "--seconds must be finite"),
    (["demo", "--seconds", "nan"], "--seconds must be finite"),
    (["demo", "--seconds", "3601"], "--seconds must be <= 3600"),
    (["demo", "--seconds", "one"], "must be a number"),
    (["demo", "--segment-size", "0"], "--segment-size must be >= 1"),
    (["demo", "--segment-size", "-4096"], "--segment-size must be >= 1"),
    (["demo", "--segment-size", "1.5"], "must be an integer"),
    (["demo", "--segment-size", "1048577"], "--segment-size must be <= 1048576, got 1048577 ("),
    (["demo", "--segment-size", TOO_BIG], "--segment-size must be <= 1048576"),
    # experiment backpressure
    (BP + ["--phase-seconds", "inf"], "--phase-seconds must be finite"),
    (BP + ["--phase-seconds", "nan"], "--phase-seconds must be finite"),
    (BP + ["--phase-seconds", "0"], "--phase-seconds must be > 0"),
    (BP + ["--phase-seconds", "-5"], "--phase-seconds must be > 0"),
    (BP + ["--phase-seconds", "-1e3"], "--phase-seconds must be > 0"),
    (BP + ["--phase-seconds", "-.5"], "--phase-seconds must be > 0"),
    (BP + ["--phase-seconds", "1e9"], "--phase-seconds must be <= 3600"),
    (BP + ["--phase-seconds", "0.2"], "must be at least --interval"),
    (BP + ["--interval", "0.4", "--phase-seconds", "0.9"],
     "--phase-seconds (0.9) must be >= 1.2 with --interval 0.4: the checks leave out the first "
     "0.5 s after each change"),
    (BP + ["--interval", "0"], "--interval must be >= 0.05"),
    (BP + ["--interval", "0.01"], "--interval must be >= 0.05"),
    (BP + ["--interval", "inf"], "--interval must be finite"),
    (BP + ["--interval", "nan"], "--interval must be finite"),
    (BP + ["--interval", "-0.5"], "--interval must be >= 0.05"),
    (BP + ["--full-speed-fraction", "0"], "--full-speed-fraction must be >= 0.01, got 0"),
    (BP + ["--full-speed-fraction", "0.001"], "--full-speed-fraction must be >= 0.01, got 0.001"),
    (BP + ["--full-speed-fraction", "1.5"], "--full-speed-fraction must be <= 1, got 1.5"),
    (BP + ["--full-speed-fraction", "nan"], "--full-speed-fraction must be finite"),
    (BP + ["--full-speed-fraction", "inf"], "--full-speed-fraction must be finite"),
    (BP + ["--full-speed", "0"], "--full-speed must be >= 854"),
    (BP + ["--full-speed", "-1"], "--full-speed must be >= 854"),
    (BP + ["--full-speed", "100"], "--full-speed must be >= 854"),
    (BP + ["--full-speed", "inf"], "--full-speed must be finite"),
    (BP + ["--full-speed", "nan"], "--full-speed must be finite"),
    (BP + ["--interval", "0.05", "--full-speed", "5000"], "--full-speed must be >= 8534"),
    (BP + ["--segment-size", "0"], "--segment-size must be >= 1"),
    (BP + ["--segment-size", TOO_BIG], "--segment-size must be <= 2147483647"),
    (BP + ["--buffers", "1"], "--buffers must be >= 2"),
    (BP + ["--buffers", "0"], "--buffers must be >= 2"),
    (BP + ["--buffers", "two"], "must be an integer"),
    (BP + ["--buffers", TOO_BIG], "--buffers must be <= 2147483647"),
    (BP + ["--buffers", "1000", "--segment-size", "2147483647"], "memory"),
    (BP + ["--transport", "tcp"], "--transport tcp needs --remote"),
    (BP + ["--remote", "--transport", "udp"], "invalid choice: 'udp'"),
    # experiment slow-subpartition
    (SS + ["--phase-seconds", "inf"], "--phase-seconds must be finite"),
    (SS + ["--phase-seconds", "nan"], "--phase-seconds must be finite"),
    (SS + ["--phase-seconds", "-nan"], "--phase-seconds must be finite"),
    (SS + ["--phase-seconds", "-Infinity"], "--phase-seconds must be finite"),
    (SS + ["--phase-seconds", "0"], "--phase-seconds must be > 0"),
    (SS + ["--phase-seconds", "-1"], "--phase-seconds must be > 0"),
    (SS + ["--phase-seconds", "7200"], "--phase-seconds must be <= 3600"),
    (SS + ["--consumer-rate", "0"], "--consumer-rate must be >= 64"),
    (SS + ["--consumer-rate", "63"], "--consumer-rate must be >= 64"),
    (SS + ["--phase-seconds", "0.1", "--consumer-rate", "800"], "--consumer-rate must be >= 854"),
    (SS + ["--consumer-rate", str(10**9 + 1)], "--consumer-rate must be <= 1000000000"),
    (SS + ["--consumer-rate", "1e5"], "must be an integer"),
    (SS + ["--pool-buffers", "2"], "--pool-buffers must be >= 3"),
    (SS + ["--pool-buffers", "0"], "--pool-buffers must be >= 3"),
    (SS + ["--pool-buffers", TOO_BIG], "--pool-buffers must be <= 2147483647"),
    (SS + ["--cap", "0"], "--cap must be >= 1"),
    (SS + ["--cap", "17"], "--cap must be <= 16"),
    (SS + ["--pool-buffers", "4", "--cap", "5"], "--cap must be <= 4"),
    (SS + ["--segment-size", "0"], "--segment-size must be >= 1"),
    (SS + ["--pool-buffers", "1000", "--segment-size", "2147483647"], "memory"),
    (SS + ["--modes", "fastest"], "unknown modes ['fastest'] in --modes"),
    (SS + ["--modes", ","], "--modes must name at least one mode"),
    (SS + ["--modes", "unimpeded,unimpeded"], "--modes must not repeat a mode"),
    (SS + ["--transport", "tcp"], "--transport tcp needs --remote"),
    # experiment debloat
    (DB + ["--phase-seconds", "0"], "--phase-seconds must be > 0"),
    (DB + ["--phase-seconds", "nan"], "--phase-seconds must be finite"),
    (DB + ["--phase-seconds", "0.15"],
     "--phase-seconds (0.15) must be >= twice --interval (0.1): the summary takes the second "
     "half of each phase"),
    (DB + ["--quick", "--phase-seconds", "2"], "--quick sets --phase-seconds: give one of them"),
    (DB + ["--interval", "0.01"], "--interval must be >= 0.05"),
    (DB + ["--interval", "11"], "--interval must be <= 10"),
    (DB + ["--segment-size", "512"], "--segment-size must be >= 1024, got 512 (debloating "
     "shrinks buffers"),
    (DB + ["--segment-size", "2097152"], "--segment-size must be <= 1048576"),
    (DB + ["--buffers", "1"], "--buffers must be >= 2, got 1 (one being filled, one in flight)"),
    (DB + ["--buffers", "many"], "must be an integer"),
    (DB + ["--target", "0"], "--target must be > 0"),
    (DB + ["--target", "-1"], "--target must be > 0"),
    (DB + ["--target", "61"], "--target must be <= 60"),
    (DB + ["--period", "0"], "--period must be >= 0.001"),
    (DB + ["--samples", "0"], "--samples must be >= 1"),
    (DB + ["--samples", "1001"], "--samples must be <= 1000"),
    (DB + ["--full-speed-fraction", "2"], "--full-speed-fraction must be <= 1"),
    (DB + ["--transport", "tcp"], "--transport tcp needs --remote"),
    (DB + ["--remote", "--transport", "udp"], "invalid choice: 'udp'"),
    # spark-demo: refused before Spark starts (and before PySpark or Java are looked for)
    (SD + ["--tasks", "3"],
     "--tasks 3 needs 3 slots at once but --master local[2] has 2: use --master local[3] "
     "or --tasks 2"),
    (SD + ["--master", "local", "--tasks", "2"], "--master local has 1: use --master local[2]"),
    *([(SD + ["--master", "local[*]", "--tasks", str(CPUS + 1)],
        f"--master local[*] has {CPUS} (the CPUs of this machine): use --master "
        f"local[{CPUS + 1}] or --tasks {CPUS}")] if CPUS < 64 else []),
    (SD + ["--master", "local[2,3]", "--tasks", "4"], "use --master local[4,3] or --tasks 2"),
    (SD + ["--master", "local-cluster[2,1,1024]", "--tasks", "3"],
     "has 2 (2 workers x 1 core): use --master local-cluster[3,1,1024] or --tasks 2"),
    (SD + ["--master", "local[0]"], "--master local[0] runs no task"),
    (SD + ["--master", "bogus://x"], "--master must be a Spark master URL (local, local[N]"),
    (SD + ["--master", "local[two]"], "--master must be a Spark master URL"),
    (SD + ["--master", "yarn-client"], "--master must be a Spark master URL"),
    (SD + ["--master", "spark://host"], "a standalone master is spark://HOST:PORT"),
    (SD + ["--master", "spark://h:7077,h2:70777"], "a standalone master is spark://HOST:PORT"),
    (SD + ["--master", "k8s://"], "the cluster's address is missing after k8s://"),
    (SD + ["--master", "mesos://h:5050"], "has no Mesos support"),
    (SD + ["--records", "0"], "--records must be >= 1, got 0"),
    (SD + ["--interval", "0.25", "--phase-seconds", "0.5"],
     "--phase-seconds (0.5) must be >= 0.75 with --interval 0.25"),
    (SD + ["--records", str(10**9 + 1)], "--records must be <= 1000000000"),
    (SD + ["--tasks", "65"], "--tasks must be <= 64"),
    (SD + ["--live-view", "4050"], "--live-view must be HOST:PORT (port 0: any free one)"),
    # monitor: refused before any request
    (["monitor"], "the following arguments are required: URL"),
    (["monitor", "https://driver:4050"], "URL must start with http://"),
    (["monitor", "driver:port"], "URL has no valid port"),
    (["monitor", "driver:4050", "--interval", "0"], "--interval must be >= 0.1"),
    (["monitor", "driver:4050", "--count", "0"], "--count must be >= 1"),
]


@pytest.mark.parametrize("args,message", BAD_ARGUMENTS,
                         ids=[" ".join(a) or "(none)" for a, _ in BAD_ARGUMENTS])
def test_bad_argument_is_one_line_exit_2_and_nothing_written(tmp_path, args, message):
    _assert_refused(args, tmp_path, message)


@pytest.mark.parametrize("experiment", ["backpressure", "slow-subpartition", "debloat"])
def test_bad_out_directory(tmp_path, experiment):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    _assert_refused(["experiment", experiment, "--out", "a-file"], tmp_path,
                    "is a file, not a directory")
    _assert_refused(["experiment", experiment, "--out", "a-file/sub/dir"], tmp_path,
                    "'a-file/sub/dir' cannot be a directory")
    # an output file of the experiment that is a directory
    (tmp_path / "o" / f"{experiment}.csv").mkdir(parents=True)
    _assert_refused(["experiment", experiment, "--out", "o"], tmp_path, "is not a file")
    assert a_file.read_text() == "not a directory"


def test_out_directory_that_cannot_be_created_or_written(tmp_path):
    # /proc refuses new directories, also to root (which ignores permission bits)
    target = "/proc/flinkbuf-cli-test/out"
    if not os.path.isdir("/proc") or os.path.exists(target):
        pytest.skip("no /proc to refuse a directory")
    err = _assert_refused(["experiment", "slow-subpartition", "--out", target], tmp_path,
                          "cannot be created")
    assert target in err
    assert not os.path.exists(target)
    # an existing directory nobody may create files in
    _assert_refused(["experiment", "backpressure", "--out", "/proc"], tmp_path,
                    "'/proc' cannot be written")


def test_out_directory_that_cannot_be_written(tmp_path):
    """A directory without write permission, and a new one under it.  Root
    ignores permission bits, so there the directory is /proc's (which no one
    may create files in) and the new one a directory under it."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):        # root
            outs = ["/proc", "/proc/flinkbuf-cli-test"]
        else:
            outs = ["locked", "locked/new"]
        for out in outs:
            _assert_refused(["experiment", "backpressure", "--out", out], tmp_path,
                            "cannot be")
            assert not os.path.exists(os.path.join(tmp_path, out, "backpressure.csv"))
    finally:
        locked.chmod(0o700)


def test_version(tmp_path):
    proc = _cli(["--version"], tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"flinkbuf {flinkbuf.__version__}\n"


@pytest.mark.parametrize("args", [[], ["demo"], ["experiment"], ["experiment", "backpressure"],
                                  ["experiment", "slow-subpartition"],
                                  ["experiment", "debloat"], ["spark-demo"],
                                  ["monitor"]])
def test_help_of_every_command(tmp_path, args):
    proc = _cli([*args, "--help"], tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("usage: flinkbuf")
    assert "seed" not in proc.stdout.lower()
    assert _tree(tmp_path) == []


def test_library_checks_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ExperimentArgumentError, match="buffers must be >= 2"):
        run_backpressure(out, 1, buffers=1)
    with pytest.raises(ExperimentArgumentError, match="phase_seconds must be finite"):
        run_backpressure(out, float("inf"))
    with pytest.raises(ExperimentArgumentError, match="pool_buffers must be >= 3"):
        run_slow_subpartition(out, 1, pool_buffers=2)
    with pytest.raises(ValueError, match="is a file"):
        (tmp_path / "f").write_text("")
        run_slow_subpartition(tmp_path / "f", 1)
    assert not out.exists()


_NO_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; "
                  "from flinkbuf.cli import main; sys.exit(main())")


def test_experiment_without_matplotlib_writes_the_data_and_says_how_to_get_the_figure(
        tmp_path):
    proc = _cli(["experiment", "slow-subpartition", "--out", "o", "--phase-seconds", "0.5",
                 "--modes", "unimpeded,backlog-aware"], tmp_path,
                python_args=["-c", _NO_MATPLOTLIB])
    assert "Traceback" not in proc.stderr, proc.stderr
    hints = [line for line in proc.stdout.splitlines() if "flinkbuf[plot]" in line]
    assert hints == ["no figure: matplotlib is not installed; for the PNG, "
                     "pip install 'flinkbuf[plot]'"], proc.stdout
    assert sorted(os.listdir(tmp_path / "o")) == ["slow-subpartition.csv",
                                                   "slow-subpartition.json"]
    doc = json.loads((tmp_path / "o" / "slow-subpartition.json").read_text())
    assert proc.returncode == (0 if doc["checks"]["passed"] else 1), proc.stdout
    assert doc["checks"]["passed"], proc.stdout


def test_per_channel_cap_only_mode_starves_the_fast_consumer_within_the_cap(tmp_path):
    proc = _cli(["experiment", "slow-subpartition", "--out", "o", "--phase-seconds", "1",
                 "--no-plot", "--modes", "unimpeded,per-channel-cap-only,per-channel-cap"],
                tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "o" / "slow-subpartition.json").read_text())
    by_mode = {r["mode"]: r for r in doc["results"]}
    checks = doc["checks"]
    # round robin with the cap: the blocked subpartition holds at most the cap,
    # and the writer, waiting for it, starves the fast consumer anyway
    assert by_mode["per-channel-cap-only"]["buffers_held_by_blocked_subpartition"] <= 6
    assert by_mode["per-channel-cap-only"]["records_steered"] == 0
    assert checks["per_channel_cap_only_starves"] is True
    # the cap with the backlog-aware round robin restores it
    assert checks["per_channel_cap_restores"] is True
    assert checks["cap_bounds_blocked_subpartition"] is True
    assert checks["shared_pool_starves"] is None          # not run
    assert not (tmp_path / "o" / "slow-subpartition.png").exists()


# ---- spark-demo: what it needs, checked before anything is written ----------------------

_NO_PYSPARK = ("import sys; sys.modules['pyspark'] = None; "
               "from flinkbuf.cli import main; sys.exit(main())")


def test_spark_demo_without_pyspark_writes_nothing(tmp_path):
    """The out directory (and its missing parents) is made only after every
    check, PySpark's among them."""
    before = _tree(tmp_path)
    proc = _cli(["spark-demo", "--out", "newdir/deeper"], tmp_path,
                python_args=["-c", _NO_PYSPARK])
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == ("flinkbuf spark-demo: error: PySpark is not installed: "
                           "pip install 'flinkbuf[spark]'\n")
    assert _tree(tmp_path) == before


def test_spark_demo_connect_without_the_connect_client_writes_nothing(tmp_path):
    pytest.importorskip("pyspark")
    # A script, not python -c: PySpark's Connect client takes a process
    # without a main file for its doctests, and exits when a package is missing.
    script = tmp_path / "no_grpc.py"
    script.write_text(_NO_PYSPARK.replace("'pyspark'", "'grpc'"))
    before = _tree(tmp_path)
    proc = _cli(["spark-demo", "--connect", "--out", "newdir/deeper"], tmp_path,
                python_args=[str(script)])
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith("flinkbuf spark-demo: error: the Spark Connect client's "
                                  "packages are missing ("), proc.stderr
    assert "grpcio" in proc.stderr and proc.stderr.endswith(
        "): pip install 'flinkbuf[spark]'\n"), proc.stderr
    assert _tree(tmp_path) == before


def _fake_java(tmp_path, version):
    home = tmp_path / f"java-{version}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\necho \'openjdk version "{version}" 2020-01-01\' >&2\n')
    java.chmod(0o755)
    return home


@pytest.mark.parametrize("case", ["no java", "JAVA_HOME without java", "Java 11", "Java 1.8"])
def test_spark_demo_without_a_usable_java_says_what_to_install(tmp_path, case):
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    if case == "no java":
        env["PATH"] = str(tmp_path)                  # nothing named java there
        message = ("no Java runtime (no java on PATH, JAVA_HOME not set): Spark needs one; "
                   "install Java 17 or later (on Debian and Ubuntu: apt-get install "
                   "openjdk-17-jre-headless)")
    elif case == "JAVA_HOME without java":
        env["JAVA_HOME"] = str(tmp_path)
        message = f"JAVA_HOME is set to {tmp_path}, which has no bin/java"
    else:
        version = "11.0.2" if case == "Java 11" else "1.8.0_292"
        env["JAVA_HOME"] = str(_fake_java(tmp_path, version))
        message = (f"needs Java 17 or later, but {env['JAVA_HOME']}/bin/java is Java "
                   f"{case.split()[1].replace('1.8', '8')}: install Java 17 or later")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env["PYTHONPATH"] = ROOT
    env.pop("PYSPARK_GATEWAY_PORT", None)
    proc = subprocess.run([sys.executable, "-m", "flinkbuf", "spark-demo", "--out", "o/deeper"],
                          cwd=run_dir, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("flinkbuf spark-demo: error: ") and message in proc.stderr, \
        proc.stderr
    assert os.listdir(run_dir) == []


# ---- demo: its verdict comes from the measured rates -------------------------------------

def _phase(name, produced, consumed, blocked, seconds=1.0):
    return {"name": name, "seconds": seconds, "produced": produced, "consumed": consumed,
            "blocked_seconds": blocked * seconds}


def test_demo_verdict_follows_the_data():
    from flinkbuf.demo import verdict

    full = _phase("consumer at full speed", 40_000, 40_000, 0.7)
    released = _phase("consumer released", 42_000, 42_000, 0.7)
    followed = verdict([full, _phase("consumer slowed", 3_450, 3_449, 0.99), released])
    assert followed["followed"] is True
    assert followed["lines"][-1].startswith("so the producer followed the consumer")
    # a consumer that slowing did not slow: nothing shown either way
    busy = verdict([full, _phase("consumer slowed", 30_000, 30_000, 0.9), released])
    assert busy["followed"] is None and busy["lines"][0].startswith("inconclusive: slowing")
    # the producer's rate followed, but its requests hardly blocked: not shown
    held = verdict([full, _phase("consumer slowed", 3_000, 3_000, 0.1), released])
    assert held["followed"] is None and "blocked only 10%" in held["lines"][-1]
    # a producer well above the consumer: it did not follow
    ahead = verdict([full, _phase("consumer slowed", 3_600, 3_000, 0.99), released])
    assert ahead["followed"] is False and ahead["lines"][-1].startswith("NO: the producer")
    # ... but two buffers ahead over the phase is only the pool in flight
    assert verdict([full, _phase("consumer slowed", 302, 300, 0.99, 0.1),
                    released])["followed"] is True
    # released, the consumer stayed slow
    stuck = verdict([full, _phase("consumer slowed", 3_000, 3_000, 0.99),
                     _phase("consumer released", 3_100, 3_100, 0.9)])
    assert stuck["followed"] is False and "did not speed up" in stuck["lines"][-1]
    # no buffer at all in a phase (1e-9 s used to print zeros and the conclusion)
    empty = verdict([_phase("consumer at full speed", 0, 0, 0, 1e-9),
                     _phase("consumer slowed", 0, 0, 0, 1e-9),
                     _phase("consumer released", 0, 0, 0, 1e-9)])
    assert empty["followed"] is None and empty["lines"][0].startswith("inconclusive: no buffer")
    for v in (busy, held, ahead, stuck, empty):
        assert not any("followed the consumer" in line for line in v["lines"])


def test_demo_prints_the_verdict_of_its_own_measurement(tmp_path):
    proc = _cli(["demo", "--seconds", "0.2"], tmp_path)
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    rows = {ln[:24].strip(): ln[24:].split() for ln in lines[2:5]}
    assert list(rows) == ["consumer at full speed", "consumer slowed", "consumer released"]
    conclusion = "so the producer followed the consumer"
    if proc.returncode == 0:
        assert lines[-1].startswith(conclusion), proc.stdout
        # what it concludes from: the slowed phase's rates, as printed
        produced, consumed = (float(x.replace(",", "")) for x in rows["consumer slowed"][:2])
        assert abs(produced - consumed) <= max(0.05 * consumed, 2 / 0.2)
    else:
        assert proc.returncode == 1
        assert not any(ln.startswith(conclusion) for ln in lines), proc.stdout
        assert lines[-1].startswith(("inconclusive", "NO")), proc.stdout
    assert _tree(tmp_path) == []


# ---- Ctrl-C: one line, exit status 130 ----------------------------------------------------

@pytest.mark.parametrize("args, ready", [
    (["demo", "--seconds", "5"], "phase"),
    (["experiment", "backpressure", "--out", "o", "--phase-seconds", "5", "--no-plot"],
     "limits P/C"),
    (["experiment", "backpressure", "--out", "o", "--phase-seconds", "5", "--no-plot",
      "--remote"], "limits P/C"),
    (["experiment", "slow-subpartition", "--out", "o", "--phase-seconds", "5", "--no-plot",
      "--remote"], "fast rec/s"),
    (["experiment", "debloat", "--out", "o", "--phase-seconds", "5", "--no-plot", "--remote"],
     "limits P/C"),
], ids=["demo", "backpressure", "backpressure-remote", "slow-subpartition-remote",
        "debloat-remote"])
def test_ctrl_c_is_one_line_and_status_130(tmp_path, args, ready):
    """Also the consumers' process of --remote, which gets the terminal's
    Ctrl-C too: it prints nothing and is gone."""
    env, marker = marked_environment()
    status, out, err = interrupt(args, tmp_path, ready, env=env)
    assert (status, err) == (130, "flinkbuf: interrupted\n"), out
    assert none_left(marker), processes_with(marker)
    assert os.listdir(tmp_path) == []      # the out directory made for the run is gone again


SWALLOWED = """
import os, signal, sys
import flinkbuf.cli as cli

class Finalized:
    def __del__(self):            # a KeyboardInterrupt raised here is ignored by Python
        os.kill(os.getpid(), signal.SIGINT)

def command(args):
    Finalized()
    print("went on", flush=True)
    return 0

parser = cli.build_parser()
def build():
    args = parser.parse_args(["monitor", "http://127.0.0.1:9/"])
    args.func = command
    class P:
        def parse_args(self, argv):
            return args
    return P()
cli.build_parser = build
sys.exit(cli.main([]))
"""


def test_ctrl_c_whose_interrupt_was_swallowed_still_exits_130(tmp_path):
    """Ctrl-C landing where Python ignores the KeyboardInterrupt (a
    finalizer): the command goes on, but the run still ends as interrupted."""
    proc = subprocess.run([sys.executable, "-c", SWALLOWED], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
                              flinkbuf.__file__))))
    assert (proc.returncode, proc.stdout, proc.stderr) == \
        (130, "went on\n", "flinkbuf: interrupted\n")
