"""Threads that would wait read the connection themselves while nobody else
reads it: a consumer whose gate is empty, and a producer whose pool has no
buffer (no hand-off from the connection's reader or writer thread).  What
they read for other gates and served partitions is delivered as the reader
thread would deliver it; adds and recycles from other threads wake them;
credit a consumer leaves for its next read reaches the producer when it stops
reading; a peer that closes right after its last buffer loses nothing.  In
this process, so the no_leaks fixture checks every buffer."""

import threading
import time

import pytest

from flinkbuf.io import RecordWriter, ResultPartition, create_partition
from flinkbuf.network import NetworkEnvironment
from helpers import run_in_thread, wait_until
from network_helpers import AUTO_SAME_HOST, SECRET

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def make_env(direct=True, **kw):
    kw.setdefault("secret", SECRET)
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024),
                              direct_reads=direct, **kw)


def assert_direct_frames(env, direct):
    """Some frames were read by a waiting thread itself, or none if off."""
    frames = sum(s["frames_in_direct"] for s in env.connection_stats())
    assert frames > 0 if direct else frames == 0, frames


@pytest.mark.parametrize("name, variable", [("direct_reads", "FLINKBUF_NET_DIRECT_READS"),
                                            ("caller_sends", "FLINKBUF_NET_CALLER_SENDS")])
def test_the_switches_take_true_false_or_none(monkeypatch, name, variable):
    """Anything but a bool (or None, the default) is refused, and so is a
    variable that is neither 0 nor 1 when it is read (no keyword given)."""
    monkeypatch.delenv(variable, raising=False)
    for bad in (1, 0, "0", 1.0, [True]):
        with pytest.raises(TypeError, match=f"{name} must be True, False or None"):
            NetworkEnvironment(8, 256, secret=SECRET, **{name: bad})
    for bad in ("2", "yes", "off", " 1"):
        monkeypatch.setenv(variable, bad)
        with pytest.raises(ValueError, match=f"{variable} must be 0 or 1"):
            NetworkEnvironment(8, 256, secret=SECRET)
        NetworkEnvironment(8, 256, secret=SECRET, **{name: True}).close()


@pytest.mark.one_transport
@pytest.mark.parametrize("variable, used", [(None, AUTO_SAME_HOST), ("", AUTO_SAME_HOST),
                                            ("auto", AUTO_SAME_HOST),
                                            ("tcp", "tcp"), ("unix", "unix"), ("shm", "shm")])
def test_the_transport_variable_says_what_auto_means(monkeypatch, variable, used):
    """FLINKBUF_NET_TRANSPORT says what transport="auto" means between
    processes on this host; unset, empty or "auto", the fastest (shared
    memory on more than one CPU); any other value is refused when an environment is made, and
    a transport given explicitly wins over it."""
    if variable is None:
        monkeypatch.delenv("FLINKBUF_NET_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("FLINKBUF_NET_TRANSPORT", variable)
    for explicit, expected in (("auto", used), ("tcp", "tcp")):
        prod = make_env(transport=explicit)
        cons = make_env(transport=explicit)
        try:
            part = create_partition(prod.network_buffer_pool, 1, min_buffers=2)
            prod.register_partition("p", part)
            gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
            with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
                w.emit(b"x")
            assert [bytes(r) for r in gate] == [b"x"]
            assert [s["transport"] for s in cons.connection_stats()] == [expected]
            gate.close()
        finally:
            cons.close()
            prod.close()
    for bad in ("TCP", "udp", "shm ", "1"):
        monkeypatch.setenv("FLINKBUF_NET_TRANSPORT", bad)
        with pytest.raises(ValueError, match="FLINKBUF_NET_TRANSPORT must be one of"):
            NetworkEnvironment(8, 256, secret=SECRET)
        NetworkEnvironment(8, 256, secret=SECRET, transport="tcp").close()


# How direct reads are set: (keyword, FLINKBUF_NET_DIRECT_READS, on?).  The
# variable overrides the default; a keyword overrides the variable.
SETTINGS = {
    "keyword on": (True, None, True),
    "keyword off": (False, None, False),
    "variable off": (None, "0", False),
    "variable on": (None, "1", True),
    "keyword on over variable off": (True, "0", True),
    "keyword off over variable on": (False, "1", False),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setting", SETTINGS)
def test_the_consumer_reads_the_socket_itself_unless_turned_off(monkeypatch, setting):
    """Records arrive whole and in order either way; with direct reads the
    consumer's thread read frames itself, without it none."""
    keyword, variable, direct = SETTINGS[setting]
    if variable is None:
        monkeypatch.delenv("FLINKBUF_NET_DIRECT_READS", raising=False)
    else:
        monkeypatch.setenv("FLINKBUF_NET_DIRECT_READS", variable)
    prod = make_env(keyword)
    cons = make_env(keyword)
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        n = 3000

        def produce():
            with RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0) as w:
                for i in range(n):
                    w.emit(i.to_bytes(4, "big") * (1 + i % 300))
                    if i % 500 == 0:
                        time.sleep(0.01)      # the consumer catches up and waits

        t, res = run_in_thread(produce)
        got = [bytes(r) for r in gate]
        t.join(10)
        assert "error" not in res, res
        assert got == [i.to_bytes(4, "big") * (1 + i % 300) for i in range(n)]
        assert_direct_frames(cons, direct)
        gate.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["local channel", "another connection"])
