"""Misuse of the exchange that used to crash, stall, lose records silently or
grow without bound: re-initialised objects, selectors shared or set up
again, a writer used by two threads at once, and events from a producer
whose consumers stalled."""

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import flinkbuf as fb
from flinkbuf import io as fio

from helpers import run_in_thread, wait_until


def _run_child(code):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith("survived"), proc.stdout


# ---- a second __init__ -------------------------------------------------------

def test_a_connected_channel_cannot_be_re_pointed():
    """ch.__init__(b, 0) after the channel joined a gate left a's
    subpartition pointing at the gate, which was then freed: the next emit
    to a notified freed memory (a use-after-free, or a hang)."""
    _run_child("""
        import gc, flinkbuf as fb
        from flinkbuf import io
        nbp = fb.NetworkBufferPool(32, 256)
        a, b = io.create_partition(nbp, 1), io.create_partition(nbp, 1)
        ch = fb.LocalInputChannel(a, 0)
        g = fb.InputGate([ch])
        try:
            ch.__init__(b, 0)
        except RuntimeError as exc:
            assert "already initialised" in str(exc), exc
        else:
            raise SystemExit("a second __init__ was accepted")
        assert ch.partition is a and ch.subpartition == 0
        g.close(); del g; gc.collect()
        w = fb.RecordWriter(a, buffer_timeout=None)
        try:
            for i in range(100):
                w.emit(i)
            w.flush()
        except fb.PartitionReleasedError:
            pass
        w.close()
        # b was never touched: it can still get a consumer
        g2 = fb.InputGate([(b, 0)])
        g2.close()
        print("survived")
    """)


def _instances():
    """(label, make) for every public class whose __init__ takes arguments."""
    nbp = fb.NetworkBufferPool(64, 256)

    def writer():
        return fb.RecordWriter(fio.create_partition(nbp, 2), buffer_timeout=None)

    def gate():
        return fb.InputGate([(fio.create_partition(nbp, 1), 0)])

    return nbp, [
        ("NetworkBufferPool", lambda: fb.NetworkBufferPool(4, 64), (8, 128)),
        ("ResultPartition", lambda: fio.create_partition(nbp, 2),
         (nbp.create_buffer_pool(4, 4), 3)),
        ("RecordWriter", writer, (fio.create_partition(nbp, 3),)),
        ("InputGate", gate, ([(fio.create_partition(nbp, 1), 0)],)),
        ("LocalInputChannel", lambda: fb.LocalInputChannel(fio.create_partition(nbp, 2), 0),
         (fio.create_partition(nbp, 2), 1)),
        ("RoundRobinSelector", lambda: fb.RoundRobinSelector(start=1), (0,)),
        ("HashSelector", lambda: fb.HashSelector(0), (1,)),
        ("CustomSelector", lambda: fb.CustomSelector(lambda r, n: 0), (lambda r, n: 1,)),
        ("BacklogAwareRebalanceSelector", lambda: fb.BacklogAwareRebalanceSelector(3), (5,)),
    ]


def test_every_class_refuses_a_second_init():
    """Re-running __init__ re-pointed objects other objects rely on (the
    channel above; a selector's function or key; a writer's partition).
    Every class refuses it and keeps its state."""
    nbp, cases = _instances()
    made = []
    try:
        for label, make, other_args in cases:
            obj = make()
            made.append(obj)
            before = repr(obj)
            with pytest.raises(RuntimeError, match="already initialised"):
                obj.__init__(*other_args)
            assert repr(obj) == before, label
    finally:
        for obj in made:
            for name in ("close", "fail"):
                if hasattr(obj, name) and not isinstance(obj, fb.ResultPartition):
                    try:
                        getattr(obj, name)()
                    except Exception:
                        pass
            if isinstance(obj, fb.NetworkBufferPool):
                obj.destroy()
        nbp.destroy()


# ---- selectors: one per writer -----------------------------------------------

@pytest.mark.parametrize("make", [fb.RoundRobinSelector, fb.RescaleSelector, fb.HashSelector,
                                  fb.GlobalSelector, fb.BacklogAwareRebalanceSelector,
                                  lambda: fb.CustomSelector(lambda r, n: n - 1)])
