"""Layer 3 failure paths: a failing producer, a consumer that leaves early,
released partitions, per-channel caps; every buffer recycled on every path."""

import gc
import os
import subprocess
import sys
import threading
import time

import pytest

import flinkbuf as fb
from test_io_support import Task, assert_all_recycled, wait_until


def _pipeline(num_consumers=1, *, segment_size=64, buffers=None, cap=None):
    nbp = fb.NetworkBufferPool(32, segment_size)
    part = fb.create_partition(nbp, num_consumers, min_buffers=buffers,
                               max_buffers_per_channel=cap, name="src")
    gates = [fb.InputGate([(part, c)], name=f"c{c}") for c in range(num_consumers)]
    return nbp, part, gates


def test_a_failing_producer_makes_every_consumer_raise():
    nbp, part, gates = _pipeline(3, segment_size=128)
    boom = ValueError("boom")

    def produce():
        with fb.RecordWriter(part, "round_robin", buffer_timeout=0.01) as w:
            for i in range(300):
                w.emit(i)
            time.sleep(0.05)
            raise boom

    def consume(gate):
        got = []
        with gate:
            with pytest.raises(fb.ProducerFailedError) as info:
                for rec in gate:
                    got.append(rec)
            assert info.value.__cause__ is boom
            # the error sticks
            with pytest.raises(fb.ProducerFailedError):
                next(gate)
        return got

    consumers = [Task(consume, g) for g in gates]
    for t in consumers:
        t.start()
    producer = Task(produce)
    producer.start()
    with pytest.raises(ValueError, match="boom"):
        producer.finish()
    for t in consumers:
        got = t.finish()
        assert got == sorted(got)
    assert part.is_failed and part.failure_cause is boom
    assert_all_recycled(nbp, [part.pool])


def test_a_consumer_blocked_on_an_idle_gate_wakes_when_the_producer_fails():
    nbp, part, (gate,) = _pipeline()
    w = fb.RecordWriter(part, buffer_timeout=None)

    def consume():
        with gate:
            return list(gate)

    t = Task(consume)
    t.start()
    assert wait_until(lambda: gate.idle_time_ns > 20_000_000)
    t0 = time.monotonic()
    w.fail(RuntimeError("producer crashed"))
    with pytest.raises(fb.ProducerFailedError, match="producer crashed"):
        t.finish(timeout=5)
    assert time.monotonic() - t0 < 2
    assert_all_recycled(nbp, [part.pool])


def test_failing_drops_queued_buffers_and_the_writers_own():
    nbp, part, (gate,) = _pipeline(segment_size=64, buffers=12)
    w = fb.RecordWriter(part, buffer_timeout=None)
    for i in range(100):
        w.emit(i)
    pool = part.pool
    assert pool.num_requested - pool.num_available > 1
    w.fail()
    assert pool.num_requested == pool.num_available
    with pytest.raises(fb.ProducerFailedError):
        next(gate)
    with pytest.raises(fb.ProducerFailedError):
        w.emit(1)
    w.close()     # after a failure: only frees, no error
    gate.close()
    assert_all_recycled(nbp, [pool])


def test_a_partition_with_block_finishes_it_and_keeps_the_data():
    """Leaving `with partition:` released the partition: everything queued,
    EndOfPartition included, was dropped, and consumers that had not read
    it yet got PartitionReleasedError."""
    nbp = fb.NetworkBufferPool(64, 128)
    with fb.create_partition(nbp, 2, min_buffers=40, name="p") as part:
        gates = [fb.InputGate([(part, c)]) for c in range(2)]
        with fb.RecordWriter(part, fb.RoundRobinSelector(start=0), buffer_timeout=None) as w:
            for i in range(200):
                w.emit(i)
    assert part.is_finished and not part.is_released and not part.is_failed
    assert part.backlogs()[0] > 0, "queued for the consumers, which read after the block"
    readers = [Task(lambda g=g: list(g)) for g in gates]
    for r in readers:
        r.start()
    assert [r.finish() for r in readers] == [list(range(0, 200, 2)), list(range(1, 200, 2))]
    for g in gates:
        g.close()
    # a writer still open at the end of the block is closed: its partly
    # filled buffer is handed over before EndOfPartition
    with fb.create_partition(nbp, 1) as part2:
        gate = fb.InputGate([(part2, 0)])
        w2 = fb.RecordWriter(part2, buffer_timeout=None)
        w2.emit("a")
        w2.emit("b")
    assert w2.is_closed and part2.is_finished
    assert list(gate) == ["a", "b"]
    gate.close()
    assert_all_recycled(nbp, [part.pool, part2.pool])


