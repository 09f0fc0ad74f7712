"""The seeds' experiments, run with short phases: the outputs' contract and
the behaviour the issue expects (behaviour, not speed)."""

import csv
import json
import statistics

import pytest

from flinkbuf.cli import main
from flinkbuf.experiments.backpressure import CSV_COLUMNS as BP_COLUMNS
from flinkbuf.experiments.slow_subpartition import CSV_COLUMNS as SS_COLUMNS


def _read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_backpressure_experiment(tmp_path, capsys):
    rc = main(["experiment", "backpressure", "--out", str(tmp_path), "--phase-seconds", "2"])
    out = capsys.readouterr().out
    assert "full speed" in out and "HIGH" in out
    header, rows = _read_csv(tmp_path / "backpressure.csv")
    assert tuple(header) == BP_COLUMNS == (
        "t_seconds", "producer_limit_pct", "consumer_limit_pct", "producer_pct", "consumer_pct",
        "backpressure_level")
    assert (tmp_path / "backpressure.png").stat().st_size > 10_000
    doc = json.loads((tmp_path / "backpressure.json").read_text())
    assert len(rows) == 20                       # 5 phases x 4 intervals of 0.5 s
    limits = [(int(r["producer_limit_pct"]), int(r["consumer_limit_pct"])) for r in rows]
    assert [limits[i] for i in range(0, 20, 4)] == [(60, 100), (60, 30), (100, 100), (100, 30),
                                                   (100, 100)]
    phases = [rows[i:i + 4] for i in range(0, 20, 4)]
    pct = lambda r, who: float(r[f"{who}_pct"])   # noqa: E731

    # slowed consumer: from 0.5 s after the change the producer tracks it within 10 %
    for phase in (phases[1], phases[3]):
        for r in phase[1:]:
            assert abs(pct(r, "producer") - pct(r, "consumer")) <= 0.10 * pct(r, "consumer"), r
            assert 15 <= pct(r, "consumer") <= 40, r
            assert r["backpressure_level"] == "HIGH", r
    # the producer at 60 % with a free consumer: the consumer follows, no backpressure
    for r in phases[0][1:]:
        assert 45 <= pct(r, "producer") <= 70, r
        assert abs(pct(r, "producer") - pct(r, "consumer")) <= 0.10 * pct(r, "producer"), r
        assert r["backpressure_level"] in ("OK", "LOW"), r
    # released: both go back up to (about) full speed, far above the slowed phases
    slowed = statistics.median(pct(r, "consumer") for p in (phases[1], phases[3]) for r in p[1:])
    for phase in (phases[2], phases[4]):
        released = statistics.median(min(pct(r, "producer"), pct(r, "consumer"))
                                     for r in phase[1:])
        assert released >= 50 and released >= 1.8 * slowed, (released, slowed)
    # memory stays bounded: never more than the 2 buffers in flight, no leak
    assert doc["max_buffers_in_use"] <= 2
    assert doc["buffers_leaked"] == 0
    assert doc["rss_mb"]["max"] - doc["rss_mb"]["min"] < 50
    assert doc["checks"]["tracks_consumer"] is True
    assert rc == 0


def test_slow_subpartition_experiment(tmp_path, capsys):
    rc = main(["experiment", "slow-subpartition", "--out", str(tmp_path),
               "--phase-seconds", "1.6"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "backlog-aware" in out
    header, rows = _read_csv(tmp_path / "slow-subpartition.csv")
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
    by_mode = {r["mode"]: r for r in doc["results"]}
    assert all(r["buffers_leaked"] == 0 for r in doc["results"])
    assert by_mode["shared-pool"]["buffers_held_by_blocked_subpartition"] >= 14   # of 16
    assert by_mode["per-channel-cap"]["buffers_held_by_blocked_subpartition"] < 6  # the cap
    assert by_mode["backlog-aware"]["records_steered"] > 0


def test_phase_seconds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["experiment", "backpressure", "--phase-seconds", "0"])
