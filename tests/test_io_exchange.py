"""Layer 3 exchange: writers, partitions, gates, events, flushing.

Invariants (each promised by a docstring): every record reaches exactly the
consumers its selector names, exactly once; records from one producer reach
a consumer in emission order; buffers go back to the producer's pool once
read; events arrive in-band; the output flusher hands partly filled buffers
over within the buffer timeout.
"""

import collections
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf import io
from test_io_support import Task, assert_all_recycled, consume_all, run_exchange, wait_until


def _selector_factories(num_consumers):
    def custom():
        return fb.CustomSelector(lambda rec, n: (rec[1] * 7 + 3) % n)

    factories = {
        "round_robin": fb.RoundRobinSelector,
        "rescale": fb.RescaleSelector,
        "hash": lambda: fb.HashSelector(key=2),
        "hash_callable": lambda: fb.HashSelector(key=lambda rec: rec[2]),
        "broadcast": fb.BroadcastSelector,
        "global": fb.GlobalSelector,
        "custom": custom,
        "backlog_aware": fb.BacklogAwareRebalanceSelector,
    }
    if num_consumers == 1:
        factories["forward"] = fb.ForwardSelector
    return factories


def _expected_targets(name, record, n):
    """The consumers a record must reach (None: exactly one, any)."""
    if name == "broadcast":
        return list(range(n))
    if name in ("global", "forward"):
        return [0]
    if name.startswith("hash"):
        return [io.assign_key_to_operator(record[2], n)]
    if name == "custom":
        return [(record[1] * 7 + 3) % n]
    return None


@settings(max_examples=100)
@given(
    num_producers=st.integers(1, 3),
    num_consumers=st.integers(1, 4),
    counts=st.lists(st.integers(0, 600), min_size=3, max_size=3),
    segment_size=st.sampled_from([7, 64, 300, 4096]),
    buffer_timeout=st.sampled_from([None, 0, 0.002, 0.05]),
    selector_pick=st.integers(0, 100),
    key_space=st.sampled_from([3, 1000]),
)
def test_exactly_once_and_ordered_under_every_selector(num_producers, num_consumers, counts,
                                                       segment_size, buffer_timeout,
                                                       selector_pick, key_space):
    factories = _selector_factories(num_consumers)
    name = sorted(factories)[selector_pick % len(factories)]
    records = {p: [(p, i, (i * 2654435761) % key_space) for i in range(counts[p])]
               for p in range(num_producers)}
    received, writers, nbp = run_exchange(
        num_producers=num_producers, num_consumers=num_consumers,
        records=lambda p: records[p], selector=factories[name],
        segment_size=segment_size, buffer_timeout=buffer_timeout)

    got = collections.Counter()
    for c, items in enumerate(received):
        last_seq = {}
        for channel, rec in items:
            p, seq, key = rec
            assert channel == p, "a consumer's channel p reads producer p"
            assert seq > last_seq.get(p, -1), f"records of producer {p} out of order at {c}"
            last_seq[p] = seq
            targets = _expected_targets(name, rec, num_consumers)
            if targets is not None:
                assert c in targets, f"{name}: {rec} reached consumer {c}, not {targets}"
            got[(rec, c if name == "broadcast" else None)] += 1
    want = collections.Counter()
    for p in range(num_producers):
        for rec in records[p]:
            if name == "broadcast":
                for c in range(num_consumers):
                    want[(rec, c)] += 1
            else:
                want[(rec, None)] += 1
    assert got == want
    for w in writers:
        assert w.num_records_out == counts[writers.index(w)]
        if buffer_timeout == 0 and name != "broadcast":
            assert w.num_buffers_out >= w.num_records_out
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_round_robin_spreads_evenly_from_a_random_start():
    received, writers, nbp = run_exchange(
        num_producers=1, num_consumers=4, records=lambda p: [(0, i, i) for i in range(4001)],
        selector=fb.RoundRobinSelector)
    sizes = sorted(len(r) for r in received)
    assert sizes == [1000, 1000, 1000, 1001]
    first = [c for c, items in enumerate(received) if items and items[0][1][1] == 0]
    assert len(first) == 1
    for c, items in enumerate(received):
        seqs = [rec[1] for _, rec in items]
        assert all((s - seqs[0]) % 4 == 0 for s in seqs)
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_many_to_one_takes_channels_in_turn():
    """With every channel backlogged the gate serves them in turn, one
    buffer each."""
    nbp = fb.NetworkBufferPool(40, 256)
    parts = [fb.create_partition(nbp, 1, min_buffers=9, name=f"p{i}") for i in range(4)]
    for i, part in enumerate(parts):
        with fb.RecordWriter(part, buffer_timeout=None) as w:
            for k in range(200):
                w.emit((i, k))
    gate = fb.InputGate([(p, 0) for p in parts])
    order = []
    with gate:
        for _ in range(800):
            ch, rec = gate.next_with_channel()
            if not order or order[-1] != ch:
                order.append(ch)
    # every channel holds the same number of buffers: strict turns
    assert len(order) >= 16
    assert order == [0, 1, 2, 3] * (len(order) // 4)
    assert_all_recycled(nbp, [p.pool for p in parts])


def test_buffers_are_handed_over_by_reference_and_recycled():
    nbp = fb.NetworkBufferPool(16, 64)
    part = fb.create_partition(nbp, 1, min_buffers=12)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=None)
    for i in range(20):
        w.emit(b"x" * 20)
    w.flush()
    pool = part.pool
    # what the writer handed over is still out of the pool, queued
    assert part.backlog(0) >= 1
    assert pool.num_requested - pool.num_available == part.backlog(0)
    w.close()
    assert [r for r in gate] == [b"x" * 20] * 20
    assert pool.num_requested == pool.num_available
    gate.close()
    assert_all_recycled(nbp, [pool])