def test_a_partition_with_block_fails_it_on_an_exception():
    nbp = fb.NetworkBufferPool(16, 128)
    boom = KeyError("k")
    gates = []
    with pytest.raises(KeyError):
        with fb.create_partition(nbp, 1, name="p") as part:
            gates.append(fb.InputGate([(part, 0)]))
            w = fb.RecordWriter(part, buffer_timeout=None)
            w.emit(1)
            raise boom
    assert part.is_failed and part.failure_cause is boom and w.is_closed
    with pytest.raises(fb.ProducerFailedError) as info:
        next(gates[0])
    assert info.value.__cause__ is boom
    gates[0].close()
    # also once the writer had finished it
    with pytest.raises(ValueError):
        with fb.create_partition(nbp, 1) as part2:
            gate = fb.InputGate([(part2, 0)])
            with fb.RecordWriter(part2) as w2:
                w2.emit(1)
            raise ValueError("after the writer")
    assert part2.is_failed
    with pytest.raises(fb.ProducerFailedError, match="ValueError"):
        list(gate)
    gate.close()
    assert_all_recycled(nbp, [part.pool, part2.pool])


def test_finishing_a_partition_closes_its_open_writer():
    """finish() while the writer was open queued EndOfPartition behind the
    writer's back: its partly filled buffer could no longer be handed over
    and its close() then failed the partition."""
    nbp = fb.NetworkBufferPool(16, 128)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=None)
    w.emit("x")
    part.finish()
    assert w.is_closed and part.is_finished
    w.close()                          # idempotent
    assert list(gate) == ["x"]
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_fail_takes_an_exception_or_none():
    """fail("oops") was accepted: consumers then got "TypeError: exception
    cause must be None or derive from BaseException" instead of a
    ProducerFailedError."""
    nbp, part, (gate,) = _pipeline(segment_size=128)
    w = fb.RecordWriter(part, buffer_timeout=None)
    w.emit(1)
    for target in (part, w):
        with pytest.raises(TypeError, match="exception instance or None, got str"):
            target.fail("oops")
        with pytest.raises(TypeError, match="got the class ValueError: pass ValueError"):
            target.fail(ValueError)
        with pytest.raises(TypeError, match="got int"):
            target.fail(3)
    assert not part.is_failed and not w.is_closed   # refused: nothing happened
    w.emit(2)
    w.close()
    assert list(gate) == [1, 2]
    gate.close()
    # None: failed without a cause of the producer's own
    nbp2, part2, (gate2,) = _pipeline(segment_size=128)
    w2 = fb.RecordWriter(part2, buffer_timeout=None)
    w2.fail(None)
    with pytest.raises(fb.ProducerFailedError) as info:
        next(gate2)
    assert type(info.value.__cause__) is RuntimeError
    assert str(info.value.__cause__) == "producer failed"
    gate2.close()
    # any exception instance, BaseExceptions included
    nbp3, part3, (gate3,) = _pipeline(segment_size=128)
    interrupt = KeyboardInterrupt()
    part3.fail(interrupt)
    with pytest.raises(fb.ProducerFailedError) as info:
        next(gate3)
    assert info.value.__cause__ is interrupt and part3.failure_cause is interrupt
    gate3.close()
    for n, p in ((nbp, part), (nbp2, part2), (nbp3, part3)):
        assert_all_recycled(n, [p.pool])


