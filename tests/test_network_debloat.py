"""Buffer debloating over the network (docs/PROTOCOL.md, section 3.4): a
remote channel's NEW_BUFFER_SIZE reaches its producer's subpartition on
every transport, between two environments of this process and across
processes; announcements coalesce to the latest size, one announced before
the request is served arrives with it, and a channel counts the buffers in
flight toward its consumer.  Hostile peers: sizes out of range, frames of
the wrong length, sizes for channels nobody serves, and a flood past the
budget, while a healthy consumer of the same producer goes on."""

import os
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from flinkbuf import _testing as t
from flinkbuf.io import LocalInputChannel, RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, RemoteInputChannel
from helpers import run_in_thread, wait_until
from network_helpers import (
    ALL,
    MSG_BUFFER,
    MSG_CLOSE,
    MSG_ERROR,
    ROOT,
    SECRET,
    Children,
    buffer_size_frame,
    connect_raw,
    frame,
    parse_buffer,
    parse_error,
    read_frame,
    request_frame,
    split_frames,
    wait_closed,
)

# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

SEG = 4096
CLEAN = {"standalone_segments": 0, "live_buffers": 0, "segments_out": 0}
# A served channel's budget of NEW_BUFFER_SIZE frames (csrc/network/conn_internal.h).
SIZE_BURST = 64


def make_env(**kw):
    kw.setdefault("secret", SECRET)
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", SEG), **kw)


@pytest.fixture
def pair():
    """(producer, consumer): two environments of this process."""
    a, b = make_env(), make_env()
    try:
        yield a, b
    finally:
        b.close()
        a.close()


def sizes(part, n):
    return [part.subpartition(k).buffer_size for k in range(n)]


def frames_in(env):
    return sum(s["frames_in"] for s in env.connection_stats())


def assert_clean(report):
    assert report["counters"] in (None, CLEAN), report
    assert report["threads"] == [], report


# ---- between two environments, on every transport ----------------------------------------

@pytest.mark.timeout(60)
def test_an_announced_size_reaches_the_producers_subpartition(pair):
    """A remote channel's size reaches its own subpartition only; the next
    one replaces it; a local channel's hook sets its subpartition the same
    way; records go on flowing."""
    a, b = pair
    part = create_partition(a.network_buffer_pool, 3)
    a.register_partition("p", part)
    with b.create_input_gate([(a.address, "p", 0), (a.address, "p", 1)],
                             codec="bytes") as gate, \
            a.create_input_gate([(a.address, "p", 2)], codec="bytes") as local:
        first, second = gate.channels
        assert isinstance(first, RemoteInputChannel)
        assert isinstance(local.channels[0], LocalInputChannel)
        assert sizes(part, 3) == [None, None, None]
        t.announce_buffer_size(first, 1000)
        assert wait_until(lambda: sizes(part, 3) == [1000, None, None], 10), sizes(part, 3)
        t.announce_buffer_size(second, SEG)
        t.announce_buffer_size(local.channels[0], 64)
        assert wait_until(lambda: sizes(part, 3) == [1000, SEG, 64], 10), sizes(part, 3)
        t.announce_buffer_size(first, 64)
        assert wait_until(lambda: sizes(part, 3) == [64, SEG, 64], 10), sizes(part, 3)
        def write():
            with RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0) as w:
                for i in range(30):
                    w.emit(bytes([i]) * 300)

        writer, written = run_in_thread(write)
        reader, remote = run_in_thread(lambda: [bytes(r) for r in gate])
        got = [bytes(r) for r in local]
        for thread in (writer, reader):
            thread.join(20)
        assert "error" not in written and "error" not in remote, (written, remote)
        assert sorted(got + remote["value"]) == sorted(bytes([i]) * 300 for i in range(30))


@pytest.mark.timeout(60)
def test_announcements_coalesce_to_the_latest_size(pair):
    """Two hundred announcements in a row reach the producer as the latest
    size, in at most one frame a millisecond (plus the one that waited)."""
    a, b = pair
    part = create_partition(a.network_buffer_pool, 1)
    a.register_partition("p", part)
    with b.create_input_gate([(a.address, "p", 0)], codec="bytes") as gate:
        ch = gate.channels[0]
        t.announce_buffer_size(ch, 100)
        t.announce_buffer_size(ch, 100)          # the size the producer has: no frame
        assert wait_until(lambda: sizes(part, 1) == [100], 10)
        time.sleep(0.05)
        before = frames_in(a)
        t0 = time.monotonic()
        for size in range(101, 301):
            t.announce_buffer_size(ch, size)
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert wait_until(lambda: sizes(part, 1) == [300], 10), sizes(part, 1)
        time.sleep(0.05)
        sent = frames_in(a) - before
        assert 1 <= sent <= elapsed_ms + 2, (sent, elapsed_ms)
        assert sent < 200