def test_a_selector_serves_one_writer_and_is_not_set_up_again(make):
    """A selector set up by a 16-channel writer while a 2-channel writer
    still used it (or set up again through its public setup()) made that
    writer index past its channel lists: a segfault.  The second binding
    and a later setup() raise; the first writer keeps working."""
    nbp = fb.NetworkBufferPool(128, 256)
    two = fio.create_partition(nbp, 2)
    gates = [fb.InputGate([(two, i)]) for i in range(2)]
    sel = make()
    writer = fb.RecordWriter(two, sel, buffer_timeout=None)
    with pytest.raises(ValueError, match="already serves a RecordWriter"):
        fb.RecordWriter(fio.create_partition(nbp, 16), sel)
    with pytest.raises(RuntimeError, match="cannot be set up again"):
        sel.setup(16)
    assert sel.num_channels == 2
    readers = [run_in_thread(list, g) for g in gates]
    records = [(i, str(i)) for i in range(200)]
    for r in records:
        writer.emit(r)
    writer.close()
    got = []
    for t, res in readers:
        t.join(10)
        got += res["value"]
    assert sorted(got) == sorted(records)
    for g in gates:
        g.close()
    nbp.destroy()


def test_unbound_selectors_still_set_up_freely():
    sel = fb.RoundRobinSelector(start=0)
    sel.setup(4)
    sel.setup(2)
    assert [sel.select_channel(None) for _ in range(3)] == [0, 1, 0]


def test_a_bare_selector_behaves_as_the_default():
    """Made without __init__, a HashSelector had max_parallelism 0 and key
    index 0; it now is HashSelector()."""
    bare = fb.HashSelector.__new__(fb.HashSelector)
    assert bare.max_parallelism == 128
    bare.setup(4)
    ref = fb.HashSelector()
    ref.setup(4)
    for key in ("a", 17, (1, 2), None):
        assert bare.select_channel(key) == ref.select_channel(key)
    bl = fb.BacklogAwareRebalanceSelector.__new__(fb.BacklogAwareRebalanceSelector)
    assert bl.max_backlog is None


# ---- one thread at a time ------------------------------------------------------

class _SlowSelector(fb.CustomSelector):
    """Sleeps (the GIL released) in the selector, so another thread runs
    in the middle of an emit."""

    def __init__(self, entered, delay=0.3):
        super().__init__()
        self.entered = entered
        self.delay = delay

    def select(self, record, num_channels):
        self.entered.set()
        time.sleep(self.delay)
        return 0


OTHER_CALLS = {
    "close": lambda w: w.close(),
    "flush": lambda w: w.flush(),
    "emit": lambda w: w.emit(("other", 0)),
    "broadcast_emit": lambda w: w.broadcast_emit(("other", 1)),
    "broadcast_event": lambda w: w.broadcast_event(fb.UserEvent("other")),
}


@pytest.mark.parametrize("call", sorted(OTHER_CALLS))
def test_a_call_overlapping_an_emit_in_another_thread_is_refused(call):
    """close() from another thread while emit ran a selector's code
    finished the partition, and emit then returned normally with its
    record in a buffer nobody would hand over: silent loss.  A second
    thread's call now raises at once and changes nothing; the first
    thread's record is delivered and its stream ends normally."""
    nbp = fb.NetworkBufferPool(32, 256)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    entered = threading.Event()
    writer = fb.RecordWriter(part, _SlowSelector(entered), buffer_timeout=None)
    t, res = run_in_thread(writer.emit, ("mine", 1))
    assert entered.wait(5)
    with pytest.raises(RuntimeError, match="in use by another thread"):
        OTHER_CALLS[call](writer)
    t.join(5)
    assert "error" not in res, res
    assert not part.is_failed and not writer.is_closed
    writer.close()
    assert list(gate) == [("mine", 1)]
    gate.close()
    nbp.destroy()