def test_an_add_from_elsewhere_wakes_a_consumer_reading_the_socket(source):
    """The gate's first channel is remote and silent (its consumer reads that
    socket while it waits); records for its other channel, from a local
    partition or over a second connection, each wake it at once: 40 round
    trips take well under the gate's 50 ms wait slices a missed wake would
    cost (40 x 50 ms = 2 s)."""
    silent_env, cons = make_env(), make_env()
    other_env = cons if source == "local channel" else make_env()
    try:
        silent = create_partition(silent_env.network_buffer_pool, 1)
        silent_env.register_partition("silent", silent)
        talker = create_partition(other_env.network_buffer_pool, 1)
        other_env.register_partition("talker", talker)
        gate = cons.create_input_gate([(silent_env.address, "silent", 0),
                                       (other_env.address, "talker", 0)], codec="bytes")
        it = iter(gate)
        w = RecordWriter(talker, codec="bytes", buffer_timeout=0)
        next_record = threading.Event()
        got = []

        def consume():
            for _ in range(41):
                next_record.set()
                got.append(bytes(next(it)))

        t, res = run_in_thread(consume)
        assert next_record.wait(5)
        next_record.clear()
        w.emit(b"warm-up")
        times = []
        for i in range(40):
            assert next_record.wait(5)
            next_record.clear()
            time.sleep(0.002)                 # it is waiting (reading the silent socket)
            t0 = time.monotonic()
            w.emit(b"r%d" % i)
            while len(got) < i + 2 and t.is_alive():
                time.sleep(0.0002)
            times.append(time.monotonic() - t0)
        t.join(10)
        assert "error" not in res, res
        assert got == [b"warm-up"] + [b"r%d" % i for i in range(40)]
        assert sum(times) < 1.0, sorted(times)[-5:]
        w.close()
        gate.close()
        silent.release()
    finally:
        for e in {silent_env, cons, other_env}:
            e.close()


@pytest.mark.timeout(60)
def test_two_gates_share_a_connection_both_ways():
    """Two consumer threads, each on its own gate, read two partitions served
    by one process over one connection, while that connection also carries
    a partition this process serves to it: every record arrives exactly
    once, in order, whichever thread happened to read the socket."""
    a, b = make_env(num_segments=128), make_env(num_segments=128)
    try:
        parts = {}
        for pid in ("p", "q"):
            parts[pid] = create_partition(a.network_buffer_pool, 1, min_buffers=2)
            a.register_partition(pid, parts[pid])
        back = create_partition(b.network_buffer_pool, 1, min_buffers=2)
        b.register_partition("back", back)
        gates = {pid: b.create_input_gate([(a.address, pid, 0)], codec="bytes")
                 for pid in ("p", "q")}
        back_gate = a.create_input_gate([(b.address, "back", 0)], codec="bytes")
        n = 4000

        def produce(part, tag):
            with RecordWriter(part, codec="bytes", buffer_timeout=0.001) as w:
                for i in range(n):
                    w.emit(tag + i.to_bytes(4, "big") * (i % 50))

        def consume(pid):
            return [bytes(r) for r in gates[pid]]

        threads = [run_in_thread(produce, parts["p"], b"p"),
                   run_in_thread(produce, parts["q"], b"q"),
                   run_in_thread(produce, back, b"b"),
                   run_in_thread(consume, "p"), run_in_thread(consume, "q"),
                   run_in_thread(lambda: [bytes(r) for r in back_gate])]
        for t, _ in threads:
            t.join(30)
        results = [res for _, res in threads]
        assert all("error" not in r for r in results), results
        for (tag, res) in zip((b"p", b"q", b"b"), results[3:]):
            assert res["value"] == [tag + i.to_bytes(4, "big") * (i % 50) for i in range(n)]
        assert len(a.connection_stats()) + len(b.connection_stats()) >= 1
        for g in (*gates.values(), back_gate):
            g.close()
    finally:
        b.close()
        a.close()