def test_closing_the_gate_ends_a_blocked_producer_with_an_error():
    nbp, part, (gate,) = _pipeline(segment_size=64)   # 2 buffers of 64 bytes
    w = fb.RecordWriter(part, buffer_timeout=None)
    emitted = []

    def produce():
        with w:
            for i in range(100000):
                w.emit((i, i))
                emitted.append(i)

    t = Task(produce)
    t.start()
    assert next(gate) == (0, 0)
    assert wait_until(lambda: w.back_pressured_time_ns > 30_000_000), "producer never blocked"
    stalled = len(emitted)
    t0 = time.monotonic()
    gate.close()
    with pytest.raises(fb.PartitionReleasedError):
        t.finish(timeout=5)
    assert time.monotonic() - t0 < 2
    assert len(emitted) < stalled + 50
    assert part.subpartition(0).is_released
    assert_all_recycled(nbp, [part.pool])


def test_closing_one_of_two_gates_fails_only_writes_to_its_channel():
    nbp, part, gates = _pipeline(2, segment_size=64, buffers=6)
    w = fb.RecordWriter(part, fb.GlobalSelector(), buffer_timeout=None)   # all to channel 0
    gates[1].close()
    for i in range(50):
        w.emit(i)
    w.close()            # EndOfPartition to the live channel only
    assert list(gates[0]) == list(range(50))
    gates[0].close()
    w2_part = fb.create_partition(nbp, 2)
    g = [fb.InputGate([(w2_part, c)]) for c in range(2)]
    g[1].close()
    w2 = fb.RecordWriter(w2_part, fb.CustomSelector(lambda r, n: 1), buffer_timeout=0)
    with pytest.raises(fb.PartitionReleasedError, match="released by its consumer"):
        w2.emit("x")
    w2.fail()
    g[0].close()
    assert_all_recycled(nbp, [part.pool, w2_part.pool])


def test_a_consumer_that_leaves_early_does_not_fail_the_others():
    """One of two consumers closes its gate early.  The producer's writes to
    that channel raise PartitionReleasedError (and are dropped); it used to
    mark the writer as holding a half written record, so the next emit
    raised RuntimeError and close() failed the partition for the consumer
    that was still reading.  Now the producer goes on and closes normally."""
    nbp, part, (keeps, leaves) = _pipeline(2, segment_size=64, buffers=6)
    w = fb.RecordWriter(part, fb.RoundRobinSelector(start=0), buffer_timeout=None)
    n = 3000

    def read_some_then_leave():
        got = [next(leaves) for _ in range(20)]
        leaves.close()
        return got

    def produce():
        dropped = []
        for i in range(n):
            try:
                w.emit(i)
            except fb.PartitionReleasedError as exc:
                assert "subpartition 1 of result partition 'src' was released by its consumer" \
                    in str(exc), exc
                dropped.append(i)
        w.close()
        return dropped

    tasks = [Task(read_some_then_leave), Task(lambda: list(keeps)), Task(produce)]
    for t in tasks:
        t.start()
    early, full, dropped = (t.finish() for t in tasks)
    assert early == list(range(1, 40, 2))
    assert full == list(range(0, n, 2)), "every record for the consumer that stayed, in order"
    assert dropped and all(i % 2 == 1 and i > 39 for i in dropped)
    # Lost without an error: only what was queued or in the channel's buffer
    # when its consumer left (6 buffers of 64 bytes, <= 16 records each);
    # from the channel's next buffer on, every record for it raises.
    lost = set(range(41, n, 2)) - set(dropped)
    assert len(lost) <= 6 * 16, len(lost)
    assert part.is_finished and not part.is_failed
    assert part.subpartition(1).is_released
    keeps.close()
    assert_all_recycled(nbp, [part.pool])


def test_a_released_channel_raises_at_its_next_buffer_not_after_the_flusher_dropped_it():
    """The flusher drops a released channel's partly filled buffer; the next
    record for that channel took a fresh buffer without looking and was lost
    in it, silently, again and again."""
    nbp, part, (stays, leaves) = _pipeline(2, segment_size=4096)
    w = fb.RecordWriter(part, lambda rec, n: rec % 2, buffer_timeout=0.002)
    leaves.close()
    for i in range(0, 200, 2):
        w.emit(i)
        with pytest.raises(fb.PartitionReleasedError, match="subpartition 1 .* released"):
            w.emit(i + 1)
    w.close()
    assert list(stays) == list(range(0, 200, 2))
    stays.close()
    assert_all_recycled(nbp, [part.pool])


