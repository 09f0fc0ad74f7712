"""Task metrics: Flink's names, readable while tasks run, moving the right way."""

import json
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.io.metrics import HIGH, LOW, OK, TaskMetrics, backpressure_level
from test_io_support import Task, assert_all_recycled, wait_until

FLINK_NAMES = {
    "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond", "busyTimeMsPerSecond",
    "outPoolUsage", "inPoolUsage", "numRecordsInPerSecond", "numRecordsOutPerSecond",
    "numBytesInPerSecond", "numBytesOutPerSecond", "backPressureLevel",
}


def test_levels_follow_flinks_thresholds():
    assert [backpressure_level(x) for x in (0, 0.1, 0.1000001, 0.5, 0.51, 1)] == \
        [OK, OK, LOW, LOW, HIGH, HIGH]
    with pytest.raises(ValueError):
        backpressure_level(float("nan"))
    with pytest.raises(ValueError):
        TaskMetrics("x", window=0)


@given(st.floats(0, 1))
def test_level_is_monotone(x):
    order = {OK: 0, LOW: 1, HIGH: 2}
    assert order[backpressure_level(x)] <= order[backpressure_level(min(1.0, x + 0.2))]


def _pool_usage(writer, gate):
    """The two gauges, read through throw-away probes (snapshots of the
    tasks' own metrics would restart their rate windows)."""
    return (TaskMetrics("probe", writers=[writer]).snapshot()["outPoolUsage"],
            TaskMetrics("probe", gates=[gate]).snapshot()["inPoolUsage"])


def _run(consumer_delay, producer_delay, seconds=0.8):
    """1 -> 1 through 4 small buffers; per-record delays (busy work in the
    consumer, sleeps between batches in the producer).  Returns the
    snapshots of both tasks taken while running."""
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1, min_buffers=4)
    writer = fb.RecordWriter(part, buffer_timeout=0.01)
    gate = fb.InputGate([(part, 0)])
    producer = TaskMetrics("producer", writers=[writer], window=0.3)
    consumer = TaskMetrics("consumer", gates=[gate], window=0.3)
    stop = threading.Event()

    def produce():
        with writer:
            i = 0
            while not stop.is_set():
                writer.emit((i, i))
                i += 1
                if producer_delay and i % 50 == 0:
                    time.sleep(producer_delay)

    def consume():
        for _ in gate:
            if consumer_delay:
                # slow work that lets go of the GIL (a spin would also slow the
                # producer down, by holding the GIL, not by backpressure)
                time.sleep(consumer_delay)

    tasks = [Task(produce), Task(consume)]
    for t in tasks:
        t.start()
    time.sleep(0.2)
    producer.snapshot()
    consumer.snapshot()
    # the pool usages are gauges (a point in time, as in Flink): sample them
    usage = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        usage.append(_pool_usage(writer, gate))
        time.sleep(0.01)
    snaps = (producer.snapshot(), consumer.snapshot(),
             max(u[0] for u in usage), max(u[1] for u in usage))
    json.loads(producer.to_json())
    stop.set()
    for t in tasks:
        t.finish()
    gate.close()
    assert_all_recycled(nbp, [part.pool])
    return snaps


def test_metrics_under_a_throttled_consumer_and_a_throttled_producer():
    slow_consumer = _run(consumer_delay=50e-6, producer_delay=0)
    slow_producer = _run(consumer_delay=0, producer_delay=0.002)
    p, c, max_out_usage, max_in_usage = slow_consumer
    assert FLINK_NAMES <= set(p) and FLINK_NAMES <= set(c)
    # the producer waits for buffers, the consumer is busy working
    assert p["backPressuredTimeMsPerSecond"] > 500
    assert p["backPressureLevel"] == HIGH
    assert max_out_usage >= 0.5
    assert c["busyTimeMsPerSecond"] > 500
    assert c["idleTimeMsPerSecond"] < 300
    assert max_in_usage > 0
    assert 0 < p["numRecordsOutPerSecond"] < 100_000
    # now the other way round: the consumer waits for input
    p2, c2, _, _ = slow_producer
    assert p2["backPressuredTimeMsPerSecond"] < 100
    assert p2["backPressureLevel"] == OK
    assert c2["idleTimeMsPerSecond"] > 500
    assert c2["busyTimeMsPerSecond"] < 500
    assert p["backPressuredTimeMsPerSecond"] > p2["backPressuredTimeMsPerSecond"]
    assert c2["idleTimeMsPerSecond"] > c["idleTimeMsPerSecond"]
    for snap in (p, c, p2, c2):
        assert abs(snap["busyTimeMsPerSecond"] + snap["idleTimeMsPerSecond"] +
                   snap["backPressuredTimeMsPerSecond"] - 1000) < 1e-6 or \
            snap["busyTimeMsPerSecond"] == 0