@pytest.mark.timeout(60)
def test_a_size_announced_before_the_request_is_served_arrives_with_it(pair):
    """The producer registers the partition late: the channel's request is
    not found and retried, and the size announced meanwhile (the latest of
    two) is there as soon as the request is served."""
    a, b = pair
    with b.create_input_gate([(a.address, "late", 0)], codec="bytes") as gate:
        ch = gate.channels[0]
        t.announce_buffer_size(ch, 500)
        time.sleep(0.1)                          # not found, retried
        t.announce_buffer_size(ch, 700)
        time.sleep(0.2)
        part = create_partition(a.network_buffer_pool, 1)
        a.register_partition("late", part)
        assert wait_until(lambda: sizes(part, 1) == [700], 10), sizes(part, 1)
        with RecordWriter(part, codec="bytes", buffer_timeout=0) as w:
            w.emit(b"after")
        assert [bytes(r) for r in gate] == [b"after"]


@pytest.mark.timeout(60)
def test_a_channel_that_ended_ignores_announcements(pair):
    a, b = pair
    part = create_partition(a.network_buffer_pool, 1)
    a.register_partition("p", part)
    gate = b.create_input_gate([(a.address, "p", 0)], codec="bytes")
    ch = gate.channels[0]
    t.announce_buffer_size(ch, 200)
    assert wait_until(lambda: sizes(part, 1) == [200], 10)
    gate.close()
    t.announce_buffer_size(ch, 300)
    assert t.buffers_in_use(ch) == 0
    time.sleep(0.1)
    assert sizes(part, 1) == [200]
    with pytest.raises(ValueError, match="positive"):
        t.announce_buffer_size(ch, 0)


@pytest.mark.timeout(60)
def test_buffers_in_use_counts_the_credit_and_the_queued_buffers(pair):
    """Before anything arrives: the exclusive buffers (the sender's
    credit).  A consumer that does not read, of a subpartition with a long
    backlog: every exclusive and floating buffer of its channel holds a
    buffer that arrived, none is credit, and the sender's backlog counts."""
    a, b = pair                      # the consumer: 2 exclusive, 8 floating (the defaults)
    part = create_partition(a.network_buffer_pool, 2, min_buffers=48)
    a.register_partition("p", part)
    records = [i.to_bytes(4, "big") * 25 for i in range(40)]
    with b.create_input_gate([(a.address, "p", 0)], codec="bytes") as empty:
        ch = empty.channels[0]
        assert wait_until(lambda: t.buffers_in_use(ch) == 2 + 1, 10), ch.stats()
        assert ch.stats()["queued"] == 0
        with RecordWriter(part, lambda record, n: 1, codec="bytes", buffer_timeout=0) as w:
            for r in records:
                w.emit(r)
        with b.create_input_gate([(a.address, "p", 1)], codec="bytes") as gate:
            ch = gate.channels[0]
            assert wait_until(lambda: ch.stats()["queued"] == 10, 10), ch.stats()
            time.sleep(0.1)
            st = ch.stats()
            assert (st["queued"], st["exclusive_available"], st["floating_available"]) == \
                (10, 0, 0), st
            assert st["backlog"] > 0                 # and the sender's, as it said last
            assert t.buffers_in_use(ch) == 10 + st["backlog"] + 1    # + the two in part
            assert [bytes(r) for r in gate] == records
            assert ch.stats()["queued"] == 0
        assert list(empty) == []


# ---- across processes ---------------------------------------------------------------------

def child_sizes(producer):
    producer.send(cmd="buffer_sizes")
    return producer.expect("buffer_sizes", 10)["buffer_sizes"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("late", [False, True], ids=["registered", "registered-late"])
def test_a_size_announced_to_a_producer_process(children, late):
    producer = children.start("producer", {
        "num_segments": 32, "segment_size": SEG, "register_late": late,
        "partitions": [{"id": "p", "n": 2, "tag": 1, "mode": "idle"}]})
    addr = producer.address()
    env = make_env()
    try:
        with env.create_input_gate([(addr, "p", 0), (addr, "p", 1)], codec="bytes") as gate:
            t.announce_buffer_size(gate.channels[1], 300)
            t.announce_buffer_size(gate.channels[1], 2000)
            if late:
                time.sleep(0.2)
                producer.send(cmd="register")
            assert wait_until(lambda: child_sizes(producer)["p"] == [None, 2000], 10, 0.05)
            t.announce_buffer_size(gate.channels[0], SEG)
            assert wait_until(lambda: child_sizes(producer)["p"] == [SEG, 2000], 10, 0.05)
    finally:
        env.close()
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 20))