def test_fail_from_another_thread_during_emit_raises_in_emit_and_returns_buffers():
    """fail() may come from any thread: an emit in progress then raises
    (ProducerFailedError) instead of returning with its record lost, and
    every buffer it took goes back to the pool."""
    nbp = fb.NetworkBufferPool(32, 256)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    entered = threading.Event()
    writer = fb.RecordWriter(part, _SlowSelector(entered), buffer_timeout=None)
    t, res = run_in_thread(writer.emit, ("mine", 1))
    assert entered.wait(5)
    writer.fail(RuntimeError("abort"))
    t.join(5)
    assert isinstance(res.get("error"), fb.ProducerFailedError), res
    with pytest.raises(fb.ProducerFailedError):
        list(gate)
    gate.close()
    assert part.pool.num_available == part.pool.num_requested     # every buffer is back
    nbp.destroy()


class _SlowPickle:
    """A record whose pickling sleeps: the codec runs user code too."""

    def __init__(self, entered):
        self.entered = entered

    def __reduce__(self):
        self.entered.set()
        time.sleep(0.3)
        return (str, ("pickled",))


def test_fail_while_the_codec_runs_user_code():
    nbp = fb.NetworkBufferPool(32, 256)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)], codec="pickle")
    entered = threading.Event()
    writer = fb.RecordWriter(part, codec="pickle", buffer_timeout=None)
    t, res = run_in_thread(writer.emit, _SlowPickle(entered))
    assert entered.wait(5)
    with pytest.raises(RuntimeError, match="in use by another thread"):
        writer.close()
    writer.fail()
    t.join(5)
    assert isinstance(res.get("error"), fb.ProducerFailedError), res
    gate.close()
    nbp.destroy()


def test_a_selector_that_calls_back_into_its_writer_is_refused():
    nbp = fb.NetworkBufferPool(32, 256)
    part = fio.create_partition(nbp, 2)
    gate = fb.InputGate([(part, 0), (part, 1)])
    holder = {}

    def select(record, n):
        if record == "again":
            holder["w"].emit("inner")
        return 0

    writer = holder["w"] = fb.RecordWriter(part, select, buffer_timeout=None)
    with pytest.raises(RuntimeError, match="re-entered"):
        writer.emit("again")
    writer.emit("fine")
    writer.close()
    assert list(gate) == ["fine"]
    gate.close()
    nbp.destroy()


def test_a_second_thread_does_not_break_the_stream_of_a_blocked_emit():
    """A second thread's emit while the first was blocked requesting a
    buffer reported "a record was left half written by an earlier error",
    and its close() failed the partition under the first thread.  Now the
    second thread is told the writer is in use, and the first thread's
    stream goes on and ends normally."""
    nbp = fb.NetworkBufferPool(16, 128)
    part = fio.create_partition(nbp, 1)          # 2 buffers
    gate = fb.InputGate([(part, 0)])
    writer = fb.RecordWriter(part, buffer_timeout=None)
    records = [("r", i, "x" * 60) for i in range(40)]
    first_done = threading.Event()

    def produce():
        for r in records:
            writer.emit(r)
        first_done.set()

    t, res = run_in_thread(produce)
    assert wait_until(lambda: writer.back_pressured_time_ns > 0, 5)   # blocked now
    for call in (lambda: writer.emit("intruder"), writer.close, writer.flush):
        with pytest.raises(RuntimeError, match="in use by another thread"):
            call()
    assert not part.is_failed
    got = []
    reader, rres = run_in_thread(lambda: got.extend(gate))
    assert first_done.wait(10), res
    t.join(5)
    writer.close()
    reader.join(10)
    assert "error" not in res and "error" not in rres, (res, rres)
    assert got == records
    gate.close()
    nbp.destroy()


def test_a_bare_writer_raises_clearly():
    """RecordWriter.__new__(RecordWriter): fail() then flush() dereferenced
    its missing partition (a segfault)."""
    w = fb.RecordWriter.__new__(fb.RecordWriter)
    for call in (w.flush, w.fail, w.close, lambda: w.emit(1), lambda: w.broadcast_emit(1),
                 lambda: w.broadcast_event(fb.UserEvent(1))):
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    assert "not initialised" in repr(w)
    assert w.is_closed