def test_rates_and_totals_agree():
    nbp = fb.NetworkBufferPool(32, 1024)  # room for all 1000 records: one thread
    part = fb.create_partition(nbp, 1, min_buffers=20)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    gate = fb.InputGate([(part, 0)])
    m = TaskMetrics("both", writers=[writer], gates=[gate], window=10)
    for i in range(1000):
        writer.emit(b"x" * 10)
    writer.close()
    assert sum(1 for _ in gate) == 1000
    s = m.snapshot()
    assert s["numRecordsOut"] == s["numRecordsIn"] == 1000
    assert s["numBytesOut"] == s["numBytesIn"] == writer.num_bytes_out > 14_000
    assert s["numRecordsOutPerSecond"] > 0 and s["numBytesInPerSecond"] > 0
    assert s["outPoolUsage"] == 0 and s["inPoolUsage"] == 0
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_snapshots_from_many_threads_while_running():
    nbp = fb.NetworkBufferPool(8, 512)
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part)
    gate = fb.InputGate([(part, 0)])
    m = TaskMetrics("t", writers=[writer], gates=[gate], window=0.05)
    stop = threading.Event()
    seen = []

    def read():
        while not stop.is_set():
            seen.append(m.snapshot())

    readers = [Task(read) for _ in range(3)]
    for r in readers:
        r.start()
    c = Task(lambda: sum(1 for _ in gate))
    c.start()
    with writer:
        for i in range(30000):
            writer.emit(i)
    assert c.finish() == 30000
    stop.set()
    for r in readers:
        r.finish()
    assert len(seen) > 3
    assert all(0 <= s["backPressuredTimeMsPerSecond"] <= 1000 for s in seen)
    assert seen[-1]["numRecordsOut"] <= 30000
    gate.close()
    assert_all_recycled(nbp, [part.pool])


@pytest.mark.timeout(60)
def test_input_buffer_metrics_over_a_remote_and_a_local_channel():
    """A gate over a remote channel and a local one: the remote channel's
    own buffers (2 exclusive, and the gate's 4 floating ones it borrows as
    its sender's backlog grows) and what arrived into them make the input
    buffer metrics; the local channel counts for none of them, and both
    count in inPoolUsage."""
    from flinkbuf.network import NetworkEnvironment
    from network_helpers import SECRET

    def env():
        return NetworkEnvironment(64, 1024, secret=SECRET, exclusive_buffers_per_channel=2,
                                  floating_buffers_per_gate=4)

    with env() as prod, env() as cons:
        remote = fb.create_partition(prod.network_buffer_pool, 1, min_buffers=8)
        prod.register_partition("r", remote)
        local = fb.create_partition(cons.network_buffer_pool, 1, min_buffers=4)
        cons.register_partition("l", local)
        gate = cons.create_input_gate([(prod.address, "r", 0), (cons.address, "l", 0)],
                                      codec="bytes")
        metrics = TaskMetrics("consumer", gates=[gate])
        s = metrics.snapshot()
        assert (s["inputExclusiveBuffersUsage"], s["inputFloatingBuffersUsage"],
                s["numBytesInRemote"], s["numBuffersInRemote"], s["inPoolUsage"]) == \
            (0.0, 0.0, 0, 0, 0.0)
        remote_writer = fb.RecordWriter(remote, codec="bytes", buffer_timeout=0)
        local_writer = fb.RecordWriter(local, codec="bytes", buffer_timeout=0)
        for i in range(6):
            remote_writer.emit(bytes([i]) * 800)          # one buffer each
        for i in range(3):
            local_writer.emit(bytes([i]) * 800)
        # Nobody reads: all 2 + 4 buffers of the remote channel fill up.
        assert wait_until(lambda: metrics.snapshot()["numBuffersInRemote"] == 6, 10)
        s = metrics.snapshot()
        assert s["inputExclusiveBuffersUsage"] == 1.0
        assert s["inputFloatingBuffersUsage"] == 1.0
        assert s["numBytesInRemote"] == 6 * 804             # 4-byte length + 800
        local_size = local.pool.num_buffers
        assert s["inPoolUsage"] == pytest.approx((3 + 6) / (local_size + 6))
        assert s["numBuffersIn"] == 0                        # nothing read yet
        remote_writer.close()
        local_writer.close()
        got = sorted(bytes(r) for r in gate)
        assert got == sorted([bytes([i]) * 800 for i in range(6)] +
                             [bytes([i]) * 800 for i in range(3)])
        s = metrics.snapshot()
        # and EndOfPartition, an event of one byte (events are no buffers)
        assert (s["numBuffersInRemote"], s["numBytesInRemote"]) == (6, 6 * 804 + 1)
        assert s["numBuffersIn"] == 9 and s["numBytesIn"] == 9 * 804
        assert s["inputFloatingBuffersUsage"] == 0.0
        gate.close()


def test_a_local_gate_has_the_input_buffer_metrics_at_zero():
    with fb.NetworkBufferPool(8, 256) as nbp:
        part = fb.create_partition(nbp, 1)
        gate = fb.InputGate([(part, 0)])
        with fb.RecordWriter(part, buffer_timeout=None) as writer:
            writer.emit(1)
        s = TaskMetrics("local", gates=[gate]).snapshot()
        assert (s["inputExclusiveBuffersUsage"], s["inputFloatingBuffersUsage"],
                s["numBytesInRemote"], s["numBuffersInRemote"]) == (0.0, 0.0, 0, 0)
        assert s["inPoolUsage"] > 0                         # the queued buffer counts here
        assert list(gate) == [1]
        gate.close()
