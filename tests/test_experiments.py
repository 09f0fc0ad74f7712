"""The experiments, run with short phases: the outputs' contract and the
behaviour expected of them (the only timed expectations in the suite), and
the rows of the Spark demo computed from its tasks' counters."""

import json
import os
import re
import statistics
import sys
import time

import pytest

from flinkbuf.cli import main
from flinkbuf.experiments import run_backpressure, run_slow_subpartition
from flinkbuf.experiments.backpressure import CSV_COLUMNS as BP_COLUMNS
from flinkbuf.experiments.backpressure import check_backpressure
from flinkbuf.experiments.slow_subpartition import CSV_COLUMNS as SS_COLUMNS
from flinkbuf.experiments.slow_subpartition import check_slow_subpartition
from flinkbuf.experiments.spark_control import Sojourns
from flinkbuf.experiments.spark_demo import (
    DEFAULT_SCHEDULE,
    _steer,
    interval_row,
    sojourn_columns,
)
from helpers import read_csv
from network_helpers import AUTO_SAME_HOST

# The experiments measure rates: make test runs them alone.
pytestmark = pytest.mark.serial


@pytest.mark.parametrize("where", ["local", "remote"])
def test_backpressure_experiment(tmp_path, capsys, where):
    """In one process, and (``--remote``) with the consumer in another one
    reading over shared memory (the default transport on this host): the
    same schedule, outputs and expectations."""
    rc = main(["experiment", "backpressure", "--out", str(tmp_path), "--phase-seconds", "3"]
              + (["--remote"] if where == "remote" else []))
    out = capsys.readouterr().out
    assert "full speed" in out
    # a live line per interval: time, limits, both rates, the backpressure level
    live = re.findall(r"^ *\d+\.\d +\d+/\d+ +[\d.]+% +[\d.]+% +(OK|LOW|HIGH) ", out, re.M)
    assert len(live) == 30, out
    header, rows = read_csv(tmp_path / "backpressure.csv")
    assert tuple(header) == BP_COLUMNS == (
        "t_seconds", "producer_limit_pct", "consumer_limit_pct", "producer_pct", "consumer_pct",
        "backpressure_level")
    assert (tmp_path / "backpressure.png").stat().st_size > 10_000
    doc = json.loads((tmp_path / "backpressure.json").read_text())
    assert doc["config"]["schedule"] == [[60, 100], [60, 30], [100, 100], [100, 30], [100, 100]]
    assert doc["config"]["buffers_per_task"] == 2 and doc["config"]["segment_size"] == 4096
    assert doc["config"]["exchange"].startswith(where)
    # the transport the connection used (on Linux, shared memory by default)
    words = {"shm": "over shared memory", "unix": "over a Unix socket"}[AUTO_SAME_HOST]
    assert (words in out) == (where == "remote"), out
    assert "TCP" not in out
    assert doc["config"]["transport"] == (AUTO_SAME_HOST if where == "remote" else None)
    assert 0 < doc["full_speed_records_per_s"] < doc["unthrottled_records_per_s"]
    assert len(rows) == 30                       # 5 phases x 6 intervals of 0.5 s
    assert [float(r["t_seconds"]) for r in rows] == [0.5 * (i + 1) for i in range(30)]
    limits = [(int(r["producer_limit_pct"]), int(r["consumer_limit_pct"])) for r in rows]
    assert limits == [tuple(lim) for lim in doc["config"]["schedule"] for _ in range(6)]
    # from 0.5 s after each change; medians where one interval of machine noise
    # (another process taking the CPU) must not decide
    phases = [rows[i + 1:i + 6] for i in range(0, 30, 6)]
    pct = lambda r, who: float(r[f"{who}_pct"])   # noqa: E731
    extra = {r["t_seconds"]: r for r in doc["rows"]}

    def median(phase, key):
        return statistics.median(key(r) for r in phase)

    # the producer at 60 %, the consumer not slowed: the consumer follows, and
    # the producer is mostly not back-pressured
    assert 50 <= median(phases[0], lambda r: pct(r, "producer")) <= 70
    for r in phases[0]:
        assert abs(pct(r, "producer") - pct(r, "consumer")) <= 0.10 * pct(r, "producer"), r
    assert median(phases[0], lambda r: extra[float(r["t_seconds"])][
        "producer_back_pressured_ms_per_s"]) <= 500
    # the level of each interval is that interval's own: OK in the first one
    # (nothing slowed yet) and in the first one after each release
    # (in one process: the consumer in another one may wait for the CPU)
    if where == "local":
        first_released = [extra[t] for t in (6.5, 12.5)]
        assert extra[0.5]["backpressure_level"] == "OK", extra[0.5]
        assert [r["backpressure_level"] for r in first_released] == ["OK", "OK"], \
            first_released
    # slowed consumer: the producer tracks it within 10 %, blocked (HIGH)
    for phase in (phases[1], phases[3]):
        for r in phase:
            assert abs(pct(r, "producer") - pct(r, "consumer")) <= 0.10 * pct(r, "consumer"), r
            assert pct(r, "consumer") <= 40, r
            assert r["backpressure_level"] == "HIGH", r
        assert 20 <= median(phase, lambda r: pct(r, "consumer")) <= 40
    # released: both back at full speed
    for phase in (phases[2], phases[4]):
        for who in ("producer", "consumer"):
            assert 85 <= median(phase, lambda r: pct(r, who)) <= 110, \
                (who, [pct(r, who) for r in phase])
    # memory stays bounded: no buffer leaked, the process does not grow
    assert doc["buffers_leaked"] == 0
    assert doc["rss_mb"]["max"] - doc["rss_mb"]["min"] < 50
    assert doc["checks"]["rss_growth_mb"] < 50
    checks = doc["checks"]
    assert checks["tracks_consumer"] is True and checks["max_tracking_error_pct"] <= 10
    assert checks["returns_to_full_speed"] is True and len(checks["released_phases"]) == 2
    assert checks["memory_bounded"] is True and checks["passed"] is True
    assert rc == 0


