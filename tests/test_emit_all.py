"""RecordWriter.emit_all (the records of an iterable in one call, the loop
in C) and InputGate.read_many (up to n records at once): the same streams
as a loop of emit and as iteration, the index of the record where emit_all
stopped, the writer's state after it, threads, remote gates."""

import itertools
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.io.producer import emit_all as produce_all
from helpers import run_in_thread, ticks_during
from test_io_support import assert_all_recycled, wait_until

SELECTORS = {
    "round_robin": lambda: fb.RoundRobinSelector(start=0),
    "rescale": fb.RescaleSelector,
    "hash_first_field": fb.HashSelector.by_first_field,
    "hash_record": fb.HashSelector,
    "hash_odd_parallelism": lambda: fb.HashSelector(0, max_parallelism=100),
    "broadcast": fb.BroadcastSelector,
    "global": fb.GlobalSelector,
    "custom": lambda: fb.CustomSelector(lambda r, n: len(repr(r)) % n),
}

scalars = st.one_of(st.integers(-2**70, 2**70), st.text(max_size=20), st.none(), st.booleans(),
                    st.floats(allow_nan=False), st.binary(max_size=40))
records = st.one_of(
    st.tuples(st.integers(-2**40, 2**40), st.integers(-2**40, 2**40)),
    st.tuples(scalars, scalars),
    st.binary(min_size=300, max_size=3000),           # spans buffers of 256 bytes
    st.lists(scalars, min_size=1, max_size=5).map(tuple),
)


def _exchange(n, selector, codec="typed", segment_size=256):
    """A partition of ``n`` channels, its gates read by threads, a writer."""
    nbp = fb.NetworkBufferPool(4 * n + 16, segment_size)
    part = fb.create_partition(nbp, n, min_buffers=2 * n + 4)
    gates = [fb.InputGate([(part, c)], codec=codec) for c in range(n)]
    readers = [run_in_thread(list, g) for g in gates]
    writer = fb.RecordWriter(part, selector, codec=codec, buffer_timeout=None)
    return nbp, part, gates, readers, writer


def _unread(n, selector=None, segments=16, segment_size=256, **part_kw):
    """A partition of ``n`` channels, its gates (nobody reads them yet), a
    writer without a buffer timeout."""
    nbp = fb.NetworkBufferPool(segments, segment_size)
    part = fb.create_partition(nbp, n, **part_kw)
    gates = [fb.InputGate([(part, c)]) for c in range(n)]
    return nbp, part, gates, fb.RecordWriter(part, selector, buffer_timeout=None)


def _finish(nbp, part, gates, readers):
    """Every channel's records once the writer closed; all buffers back."""
    out = []
    for (t, res), g in zip(readers, gates):
        t.join(20)
        assert "error" not in res, res
        out.append(res["value"])
        g.close()
    assert_all_recycled(nbp, [part.pool])
    return out


def _streams(n, name, recs, write):
    ex = _exchange(n, SELECTORS[name]())
    with ex[4] as writer:
        written = write(writer, recs)
    return written, _finish(*ex[:4])


@settings(max_examples=40)
@given(recs=st.lists(records, max_size=60), n=st.integers(1, 4),
       name=st.sampled_from(sorted(SELECTORS)), shape=st.sampled_from(["list", "tuple", "gen"]))
def test_same_channels_and_order_as_a_loop_of_emit(recs, n, name, shape):
    """emit_all of a list, a tuple or a generator delivers what a loop of
    emit delivers, channel by channel, and returns the number of records."""
    if name == "hash_odd_parallelism":
        recs = [r if isinstance(r, tuple) else (r,) for r in recs]

    def loop(writer, items):
        for r in items:
            writer.emit(r)

    source = {"list": list, "tuple": tuple, "gen": lambda rs: (r for r in rs)}[shape]
    _, expected = _streams(n, name, recs, loop)
    written, got = _streams(n, name, recs, lambda w, rs: w.emit_all(source(rs)))
    assert written == len(recs)
    assert got == expected


