"""ResultPartition.wait_consumed in one process: it returns True as soon as
every subpartition is read to its end, released or failed (woken by the
consumer's thread, not by polling), False on timeout, optionally counting
the timeout from the consumers' last step; bad arguments raise."""

import math
import time

import pytest

import flinkbuf as fb
from helpers import run_in_thread


def _finished_partition(nbp, n=2, records=3):
    """A finished partition of ``n`` subpartitions, ``records`` records
    each (one buffer per record), and a gate per subpartition."""
    part = fb.create_partition(nbp, n, min_buffers=n * records + 1)
    gates = [fb.InputGate([(part, i)]) for i in range(n)]
    with fb.RecordWriter(part, fb.BroadcastSelector(), buffer_timeout=0) as writer:
        for i in range(records):
            writer.emit(i)
    return part, gates


def test_not_consumed_until_every_consumer_read_to_the_end():
    with fb.NetworkBufferPool(32, 256) as nbp:
        part, (g0, g1) = _finished_partition(nbp)
        assert part.wait_consumed(0) is False
        assert list(g0) == [0, 1, 2]
        assert part.wait_consumed(0.05) is False       # the other one has not read
        it = iter(g1)
        assert [next(it), next(it), next(it)] == [0, 1, 2]
        assert part.wait_consumed(0) is False           # EndOfPartition not taken yet
        assert list(it) == []
        assert part.wait_consumed(0) is True
        g0.close()
        g1.close()


def test_a_partition_that_is_not_finished_is_not_consumed():
    """Empty queues are not enough: the producer may still write."""
    with fb.NetworkBufferPool(8, 256) as nbp:
        part = fb.create_partition(nbp, 1)
        gate = fb.InputGate([(part, 0)])
        assert part.wait_consumed(0.05) is False
        part.finish()
        assert part.wait_consumed(0) is False           # EndOfPartition is queued
        assert list(gate) == []
        assert part.wait_consumed(0) is True
        gate.close()


@pytest.mark.timeout(30)
def test_returns_as_soon_as_the_consumer_takes_the_last_item():
    """The waiter is woken by the consumer's thread: 20 waits, each ended
    by a consumer that reads 20 ms after the wait began, take far less than
    the 50 ms wait slices a missed wake would add to each (20 x 50 ms = 1 s)."""
    with fb.NetworkBufferPool(16, 256) as nbp:
        late = []
        for _ in range(20):
            part, (gate,) = _finished_partition(nbp, n=1, records=2)
            done = []

            def consume(gate=gate, done=done):
                time.sleep(0.02)
                assert list(gate) == [0, 1]
                done.append(time.monotonic())

            t, res = run_in_thread(consume)
            assert part.wait_consumed(10) is True
            returned = time.monotonic()
            t.join(5)
            assert "error" not in res, res
            late.append(returned - done[0])
            gate.close()
        assert sum(late) < 0.5, sorted(late)[-5:]