def test_backpressure_blocks_the_producer_until_the_consumer_reads():
    nbp = fb.NetworkBufferPool(4, 64)
    part = fb.create_partition(nbp, 1)          # 2 buffers
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=None)
    progress = []

    def produce():
        with w:
            for i in range(200):
                w.emit(i)
                progress.append(i)

    t = Task(produce, name="producer")
    t.start()
    assert wait_until(lambda: w.back_pressured_time_ns > 50_000_000)
    stalled_at = len(progress)
    time.sleep(0.1)
    assert len(progress) == stalled_at, "the producer must wait while both buffers are queued"
    assert part.pool.num_available == 0
    assert list(gate) == list(range(200))
    t.finish()
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_user_events_travel_in_band():
    items = lambda p: ([(p, i, 0) for i in range(50)] + [fb.UserEvent({"mark": p, "n": 1})] +
                       [(p, i, 0) for i in range(50, 90)] + [fb.UserEvent(("end", p))])
    received, writers, nbp = run_exchange(
        num_producers=2, num_consumers=3, records=items, selector=fb.RoundRobinSelector,
        segment_size=64)
    for c, got in enumerate(received):
        for p in range(2):
            mine = [x for ch, x in got if ch == p]
            marks = [k for k, x in enumerate(mine) if isinstance(x, fb.UserEvent)]
            assert [mine[k] for k in marks] == [fb.UserEvent({"mark": p, "n": 1}),
                                                fb.UserEvent(("end", p))]
            before = mine[:marks[0]]
            between = mine[marks[0] + 1:marks[1]]
            assert all(r[1] < 50 for r in before) and all(r[1] >= 50 for r in between)
            assert marks[1] == len(mine) - 1
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_user_events_are_final_immutable_values():
    """UserEvent could be subclassed (broadcast_event then refused the
    subclass after it had flushed, and equality with a UserEvent depended
    on the operand order), its payload could be reassigned while it was
    hashable, and hashing one with a dict payload raised a bare error."""
    import copy
    import pickle

    with pytest.raises(TypeError, match="cannot be subclassed"):
        class Mine(fb.UserEvent):
            pass

    ev = fb.UserEvent({"k": [1, 2]})
    for attempt in (lambda: setattr(ev, "payload", 1), lambda: setattr(ev, "_payload", 1),
                    lambda: delattr(ev, "payload"), lambda: setattr(ev, "other", 1)):
        with pytest.raises(AttributeError):
            attempt()
    ev.__init__("again")                     # no way around it either
    assert ev.payload == {"k": [1, 2]}
    # equal when the payloads are; hashable exactly when the payload is
    assert fb.UserEvent((1, "a")) == fb.UserEvent((1, "a"))
    assert fb.UserEvent(1) == fb.UserEvent(1.0) and hash(fb.UserEvent(1)) == hash(fb.UserEvent(1.0))
    assert fb.UserEvent(1) != fb.UserEvent(2) and fb.UserEvent(1) != 1
    assert fb.UserEvent() == fb.UserEvent(None) and fb.UserEvent().payload is None
    assert len({fb.UserEvent(("a", 1)), fb.UserEvent(("a", 1)), fb.UserEvent("b")}) == 2
    assert ev == fb.UserEvent({"k": [1, 2]})
    for payload in ({"k": 1}, [1], (1, [2])):
        with pytest.raises(TypeError, match="unhashable UserEvent"):
            hash(fb.UserEvent(payload))
    nan = float("nan")
    assert fb.UserEvent(nan) == fb.UserEvent(nan)         # the same object, as in a tuple
    for clone in (pickle.loads(pickle.dumps(ev)), copy.copy(ev), copy.deepcopy(ev)):
        assert type(clone) is fb.UserEvent and clone == ev
    assert repr(fb.UserEvent((1, "a"))) == "UserEvent((1, 'a'))"