def _rows(pattern, ticks=4, interval=0.5):
    """Rows for check_backpressure: ``pattern`` is one (producer limit,
    consumer limit, [(producer %, consumer %) per interval]) per phase."""
    rows = []
    for p_lim, c_lim, values in pattern:
        assert len(values) == ticks
        for p, c in values:
            rows.append({"t_seconds": (len(rows) + 1) * interval, "producer_limit_pct": p_lim,
                         "consumer_limit_pct": c_lim, "producer_pct": p, "consumer_pct": c})
    return rows


def test_backpressure_checks_fail_when_the_producer_does_not_follow():
    good = [(60, 100, [(60, 60)] * 4),
            (60, 30, [(45, 31)] + [(30, 30)] * 3),    # the first 0.5 s is not checked
            (100, 100, [(70, 70), (100, 99), (60, 61), (98, 98)])]   # median 98
    checks = check_backpressure(_rows(good), 0.5, 4)
    assert checks["tracks_consumer"] is True and checks["returns_to_full_speed"] is True
    assert checks["max_tracking_error_pct"] == 0
    assert checks["released_phases"] == [{"from_seconds": 4.5, "to_seconds": 6.0,
                                          "producer_median_pct": 98, "consumer_median_pct": 98}]

    not_following = [(60, 30, [(30, 30), (30, 30), (34, 30), (30, 30)])]
    checks = check_backpressure(_rows(not_following), 0.5, 4)
    assert checks["tracks_consumer"] is False
    assert checks["max_tracking_error_pct"] == pytest.approx(13.33)
    assert checks["returns_to_full_speed"] is None            # no released phase

    stuck = [(100, 100, [(100, 100), (100, 100), (80, 80), (80, 80)])]
    checks = check_backpressure(_rows(stuck), 0.5, 4)
    assert checks["returns_to_full_speed"] is False
    assert checks["released_producer_median_pct"] == 80
    assert checks["tracks_consumer"] is None                  # no slowed phase

    # a consumer that was not slowed shows nothing about the producer following it
    unslowed = [(60, 30, [(60, 58), (60, 59), (60, 60), (60, 60)])]
    checks = check_backpressure(_rows(unslowed), 0.5, 4)
    assert checks["consumer_slowed"] is False and checks["tracks_consumer"] is None
    assert checks["max_tracking_error_pct"] == pytest.approx(1.69, abs=0.01)   # (60, 59)
    assert check_backpressure(_rows(good), 0.5, 4)["consumer_slowed"] is True

    # with 0.25 s intervals the first two intervals after a change are not checked
    settling = [(60, 30, [(50, 30), (40, 30), (30, 30), (30, 30)])]
    assert check_backpressure(_rows(settling, interval=0.25), 0.25, 4)["tracks_consumer"] is True
    assert check_backpressure(_rows(settling), 0.5, 4)["tracks_consumer"] is False


