"""Soft and hard backpressure, and a task's producer and consumer sides:
each wait of a RecordWriter lands where its docstring says (hard: blocked
requesting a buffer the pool does not have; soft: a channel at its cap, no
channel free for the backlog-aware round robin, no room for an event),
while it lasts and after; TaskMetrics' sums hold for any counters
(hypothesis) and for real runs; an exchange task's producer is idle before
it starts and once it is done."""

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.io import MAX_QUEUED_EVENTS, monotonic_ns
from flinkbuf.io.metrics import TaskMetrics, _Sample
from flinkbuf.io.producer import ProducerThread
from flinkbuf.spark.exchange import ExchangeTask
from test_io_support import Task, wait_until

SIDES = ("producerBusyTimeMsPerSecond", "producerIdleTimeMsPerSecond",
         "consumerBusyTimeMsPerSecond", "consumerIdleTimeMsPerSecond")


@pytest.fixture
def nbp():
    with fb.NetworkBufferPool(32, 256) as pool:
        yield pool


def _blocked(writer, action, at_least_ns=100_000_000):
    """Run ``action`` in a thread until the writer has been back-pressured
    for ``at_least_ns`` (the wait still in progress); the thread."""
    task = Task(action)
    task.start()
    assert wait_until(lambda: writer._back_pressure_counters()[0] >= at_least_ns, 10)
    assert task.is_alive()
    return task


def _assert_split(writer, soft_share):
    """The writer's back-pressured time so far is soft (``soft_share`` 1)
    or hard (0), within the few microseconds a wait takes to classify."""
    total, soft = writer._back_pressure_counters()
    assert 0 <= soft <= total and total > 0
    hard = total - soft
    if soft_share:
        assert hard < 0.01 * total + 50_000, (total, soft)
    else:
        assert soft == 0, (total, soft)
    return total, soft


def test_a_request_for_a_buffer_the_pool_does_not_have_is_hard(nbp):
    part = fb.create_partition(nbp, 1, min_buffers=2)
    writer = fb.RecordWriter(part, buffer_timeout=0)
    gate = fb.InputGate([(part, 0)])
    metrics = TaskMetrics("t", writers=[writer], window=60)
    task = _blocked(writer, lambda: [writer.emit(i) for i in range(5)])
    total, _ = _assert_split(writer, 0)                  # while it waits
    for _ in range(5):
        next(gate)
    task.finish()
    total2, _ = _assert_split(writer, 0)                 # and once it is over
    assert total2 >= total
    s = metrics.snapshot()
    assert s["softBackPressuredTimeMsPerSecond"] == 0.0
    assert s["hardBackPressuredTimeMsPerSecond"] == s["backPressuredTimeMsPerSecond"] > 0
    writer.close()
    gate.close()


def test_a_channel_at_its_cap_while_the_pool_has_buffers_is_soft(nbp):
    part = fb.create_partition(nbp, 2, min_buffers=8, max_buffers_per_channel=2)
    writer = fb.RecordWriter(part, lambda record, n: 0, buffer_timeout=0)
    gate = fb.InputGate([(part, 0)])
    metrics = TaskMetrics("t", writers=[writer], window=60)
    task = _blocked(writer, lambda: [writer.emit(i) for i in range(4)])
    assert part.pool.num_available + part.pool.num_buffers - part.pool.num_requested > 0
    _assert_split(writer, 1)
    for _ in range(4):
        next(gate)
    task.finish()
    _assert_split(writer, 1)
    s = metrics.snapshot()
    assert s["softBackPressuredTimeMsPerSecond"] > 0
    assert s["softBackPressuredTimeMsPerSecond"] + s["hardBackPressuredTimeMsPerSecond"] == \
        pytest.approx(s["backPressuredTimeMsPerSecond"])
    writer.close()
    part.release()
    gate.close()