def test_broadcast_event_refuses_a_bad_event_before_flushing():
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 2)
    gates = [fb.InputGate([(part, c)]) for c in range(2)]
    w = fb.RecordWriter(part, fb.RoundRobinSelector(start=0), buffer_timeout=None)
    w.emit("a")
    for bad, message in [(fb.UserEvent(object()), "object"), (io.END_OF_PARTITION, "only UserEvent"),
                         ("event", "only UserEvent")]:
        with pytest.raises(TypeError, match=message):
            w.broadcast_event(bad)
        assert part.backlogs() == [0, 0], "nothing is flushed for a refused event"
    w.broadcast_event(fb.UserEvent("mark"))
    w.emit("b")
    w.close()
    assert [list(g) for g in gates] == [["a", fb.UserEvent("mark")], [fb.UserEvent("mark"), "b"]]
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_end_of_partition_is_not_yielded_and_the_gate_ends_once():
    nbp = fb.NetworkBufferPool(8, 128)
    parts = [fb.create_partition(nbp, 1) for _ in range(2)]
    for i, part in enumerate(parts):
        with fb.RecordWriter(part) as w:
            w.emit(i)
    gate = fb.InputGate([(p, 0) for p in parts])
    assert sorted(gate) == [0, 1]
    assert gate.is_finished
    with pytest.raises(StopIteration):
        next(gate)
    assert io.END_OF_PARTITION not in list(gate)
    gate.close()
    assert_all_recycled(nbp, [p.pool for p in parts])


@settings(max_examples=10)
@given(timeout=st.sampled_from([0.005, 0.02, 0.05]), n=st.integers(1, 5))
def test_output_flusher_hands_over_within_the_buffer_timeout(timeout, n):
    nbp = fb.NetworkBufferPool(8, 32768)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=timeout)
    try:
        t0 = time.monotonic()
        for i in range(n):
            w.emit(i)
        assert [next(gate) for _ in range(n)] == list(range(n))
        elapsed = time.monotonic() - t0
        # a partly filled 32 KiB buffer: only the flusher can have handed it over
        assert elapsed < timeout + 2.0
        assert w.num_buffers_out >= 1
    finally:
        w.close()
        assert list(gate) == []
        gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_without_a_timeout_nothing_moves_until_flush():
    nbp = fb.NetworkBufferPool(8, 32768)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=None)
    w.emit("a")
    time.sleep(0.05)
    assert part.backlog(0) == 0
    w.flush()
    assert part.backlog(0) == 1
    assert next(gate) == "a"
    w.close()
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_flush_every_record_with_timeout_zero():
    nbp = fb.NetworkBufferPool(8, 4096)
    part = fb.create_partition(nbp, 1, min_buffers=4)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, buffer_timeout=0)
    t = Task(lambda: list(gate), name="consumer")
    t.start()
    with w:
        for i in range(100):
            w.emit(i)
    assert t.finish() == list(range(100))
    assert w.num_buffers_out == 100
    assert_all_recycled(nbp, [part.pool])