@pytest.mark.timeout(30)
def test_a_reader_in_another_process_holds_the_partition_until_it_is_done():
    """A reader elsewhere (a connection serving a subpartition, here its
    test hooks) keeps a drained partition from being consumed; its
    detaching wakes the wait at once: 20 waits, each ended 20 ms in, end
    within 12 ms of the detach in the median (a missed wake waits out a
    50 ms slice: 25 ms in the median)."""
    from flinkbuf._testing import attach_reader, detach_reader, num_readers
    with fb.NetworkBufferPool(16, 256) as nbp:
        late = []
        for _ in range(20):
            part, (gate,) = _finished_partition(nbp, n=1, records=1)
            attach_reader(part)
            assert num_readers(part) == 1
            assert list(gate) == [0]
            assert part.wait_consumed(0) is False
            detached = []

            def detach(part=part, detached=detached):
                time.sleep(0.02)
                detached.append(time.monotonic())
                detach_reader(part)

            t, res = run_in_thread(detach)
            assert part.wait_consumed(10) is True
            late.append(time.monotonic() - detached[0])
            t.join(5)
            assert "error" not in res, res
            assert num_readers(part) == 0
            gate.close()
        assert sorted(late)[len(late) // 2] < 0.012, sorted(late)
        with pytest.raises(ValueError, match="no reader"):
            detach_reader(part)


@pytest.mark.timeout(30)
def test_false_after_the_timeout_while_nobody_reads():
    with fb.NetworkBufferPool(16, 256) as nbp:
        part, (gate,) = _finished_partition(nbp, n=1)
        t0 = time.monotonic()
        assert part.wait_consumed(0.3) is False
        assert 0.29 <= time.monotonic() - t0 < 2.0
        gate.close()


@pytest.mark.parametrize("end", ["gate closed early", "partition released", "producer failed"])
def test_released_or_failed_subpartitions_have_nothing_left(end):
    with fb.NetworkBufferPool(16, 256) as nbp:
        part, (g0, g1) = _finished_partition(nbp)
        assert list(g0) == [0, 1, 2]
        assert part.wait_consumed(0) is False
        if end == "gate closed early":
            t, res = run_in_thread(part.wait_consumed, 10)
            time.sleep(0.05)
            assert t.is_alive()
            g1.close()
            t.join(5)
            assert res["value"] is True and res["elapsed"] < 5
        elif end == "partition released":
            part.release()
            assert part.wait_consumed(0) is True
        else:
            live = fb.create_partition(nbp, 2)
            gate = fb.InputGate([(live, 0)])
            writer = fb.RecordWriter(live, buffer_timeout=None)
            writer.emit(1)
            assert live.wait_consumed(0) is False
            writer.fail(ValueError("boom"))
            assert live.wait_consumed(0) is True
            with pytest.raises(fb.ProducerFailedError):
                list(gate)
            gate.close()
        g0.close()
        g1.close()


@pytest.mark.timeout(30)
def test_the_timeout_counts_from_the_last_step_with_reset_on_progress():
    """A consumer that takes one buffer every 50 ms for 0.6 s is waited
    for with reset_on_progress and a 0.3 s timeout (not without it); once
    it stops, the wait gives up 0.3 s after its last step."""
    with fb.NetworkBufferPool(32, 256) as nbp:
        for reset in (False, True):
            part, (gate,) = _finished_partition(nbp, n=1, records=12)

            def consume(gate=gate):
                for _ in gate:
                    time.sleep(0.05)

            t, res = run_in_thread(consume)
            assert part.wait_consumed(0.3, reset_on_progress=reset) is reset
            t.join(5)
            assert "error" not in res, res
            gate.close()

        part, (gate,) = _finished_partition(nbp, n=1, records=12)
        it = iter(gate)
        steps = []

        def consume_some():
            for _ in range(6):
                next(it)
                steps.append(time.monotonic())
                time.sleep(0.05)

        t, res = run_in_thread(consume_some)
        assert part.wait_consumed(0.3, reset_on_progress=True) is False
        gave_up = time.monotonic()
        t.join(5)
        assert "error" not in res, res
        assert len(steps) == 6
        assert 0.3 <= gave_up - steps[-1] < 2.0
        gate.close()


@pytest.mark.parametrize("timeout, error", [
    (-1, ValueError), (math.nan, ValueError), ("1", TypeError), (b"1", TypeError),
    ([1], TypeError), (object(), TypeError)])
def test_bad_timeouts_are_refused(timeout, error):
    with fb.NetworkBufferPool(8, 256) as nbp:
        part = fb.create_partition(nbp, 1)
        with pytest.raises(error, match="timeout"):
            part.wait_consumed(timeout)
        with pytest.raises(TypeError, match="reset_on_progress"):
            part.wait_consumed(0, reset_on_progress=1)
        part.release()


def test_an_uninitialised_partition_refuses_to_wait():
    part = fb.ResultPartition.__new__(fb.ResultPartition)
    with pytest.raises(RuntimeError, match="not initialised"):
        part.wait_consumed(0)


@pytest.mark.timeout(30)
def test_waiting_releases_the_gil():
    """Another Python thread runs while one waits."""
    with fb.NetworkBufferPool(16, 256) as nbp:
        part, (gate,) = _finished_partition(nbp, n=1)
        t, res = run_in_thread(part.wait_consumed, 0.5)
        count = 0
        while t.is_alive():
            count += 1
        assert res["value"] is False
        assert count > 10_000
        gate.close()