def test_a_debloated_channel_at_its_limit_while_the_pool_has_buffers_is_soft():
    """A slow local consumer's debloated size limits its channel to a few
    buffers; the writer's wait there, with the pool's other buffers free,
    is soft.  (A pool kept at 16 buffers: the limit, not the pool, holds.)"""
    from test_debloat_gate import FAST, _read_slowly
    with fb.NetworkBufferPool(64, 32768) as pool:
        part = fb.create_partition(pool, 1, min_buffers=16, max_buffers=16,
                                   buffer_debloat=True)
        writer = fb.RecordWriter(part, buffer_timeout=0.01, codec="bytes")
        gate = fb.InputGate([(part, 0)], codec="bytes", **FAST)
        stop = threading.Event()

        def produce():
            i = 0
            while not stop.is_set():
                writer.emit(i.to_bytes(4, "big") + b"x" * 96)
                i += 1

        task = Task(produce)
        task.start()
        _read_slowly(gate, 1.0, 500)
        assert 0 < part.subpartition(0).buffer_size < 32768
        base = writer._back_pressure_counters()
        assert wait_until(lambda: writer._back_pressure_counters()[0] - base[0] >= 100_000_000, 10)
        assert part.pool.num_available + part.pool.num_buffers - part.pool.num_requested > 0
        total, soft = writer._back_pressure_counters()
        assert soft - base[1] >= 0.99 * (total - base[0]) - 50_000, (base, total, soft)
        stop.set()
        for _ in gate:          # drain until the writer's loop sees stop
            if not task.is_alive():
                break
        task.finish()
        writer.close()
        gate.close()


def test_no_free_channel_for_the_backlog_aware_round_robin_is_soft(nbp):
    part = fb.create_partition(nbp, 2, min_buffers=16)
    writer = fb.RecordWriter(part, fb.BacklogAwareRebalanceSelector(1), buffer_timeout=0)
    gates = [fb.InputGate([(part, i)]) for i in range(2)]
    task = _blocked(writer, lambda: [writer.emit(i) for i in range(3)])
    total, soft = _assert_split(writer, 1)
    assert soft == total                         # the wait is soft from its first instant
    next(gates[0])
    task.finish()
    assert _assert_split(writer, 1)[1] == writer._back_pressure_counters()[0]
    writer.close()
    for g in gates:
        g.close()


def test_waiting_for_room_for_an_event_is_soft(nbp):
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    gate = fb.InputGate([(part, 0)])
    task = _blocked(writer, lambda: [writer.broadcast_event(fb.UserEvent(i))
                                     for i in range(MAX_QUEUED_EVENTS + 1)])
    total, soft = _assert_split(writer, 1)
    assert soft == total
    assert next(gate) == fb.UserEvent(0)
    task.finish()
    total, soft = writer._back_pressure_counters()
    assert soft == total > 0
    writer.close()
    gate.close()


def test_a_hard_wait_then_a_soft_one_count_apart(nbp):
    part = fb.create_partition(nbp, 1, min_buffers=2)
    writer = fb.RecordWriter(part, buffer_timeout=0)
    gate = fb.InputGate([(part, 0)])
    task = _blocked(writer, lambda: [writer.emit(i) for i in range(4)])
    for _ in range(4):
        next(gate)
    task.finish()
    hard, soft = writer._back_pressure_counters()
    assert soft == 0 and hard > 0
    task = Task(lambda: [writer.broadcast_event(fb.UserEvent(i))
                         for i in range(MAX_QUEUED_EVENTS + 1)])
    task.start()
    assert wait_until(lambda: writer._back_pressure_counters()[1] >= 100_000_000, 10)
    for _ in range(MAX_QUEUED_EVENTS + 1):
        next(gate)
    task.finish()
    total, soft = writer._back_pressure_counters()
    assert total - soft == hard and soft >= 100_000_000
    assert writer.back_pressured_time_ns >= total
    writer.close()
    gate.close()


# ---- the sums, for any counters -----------------------------------------------------------------

_NS = st.integers(0, 10 ** 12)


@st.composite
def _sample_pairs(draw):
    """Two samples of monotone counters (as the writers and gates keep them:
    soft within back-pressured, each time within the interval)."""
    dt = draw(st.integers(0, 10 ** 10))
    bp = draw(st.integers(0, dt))
    soft = draw(st.integers(0, bp))
    idle = draw(st.integers(0, dt))
    producer_idle = draw(st.integers(0, dt))
    t0, bp0, soft0, idle0, pidle0 = (draw(_NS) for _ in range(5))
    base = _Sample(t0, 0, 0, 0, idle0, 0, 0, 0, bp0, soft0, pidle0)
    now = _Sample(t0 + dt, 0, 0, 0, idle0 + idle, 0, 0, 0, bp0 + bp, soft0 + soft,
                  pidle0 + producer_idle)
    return base, now


_NBP = fb.NetworkBufferPool(8, 256)
_PART = fb.create_partition(_NBP, 1)
_WRITER = fb.RecordWriter(_PART, buffer_timeout=None)
_GATE = fb.InputGate([(_PART, 0)])
_METRICS = {(w, g): TaskMetrics("t", writers=[_WRITER] if w else [], gates=[_GATE] if g else [])
            for w in (False, True) for g in (False, True)}