@pytest.mark.parametrize("codec,make", [
    ("typed", lambda i: {"i": i, "s": "x" * (i % 50), "t": (i, -i, 2.5)}),
    ("bytes", lambda i: bytes([i % 256]) * (i % 3000)),
    ("pickle", lambda i: {i: frozenset({i})}),
])
def test_codecs_and_records_that_span_many_buffers(codec, make):
    received, writers, nbp = run_exchange(
        num_producers=1, num_consumers=2, records=lambda p: [make(i) for i in range(300)],
        selector=fb.RoundRobinSelector, segment_size=128, codec=codec)
    got = [x for r in received for _, x in r]
    want = [make(i) for i in range(300)]
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_numpy_batches_as_single_records():
    batches = [np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64).reshape(500, 2)
               for i in range(40)]
    received, writers, nbp = run_exchange(
        num_producers=1, num_consumers=1, records=lambda p: batches,
        selector=fb.ForwardSelector, segment_size=4096)
    got = [x for _, x in received[0]]
    assert len(got) == 40
    for a, b in zip(got, batches):
        np.testing.assert_array_equal(a, b)
    assert writers[0].num_bytes_out > 40 * 8000
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_broadcast_emit_on_a_round_robin_writer():
    nbp = fb.NetworkBufferPool(16, 256)
    part = fb.create_partition(nbp, 3)
    gates = [fb.InputGate([(part, c)]) for c in range(3)]
    with fb.RecordWriter(part, fb.RoundRobinSelector(start=0)) as w:
        w.emit("a")
        w.broadcast_emit("all")
        w.emit("b")
    assert [list(g) for g in gates] == [["a", "all"], ["all", "b"], ["all"]]
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_pointwise_rescale_wiring_delivers_every_record_once():
    subparts, inputs = io.pointwise_connections(2, 5)
    nbp = fb.NetworkBufferPool(64, 512)
    parts = [fb.create_partition(nbp, n, name=f"p{p}") for p, n in enumerate(subparts)]
    gates = [fb.InputGate([(parts[p], s) for p, s in ins]) for ins in inputs]
    consumers = [Task(consume_all, g) for g in gates]
    for t in consumers:
        t.start()
    for p, part in enumerate(parts):
        with fb.RecordWriter(part, "rescale") as w:
            for i in range(100):
                w.emit((p, i))
    got = sorted(rec for t in consumers for _, rec in t.finish())
    assert got == sorted((p, i) for p in range(2) for i in range(100))
    assert_all_recycled(nbp, [p.pool for p in parts])


def test_metric_counters_of_writer_and_gate_agree():
    received, writers, nbp = run_exchange(
        num_producers=2, num_consumers=2, records=lambda p: [(p, i, i) for i in range(1000)],
        selector=fb.RoundRobinSelector, segment_size=512)
    assert sum(w.num_records_out for w in writers) == 2000
    assert sum(len(r) for r in received) == 2000
    assert all(w.num_bytes_out > 0 and w.num_buffers_out > 0 for w in writers)
    assert_all_recycled(nbp, [w.partition.pool for w in writers])


def test_partition_and_writer_arguments_are_checked():
    nbp = fb.NetworkBufferPool(16, 128)
    small = nbp.create_buffer_pool(2, 2)
    with pytest.raises(ValueError, match="at least 4 buffers"):
        fb.ResultPartition(small, 3)
    counted = nbp.create_buffer_pool(4, 4, num_subpartitions=2)
    with pytest.raises(ValueError, match="num_subpartitions=3"):
        fb.ResultPartition(counted, 3)
    part = fb.ResultPartition(counted, 2)
    w = fb.RecordWriter(part)
    with pytest.raises(ValueError, match="already has a writer"):
        fb.RecordWriter(part)
    with pytest.raises(ValueError, match="unknown selector"):
        fb.RecordWriter(fb.create_partition(nbp, 1), "nope")
    with pytest.raises(ValueError):
        fb.RecordWriter(fb.create_partition(nbp, 1), buffer_timeout=-1)
    with pytest.raises(ValueError):
        fb.RecordWriter(fb.create_partition(nbp, 1), codec="json")
    with pytest.raises(ValueError, match="forward needs exactly one"):
        fb.RecordWriter(fb.create_partition(nbp, 2), "forward")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.emit(1)
    w.close()   # idempotent
    gate = fb.InputGate([(part, 0)])
    with pytest.raises(ValueError, match="already has a consumer"):
        fb.InputGate([(part, 0)])
    with pytest.raises(TypeError):
        fb.InputGate([part])
    with pytest.raises(ValueError):
        fb.InputGate([])
    assert list(gate) == []
    gate.close()
    with pytest.raises(StopIteration):     # a finished gate stays finished
        next(gate)
    part2 = fb.create_partition(nbp, 1)
    early = fb.InputGate([(part2, 0)])
    early.close()
    with pytest.raises(ValueError, match="closed"):
        next(early)


