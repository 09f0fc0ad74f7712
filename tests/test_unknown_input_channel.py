"""UnknownInputChannel: a place in an InputGate for an input whose producer
is not known yet.  The gate reads its other channels meanwhile and cannot
end; update() puts the real channel in its place (with what it already
holds) from any thread, waking a reader that waits; fail() makes the gate
raise the error given; a closed gate releases a channel given later."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.errors import PartitionReleasedError
from helpers import run_in_thread

SEG = 256


@pytest.fixture
def nbp():
    pool = fb.NetworkBufferPool(64, SEG)
    yield pool
    pool.destroy()


def _produce(nbp, records, *, finish=True):
    """A partition of one subpartition holding ``records`` (its writer
    closed when ``finish``)."""
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    for r in records:
        writer.emit(r)
    writer.flush()
    if finish:
        writer.close()
    return part, writer


def test_the_gate_reads_its_other_channels_until_the_unknown_one_is_updated(nbp):
    known, _ = _produce(nbp, [("a", i) for i in range(50)])
    later, _ = _produce(nbp, [("b", i) for i in range(30)])
    unknown = fb.UnknownInputChannel("p", 0)
    with fb.InputGate([(known, 0), unknown]) as gate:
        assert [gate.next_with_channel() for _ in range(50)] == [(0, ("a", i))
                                                                for i in range(50)]
        assert not gate.is_finished and unknown.channel is None
        unknown.update((later, 0))              # its records came before the update
        assert isinstance(unknown.channel, fb.LocalInputChannel)
        assert unknown.index == 1 and unknown.channel.index == 1
        assert list(gate) == [("b", i) for i in range(30)]
        assert gate.is_finished and gate.num_records_in == 80


def test_an_update_from_another_thread_wakes_a_waiting_reader(nbp):
    known, _ = _produce(nbp, [])
    unknown = fb.UnknownInputChannel()
    gate = fb.InputGate([(known, 0), unknown])
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=0)

    def update_later():
        time.sleep(0.2)
        unknown.update((part, 0))
        for i in range(100):          # records after the update arrive too
            writer.emit(i)
        writer.close()

    t = threading.Thread(target=update_later)
    t.start()
    started = time.monotonic()
    try:
        assert list(gate) == list(range(100))
        assert time.monotonic() - started >= 0.15       # it waited for the update
    finally:
        t.join(10)
        gate.close()


def test_fail_makes_a_waiting_reader_raise_that_error(nbp):
    known, writer = _produce(nbp, [1, 2], finish=False)
    unknown = fb.UnknownInputChannel()
    gate = fb.InputGate([(known, 0), unknown])
    error = ConnectionError("the producer's address never came")
    try:
        assert [next(gate), next(gate)] == [1, 2]
        threading.Timer(0.1, lambda: unknown.fail(error)).start()
        with pytest.raises(ConnectionError) as raised:
            next(gate)
        assert raised.value is error                # as it was given
        with pytest.raises(ConnectionError):        # and for good
            next(gate)
        assert unknown.error is error and unknown.channel is None
    finally:
        writer.close()
        gate.close()


def test_a_channel_that_failed_before_joining_a_gate_fails_it_at_once(nbp):
    known, _ = _produce(nbp, [])
    unknown = fb.UnknownInputChannel()
    assert unknown.fail(TimeoutError("no address")) is True
    with fb.InputGate([(known, 0), unknown]) as gate:
        with pytest.raises(TimeoutError, match="no address"):
            list(gate)


def test_update_and_fail_refuse_what_cannot_be(nbp):
    part, _ = _produce(nbp, [7])
    unknown = fb.UnknownInputChannel()
    with pytest.raises(ValueError, match="in no input gate"):
        unknown.update((part, 0))                   # before it joined a gate
    with pytest.raises(TypeError, match="exception"):
        unknown.fail("not an exception")
    with pytest.raises(TypeError, match="InputChannels"):
        unknown.update("a channel")
    other, _ = _produce(nbp, [])
    gate = fb.InputGate([(other, 0), unknown])
    try:
        unknown.update((part, 0))
        with pytest.raises(ValueError, match="updated already"):
            unknown.update((fb.create_partition(nbp, 1), 0))
        assert unknown.fail(RuntimeError("late")) is False     # the real channel reports
        assert list(gate) == [7] and unknown.error is None
    finally:
        gate.close()
    failed = fb.UnknownInputChannel()
    gate = fb.InputGate([(fb.create_partition(nbp, 1), 0), failed])
    try:
        failed.fail(RuntimeError("gone"))
        with pytest.raises(ValueError, match="failed already"):
            failed.update((fb.create_partition(nbp, 1), 0))
    finally:
        gate.close()
    with pytest.raises(ValueError, match="already belongs"):
        fb.InputGate([unknown, (fb.create_partition(nbp, 1), 0)])   # one gate, for good


def test_an_update_after_the_gate_closed_releases_the_channel_given(nbp):
    known, _ = _produce(nbp, [])
    unknown = fb.UnknownInputChannel()
    gate = fb.InputGate([(known, 0), unknown])
    gate.close()
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    with pytest.raises(ValueError, match="closed"):
        unknown.update((part, 0))
    with pytest.raises(PartitionReleasedError):     # its producer hears of it
        writer.emit(1)
        writer.flush()
    writer.fail(None)


def test_a_gate_that_cannot_be_made_leaves_its_unknown_channel_free(nbp):
    unknown = fb.UnknownInputChannel()
    part, _ = _produce(nbp, [])
    with pytest.raises(TypeError):
        fb.InputGate([unknown, "not a channel"])
    with fb.InputGate([(part, 0)]) as first:
        with pytest.raises(ValueError, match="already has a consumer"):
            fb.InputGate([unknown, (part, 0)])     # fails after the unknown one joined
    assert unknown.index is None
    part, _ = _produce(nbp, [])
    with fb.InputGate([(part, 0), unknown]) as gate:   # it may join another
        assert unknown.index == 1 and gate.num_channels == 2


def test_a_gate_of_unknown_channels_only_reads_what_updates_bring(nbp):
    unknowns = [fb.UnknownInputChannel("p", i) for i in range(3)]
    parts = [_produce(nbp, [(i, j) for j in range(5)])[0] for i in range(3)]
    with fb.InputGate(unknowns) as gate:
        assert gate.backlogs() == [0, 0, 0] and gate.source_pools() == []
        for i in (2, 0, 1):
            unknowns[i].update((parts[i], 0))
        assert gate.source_pools() == [parts[0].pool, parts[1].pool, parts[2].pool]
        got = list(gate)
    assert sorted(got) == [(i, j) for i in range(3) for j in range(5)]
    for i in range(3):
        assert [r for r in got if r[0] == i] == [(i, j) for j in range(5)]


@st.composite
def schedules(draw):
    """Channels (records per channel, which are unknown at first) and an
    order of steps: read some records, or update the next unknown channel."""
    counts = draw(st.lists(st.integers(0, 40), min_size=1, max_size=5))
    unknown = draw(st.lists(st.booleans(), min_size=len(counts), max_size=len(counts)))
    order = draw(st.permutations([i for i, u in enumerate(unknown) if u]))
    steps = draw(st.lists(st.one_of(st.just("update"), st.integers(0, 30)), max_size=20))
    return counts, unknown, order, steps


@settings(deadline=None)
@given(schedules())
def test_every_record_arrives_once_in_order_whenever_channels_are_updated(sched):
    counts, unknown, order, steps = sched
    with fb.NetworkBufferPool(256, SEG) as pool:
        parts = [_produce(pool, [(i, j) for j in range(c)])[0] for i, c in enumerate(counts)]
        channels = [fb.UnknownInputChannel() if u else (parts[i], 0)
                    for i, u in enumerate(unknown)]
        got = []
        with fb.InputGate(channels) as gate:
            pending = list(order)
            readable = sum(c for c, u in zip(counts, unknown) if not u)
            for step in steps + ["update"] * len(pending):
                if step == "update":
                    if pending:
                        i = pending.pop(0)
                        channels[i].update((parts[i], 0))
                        readable += counts[i]
                    continue
                for _ in range(min(step, readable - len(got))):   # never waits
                    got.append(next(gate))
            got.extend(gate)
            assert gate.is_finished
        assert sorted(got) == [(i, j) for i, c in enumerate(counts) for j in range(c)]
        for i, c in enumerate(counts):
            assert [r for r in got if r[0] == i] == [(i, j) for j in range(c)]


def test_threads_update_while_producers_write_and_a_reader_reads():
    """Producers in threads, the unknown channels updated by another
    thread at random moments, one reader: every record once, in order."""
    n, per = 4, 2000
    with fb.NetworkBufferPool(64, SEG) as pool:
        parts = [fb.create_partition(pool, 1) for _ in range(n)]
        unknowns = [fb.UnknownInputChannel() for _ in range(n - 1)]
        gate = fb.InputGate([(parts[0], 0), *unknowns])

        def produce(i):
            with fb.RecordWriter(parts[i], buffer_timeout=0.001) as w:
                for j in range(per):
                    w.emit((i, j))

        def update():
            for k, u in enumerate(unknowns):
                time.sleep(0.02 * (k % 2))
                u.update((parts[k + 1], 0))

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(n)]
        threads.append(threading.Thread(target=update))
        for t in threads:
            t.start()
        try:
            reader, result = run_in_thread(lambda: list(gate))
            reader.join(30)
            assert "error" not in result, result
            got = result["value"]
        finally:
            for t in threads:
                t.join(30)
            gate.close()
    assert len(got) == n * per
    for i in range(n):
        assert [r for r in got if r[0] == i] == [(i, j) for j in range(per)]


def test_repr_says_what_it_stands_for(nbp):
    part, _ = _produce(nbp, [])
    unknown = fb.UnknownInputChannel("ex", 3)
    assert "unknown" in repr(unknown) and "'ex'" in repr(unknown)
    assert unknown.partition_id == "ex" and unknown.subpartition == 3
    with fb.InputGate([unknown]):
        unknown.update((part, 0))
        assert "LocalInputChannel" in repr(unknown)