def test_a_record_larger_than_many_buffers():
    """A 1 MiB record between small ones spans 4096 buffers of 256 bytes."""
    big = bytes(range(256)) * 4096
    recs = [(1, 2), big, "after", big[:1000]]
    written, (got,) = _streams(1, "round_robin", recs, lambda w, rs: w.emit_all(iter(rs)))
    assert written == 4 and got == recs


def _note(exc):
    notes = getattr(exc, "__notes__", [])
    assert len(notes) == 1, notes
    return notes[0]


def test_an_iterable_that_raises_midway():
    """The iterable's own exception, with a note naming the index; the
    records before it are written and the writer stays usable."""
    def gen():
        yield from range(5)
        raise KeyError("no more")

    nbp, part, gates, readers, w = _exchange(1, "round_robin")
    with pytest.raises(KeyError, match="no more") as info:
        w.emit_all(gen())
    assert "the iterable raised for the record at index 5" in _note(info.value)
    assert w.num_records_out == 5 and not w.is_closed
    assert w.emit_all([5, 6]) == 2
    w.close()
    assert _finish(nbp, part, gates, readers) == [[0, 1, 2, 3, 4, 5, 6]]


def test_a_record_the_codec_cannot_encode():
    """TypeError as emit raises it, naming the record's index; the writer
    goes on (nothing of that record was written)."""
    nbp, part, gates, readers, w = _exchange(2, fb.RoundRobinSelector(start=0))
    with pytest.raises(TypeError, match="cannot encode") as info:
        w.emit_all([(1, "a"), (2, "b"), (3, object()), (4, "d")])
    assert "record at index 2 of the iterable was not written; the 2 before it" in \
        _note(info.value)
    w.emit_all([(5, "e")])          # round robin went on past record 2's channel, as with emit
    w.close()
    assert _finish(nbp, part, gates, readers) == [[(1, "a")], [(2, "b"), (5, "e")]]


def test_a_consumer_that_left_early():
    """A released subpartition: PartitionReleasedError (its type kept, so a
    caller tells a consumer's leaving from a failure) at the first record
    for it; the other channel goes on."""
    nbp, part, gates, w = _unread(2, fb.RoundRobinSelector(start=0), min_buffers=6)
    gates[1].close()
    with pytest.raises(fb.PartitionReleasedError) as info:
        w.emit_all(["to 0", "to 1", "to 0 again"])
    assert "record at index 1 " in _note(info.value)
    assert w.emit_all(iter(["to 0 at last"])) == 1        # round robin's next: channel 0
    w.close()
    assert list(gates[0]) == ["to 0", "to 0 at last"]
    gates[0].close()
    assert_all_recycled(nbp, [part.pool])


def test_the_index_of_a_record_dropped_by_a_released_channel_among_many():
    nbp, part, gates, w = _unread(2, fb.HashSelector(), min_buffers=6)
    sel = fb.HashSelector()
    sel.setup(2)
    recs = list(range(40))
    first_on_1 = next(i for i, r in enumerate(recs) if sel.select_channel(r) == 1)
    gates[1].close()
    with pytest.raises(fb.PartitionReleasedError) as info:
        w.emit_all(recs)
    assert f"record at index {first_on_1} " in _note(info.value)
    w.close()
    assert list(gates[0]) == [r for r in recs[:first_on_1] if sel.select_channel(r) == 0]
    gates[0].close()
    assert_all_recycled(nbp, [part.pool])


def test_reentering_from_a_selector_or_a_codec():
    """Code run by the selector or the codec that calls the writer again
    is refused (RuntimeError naming the re-entry) at that record's index;
    the records before it are written, the writer goes on."""
    holder = {}

    def selector(record, n):
        if record == "again":
            holder["w"].emit_all(["inner"])
        return 0

    nbp, part, gates, readers, w = _exchange(1, selector)
    holder["w"] = w
    with pytest.raises(RuntimeError, match="re-entered") as info:
        w.emit_all(["a", "again", "b"])
    assert "record at index 1 " in _note(info.value)
    w.emit_all(["c"])
    w.close()
    assert _finish(nbp, part, gates, readers) == [["a", "c"]]

    class Sneaky:
        def __reduce__(self):
            holder["w2"].emit("inner")
            return (str, ("sneaky",))

    nbp, part, gates, readers, w2 = _exchange(1, "round_robin", codec="pickle")
    holder["w2"] = w2
    with pytest.raises(RuntimeError, match="re-entered") as info:
        w2.emit_all(["x", Sneaky()])
    assert "record at index 1 " in _note(info.value)
    w2.close()
    assert _finish(nbp, part, gates, readers) == [["x"]]