def test_input_channels_are_local_or_compiled_subclasses():
    """InputChannel() and Python subclasses of it could be built, and an
    InputGate over one raised NotImplementedError from deep inside.  Input
    channels are cdef classes (see test_io_cython_channel): the abstract
    base and Python subclasses are refused when constructed."""
    with pytest.raises(TypeError, match="abstract.*LocalInputChannel"):
        fb.InputChannel()

    class PyChannel(fb.InputChannel):
        pass

    with pytest.raises(TypeError, match="PyChannel subclasses InputChannel in Python"):
        PyChannel()
    nbp = fb.NetworkBufferPool(8, 128)
    part = fb.create_partition(nbp, 1)
    channel = fb.LocalInputChannel(part, 0)
    assert channel.index is None
    gate = fb.InputGate([channel])
    assert channel.index == 0 and gate.channels == [channel]
    with fb.RecordWriter(part) as w:
        w.emit("x")
    assert list(gate) == ["x"]
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_buffer_timeout_is_a_finite_number_of_seconds_or_none():
    """buffer_timeout=float("inf") was accepted and the flusher thread died
    in Event.wait (OverflowError, unseen: nothing was flushed on a timer);
    "0.5" was accepted through float()."""
    from decimal import Decimal
    from fractions import Fraction

    nbp = fb.NetworkBufferPool(16, 32768)
    part = fb.create_partition(nbp, 1)
    sel = fb.BacklogAwareRebalanceSelector()
    threads = threading.active_count()
    for bad in ("0.5", b"1", True, False, [0.1], 1j, Decimal("0.1")):
        with pytest.raises(TypeError, match="buffer_timeout must be a number of seconds"):
            fb.RecordWriter(part, sel, buffer_timeout=bad)
    for bad in (-1, -0.001, float("-inf"), float("nan")):
        with pytest.raises(ValueError, match=">= 0 seconds"):
            fb.RecordWriter(part, sel, buffer_timeout=bad)
    for bad in (float("inf"), 1e300, 10**400, threading.TIMEOUT_MAX * 2):
        with pytest.raises(ValueError, match="must be finite.*use None"):
            fb.RecordWriter(part, sel, buffer_timeout=bad)
    assert threading.active_count() == threads, "no flusher thread was started"
    for good, want in ((None, None), (0, 0.0), (Fraction(1, 4), 0.25), (np.int64(2), 2.0),
                       (threading.TIMEOUT_MAX, threading.TIMEOUT_MAX)):
        other = fb.create_partition(nbp, 1)
        w = fb.RecordWriter(other, buffer_timeout=good)
        assert w.buffer_timeout == want and type(w.buffer_timeout) is type(want)
        w.close()
        other.pool.destroy()
    # the refused writers took nothing: the partition and the selector are free
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part, sel, buffer_timeout=np.float64(0.005))
    w.emit("x")                                    # a partly filled 32 KiB buffer
    reader = Task(lambda: next(gate))
    reader.start()
    assert reader.finish(timeout=10) == "x", "the flusher hands it over"
    w.close()
    assert list(gate) == []
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_names_are_strings():
    """Any object was stored as the name of a partition, writer or gate
    (and shown in their errors and thread names)."""
    nbp = fb.NetworkBufferPool(16, 128)
    pool = nbp.create_buffer_pool(3, 3, num_subpartitions=2)
    for bad in (3, b"p", ["p"], object()):
        with pytest.raises(TypeError, match=f"name must be a str or None, got {type(bad).__name__}"):
            fb.ResultPartition(pool, 2, name=bad)
    with pytest.raises(TypeError, match="name must be a str"):
        fb.create_partition(nbp, 2, name=1.5)
    assert nbp.num_total_required_buffers == 3, "the pool made for it was destroyed"
    part = fb.ResultPartition(pool, 2, name="src")
    with pytest.raises(TypeError, match="name must be a str or None, got int"):
        fb.RecordWriter(part, name=7)
    with pytest.raises(TypeError, match="name must be a str or None, got bytes"):
        fb.InputGate([(part, 0)], name=b"c0")
    # nothing was taken by the refused writer and gate
    gates = [fb.InputGate([(part, c)], name=f"c{c}") for c in range(2)]
    w = fb.RecordWriter(part, fb.RoundRobinSelector(start=0))
    assert (part.name, w.name, gates[1].name) == ("src", "src", "c1")
    w.emit(1)
    w.close()
    assert [list(g) for g in gates] == [[1], []]
    for g in gates:
        g.close()
    unnamed = fb.RecordWriter(fb.create_partition(nbp, 1), name=None, buffer_timeout=None)
    assert unnamed.name is None
    unnamed.close()
    assert_all_recycled(nbp, [pool, unnamed.partition.pool])