@given(_sample_pairs(), st.booleans(), st.booleans())
def test_soft_and_hard_make_the_back_pressured_time_and_each_side_makes_1000(
        pair, with_writers, with_gates):
    base, now = pair
    times = _METRICS[with_writers, with_gates]._times(now, base)
    for v in times.values():
        assert 0.0 <= v <= 1000.0
    bp = times["backPressuredTimeMsPerSecond"]
    assert times["softBackPressuredTimeMsPerSecond"] + \
        times["hardBackPressuredTimeMsPerSecond"] == pytest.approx(bp, abs=1e-9)
    producer = bp + times["producerBusyTimeMsPerSecond"] + times["producerIdleTimeMsPerSecond"]
    consumer = times["consumerBusyTimeMsPerSecond"] + times["consumerIdleTimeMsPerSecond"]
    assert producer == pytest.approx(1000.0 if with_writers else 0.0, abs=1e-9)
    assert consumer == pytest.approx(1000.0 if with_gates else 0.0, abs=1e-9)
    assert times["consumerIdleTimeMsPerSecond"] == times["idleTimeMsPerSecond"]
    if with_writers and now.time > base.time:
        assert bp == pytest.approx(min(1000.0, (now.bp - base.bp) / (now.time - base.time) * 1e3))
    # Flink's busy: both threads counted as one.
    assert times["busyTimeMsPerSecond"] == max(0.0, 1000.0 - times["idleTimeMsPerSecond"] - bp)


# ---- the sides, for real ------------------------------------------------------------------------

def test_producer_idle_is_read_from_the_callable_and_checked(nbp):
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    created = monotonic_ns()
    always_idle = TaskMetrics("idle", writers=[writer], window=60,
                              producer_idle=lambda: monotonic_ns() - created)
    never_idle = TaskMetrics("busy", writers=[writer], window=60)
    time.sleep(0.05)
    idle, busy = always_idle.snapshot(), never_idle.snapshot()
    assert idle["producerIdleTimeMsPerSecond"] > 990 and idle["producerBusyTimeMsPerSecond"] < 10
    assert busy["producerIdleTimeMsPerSecond"] == 0 and busy["producerBusyTimeMsPerSecond"] == 1000
    with pytest.raises(TypeError, match="producer_idle must be callable"):
        TaskMetrics("x", producer_idle=3)
    writer.close()
    part.release()


def test_an_exchange_task_s_producer_is_idle_before_it_starts_and_once_it_is_done(nbp):
    """A task of one: its producer writes 3000 records into a pool the
    consumer empties slowly (busy consumer, backpressured producer), then
    ends: from then on the producer side is idle and the consumer busy."""
    part = fb.create_partition(nbp, 1, min_buffers=4)
    writer = fb.RecordWriter(part, buffer_timeout=0.01)
    gate = fb.InputGate([(part, 0)])
    task = ExchangeTask(0, 1, "127.0.0.1:1", None, part, writer, gate)
    metrics = TaskMetrics("probe", writers=[writer], gates=[gate], window=60,
                          producer_idle=task._producer_idle_ns)
    time.sleep(0.1)
    before = metrics.snapshot()
    assert before["producerIdleTimeMsPerSecond"] > 990           # not started yet
    task.producer = ProducerThread(writer, range(3000))
    task.producer.start()
    seen = 0
    for _ in gate:
        seen += 1
        if seen % 10 == 0:
            time.sleep(0.001)             # the consumer is slower: the producer waits
    task.producer.join(10)
    assert seen == 3000 and task.producer.ended_ns >= task.producer.started_ns
    running = metrics.snapshot()
    assert running["backPressuredTimeMsPerSecond"] > 0
    idle_before = (task.producer.started_ns - task._created_ns) / 1e9
    time.sleep(0.2)
    done = metrics.snapshot()
    # Over the whole run: the producer idle until it started and since it ended.
    idle_ns = task._producer_idle_ns()
    assert idle_ns >= (task.producer.started_ns - task._created_ns) + 200_000_000
    assert idle_before >= 0.1
    for snap in (before, running, done):
        assert sum(snap[k] for k in SIDES[:2]) + snap["backPressuredTimeMsPerSecond"] == \
            pytest.approx(1000.0, abs=1e-6)
        assert sum(snap[k] for k in SIDES[2:]) == pytest.approx(1000.0, abs=1e-6)
    recent = TaskMetrics("after", writers=[writer], gates=[gate], window=60,
                         producer_idle=task._producer_idle_ns)
    time.sleep(0.05)
    after = recent.snapshot()
    assert after["producerIdleTimeMsPerSecond"] > 990          # done: nothing to write
    gate.close()