# ---- events are bounded ------------------------------------------------------------

def test_broadcast_event_waits_while_a_consumer_holds_max_queued_events():
    """broadcast_event never blocked: with stalled consumers, 5 s of 4 KiB
    events grew the process by 1.9 GiB.  A consumer now holds at most
    MAX_QUEUED_EVENTS events it has not taken; beyond that the producer
    waits (back-pressured time), and goes on when the consumer reads."""
    limit = fio.MAX_QUEUED_EVENTS
    nbp = fb.NetworkBufferPool(16, 8192)
    part = fio.create_partition(nbp, 2)
    gates = [fb.InputGate([(part, i)]) for i in range(2)]
    writer = fb.RecordWriter(part, buffer_timeout=None)
    payload = b"e" * 4000
    sent = []

    def produce():
        for i in range(limit * 3):
            writer.broadcast_event(fb.UserEvent((i, payload)))
            sent.append(i)

    t, res = run_in_thread(produce)
    assert wait_until(lambda: len(sent) == limit, 5)
    time.sleep(0.3)
    assert len(sent) == limit and t.is_alive()            # waiting, not growing
    assert [part.subpartition(i).num_queued for i in range(2)] == [limit, limit]
    assert writer.back_pressured_time_ns > 0.2e9
    readers = [run_in_thread(lambda g=g: [e.payload[0] for e in g]) for g in gates]
    t.join(10)
    assert "error" not in res, res
    assert len(sent) == limit * 3
    writer.close()
    for thread, r in readers:
        thread.join(10)
        assert r["value"] == list(range(limit * 3))
    for g in gates:
        g.close()
    nbp.destroy()


def test_a_waiting_broadcast_event_ends_on_fail_and_skips_a_released_consumer():
    limit = fio.MAX_QUEUED_EVENTS
    nbp = fb.NetworkBufferPool(16, 1024)
    part = fio.create_partition(nbp, 2)
    gates = [fb.InputGate([(part, i)]) for i in range(2)]
    writer = fb.RecordWriter(part, buffer_timeout=None)
    for i in range(limit):
        writer.broadcast_event(fb.UserEvent(i))
    # the consumer of subpartition 1 leaves: events for it are skipped,
    # subpartition 0 still bounds the producer
    gates[1].close()
    t, res = run_in_thread(writer.broadcast_event, fb.UserEvent("more"))
    time.sleep(0.2)
    assert t.is_alive()
    writer.fail(RuntimeError("stop"))
    t.join(5)
    assert isinstance(res.get("error"), fb.ProducerFailedError), res
    gates[0].close()
    nbp.destroy()


def test_partition_broadcast_event_is_bounded_too():
    limit = fio.MAX_QUEUED_EVENTS
    nbp = fb.NetworkBufferPool(16, 1024)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    for i in range(limit):
        part.broadcast_event(fb.UserEvent(i))
    t, res = run_in_thread(part.broadcast_event, fb.UserEvent(limit))
    time.sleep(0.2)
    assert t.is_alive()
    assert next(gate) == fb.UserEvent(0)
    t.join(5)
    assert "error" not in res, res
    part.finish()
    assert [e.payload for e in gate] == list(range(1, limit + 1))
    gate.close()
    nbp.destroy()


def test_an_event_must_fit_one_buffer():
    nbp = fb.NetworkBufferPool(16, 256)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    writer = fb.RecordWriter(part, buffer_timeout=None)
    writer.emit("before")
    with pytest.raises(ValueError, match="does not fit one buffer"):
        writer.broadcast_event(fb.UserEvent(b"x" * 300))
    with pytest.raises(ValueError, match="does not fit one buffer"):
        part.broadcast_event(fb.UserEvent(b"x" * 300))
    writer.broadcast_event(fb.UserEvent(b"x" * 200))
    writer.close()
    assert list(gate) == ["before", fb.UserEvent(b"x" * 200)]
    gate.close()
    nbp.destroy()