def test_backpressure_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="phase_seconds .* must be >= interval"):
        run_backpressure(tmp_path, 0.2, interval=0.5)
    with pytest.raises(ValueError, match="pairs of numbers > 0"):
        run_backpressure(tmp_path, 1, schedule=[(60, 0)])
    with pytest.raises(ValueError, match="full_speed_fraction"):
        run_backpressure(tmp_path, 1, full_speed_fraction=1.5)
    assert not list(tmp_path.iterdir())                       # nothing ran, nothing written


def test_backpressure_cli_rejects_bad_arguments(capsys):
    for argv, message in ((["--phase-seconds", "0"], "must be > 0"),
                          (["--phase-seconds", "0.2"], "must be at least --interval"),
                          (["--buffers", "two"], "must be an integer"),
                          (["--full-speed-fraction", "2"], "must be <= 1")):
        with pytest.raises(SystemExit) as exc:
            main(["experiment", "backpressure", *argv])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("where", ["local", "remote"])
def test_slow_subpartition_experiment(tmp_path, capsys, where):
    rc = main(["experiment", "slow-subpartition", "--out", str(tmp_path),
               "--phase-seconds", "1.6"] + (["--remote"] if where == "remote" else []))
    out = capsys.readouterr().out
    assert "backlog-aware" in out
    header, rows = read_csv(tmp_path / "slow-subpartition.csv")
    assert tuple(header) == SS_COLUMNS == (
        "mode", "fast_consumer_records_per_s", "slow_consumer_records_per_s")
    assert [r["mode"] for r in rows] == ["unimpeded", "shared-pool", "per-channel-cap",
                                         "backlog-aware"]
    assert (tmp_path / "slow-subpartition.png").stat().st_size > 10_000
    fast = {r["mode"]: float(r["fast_consumer_records_per_s"]) for r in rows}
    slow = {r["mode"]: float(r["slow_consumer_records_per_s"]) for r in rows}
    unimpeded = fast["unimpeded"]
    assert unimpeded > 10_000
    assert slow["unimpeded"] > 0.5 * unimpeded
    assert fast["shared-pool"] <= 0.10 * unimpeded          # starving
    assert fast["per-channel-cap"] >= 0.90 * unimpeded      # restored
    assert fast["backlog-aware"] >= 0.90 * unimpeded
    for mode in ("shared-pool", "per-channel-cap", "backlog-aware"):
        assert slow[mode] == 0
    doc = json.loads((tmp_path / "slow-subpartition.json").read_text())
    assert doc["config"]["pool_buffers"] == 16 and doc["config"]["max_buffers_per_channel"] == 6
    assert doc["config"]["exchange"].startswith(where)
    by_mode = {r["mode"]: r for r in doc["results"]}
    assert all(r["buffers_leaked"] == 0 for r in doc["results"])
    assert by_mode["shared-pool"]["buffers_held_by_blocked_subpartition"] >= 14   # of 16
    assert by_mode["per-channel-cap"]["buffers_held_by_blocked_subpartition"] < 6   # the cap
    assert by_mode["backlog-aware"]["records_steered"] > 0
    checks = doc["checks"]
    assert checks["shared_pool_starves"] is True
    assert checks["per_channel_cap_restores"] is True and checks["backlog_aware_restores"] is True
    assert checks["passed"] is True and rc == 0