def test_fail_from_another_thread_while_emit_all_waits_for_buffers():
    """A producer in emit_all blocked on backpressure (nobody reads) is
    aborted by fail() from another thread: ProducerFailedError from the
    cause, noting where it stopped; the consumer raises it too."""
    nbp, part, (gate,), w = _unread(1, segments=8, min_buffers=4)
    t, res = run_in_thread(w.emit_all, [b"x" * 100] * 1000)
    assert wait_until(lambda: w.back_pressured_time_ns > 0)
    cause = ValueError("stop it")
    w.fail(cause)
    t.join(10)
    err = res["error"]
    assert isinstance(err, fb.ProducerFailedError) and err.__cause__ is cause
    index = int(_note(err).split("index ")[1].split()[0])
    assert 0 < index < 1000 and w.num_records_out == index
    with pytest.raises(fb.ProducerFailedError):
        list(gate)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


@pytest.mark.parametrize("selector", ["round_robin", "hash_first_field"])
def test_fail_from_another_thread_during_a_long_list(selector):
    """Over a list the loop runs no Python code, yet other threads get the
    GIL (a consumer, a thread calling fail()) while it runs."""
    nbp, part, gates, readers, w = _exchange(2, SELECTORS[selector](), segment_size=32768)
    recs = [(1, 2)] * 2_000_000
    t, res = run_in_thread(w.emit_all, recs)
    assert wait_until(lambda: w.num_records_out > 1000)
    w.fail(KeyError("enough"))
    t.join(30)
    assert isinstance(res.get("error"), fb.ProducerFailedError), res
    assert w.num_records_out < len(recs)
    for (rt, rres), g in zip(readers, gates):
        rt.join(10)
        assert isinstance(rres.get("error"), fb.ProducerFailedError)
        g.close()
    assert_all_recycled(nbp, [part.pool])


def test_other_threads_run_during_emit_all_of_a_list():
    nbp, part, (gate,), w = _unread(1, segments=64, segment_size=32768, min_buffers=40)
    reader = run_in_thread(lambda: sum(1 for _ in gate))
    assert ticks_during(lambda: w.emit_all([(7, 7)] * 500_000)) > 5
    w.close()
    reader[0].join(20)
    assert reader[1]["value"] == 500_000
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_backlog_aware_rebalance_waits_for_a_free_channel():
    """Every channel blocked: emit_all waits (soft back pressure) until a
    consumer reads, and every record arrives once."""
    nbp, part, gates, w = _unread(2, fb.BacklogAwareRebalanceSelector(max_backlog=1),
                                  segments=32, min_buffers=12, max_buffers_per_channel=5)
    t, res = run_in_thread(w.emit_all, [b"r" * 200] * 60)
    assert wait_until(lambda: w.back_pressured_time_ns > 0)
    readers = [run_in_thread(list, g) for g in gates]
    t.join(20)
    assert res == {"value": 60, "elapsed": res["elapsed"]}
    w.close()
    got = []
    for (rt, rres), g in zip(readers, gates):
        rt.join(10)
        got += rres["value"]
        g.close()
    assert got == [b"r" * 200] * 60
    assert_all_recycled(nbp, [part.pool])


def test_arguments_state_and_the_producer_helper():
    nbp, part, gates, readers, w = _exchange(1, "round_robin")
    with pytest.raises(TypeError, match="iterable of records, got int"):
        w.emit_all(5)
    with pytest.raises(TypeError):
        w.emit_all(records=[1])
    assert w.emit_all([]) == 0 and w.emit_all(()) == 0
    assert produce_all(w, iter(["p", "q"])) == 2
    assert str(__import__("inspect").signature(fb.RecordWriter.emit_all)) == \
        "(self, records, /)"
    entered = threading.Event()
    release = threading.Event()

    def slow():
        entered.set()
        release.wait(10)
        yield "slow"

    t, res = run_in_thread(w.emit_all, slow())
    assert entered.wait(10)
    with pytest.raises(RuntimeError, match="in use by another thread"):
        w.emit_all(["refused"])
    release.set()
    t.join(10)
    assert res["value"] == 1
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.emit_all([])
    assert _finish(nbp, part, gates, readers) == [["p", "q", "slow"]]