def test_backlog_aware_rebalance_steers_around_a_consumer_that_left():
    """A released channel has no backlog, so it never looked blocked: records
    were steered into it (and dropped) instead of waiting for the live one."""
    nbp, part, (stays, leaves) = _pipeline(2, segment_size=64, buffers=6)
    leaves.close()
    w = fb.RecordWriter(part, fb.BacklogAwareRebalanceSelector(), buffer_timeout=None)
    n = 2000

    def produce():
        for i in range(n):
            w.emit(i)
        w.close()

    tasks = [Task(produce), Task(lambda: list(stays))]
    for t in tasks:
        t.start()
    _, got = (t.finish() for t in tasks)
    assert got == list(range(n)), "every record to the consumer that stayed, in order"
    stays.close()
    assert_all_recycled(nbp, [part.pool])


def test_backlog_aware_rebalance_with_every_consumer_gone_raises():
    nbp, part, gates = _pipeline(2, segment_size=64, buffers=6)
    for g in gates:
        g.close()
    w = fb.RecordWriter(part, fb.BacklogAwareRebalanceSelector(), buffer_timeout=None)

    def produce():
        with pytest.raises(fb.PartitionReleasedError):
            w.emit(0)
        w.close()

    t = Task(produce)
    t.start()
    t.finish()
    assert_all_recycled(nbp, [part.pool])


def test_the_output_flusher_drops_a_released_channels_buffer_quietly():
    """The flusher kept the PartitionReleasedError of a channel whose
    consumer had left and raised it from the next emit, to any channel,
    after which the writer claimed "a record was left half written"."""
    nbp, part, (stays, leaves) = _pipeline(2, segment_size=4096)
    pool = part.pool
    w = fb.RecordWriter(part, lambda rec, n: rec[0], buffer_timeout=0.2)
    w.emit((1, "lost"))                    # in a fresh, partly filled buffer ...
    leaves.close()                         # ... whose consumer leaves before the flush
    assert wait_until(lambda: pool.num_requested == pool.num_available), \
        "the flusher recycles the released channel's buffer"
    for i in range(100):
        w.emit((0, i))
    w.close()
    assert list(stays) == [(0, i) for i in range(100)]
    stays.close()
    assert_all_recycled(nbp, [pool])


def test_flush_hands_over_the_live_channels_before_reporting_a_released_one():
    nbp, part, (leaves, stays) = _pipeline(2, segment_size=4096)
    w = fb.RecordWriter(part, lambda rec, n: rec[0], buffer_timeout=None)
    w.emit((0, "lost"))
    w.emit((1, "a"))
    leaves.close()
    with pytest.raises(fb.PartitionReleasedError, match="subpartition 0 .* not delivered"):
        w.flush()
    assert part.backlog(1) == 1, "the live channel was flushed all the same"
    w.flush()                              # reported once: nothing more was written there
    w.emit((1, "b"))
    w.close()
    assert list(stays) == [(1, "a"), (1, "b")]
    stays.close()
    assert_all_recycled(nbp, [part.pool])


def test_broadcasts_skip_consumers_that_left():
    """A broadcast writer blocked by a consumer that does not read goes on
    with the others when that consumer closes its gate: the record reaches
    every consumer still there (it used to raise half way through the
    channels, leaving the record with some consumers only)."""
    nbp, part, gates = _pipeline(3, segment_size=64, buffers=8)
    w = fb.RecordWriter(part, "broadcast", buffer_timeout=None)
    n = 500

    def produce():
        for i in range(n):
            w.emit(i)
        w.broadcast_event(fb.UserEvent("end"))
        w.close()

    readers = [Task(lambda g=g: list(g)) for g in (gates[0], gates[2])]
    producer = Task(produce)
    for t in readers + [producer]:
        t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 30_000_000), "gate 1 does not read"
    gates[1].close()
    producer.finish()
    for r in readers:
        assert r.finish() == list(range(n)) + [fb.UserEvent("end")]
    assert part.is_finished
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_a_broadcast_with_no_consumer_left_raises():
    nbp, part, gates = _pipeline(2, segment_size=64)
    w = fb.RecordWriter(part, "broadcast", buffer_timeout=None)

    def produce():
        for i in range(100000):
            w.emit((i, i))

    t = Task(produce)
    t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 30_000_000), "producer never blocked"
    gates[0].close()
    gates[1].close()
    with pytest.raises(fb.PartitionReleasedError, match="every consumer of result partition 'src'"):
        t.finish(timeout=10)
    w.close()                              # nobody to end: a normal close
    assert part.is_finished and not part.is_failed
    assert_all_recycled(nbp, [part.pool])