def test_slow_subpartition_checks():
    def result(mode, fast):
        return {"mode": mode, "fast_consumer_records_per_s": fast, "buffers_leaked": 0}

    ok = [result("unimpeded", 1000), result("shared-pool", 50), result("per-channel-cap", 950),
          result("backlog-aware", 900)]
    checks = check_slow_subpartition(ok)
    assert checks["passed"] is True
    assert checks["fast_vs_unimpeded"] == {"unimpeded": 1.0, "shared-pool": 0.05,
                                           "per-channel-cap": 0.95, "backlog-aware": 0.9}
    not_starving = [result("unimpeded", 1000), result("shared-pool", 400)]
    checks = check_slow_subpartition(not_starving)
    assert checks["shared_pool_starves"] is False and checks["passed"] is False
    assert checks["backlog_aware_restores"] is None
    not_restored = [result("unimpeded", 1000), result("backlog-aware", 850)]
    assert check_slow_subpartition(not_restored)["passed"] is False
    # an unimpeded run that read nothing is no reference: nothing passes on it
    no_reference = [result("unimpeded", 0), result("shared-pool", 0),
                    result("backlog-aware", 900)]
    checks = check_slow_subpartition(no_reference)
    assert checks["reference_measured"] is False and checks["passed"] is False
    assert checks["shared_pool_starves"] is None and checks["backlog_aware_restores"] is None
    assert check_slow_subpartition([result("shared-pool", 50)])["reference_measured"] is None


def test_slow_subpartition_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown modes"):
        run_slow_subpartition(tmp_path, 1, modes=("unimpeded", "fastest"))
    with pytest.raises(ValueError, match="cap must be >= 1"):
        run_slow_subpartition(tmp_path, 1, cap=0)


def test_backpressure_remote_over_tcp_says_tcp(tmp_path):
    lines = []
    doc = run_backpressure(tmp_path, 0.75, interval=0.25, remote=True, transport="tcp",
                           plot=False, printer=lines.append)
    assert doc["config"]["transport"] == "tcp" and doc["config"]["transport_asked"] == "tcp"
    assert "over TCP on loopback" in lines[0] and "Unix" not in "".join(lines), lines
    assert "reads over TCP on loopback" in doc["config"]["exchange"]


def _is_devnull(fd):
    st, null = os.fstat(fd), os.stat(os.devnull)
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)


def test_a_ctrl_c_while_the_consumers_spawn_waits_until_stderr_is_back():
    """The remote consumers are spawned with fd 2 on /dev/null (what the
    child prints before its target runs, a Ctrl-C's traceback while it
    imports, goes nowhere); a Ctrl-C of those moments reaches this
    process's handler afterwards, with its standard error restored."""
    import signal

    from flinkbuf.experiments.remote import _quiet_spawn

    before = os.fstat(2)
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(
        _is_devnull(2)))
    try:
        with _quiet_spawn():
            assert _is_devnull(2)
            signal.raise_signal(signal.SIGINT)
            assert seen == []                   # held back
        assert seen == [False]                  # then handled, stderr back
        after = os.fstat(2)
        assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_to_stderr(stderr, text):
    os.dup2(stderr.fd, 2)
    os.close(stderr.fd)
    sys.stderr.write(text)
    sys.stderr.flush()


def test_a_child_spawned_quietly_takes_the_real_stderr_back(capfd):
    import multiprocessing

    from flinkbuf.experiments.remote import _quiet_spawn

    ctx = multiprocessing.get_context("spawn")
    with _quiet_spawn() as stderr:
        child = ctx.Process(target=_write_to_stderr, args=(stderr, "from the child\n"))
        child.start()
    child.join(60)
    assert child.exitcode == 0
    assert "from the child" in capfd.readouterr().err