def test_stalled_consumers_bound_the_memory_of_events():
    """The reported case: a producer sending 4 KiB events as fast as it can
    to consumers that never read.  Within a second it stops at the bound;
    the queues hold MAX_QUEUED_EVENTS events each, whatever the time."""
    nbp = fb.NetworkBufferPool(16, 8192)
    part = fio.create_partition(nbp, 4)
    gates = [fb.InputGate([(part, i)]) for i in range(4)]
    writer = fb.RecordWriter(part, buffer_timeout=None)
    stop = threading.Event()
    count = [0]

    def flood():
        payload = b"p" * 4096
        while not stop.is_set():
            writer.broadcast_event(fb.UserEvent(payload))
            count[0] += 1

    t, res = run_in_thread(flood)
    time.sleep(1.0)
    assert count[0] == fio.MAX_QUEUED_EVENTS
    assert sum(part.subpartition(i).num_queued for i in range(4)) == 4 * fio.MAX_QUEUED_EVENTS
    writer.fail()
    t.join(5)
    assert isinstance(res.get("error"), fb.ProducerFailedError)
    for g in gates:
        g.close()
    nbp.destroy()


# ---- queue items are plain memory -------------------------------------------------

def test_add_buffer_takes_a_buffer_over_only_when_nothing_else_holds_it():
    """Queued buffers are handed over as plain segments (so that threads
    without the GIL can send and recycle them): a buffer with another
    reference or an exported view is refused, untouched."""
    nbp = fb.NetworkBufferPool(16, 256)
    part = fio.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    pool = part.pool
    buf = pool.request_buffer()
    fb.RecordSerializer().serialize_record("hello")
    ser = fb.RecordSerializer()
    ser.serialize_record("hello")
    ser.copy_to_buffer(buf)
    buf.retain()
    with pytest.raises(ValueError, match="2 references"):
        part.add_buffer(0, buf)
    buf.recycle()
    view = memoryview(buf)
    with pytest.raises(fb.ExportedBufferError):
        part.add_buffer(0, buf)
    view.release()
    assert buf.ref_count == 1 and not buf.is_recycled
    part.add_buffer(0, buf)
    assert buf.is_recycled                 # handed over: this object is done
    part.finish()
    assert list(gate) == ["hello"]
    gate.close()
    assert pool.num_available == pool.num_requested
    nbp.destroy()


def test_an_event_buffer_travels_as_an_event():
    """DataType.EVENT_BUFFER: a buffer holding an encoded event is queued
    as an event, in order with the records."""
    from flinkbuf._testing import serialize_event as encode_event
    nbp = fb.NetworkBufferPool(16, 256)
    part = fio.create_partition(nbp, 1, min_buffers=4)     # nobody reads until the end
    gate = fb.InputGate([(part, 0)])
    writer = fb.RecordWriter(part, buffer_timeout=None)
    writer.emit("before")
    writer.flush()
    buf = part.pool.request_buffer()
    buf.write(encode_event(fb.UserEvent({"k": 1})))
    buf.data_type = fb.DataType.EVENT_BUFFER
    part.add_buffer(0, buf)
    writer.emit("after")
    writer.close()
    assert list(gate) == ["before", fb.UserEvent({"k": 1}), "after"]
    gate.close()
    nbp.destroy()


def test_a_subpartition_outliving_its_partition_gives_its_buffers_back():
    """Queued items are plain segments: the subpartition keeps their pool
    alive, so one held past its partition still returns them safely."""
    _run_child("""
        import gc, flinkbuf as fb
        from flinkbuf import io
        nbp = fb.NetworkBufferPool(16, 128)
        part = io.create_partition(nbp, 2)
        w = fb.RecordWriter(part, buffer_timeout=None)
        for i in range(4):                  # fits the pool: nobody reads
            w.emit(("x" * 30, i))
        w.flush()
        sp = part.subpartition(0)
        assert sp.num_queued > 0
        w.fail()
        del w, part; gc.collect()
        del sp; gc.collect()
        assert nbp.num_available_segments == 16, nbp.num_available_segments
        nbp.destroy()
        print("survived")
    """)