# ---- the fused loop: common records straight into the buffers ---------------------

# Fields the fused loop writes itself (small and large ints, floats, short
# ASCII str, short bytes, None, bool) and ones it leaves to emit's path.
fast_fields = st.one_of(st.integers(-2**31, 2**31 - 1), st.integers(-2**62, 2**62),
                        st.floats(allow_nan=False), st.text("abcxyz 09", max_size=12),
                        st.binary(max_size=30), st.none(), st.booleans())
slow_fields = st.one_of(
    st.integers(2**64, 2**80), st.integers(-2**80, -2**64),          # beyond int64
    st.text("é€𝄞", min_size=1, max_size=4),                          # not ASCII
    st.text("ab", min_size=256, max_size=300),                        # long
    st.lists(st.integers(0, 9), max_size=3), st.tuples(st.integers(), st.none()),
    st.dictionaries(st.text("k", max_size=2), st.integers(0, 3), max_size=2),
    st.sampled_from([np.int64(-3), np.float64(2.5), np.int32(7)]))
keys = st.one_of(st.integers(0, 999), st.integers(-2**62, 2**62), st.integers(2**64, 2**70),
                 st.text("kéy", max_size=5), st.floats(allow_nan=False), st.none())
mixed_records = st.one_of(
    st.tuples(keys, st.lists(st.one_of(fast_fields, fast_fields, slow_fields), min_size=1,
                             max_size=4)).map(lambda kv: (kv[0], *kv[1])),
    st.tuples(keys, st.lists(fast_fields, min_size=1, max_size=3)).map(lambda kv: [kv[0], *kv[1]]),
    keys, fast_fields, slow_fields)
FUSED_SELECTORS = {
    "round_robin": lambda: fb.RoundRobinSelector(start=1),
    "hash_record": fb.HashSelector,
    "hash_first_field": fb.HashSelector.by_first_field,
    "hash_field_1": lambda: fb.HashSelector(1, max_parallelism=100),
    "hash_callable": lambda: fb.HashSelector(lambda r: repr(r)[:3]),
}


def _keyable(recs, name):
    """``recs`` as records the selector ``name`` can key: a record it cannot
    hash (or without the keyed field) goes as ``(repr(record), 0)``."""
    sel = FUSED_SELECTORS[name]()
    sel.setup(3)
    out = []
    for r in recs:
        try:
            sel.select_channel(r)
        except (TypeError, IndexError, KeyError, ValueError):
            r = (repr(r), 0)
        out.append(r)
    return out


def _raw_streams(name, recs, write, n=3, segment_size=64):
    """What each channel's gate reads as raw payloads (codec "bytes": the
    typed encoding of each record), and the writer's counters."""
    nbp = fb.NetworkBufferPool(4 * n + 16, segment_size)
    part = fb.create_partition(nbp, n, min_buffers=2 * n + 4)
    gates = [fb.InputGate([(part, c)], codec="bytes") for c in range(n)]
    readers = [run_in_thread(list, g) for g in gates]
    with fb.RecordWriter(part, FUSED_SELECTORS[name](), buffer_timeout=None) as w:
        write(w, recs)
    counters = (w.num_records_out, w.num_bytes_out, w.num_buffers_out)
    return _finish(nbp, part, gates, readers), counters


@settings(max_examples=60, deadline=None)
@given(recs=st.lists(mixed_records, max_size=80), name=st.sampled_from(sorted(FUSED_SELECTORS)),
       shape=st.sampled_from(["list", "tuple", "gen"]), split=st.integers(0, 80))