@pytest.mark.timeout(60)
def test_an_echo_through_one_connection_with_minimal_buffers():
    """A thread that reads a gate and writes each record back over the same
    connection (so it may block in emit right after reading the socket
    itself) with one buffer of credit and two in each pool: the reader
    thread takes the socket back, and everything comes back in order."""
    a = make_env(exclusive_buffers_per_channel=1, floating_buffers_per_gate=0)
    b = make_env(exclusive_buffers_per_channel=1, floating_buffers_per_gate=0)
    try:
        there = create_partition(a.network_buffer_pool, 1, min_buffers=2)
        a.register_partition("there", there)
        back = create_partition(b.network_buffer_pool, 1, min_buffers=2)
        b.register_partition("back", back)
        in_b = b.create_input_gate([(a.address, "there", 0)], codec="bytes")
        in_a = a.create_input_gate([(b.address, "back", 0)], codec="bytes")
        n = 3000
        records = [i.to_bytes(4, "big") * (1 + i % 200) for i in range(n)]

        def echo():
            with RecordWriter(back, codec="bytes", buffer_timeout=0.001) as w:
                for r in in_b:
                    w.emit(bytes(r))

        def send():
            with RecordWriter(there, codec="bytes", buffer_timeout=0.001) as w:
                for r in records:
                    w.emit(r)

        (te, re_), (ts, rs) = run_in_thread(echo), run_in_thread(send)
        got = [bytes(r) for r in in_a]
        ts.join(10)
        te.join(10)
        assert "error" not in rs and "error" not in re_, (rs, re_)
        assert got == records
        in_a.close()
        in_b.close()
    finally:
        b.close()
        a.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("direct, caller_sends, variable, reads", [
    (True, None, None, True), (False, None, None, False), (True, False, None, False),
    (True, None, "0", False), (True, True, "0", True)],
    ids=["both", "no direct reads", "no caller sends", "no caller sends (variable)",
         "caller sends over the variable"])
def test_a_backpressured_producer_reads_its_credit_itself(monkeypatch, direct, caller_sends,
                                                          variable, reads):
    """A producer whose emit waits for a buffer reads the connection that
    serves its partition itself (credit arrives, and its buffers go out, in
    its own thread): its environment counts frames read that way, none when
    direct reads or the caller's sends are off (by the keyword, or by
    FLINKBUF_NET_CALLER_SENDS when the keyword is left out); every record
    arrives in order either way."""
    if variable is None:
        monkeypatch.delenv("FLINKBUF_NET_CALLER_SENDS", raising=False)
    else:
        monkeypatch.setenv("FLINKBUF_NET_CALLER_SENDS", variable)
    prod = make_env(direct, caller_sends=caller_sends)
    cons = make_env(direct, caller_sends=caller_sends)
    try:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=2)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        n = 400

        def produce():
            with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
                for i in range(n):
                    w.emit(i.to_bytes(4, "big") * 200)      # 800 B: one per buffer

        t, res = run_in_thread(produce)
        got = []
        for r in gate:
            got.append(bytes(r))
            if len(got) % 20 == 0:
                time.sleep(0.005)       # slower than the producer: it waits for credit
        t.join(10)
        assert "error" not in res, res
        assert got == [i.to_bytes(4, "big") * 200 for i in range(n)]
        assert_direct_frames(prod, reads)
        gate.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(60)