# ---- lent buffers ---------------------------------------------------------------------------

LEND_PRODUCER = textwrap.dedent("""
    import sys, time
    from flinkbuf.io import RecordWriter, create_partition
    from flinkbuf.network import NetworkEnvironment
    env = NetworkEnvironment(64, 4096, secret=bytes.fromhex(sys.argv[1]), transport="shm",
                             lend_buffers=True)
    part = create_partition(env.network_buffer_pool, 1, min_buffers=8)
    env.register_partition("p", part)
    print("{}:{}".format(*env.address), flush=True)
    deadline = time.monotonic() + 20
    while part.subpartition(0).buffer_size != int(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.005)
    print(part.subpartition(0).buffer_size, flush=True)
    with RecordWriter(part, codec="bytes", buffer_timeout=0) as w:
        for i in range(int(sys.argv[3])):
            w.emit(i.to_bytes(4, "little") * (i % 60 + 1))
    sys.stdin.read()
""")


@pytest.mark.timeout(60)
@pytest.mark.one_transport
def test_lent_buffers_flow_with_a_smaller_buffer_size():
    """Over shared memory with lending, a subpartition whose consumer
    announced a small size: buffers of at most that size come lent, in
    order, and go back."""
    n = 300
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", LEND_PRODUCER, SECRET.hex(), "256", str(n)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    cons = make_env(transport="shm")
    try:
        addr = proc.stdout.readline().strip()
        with cons.create_input_gate([(addr, "p", 0)], codec="bytes") as gate:
            t.announce_buffer_size(gate.channels[0], 256)
            assert proc.stdout.readline().strip() == "256"
            got = [bytes(r) for r in gate]
        assert got == [i.to_bytes(4, "little") * (i % 60 + 1) for i in range(n)]
        [stats] = cons.connection_stats()
        assert stats["transport"] == "shm" and stats["buffers_in"] >= n, stats
        assert stats["bytes_in"] < 64 * stats["buffers_in"], stats     # lent, not copied
        assert wait_until(lambda: cons.connection_stats()[0]["buffers_borrowed"] == 0, 10)
    finally:
        cons.close()
        proc.stdin.close()
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0


# ---- hostile peers ---------------------------------------------------------------------------

class Server:
    """A producer process serving "live" (endless records) to a healthy
    consumer process, and "idle" (nothing written) and "spare" (finished,
    empty) to raw peers."""

    def __init__(self):
        self.children = Children()
        self.proc = self.children.start("producer", {
            "num_segments": 256, "segment_size": SEG, "io_timeout": 10.0,
            "partitions": [
                {"id": "live", "n": 1, "tag": 1, "mode": "endless", "size": 300,
                 "min_buffers": 8, "buffer_timeout": 0.001, "pace": 0.002},
                {"id": "idle", "n": 64, "tag": 2, "mode": "idle"},
                {"id": "spare", "n": 64, "tag": 3, "plan": []},
            ]}, life=240)
        self.address = self.proc.address()
        self.healthy = self.children.start("consumer", {
            "num_segments": 32, "segment_size": SEG, "gates": [[[self.address, "live", 0]]],
            "report": "count", "progress": True}, life=240)
        self.count = 0
        self.next_sub = 0

    def served(self):
        for m in self.healthy.poll_messages():
            if "progress" in m:
                self.count = m["progress"][0]
            assert "gate_error" not in m, f"the healthy consumer failed: {m}"
        return self.count

    def assert_still_serving(self):
        before = self.served()
        assert wait_until(lambda: self.served() > before, 5, 0.05), \
            "the healthy consumer got nothing more"
        assert self.proc.proc.poll() is None, self.proc.stderr()[-3000:]

    def subpartition(self):
        """An idle (and spare) subpartition no raw peer asked for yet."""
        self.next_sub += 1
        assert self.next_sub < 64
        return self.next_sub

    def sizes(self, partition):
        return child_sizes(self.proc)[partition]

    def shutdown(self):
        try:
            self.assert_still_serving()
            assert "Traceback" not in self.proc.stderr(), self.proc.stderr()[-3000:]
            self.proc.send(cmd="close")
            assert_clean(self.proc.expect("closed", 20))
        finally:
            self.children.stop_all()


@pytest.fixture(scope="module")
def server():
    s = Server()
    s.healthy.expect("progress", 20)
    yield s
    s.shutdown()


