"""``flinkbuf experiment debloat``: the schedule runs twice (debloating off,
then on) in one process and with the consumer in another one; its outputs'
contract, the expectations it checks (on order, not on timings), its
per-phase summary and its sojourn bookkeeping."""

import json
import sys

import pytest
from helpers import read_csv
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf.experiments
from flinkbuf.cli import main
from flinkbuf.experiments import debloat as db
from flinkbuf.experiments.arguments import ExperimentArgumentError

# The experiment measures rates and times: make test runs it alone.
pytestmark = pytest.mark.serial

PHASES = 5


@pytest.mark.parametrize("where", ["local", "remote"])
def test_debloat_experiment(tmp_path, capsys, where):
    """Both runs of the schedule, a row per interval each; with debloating
    the slowed consumer's records wait less (p99 over the second half of
    each slowed phase), the size shrinks below the segment size while it is
    slowed, and no buffer is lost."""
    rc = main(["experiment", "debloat", "--out", str(tmp_path), "--phase-seconds", "2"]
              + (["--remote", "--no-plot"] if where == "remote" else []))
    out = capsys.readouterr().out
    header, rows = read_csv(tmp_path / "debloat.csv")
    assert tuple(header) == db.CSV_COLUMNS
    doc = json.loads((tmp_path / "debloat.json").read_text())
    assert doc["config"]["exchange"].startswith(where)
    assert doc["config"]["schedule"] == [[60, 100], [60, 30], [100, 100], [100, 30], [100, 100]]
    assert (tmp_path / "debloat.png").exists() == (where == "local")
    ticks = 20                                  # 2 s phases of 0.1 s intervals
    assert [r["debloat"] for r in rows] == ["off"] * ticks * PHASES + ["on"] * ticks * PHASES
    for run in ("off", "on"):
        mine = [r for r in rows if r["debloat"] == run]
        assert [float(r["t_seconds"]) for r in mine] == pytest.approx(
            [0.1 * (i + 1) for i in range(ticks * PHASES)])
        assert [int(r["phase"]) for r in mine] == [1 + i // ticks for i in range(ticks * PHASES)]
        for r in mine:
            assert int(r["consumer_records_per_s"]) >= 0 and int(r["in_flight_bytes"]) >= 0
            assert int(r["held_bytes"]) >= 0 and int(r["given_back_segments"]) >= 0
            if int(r["sojourn_records"]):
                assert 0 <= float(r["sojourn_p50_ms"]) <= float(r["sojourn_p99_ms"])
        # the slowed consumer backs the producer's pool up: all its buffers held
        held = [int(r["held_bytes"]) for r in mine
                if int(r["consumer_limit_pct"]) < int(r["producer_limit_pct"])]
        assert max(held) >= 16 * 32768, held
        sizes = [r["buffer_size"] for r in mine]
        if run == "off":
            assert set(sizes) == {""}
        else:
            assert all(256 <= int(s) <= 32768 for s in sizes if s)
            slowed = [int(r["buffer_size"]) for r in mine
                      if int(r["consumer_limit_pct"]) < int(r["producer_limit_pct"])
                      and r["buffer_size"]]
            assert min(slowed) < 32768, slowed
    phases = doc["phases"]
    assert [(p["producer_limit_pct"], p["consumer_limit_pct"]) for p in phases] == \
        [tuple(s) for s in doc["config"]["schedule"]]
    for p in phases:
        if p["consumer_limit_pct"] < p["producer_limit_pct"]:
            assert p["on"]["settled_sojourn_p99_ms"] < p["off"]["settled_sojourn_p99_ms"], p
            # the slowed consumer runs at its limit either way
            assert p["on"]["consumer_records_per_s"] > 0.5 * p["off"]["consumer_records_per_s"]
    checks = doc["checks"]
    assert checks["sojourn_lower"] is True and checks["no_buffer_lost"] is True
    assert doc["buffers_leaked"] == {"off": 0, "on": 0}
    assert rc == (0 if checks["passed"] else 1)
    # a line per interval and run, then the table: a line per phase
    assert len([ln for ln in out.splitlines() if ln.startswith(("off ", " on "))]) == \
        2 * ticks * PHASES
    assert "per phase, over its second half (debloating off / on):" in out
    assert "p99 sojourn lower with debloating: yes" in out


def _phase(k, limits, off, on):
    """A phase of the summary: (settled p99 ms, consumer records/s) per run."""
    entry = {"phase": k, "producer_limit_pct": limits[0], "consumer_limit_pct": limits[1]}
    for mode, (p99, rate) in (("off", off), ("on", on)):
        entry[mode] = {"settled_sojourn_p99_ms": p99, "consumer_records_per_s": rate}
    return entry


def test_checks_follow_the_summary():
    good = [_phase(1, (60, 100), (10, 1000), (9, 1000)),
            _phase(2, (60, 30), (300, 500), (120, 480))]
    checks = db.check_debloat(good, {"off": 0, "on": 0})
    assert checks["sojourn_lower"] is True and checks["throughput_kept"] is True
    assert checks["min_throughput_ratio"] == 0.96 and checks["passed"] is True
    assert checks["slowed_p99_ms"] == [{"phase": 2, "off": 300, "on": 120}]

    not_lower = good[:1] + [_phase(2, (60, 30), (300, 500), (300, 500))]
    checks = db.check_debloat(not_lower, {"off": 0, "on": 0})
    assert checks["sojourn_lower"] is False and checks["passed"] is False

    slower = good[:1] + [_phase(2, (60, 30), (300, 500), (100, 350))]
    checks = db.check_debloat(slower, {"off": 0, "on": 0})
    assert checks["throughput_kept"] is False and checks["min_throughput_ratio"] == 0.7
    assert checks["passed"] is False

    checks = db.check_debloat(good, {"off": 0, "on": 2})
    assert checks["no_buffer_lost"] is False and checks["passed"] is False

    # no slowed phase: nothing to show about the sojourn, and nothing fails
    checks = db.check_debloat(good[:1], {"off": 0, "on": 0})
    assert checks["sojourn_lower"] is None and checks["passed"] is True


def test_percentile_by_rank():
    assert db.percentile([], 0.99) is None
    assert db.percentile([5], 0.5) == 5
    values = list(range(1, 101))
    assert db.percentile(values, 0.5) == 51 and db.percentile(values, 0.99) == 100
    assert db.percentile(values, 0.0) == 1


@given(st.lists(st.lists(st.integers(0, 10**12), max_size=40), max_size=30),
       st.integers(1, 6))
def test_phase_sojourns_keep_a_uniform_subsample(batches, cap_log2):
    """Past the cap, every other sojourn is kept, then every fourth, ...:
    what is kept is always every ``stride``-th of all seen, in order."""
    old = db.MAX_KEPT_SOJOURNS
    db.MAX_KEPT_SOJOURNS = 2 ** cap_log2
    try:
        kept = db._PhaseSojourns()
        seen = []
        for k, batch in enumerate(batches):
            kept.add(batch, second_half=k >= len(batches) // 2)
            seen.extend(batch)
            assert list(kept.all) == seen[::kept._stride]
            assert len(kept.all) <= db.MAX_KEPT_SOJOURNS
    finally:
        db.MAX_KEPT_SOJOURNS = old


def test_library_rejects_bad_arguments_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    for kwargs, message in (({"buffers": 1}, "buffers must be >= 2"),
                            ({"target": 0}, "target must be > 0"),
                            ({"samples": 0}, "samples must be >= 1"),
                            ({"interval": 0.5}, r"phase_seconds \(0.5\) must be >= twice"),
                            ({"transport": "tcp"}, "transport tcp needs remote"),
                            ({"segment_size": 100}, "segment_size must be >= 1024")):
        with pytest.raises(ExperimentArgumentError, match=message):
            db.run_debloat(out, 0.5, **kwargs)
    assert not out.exists()


def test_without_matplotlib_the_data_is_written_and_the_figure_skipped(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setitem(sys.modules, "flinkbuf.experiments.plotting", None)
    monkeypatch.delattr(flinkbuf.experiments, "plotting", raising=False)
    lines = []
    row = {c: 0 for c in db.CSV_COLUMNS}
    drawn = db.write_outputs(tmp_path, {"rows": [row]}, plot=True, printer=lines.append)
    assert drawn is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["debloat.csv", "debloat.json"]
    assert lines == ["no figure: matplotlib is not installed; for the PNG, "
                     "pip install 'flinkbuf[plot]'"]