def test_transport_in_use_tells_the_transports_apart():
    """What the experiments report is the connection's transport, seen from
    the server's side: a peer with transport "tcp" comes over TCP even to a
    server that also listens on a Unix socket, and so on."""
    import sys

    import flinkbuf as fb
    from flinkbuf.experiments.remote import new_secret, transport_in_use
    from flinkbuf.network import NetworkEnvironment

    secret = new_secret()
    linux = sys.platform.startswith("linux")
    expected = {"tcp": "tcp",
                "auto": AUTO_SAME_HOST if linux else "tcp",
                "unix": "unix" if linux else "tcp", "shm": "shm" if linux else "tcp"}
    for transport, used in expected.items():
        with NetworkEnvironment(8, 4096, secret=secret) as server, \
                NetworkEnvironment(8, 4096, secret=secret, transport=transport,
                                   floating_buffers_per_gate=0) as client:
            assert transport_in_use(server) is None         # no connection yet
            partition = fb.create_partition(server.network_buffer_pool, 1, min_buffers=2)
            server.register_partition("p", partition)
            writer = fb.RecordWriter(partition, fb.ForwardSelector())
            gate = client.create_input_gate([(server.address, "p", 0)])
            writer.emit((1, 2))
            writer.close()
            assert list(gate) == [(1, 2)]
            assert transport_in_use(server) == used, transport
            gate.close()
            partition.pool.destroy()


# ---- the Spark demo's rows, from its tasks' cumulative counters ---------------------------

class _Job:
    error = None


class _SimulatedTasks:
    """The Spark demo's control connection, answered by simulated tasks:
    records flow at the limits set; a producer whose consumer is slower is
    back-pressured 950 ms per second, an unthrottled one (the calibration)
    600.  Each task reports its cumulative counters, as the real ones do,
    and ``bp``: the back-pressured ms/s of the last second, as a 1 s
    sliding window of the task's metrics reads it."""

    num_tasks = 2
    UNTHROTTLED = 400_000             # records/s of each task
    SOJOURN_MS = 250
    seq = last_ns = 0

    def __init__(self):
        self.now = time.monotonic()
        self.records = 0.0
        self.bp_seconds = 0.0
        self.flow = (self.UNTHROTTLED, 0.6)
        self.history = [(self.now, 0.0)]

    def _advance(self):
        now = time.monotonic()
        self.records += self.flow[0] * (now - self.now)
        self.bp_seconds += self.flow[1] * (now - self.now)
        self.now = now
        self.history.append((now, self.bp_seconds))

    def _window(self):
        t0, bp0 = next(h for h in self.history if h[0] >= self.now - 1.0)
        return (self.bp_seconds - bp0) / (self.now - t0) * 1000 if self.now > t0 else 0.0

    def ask(self, msg):
        self._advance()
        if msg["cmd"] == "limits":
            if msg["producer"] is None:
                self.flow = (self.UNTHROTTLED, 0.6)
            else:
                consumer = msg["consumer"] or 100.0
                self.flow = (msg["rate"] * min(msg["producer"], consumer) / 100,
                             0.95 if consumer < msg["producer"] else 0.0)
            return [{"ok": True}] * self.num_tasks
        assert msg["cmd"] == "sample"
        # a record a sample: emitted now (task 0), read by task 1 at the next
        # sample, SOJOURN_MS later while the consumer is slower
        ns = int(self.now * 1e9)
        self.seq += 1
        wait = self.SOJOURN_MS * 1e6 if self.flow[1] > 0.9 else 1e6
        read = [(self.seq - 1, self.last_ns + int(wait))] if self.seq > 1 else []
        self.last_ns = ns
        return [{"t_ns": ns, "out": int(self.records),
                 "in": int(self.records), "bp_ns": int(self.bp_seconds * 1e9),
                 "bp": self._window(), "out_pool": 1.0 if self.flow[1] else 0.4,
                 "in_pool": 0.5, "emitted": [(self.seq, ns)] if k == 0 else [],
                 "read": read if k == 1 else []} for k in range(self.num_tasks)]