def test_closing_the_gate_from_another_thread_wakes_its_consumer():
    nbp, part, (gate,) = _pipeline()
    t = Task(lambda: list(gate))
    t.start()
    assert wait_until(lambda: gate.idle_time_ns > 20_000_000)
    gate.close()
    with pytest.raises(ValueError, match="closed"):
        t.finish(timeout=5)
    w = fb.RecordWriter(part, buffer_timeout=0)
    with pytest.raises(fb.PartitionReleasedError):
        w.emit(1)
    w.fail()
    assert_all_recycled(nbp, [part.pool])


def test_a_gate_dropped_without_close_releases_its_channels():
    nbp, part, gates = _pipeline(segment_size=64, buffers=8)
    w = fb.RecordWriter(part, buffer_timeout=None)
    for i in range(40):
        w.emit(i)
    w.flush()
    assert part.backlog(0) > 0
    del gates
    gc.collect()
    assert part.subpartition(0).is_released
    assert part.pool.num_requested - part.pool.num_available <= 1   # the writer's own
    with pytest.raises(fb.PartitionReleasedError):
        for i in range(1000):
            w.emit(i)
    w.fail()
    assert_all_recycled(nbp, [part.pool])


def test_releasing_the_partition_reaches_its_consumers():
    nbp, part, (gate,) = _pipeline(segment_size=64, buffers=8)
    w = fb.RecordWriter(part, buffer_timeout=None)
    for i in range(30):
        w.emit(i)
    w.flush()
    part.release()
    with pytest.raises(fb.PartitionReleasedError):
        list(gate)
    with pytest.raises(fb.PartitionReleasedError):
        w.emit(1)
    w.fail()
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_a_partition_dropped_with_queued_buffers_recycles_them():
    nbp = fb.NetworkBufferPool(16, 64)
    part = fb.create_partition(nbp, 2, min_buffers=10)
    pool = part.pool
    with fb.RecordWriter(part, buffer_timeout=None) as w:
        for i in range(100):
            w.emit(i)
    assert pool.num_requested > pool.num_available
    del w, part
    gc.collect()
    assert_all_recycled(nbp, [pool])


def test_a_pool_destroyed_under_a_blocked_writer_fails_the_emit():
    nbp, part, (gate,) = _pipeline(segment_size=64)
    w = fb.RecordWriter(part, buffer_timeout=None)

    def produce():
        for i in range(100000):
            w.emit((i, i))

    t = Task(produce)
    t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 20_000_000)
    part.pool.destroy()
    with pytest.raises(fb.PoolDestroyedError):
        t.finish(timeout=5)
    with pytest.raises(RuntimeError, match="half written"):
        w.emit(1)
    w.fail()
    gate.close()
    assert nbp.num_available_segments == nbp.num_segments


def test_a_per_channel_cap_stalls_plain_round_robin_like_flink():
    """Flink semantics: a subpartition at its cap makes the whole pool
    unavailable, so a round-robin writer waits even for the free channel."""
    nbp, part, (slow, fast) = _pipeline(2, segment_size=64, buffers=8, cap=3)
    w = fb.RecordWriter(part, fb.RoundRobinSelector(start=0), buffer_timeout=None)
    got = []
    fast_t = Task(lambda: [got.append(r) for r in fast])
    fast_t.start()

    def produce():
        with w:
            for i in range(5000):
                w.emit(i)

    t = Task(produce)
    t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 100_000_000)
    stalled = len(got)
    time.sleep(0.1)
    assert len(got) == stalled < 2500
    assert part.pool.channel_count(0) >= 3
    # release the slow consumer: everything drains, in order, exactly once
    slow_got = list(slow)
    t.finish()
    fast_t.finish()
    assert sorted(slow_got + got) == list(range(5000))
    slow.close()
    fast.close()
    assert_all_recycled(nbp, [part.pool])