def test_a_recycle_elsewhere_wakes_a_producer_reading_the_socket():
    """A thread blocked on an exhausted partition pool reads the connection
    that serves the partition while it waits; a buffer recycled by another
    thread wakes it at once: 40 waits take well under the 50 ms wait slices
    a missed wake would cost (40 x 50 ms = 2 s)."""
    prod, cons = make_env(), make_env()
    try:
        pool = prod.network_buffer_pool.create_buffer_pool(4, 4, num_subpartitions=1)
        part = ResultPartition(pool, 1)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        held = [pool.request_buffer() for _ in range(4)]
        assert None not in held and pool.request_buffer() is None
        # The connection serves the partition once the request arrived.
        assert wait_until(lambda: any(c.num_channels for c in prod.connections()), 5)
        times = []
        for _ in range(40):
            t, res = run_in_thread(pool.request_buffer_blocking, 5.0)
            time.sleep(0.003)                 # it is waiting (reading the socket)
            assert t.is_alive()
            t0 = time.monotonic()
            held.pop().recycle()
            t.join(5)
            times.append(time.monotonic() - t0)
            assert "error" not in res, res
            held.append(res["value"])
        assert sum(times) < 1.0, sorted(times)[-5:]
        for b in held:
            b.recycle()
        gate.close()
        part.release()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("direct", [True, False])
def test_credit_left_for_the_consumers_next_read_reaches_a_producer_when_it_stops(direct):
    """A consumer that reads the socket itself leaves the credit of a buffer
    it recycles for its next read while the sender has credit to spare; if
    it then stops reading, the credit still goes out (the reader thread
    takes the socket back): the producer, having spent the rest of its
    credit, gets the buffers it was owed while the consumer reads nothing."""
    prod = make_env(direct, num_segments=64, segment_size=1024)
    cons = make_env(direct, num_segments=64, segment_size=1024,
                    exclusive_buffers_per_channel=8, floating_buffers_per_gate=0)
    try:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=16)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        w = RecordWriter(part, codec="bytes", buffer_timeout=0)
        first, go = threading.Event(), threading.Event()

        def produce():
            first.wait(10)
            w.emit(b"a" * 800)                # 800 B: one buffer each
            w.emit(b"b" * 800)
            go.wait(10)
            for i in range(20):
                w.emit(bytes([i]) * 800)
                time.sleep(0.01)

        t, res = run_in_thread(produce)
        it = iter(gate)
        ta, ra = run_in_thread(next, it)      # waiting: it reads the socket itself
        time.sleep(0.1)
        first.set()
        ta.join(5)
        assert bytes(ra["value"]) == b"a" * 800
        assert bytes(next(it)) == b"b" * 800  # "a" (and "b") recycled: credit left for later
        go.set()                              # the producer has 6 credits left, and 20 to send

        def received():
            return sum(s["buffers_in"] for s in cons.connection_stats())

        # 8 buffers of credit at first, more once the recycled ones are announced.
        assert wait_until(lambda: received() >= 9, 5.0), cons.connection_stats()
        t.join(10)
        assert res.get("error") is None or "released" in str(res["error"]), res
        w.close()
        gate.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(120)
def test_producers_that_close_as_soon_as_they_are_served_lose_nothing():
    """Producers close their environments as soon as their last buffer and
    end of partition went out, while their consumer, reading slowly with one
    buffer of credit per channel, still sends them credit (a write may find
    the peer gone; the channels whose data is still in the socket end
    normally all the same): every record arrives and the gate ends."""
    for round_ in range(6):
        producers = [make_env(num_segments=32) for _ in range(3)]
        cons = make_env(num_segments=32, exclusive_buffers_per_channel=1,
                        floating_buffers_per_gate=0)
        try:
            parts = []
            for k, env in enumerate(producers):
                part = create_partition(env.network_buffer_pool, 1, min_buffers=4)
                env.register_partition("p", part)
                parts.append(part)
            gate = cons.create_input_gate([(env.address, "p", 0) for env in producers],
                                          codec="bytes")

            def produce(env, part, k):
                with RecordWriter(part, codec="bytes", buffer_timeout=0) as w:
                    for i in range(30):
                        w.emit(bytes([k, i]) * 400)     # 800 B: one buffer each
                while any(c.num_channels for c in env.connections()):
                    time.sleep(0.0005)                  # served: its end went out
                env.close()

            threads = [run_in_thread(produce, env, part, k)
                       for k, (env, part) in enumerate(zip(producers, parts))]
            got = []
            for r in gate:
                got.append(bytes(r))
                if len(got) % 7 == 0:
                    time.sleep(0.002)
            for t, res in threads:
                t.join(10)
                assert "error" not in res, (round_, res)
            assert sorted(got) == sorted(bytes([k, i]) * 400 for k in range(3)
                                         for i in range(30)), round_
            gate.close()
        finally:
            cons.close()
            for env in producers:
                env.close()