def test_the_fused_loop_writes_the_bytes_of_a_loop_of_emit(recs, name, shape, split):
    """Common and uncommon records mixed, over buffers of 64 bytes (records
    straddle them): emit_all, then emit for the rest, delivers to every
    channel the bytes a loop of emit delivers, with the same counters (the
    round robin's position and the buffers' boundaries carried over)."""
    recs = _keyable(recs, name)
    source = {"list": list, "tuple": tuple, "gen": lambda rs: (r for r in rs)}[shape]

    def loop(w, items):
        for r in items:
            w.emit(r)

    def fused(w, items):
        assert w.emit_all(source(items[:split])) == len(items[:split])
        loop(w, items[split:])

    expected = _raw_streams(name, recs, loop)
    assert _raw_streams(name, recs, fused) == expected
    assert sum(map(len, expected[0])) == len(recs)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), data=st.data(), name=st.sampled_from(sorted(FUSED_SELECTORS)))
def test_an_unencodable_record_in_a_fast_run(n, data, name):
    """A record the codec refuses (a lone surrogate, which every selector
    keys) at index i among common ones, past the pauses of a long list too:
    exactly the first i are delivered, as by a loop of emit, and the note
    names index i; the writer goes on."""
    i = data.draw(st.integers(0, n - 1))
    recs = [(k % 7, k) for k in range(n)]
    recs[i] = (i % 7, i, "\ud800")

    def stop_at_i(w, items):
        with pytest.raises(UnicodeEncodeError) as info:
            w.emit_all(items)
        assert f"the record at index {i} of the iterable was not written; the {i} before" in \
            _note(info.value)
        assert w.num_records_out == i
        w.emit_all([("after", 1)])

    def loop(w, items):
        for r in items[:i]:
            w.emit(r)
        with pytest.raises(UnicodeEncodeError):
            w.emit(items[i])
        w.emit(("after", 1))

    assert _raw_streams(name, recs, stop_at_i, segment_size=256) == \
        _raw_streams(name, recs, loop, segment_size=256)


@pytest.mark.parametrize("timeout", [0, 0.0005])
def test_the_output_flusher_and_a_buffer_timeout_of_zero(timeout):
    """With a buffer timeout (the output flusher hands buffers over, or a
    flush after every record) every record arrives, in order."""
    nbp = fb.NetworkBufferPool(40, 4096)
    part = fb.create_partition(nbp, 2, min_buffers=12)
    gates = [fb.InputGate([(part, c)]) for c in range(2)]
    readers = [run_in_thread(list, g) for g in gates]
    recs = [(k % 10, k) for k in range(20_000)]
    with fb.RecordWriter(part, fb.HashSelector.by_first_field(), buffer_timeout=timeout) as w:
        assert w.emit_all(recs) == len(recs)
    got = _finish(nbp, part, gates, readers)
    sel = fb.HashSelector.by_first_field()
    sel.setup(2)
    assert got == [[r for r in recs if sel.select_channel(r) == c] for c in range(2)]


# ---- read_many ------------------------------------------------------------------


def _gate_with(recs, *, n=1, event_at=None, segment_size=256):
    nbp = fb.NetworkBufferPool(4 * len(recs) + 16, segment_size)
    part = fb.create_partition(nbp, n, min_buffers=4 * len(recs) + 8)
    gate = fb.InputGate([(part, c) for c in range(n)])
    with fb.RecordWriter(part, fb.RoundRobinSelector(start=0), buffer_timeout=None) as w:
        for i, r in enumerate(recs):
            if i == event_at:
                w.broadcast_event(fb.UserEvent("mid"))
            w.emit(r)
    return nbp, part, gate


def test_read_many_checks_n():
    nbp, part, gate = _gate_with([1])
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n must be >= 1"):
            gate.read_many(bad)
    for bad in (1.5, True, "3", None):
        with pytest.raises(TypeError, match="n must be an integer"):
            gate.read_many(bad)
    assert gate.read_many(2**100) == [1]
    gate.close()
    assert_all_recycled(nbp, [part.pool])


@settings(max_examples=30)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=40),
       plan=st.lists(st.sampled_from(["next", "many"]), min_size=1, max_size=40),
       n=st.integers(1, 3), count=st.integers(0, 80), event_at=st.integers(0, 80))