@pytest.mark.parametrize("cap", [None, 6])
def test_backlog_aware_rebalance_routes_around_a_stalled_consumer(cap):
    nbp, part, (slow, fast) = _pipeline(2, segment_size=128, buffers=10, cap=cap)
    sel = fb.BacklogAwareRebalanceSelector(start=0)
    w = fb.RecordWriter(part, sel, buffer_timeout=0.005)
    fast_t = Task(lambda: list(fast))
    fast_t.start()
    n = 20000
    producer = Task(lambda: [w.emit(i) for i in range(n)])
    producer.start()
    producer.finish(timeout=60)          # never stalls on the blocked consumer
    held = part.backlog(0)
    assert held >= sel.max_backlog
    if cap is not None:
        assert part.pool.channel_count(0) < cap, "the pool must stay available"
    assert sel.num_steered > n // 3
    w.close()
    fast_got = fast_t.finish()
    slow_got = list(slow)
    assert len(slow_got) < n // 10
    assert sorted(fast_got + slow_got) == list(range(n))
    assert fast_got == sorted(fast_got) and slow_got == sorted(slow_got)
    slow.close()
    fast.close()
    assert_all_recycled(nbp, [part.pool])


def test_backlog_aware_rebalance_waits_while_every_channel_is_blocked():
    nbp, part, gates = _pipeline(2, segment_size=64, buffers=8)
    sel = fb.BacklogAwareRebalanceSelector(max_backlog=1)
    w = fb.RecordWriter(part, sel, buffer_timeout=0.005)
    emitted = []

    def produce():
        with w:
            for i in range(3000):
                w.emit(i)
                emitted.append(i)

    t = Task(produce)
    t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 100_000_000)
    n = len(emitted)
    time.sleep(0.05)
    assert len(emitted) == n < 3000
    assert part.pool.num_requested - part.pool.num_available <= 8
    results = [Task(lambda g=g: list(g)) for g in gates]
    for r in results:
        r.start()
    t.finish()
    got = [r.finish() for r in results]
    assert sorted(got[0] + got[1]) == list(range(3000))
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_writer_as_context_manager_fails_the_partition_on_error():
    nbp, part, (gate,) = _pipeline()
    with pytest.raises(KeyError):
        with fb.RecordWriter(part) as w:
            w.emit(1)
            raise KeyError("k")
    assert part.is_failed
    with pytest.raises(fb.ProducerFailedError) as info:
        list(gate)
    assert isinstance(info.value.__cause__, KeyError)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_many_threads_close_and_fail_concurrently_without_leaks():
    for _ in range(20):
        nbp, part, gates = _pipeline(3, segment_size=64, buffers=6)
        w = fb.RecordWriter(part, buffer_timeout=0.001)
        stop = threading.Event()

        def produce():
            try:
                while not stop.is_set():
                    w.emit((1, 2, 3))
            except (fb.PartitionReleasedError, fb.ProducerFailedError):
                pass
            finally:
                w.fail()

        def consume(g):
            try:
                for _ in g:
                    pass
            except (ValueError, fb.ProducerFailedError):
                pass

        threads = [Task(produce)] + [Task(consume, g) for g in gates]
        for t in threads:
            t.start()
        time.sleep(0.01)
        for g in gates:
            g.close()
        stop.set()
        for t in threads:
            t.finish(timeout=10)
        assert_all_recycled(nbp, [part.pool])


def test_a_gate_that_cannot_be_built_leaves_its_channels_to_a_later_gate():
    """A failed InputGate constructor used to release the subpartitions it
    had connected so far: no gate could ever read them again."""
    nbp = fb.NetworkBufferPool(16, 128)
    part = fb.create_partition(nbp, 2)
    reused = fb.LocalInputChannel(part, 0)
    with pytest.raises(ValueError, match="already has a consumer"):
        fb.InputGate([reused, (part, 1), (part, 1)])
    assert not part.subpartition(0).is_released
    assert not part.subpartition(1).is_released
    gates = [fb.InputGate([reused]), fb.InputGate([(part, 1)])]
    with fb.RecordWriter(part, fb.RoundRobinSelector(start=0)) as w:
        for i in range(10):
            w.emit(i)
    assert [list(g) for g in gates] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_a_stream_that_ends_inside_a_record_fails_the_gate_for_good():
    """The CorruptRecordError at EndOfPartition was raised once; the next
    read then waited forever for a channel that had ended."""
    nbp = fb.NetworkBufferPool(16, 128)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    buf = part.pool.request_buffer()
    buf.write(b"\x00\x00\x00\x10ab")       # 16 bytes announced, 2 sent
    part.add_buffer(0, buf)
    part.finish()
    with pytest.raises(fb.CorruptRecordError, match="ended inside a record"):
        next(gate)
    again = Task(lambda: next(gate))
    again.start()
    with pytest.raises(fb.CorruptRecordError, match="ended inside a record"):
        again.finish(timeout=10)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