def test_spark_demo_levels_are_those_of_their_intervals():
    """The first interval (nothing slowed) and the first after each release
    read OK, every slowed one HIGH: the back-pressured time of exactly each
    interval, not a 1 s window that still holds the calibration or the
    slowed phase before."""
    lines = []
    rows, unthrottled, full_rate = _steer(_SimulatedTasks(), _Job(), 0.4, 0.1,
                                          DEFAULT_SCHEDULE, 0.25, lines.append)
    assert unthrottled == pytest.approx(2 * _SimulatedTasks.UNTHROTTLED, rel=0.05)
    assert len(rows) == 20
    levels = [r["backpressure_level"] for r in rows]
    slowed = [r["consumer_limit_pct"] < r["producer_limit_pct"] for r in rows]
    assert levels == ["HIGH" if s else "OK" for s in slowed], levels
    # An interval may hold a few ms of the phase before it (the steering's
    # command lands just after the interval's first sample on a busy
    # machine): 60 ms/s allows that, and is far from what a 1 s window
    # still holding the calibration (600) or a slowed phase (950) reads.
    slack = 60
    assert rows[0]["producer_back_pressured_ms_per_s"] == pytest.approx(0, abs=slack)
    for r in (rows[8], rows[16]):                   # the first intervals after a release
        assert r["producer_back_pressured_ms_per_s"] == pytest.approx(0, abs=slack), r
    for r, s in zip(rows, slowed):
        if s:
            assert r["producer_back_pressured_ms_per_s"] == pytest.approx(950, abs=slack), r
    assert [r["producer_pct"] for r in rows[:4]] == pytest.approx([60] * 4, abs=1)
    live = [ln for ln in lines if re.match(r"^ *\d+\.\d ", ln)]
    assert [ln.split()[4] for ln in live] == levels
    # the records' sojourn: each interval's sample reads the record of the
    # sample before (the first, the calibration's last)
    for r, s in zip(rows, slowed):
        assert r["sojourn_records"] == 1, r
        assert r["sojourn_p99_ms"] == pytest.approx(250 if s else 1), r
    assert [ln.split()[-1] for ln in live] == [f"{r['sojourn_p99_ms']:.1f}" for r in rows]


def test_spark_demo_sojourns_join_the_marks_of_any_sample():
    """An emit mark and its read mark meet whichever sample brings either
    first; a mark without its partner waits, and the oldest are dropped
    beyond the bound."""
    sojourns = Sojourns(max_pending=3)
    assert sojourns.add([{"emitted": [(1, 100), (2, 200)], "read": [(1, 150)]}]) == [50]
    assert sorted(sojourns.add([{"read": [(3, 390)]},
                                {"emitted": [(3, 300)], "read": [(2, 260)]}])) == [60, 90]
    assert sojourns.add([{}]) == []                 # a sample without marks
    assert sojourns.add([{"emitted": [(k, k) for k in range(10, 16)]}]) == []
    assert sojourns.add([{"read": [(10, 20), (15, 20)]}]) == [5]   # 10 was dropped
    assert sojourn_columns([]) == {"sojourn_p50_ms": None, "sojourn_p99_ms": None,
                                   "sojourn_records": 0}
    assert sojourn_columns([3_000_000, 1_000_000, 2_000_000]) == {
        "sojourn_p50_ms": 2.0, "sojourn_p99_ms": 3.0, "sojourn_records": 3}


def test_spark_demo_interval_row():
    before = (10.0, [{"t_ns": 0, "out": 0, "in": 0, "bp_ns": 0, "out_pool": 0.4, "in_pool": 0},
                     {"t_ns": 5, "out": 0, "in": 0, "bp_ns": 0, "out_pool": 0.4, "in_pool": 0}])
    after = (10.5, [{"t_ns": 500_000_000, "out": 300, "in": 250, "bp_ns": 40_000_000,
                     "out_pool": 0.6, "in_pool": 0.2},
                    {"t_ns": 500_000_005, "out": 200, "in": 250, "bp_ns": 300_000_000,
                     "out_pool": 1.0, "in_pool": 0.5}])
    row = interval_row(0.5, (60, 30), before, after, 2000.0)
    assert row == {"t_seconds": 0.5, "producer_limit_pct": 60, "consumer_limit_pct": 30,
                   "producer_pct": 50.0, "consumer_pct": 50.0, "backpressure_level": "HIGH",
                   "producer_records_per_s": 1000, "consumer_records_per_s": 1000,
                   "producer_back_pressured_ms_per_s": 600.0, "out_pool_usage": 1.0,
                   "in_pool_usage": 0.5}