def test_read_many_mixed_with_iteration(sizes, plan, n, count, event_at):
    """read_many and next in any mix read the stream iteration reads, in
    order, events in place; [] (and StopIteration) at its end."""
    recs = [(i, "v" * (i % 50)) for i in range(count)]
    nbp, part, gate = _gate_with(recs, n=n, event_at=event_at)
    expected = _gate_with(recs, n=n, event_at=event_at)
    want = list(expected[2])
    expected[2].close()
    expected[1].pool.destroy()
    got = []
    for step, size in zip(itertools.cycle(plan), itertools.cycle(sizes)):
        if step == "next":
            item = next(gate, None)
            if item is None:
                break
            got.append(item)
        else:
            batch = gate.read_many(size)
            assert len(batch) <= size
            if not batch:
                break
            got += batch
    assert got == want
    assert gate.read_many(5) == [] and gate.is_finished
    with pytest.raises(StopIteration):
        next(gate)
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_read_many_waits_for_the_first_record_only():
    nbp, part, (gate,), w = _unread(1, min_buffers=6)
    t, res = run_in_thread(gate.read_many, 100)
    t.join(0.3)
    assert t.is_alive()                        # nothing yet: it waits
    w.emit_all(["a", "b"])
    w.flush()
    t.join(10)
    assert res["value"] == ["a", "b"]          # what was there, without waiting for 100
    w.close()
    assert gate.read_many(100) == []
    gate.close()
    assert_all_recycled(nbp, [part.pool])


def test_read_many_returns_what_came_before_an_error_then_raises_it():
    """A channel's producer failed after another channel's records arrived:
    read_many returns those records, the next read raises the failure (and
    every read after it, as iteration does)."""
    nbp = fb.NetworkBufferPool(16, 256)
    good = fb.create_partition(nbp, 1, min_buffers=4)
    bad = fb.create_partition(nbp, 1, min_buffers=4)
    gate = fb.InputGate([(good, 0), (bad, 0)])
    w_good = fb.RecordWriter(good, buffer_timeout=None)
    w_good.emit_all([1, 2, 3])
    w_good.flush()
    w_bad = fb.RecordWriter(bad, buffer_timeout=None)
    w_bad.fail(KeyError("producer died"))
    assert gate.read_many(10) == [1, 2, 3]
    with pytest.raises(fb.ProducerFailedError):
        gate.read_many(10)
    with pytest.raises(fb.ProducerFailedError):
        next(gate)
    w_good.close()
    gate.close()
    assert_all_recycled(nbp, [good.pool, bad.pool])


@pytest.mark.timeout(60)
def test_remote_gate_over_tcp():
    """A remote gate (the same InputGate class) reads with read_many what
    emit_all wrote in another environment, over TCP."""
    from flinkbuf.network import NetworkEnvironment
    from network_helpers import SECRET

    prod = NetworkEnvironment(64, 1024, secret=SECRET, transport="tcp")
    cons = NetworkEnvironment(64, 1024, secret=SECRET, transport="tcp")
    try:
        part = fb.create_partition(prod.network_buffer_pool, 2)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0), (prod.address, "p", 1)])
        recs = [(i % 7, "x" * (i % 300)) for i in range(5000)]

        def produce():
            with fb.RecordWriter(part, fb.HashSelector.by_first_field(),
                                 buffer_timeout=0.01) as w:
                written = w.emit_all(recs)
                w.broadcast_event(fb.UserEvent("end"))
            return written

        t, res = run_in_thread(produce)
        got = []
        while batch := gate.read_many(64):
            assert len(batch) <= 64
            got += batch
        gate.close()
        t.join(10)
        assert res["value"] == 5000
        assert got.count(fb.UserEvent("end")) == 2
        rows = [r for r in got if not isinstance(r, fb.UserEvent)]
        assert sorted(rows) == sorted(recs)
        for key in range(7):                 # one channel per key: its records in order
            assert [r for r in rows if r[0] == key] == [r for r in recs if r[0] == key]
    finally:
        cons.close()
        prod.close()