def test_a_record_the_codec_refuses_leaves_the_writer_usable():
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    with fb.RecordWriter(part) as w:
        w.emit(1)
        with pytest.raises(TypeError):
            w.emit(object())
        w.emit(2)
    assert list(gate) == [1, 2]
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_custom_selector_errors_leave_the_writer_usable():
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 2)
    gates = [fb.InputGate([(part, c)]) for c in range(2)]
    with fb.RecordWriter(part, lambda rec, n: rec) as w:
        w.emit(1)
        with pytest.raises(IndexError):
            w.emit(5)
        with pytest.raises(TypeError):
            w.emit("0")
        w.emit(0)
    assert [list(g) for g in gates] == [[0], [1]]
    for g in gates:
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_consumers_wait_without_the_gil():
    """A consumer blocked on an empty gate lets other threads run freely."""
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    t = Task(lambda: list(gate), name="consumer")
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    x = 0
    for i in range(2_000_000):
        x += i
    spin = time.perf_counter() - t0
    assert gate.idle_time_ns > 0
    with fb.RecordWriter(part) as w:
        w.emit("done")
    assert t.finish() == ["done"]
    # reference: the same loop with no other thread around
    t0 = time.perf_counter()
    x = 0
    for i in range(2_000_000):
        x += i
    alone = time.perf_counter() - t0
    assert spin < alone * 3 + 0.2
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_concurrent_metric_reads_while_tasks_run():
    nbp = fb.NetworkBufferPool(16, 512)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    w = fb.RecordWriter(part)
    stop = threading.Event()
    reads = []

    def reader():
        while not stop.is_set():
            reads.append((w.num_records_out, gate.num_records_in, w.back_pressured_time_ns,
                          gate.idle_time_ns, part.backlogs(), gate.backlogs()))

    r = Task(reader, name="reader")
    r.start()
    c = Task(lambda: sum(1 for _ in gate), name="consumer")
    c.start()
    with w:
        for i in range(20000):
            w.emit((i, i))
    assert c.finish() == 20000
    stop.set()
    r.finish()
    assert len(reads) > 1
    outs = [x[0] for x in reads]
    assert outs == sorted(outs)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_emit_is_a_positional_only_fast_call():
    """emit is the per-record entry point: a METH_O method (no bound-method
    object, no keyword parsing per call) that still shows its signature."""
    import inspect

    assert str(inspect.signature(fb.RecordWriter.emit)) == "(self, record, /)"
    assert "channel the selector picks" in fb.RecordWriter.emit.__doc__
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    with fb.RecordWriter(part) as w:
        w.emit(1)
        with pytest.raises(TypeError):
            w.emit(record=2)
        with pytest.raises(TypeError):
            w.emit()
        with pytest.raises(TypeError):
            w.emit(3, 4)
        fb.RecordWriter.emit(w, 5)
    assert list(gate) == [1, 5]
    gate.close()
    assert_all_recycled(nbp, [part.pool])
