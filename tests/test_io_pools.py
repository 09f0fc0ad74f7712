"""The io layer's one pool-sizing formula (task_segments, partition_buffers)
and its one producer thread (ProducerThread), which local_pipeline and the
Spark exchanges use."""

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.io import partition_buffers, task_segments
from flinkbuf.io.producer import ProducerThread, emit_all
from flinkbuf.network import NetworkEnvironment

SECRET = b"flinkbuf-pools-test-secret-01234"


@given(st.lists(st.integers(1, 1000), max_size=5), st.lists(st.integers(0, 50), max_size=5),
       st.integers(1, 8), st.integers(0, 16))
def test_task_segments_adds_partitions_and_each_gates_remote_buffers(parts, gates, excl, flt):
    got = task_segments(parts, gates, exclusive_buffers_per_channel=excl,
                        floating_buffers_per_gate=flt)
    assert got == sum(parts) + sum(r * excl + flt for r in gates if r)


def test_partition_buffers_is_flinks_minimum_per_channel():
    assert partition_buffers(1) == 2
    assert partition_buffers(4, 2) == 9
    nbp = fb.NetworkBufferPool(partition_buffers(3), 64)
    try:
        part = fb.create_partition(nbp, 3)     # the default minimum: the whole pool
        assert part.pool.num_buffers == nbp.num_segments == 4
    finally:
        nbp.destroy()


@pytest.mark.parametrize("call, error, message", [
    (lambda: task_segments([0]), ValueError, "a partition's buffers must be >= 1, got 0"),
    (lambda: task_segments([], [-1]), ValueError, "a gate's remote channels must be >= 0"),
    (lambda: task_segments([], [1], exclusive_buffers_per_channel=0), ValueError,
     "exclusive_buffers_per_channel must be >= 1"),
    (lambda: task_segments([2**31 - 1, 1]), ValueError, "the task's segments must be <= "),
    (lambda: task_segments([1.5]), TypeError, "must be an integer, got 1.5"),
    (lambda: partition_buffers(0), ValueError, "num_subpartitions must be >= 1, got 0"),
    (lambda: partition_buffers(2, 0), ValueError, "buffers_per_channel must be >= 1, got 0"),
])
def test_sizing_refuses_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _exchange(consumer_segments, records=200, buffer_debloat=False):
    """A producer's partition of two subpartitions read by one gate of two
    remote channels in an environment of ``consumer_segments``; the
    records the gate read."""
    out = partition_buffers(2, 2)
    with NetworkEnvironment(task_segments([out]), 256, secret=SECRET) as producer, \
            NetworkEnvironment(consumer_segments, 256, secret=SECRET,
                               exclusive_buffers_per_channel=2,
                               floating_buffers_per_gate=3,
                               buffer_debloat=buffer_debloat) as consumer:
        part = fb.create_partition(producer.network_buffer_pool, 2, min_buffers=out)
        producer.register_partition("p", part)
        gate = consumer.create_input_gate([(producer.address, "p", 0),
                                           (producer.address, "p", 1)])
        thread = ProducerThread(fb.RecordWriter(part, "round_robin", buffer_timeout=0.01),
                                range(records), name="pools-test-producer")
        thread.start()
        got = sorted(gate)
        thread.join(30)
        assert thread.error is None
        gate.close()
        return got


@pytest.mark.timeout(120)
def test_an_environment_sized_by_task_segments_reads_its_gate_and_one_less_does_not():
    need = task_segments(remote_channels=[2], exclusive_buffers_per_channel=2,
                         floating_buffers_per_gate=3)
    assert need == 7
    assert _exchange(need) == list(range(200))
    with pytest.raises(fb.InsufficientBuffersError):
        _exchange(need - 1)


@pytest.mark.timeout(120)
def test_a_debloating_gate_requires_one_floating_buffer_and_reads_with_more():
    """A debloating gate's floating pool requires one segment (it takes the
    others as they are free, and gives them back when it needs fewer):
    the exclusive buffers and one floating are the least it reads with,
    and task_segments' size, the full-speed one, serves it too."""
    need = task_segments(remote_channels=[2], exclusive_buffers_per_channel=2,
                         floating_buffers_per_gate=3)
    least = 2 * 2 + 1
    assert _exchange(need, buffer_debloat=True) == list(range(200))
    assert _exchange(least, buffer_debloat=True) == list(range(200))
    with pytest.raises(fb.InsufficientBuffersError):
        _exchange(least - 1, buffer_debloat=True)


def _local(records, **kw):
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1, min_buffers=4)
    gate = fb.InputGate([(part, 0)])
    thread = ProducerThread(fb.RecordWriter(part, buffer_timeout=None), records, **kw)
    return nbp, gate, thread


def test_a_producer_thread_emits_everything_then_closes_its_writer():
    nbp, gate, thread = _local(iter(range(5000)), name="emitter")
    try:
        assert thread.daemon and thread.name == "emitter"
        thread.start()
        assert list(gate) == list(range(5000))      # EndOfPartition: the writer closed
        thread.join(10)
        assert thread.error is None and thread.writer.is_closed
    finally:
        gate.close()
        nbp.destroy()


def test_a_producer_thread_fails_its_writer_and_keeps_the_error():
    def records():
        yield from range(10)
        raise KeyError("source broke")

    nbp, gate, thread = _local(records())
    try:
        thread.start()
        with pytest.raises(fb.ProducerFailedError) as info:
            list(gate)
        thread.join(10)
        assert isinstance(thread.error, KeyError) and info.value.__cause__ is thread.error
    finally:
        gate.close()
        nbp.destroy()


def test_a_producer_thread_runs_its_produce_function_with_writer_and_source():
    seen = []

    def produce(writer, source):
        seen.append(threading.current_thread().name)
        emit_all(writer, (x * 2 for x in source))

    nbp, gate, thread = _local([1, 2, 3], produce=produce, name="doubler")
    try:
        thread.start()
        assert list(gate) == [2, 4, 6] and seen == ["doubler"]
        thread.join(10)
    finally:
        gate.close()
        nbp.destroy()


def test_a_producer_thread_refuses_what_it_cannot_run():
    with pytest.raises(TypeError, match="writer must be a RecordWriter, got list"):
        ProducerThread([], [])
    nbp, gate, thread = _local([])
    try:
        with pytest.raises(TypeError, match="produce must be callable"):
            ProducerThread(thread.writer, [], produce=3)
        thread.start()
        assert list(gate) == []
        thread.join(10)
    finally:
        gate.close()
        nbp.destroy()