def raw(server):
    return connect_raw(server.address, segment_size=SEG)


def expect_protocol_error(server, data, reason, *, before=b""):
    """Send ``before`` + ``data`` on a connection of its own: the server
    answers an ERROR_RESPONSE for the whole connection (code 4) naming
    ``reason``, then closes it."""
    with raw(server) as s:
        s.sendall(before + data)
        got = wait_closed(s, 5)
    errors = [parse_error(body) for msg_id, body in split_frames(got) if msg_id == MSG_ERROR]
    assert errors, f"no error response before the close: {split_frames(got)}"
    receiver, code, type_name, message = errors[-1]
    assert (receiver, code, type_name) == (ALL, 4, "ProtocolError"), errors[-1]
    assert reason in message, message


def assert_alive(sock, server):
    """The connection still serves: a request of a finished subpartition is
    answered with its end."""
    sub = server.subpartition()
    sock.sendall(request_frame(1000 + sub, sub, 1, "spare"))
    msg_id, body = read_frame(sock)
    assert msg_id == MSG_BUFFER, (msg_id, body)
    assert parse_buffer(body)[0] == 1000 + sub


BAD_SIZES = [0, 1, 63, SEG + 1, 2**31, 2**32 - 1]


@pytest.mark.timeout(30)
@pytest.mark.one_transport
@pytest.mark.parametrize("size", BAD_SIZES)
def test_a_size_out_of_range_is_a_protocol_error(server, size):
    sub = server.subpartition()
    expect_protocol_error(server, buffer_size_frame(5, size),
                          f"buffer size {size} outside 64..{SEG}",
                          before=request_frame(5, sub, 1, "idle"))
    assert server.sizes("idle")[sub] is None
    server.assert_still_serving()


@pytest.mark.timeout(30)
@pytest.mark.one_transport
@pytest.mark.parametrize("body, length", [(b"", 9), (struct.pack(">I", 5), 13),
                                          (struct.pack(">IIB", 5, 100, 0), 18),
                                          (struct.pack(">III", 5, 100, 100), 21)])
def test_a_size_frame_of_the_wrong_length_is_a_protocol_error(server, body, length):
    expect_protocol_error(server, frame(10, body), f"new buffer size frame of {length} bytes")
    server.assert_still_serving()


@pytest.mark.timeout(30)
@pytest.mark.one_transport
def test_a_size_for_a_channel_nobody_serves_is_ignored(server):
    """Before any request, and for a receiver id never used: ignored, as
    credit for it is; the connection goes on and serves, and a size for a
    channel it serves reaches that subpartition."""
    sub = server.subpartition()
    with raw(server) as s:
        s.sendall(buffer_size_frame(77, 1000) + buffer_size_frame(0xFFFFFFFF, 64))
        assert_alive(s, server)
        s.sendall(request_frame(7, sub, 1, "idle") + buffer_size_frame(7, 1000)
                  + buffer_size_frame(8, 2000))
        assert wait_until(lambda: server.sizes("idle")[sub] == 1000, 10, 0.05)
        assert_alive(s, server)
        s.sendall(frame(MSG_CLOSE))
        assert wait_closed(s, 5) == b""
    server.assert_still_serving()


@pytest.mark.timeout(30)
@pytest.mark.one_transport
def test_a_burst_within_the_budget_is_taken(server):
    sub = server.subpartition()
    with raw(server) as s:
        s.sendall(request_frame(9, sub, 1, "idle")
                  + b"".join(buffer_size_frame(9, 100 + k) for k in range(SIZE_BURST)))
        assert wait_until(lambda: server.sizes("idle")[sub] == 100 + SIZE_BURST - 1, 10, 0.05)
        assert_alive(s, server)
    server.assert_still_serving()


@pytest.mark.timeout(60)
@pytest.mark.one_transport
def test_a_flood_of_sizes_is_a_protocol_error_for_that_peer_only(server):
    """A thousand valid sizes at once for one served channel (the budget
    refills one every 0.5 ms: the reader would have to take 0.47 s over
    them to stay within it): that peer gets a protocol error and its
    connection ends; the healthy consumer of the same producer goes on."""
    sub = server.subpartition()
    flood = b"".join(buffer_size_frame(11, 64 + k) for k in range(1000))
    expect_protocol_error(server, flood,
                          f"buffer sizes on receiver id 11 faster than {SIZE_BURST} at once "
                          "and 2000 a second", before=request_frame(11, sub, 1, "idle"))
    assert 64 <= server.sizes("idle")[sub] < 64 + 1000
    server.assert_still_serving()