CLOSE_WHILE_READING = r"""
import gc, sys
import flinkbuf as fb
nbp = fb.NetworkBufferPool(64, 128)
part = fb.create_partition(nbp, 1, min_buffers=40)
with fb.RecordWriter(part, buffer_timeout=None) as w:
    for i in range(200):
        w.emit((i, "x" * 10))
gate = fb.InputGate([(part, 0)])
k = int(sys.argv[1])
seen = [0]
def close_on_kth_collection(phase, info):
    if phase == "start":
        seen[0] += 1
        if seen[0] == k:
            gate.close()
gc.callbacks.append(close_on_kth_collection)
gc.set_threshold(1)
got = []
try:
    for rec in gate:
        got.append(rec)
    outcome = "end"
except ValueError as exc:
    outcome = "closed" if "closed" in str(exc) else repr(exc)
gc.callbacks.remove(close_on_kth_collection)
gc.set_threshold(700)
assert got == [(i, "x" * 10) for i in range(len(got))], got[:5]
part.pool.destroy()
del gate, part
gc.collect()
print(outcome, nbp.num_available_segments == nbp.num_segments)
"""


def test_closing_the_gate_at_any_point_of_its_own_iteration_is_safe():
    """close() may run in the middle of the consumer's read (here: from a
    gc callback, as another thread would when the reader lets go of the
    GIL).  A read that went on with the dropped deserializer crashed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for k in (1, 2, 3, 5, 8, 13, 40):
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CLOSE_WHILE_READING,
                               str(k)], capture_output=True, text=True, timeout=120, cwd=root)
        assert proc.returncode == 0, f"k={k}: {proc.returncode}\n{proc.stderr[-3000:]}"
        assert proc.stdout.split() in (["closed", "True"], ["end", "True"]), proc.stdout


def test_a_writer_dropped_without_close_fails_its_partition():
    """A producer whose writer was garbage collected while open (the thread
    died without close() or a with block) left its consumers waiting forever."""
    nbp, part, (gate,) = _pipeline(segment_size=128)

    def produce():
        w = fb.RecordWriter(part, buffer_timeout=0.01)
        for i in range(10):
            w.emit(i)
        raise KeyError("producer died")

    t = Task(produce)
    t.start()
    with pytest.raises(KeyError):
        t.finish()
    t = None
    gc.collect()
    assert part.is_failed
    reader = Task(lambda: list(gate))
    reader.start()
    with pytest.raises(fb.ProducerFailedError, match="without close"):
        reader.finish(timeout=10)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_a_writer_cannot_be_initialised_twice():
    """Calling __init__ again rebound a live writer to another partition: the
    first partition never ended (its consumers hung) and a second flusher
    thread started."""
    nbp = fb.NetworkBufferPool(16, 128)
    first, second = fb.create_partition(nbp, 1), fb.create_partition(nbp, 1)
    gate = fb.InputGate([(first, 0)])
    w = fb.RecordWriter(first, buffer_timeout=0.01)
    w.emit(1)
    flushers = {t for t in threading.enumerate() if t.name.startswith("flinkbuf-output-flusher")}
    with pytest.raises(RuntimeError, match="already initialised"):
        w.__init__(second, buffer_timeout=0.01)
    assert {t for t in threading.enumerate()
            if t.name.startswith("flinkbuf-output-flusher")} == flushers
    assert w.partition is first
    w.emit(2)
    w.close()
    assert list(gate) == [1, 2]
    gate.close()
    fb.RecordWriter(second).close()
    assert_all_recycled(nbp, [first.pool, second.pool])
