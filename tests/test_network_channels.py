"""Many channels on one connection: 200 subpartitions read by one gate,
the cap of 4096 channels per connection (refused clearly, on both
sides), two peers reading each other over one connection, and a channel
whose consumer does not read not blocking the other channels of its
connection."""

import random
import time

import pytest

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.network import NetworkEnvironment
from helpers import run_in_thread
from network_helpers import (
    MSG_ERROR,
    MSG_CLOSE,
    SECRET,
    connect_raw,
    expected_streams,
    frame,
    parse_error,
    read_frame,
    record_bytes,
    request_frame,
    wait_closed,
)

# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

CLEAN = {"standalone_segments": 0, "live_buffers": 0, "segments_out": 0}


def assert_clean(report):
    assert report["counters"] in (None, CLEAN), report
    assert report["threads"] == [], report
    assert report["shared_memory"] == [], report


@pytest.mark.timeout(60)
def test_one_connection_carries_200_channels(children):
    """One gate of 200 remote channels (200 subpartitions of one producer
    process): one connection carries them all, every record arrives once
    and in order on its channel."""
    n = 200
    rng = random.Random(200)
    plan = [["r", rng.randint(0, 300), rng.randrange(n)] for _ in range(3000)]
    plan[1500:1500] = [["e", "half"]]
    producer = children.start("producer", {
        "num_segments": n + 40, "segment_size": 256,
        "partitions": [{"id": "wide", "n": n, "tag": 4, "plan": plan, "min_buffers": n + 20,
                        "buffer_timeout": 0.001}]})
    addr = producer.address()
    consumer = children.start("consumer", {
        "num_segments": n + 20, "segment_size": 256, "exclusive": 1, "floating": 8,
        "gates": [[[addr, "wide", s] for s in range(n)]]})
    msg = consumer.expect("results", 45)
    res = msg["results"][0]
    assert "error" not in res, res
    assert res["streams"] == expected_streams(4, plan, n)
    assert [st["peer"] for st in msg["stats"]] == [addr]  # one connection
    assert msg["stats"][0]["buffers_in"] >= n
    assert_clean(consumer.expect("closed", 10))
    producer.expect("written", 10)
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))


@pytest.mark.timeout(120)
@pytest.mark.plaintext_wire                 # (a raw peer asks for the 4097th channel)
def test_channel_cap_is_refused_clearly(children):
    """A gate of 4097 channels to one process: RemoteConnectionError naming
    the cap of 4096, every buffer back; the connection goes on carrying
    new channels.  A raw peer that asks the server for a 4097th channel
    is answered code 5 (refused), and the connection stays."""
    producer = children.start("producer", {
        "num_segments": 8400, "segment_size": 64,
        "partitions": [{"id": "wide", "n": 4097, "tag": 1, "mode": "idle", "min_buffers": 4098},
                       {"id": "wide2", "n": 4097, "tag": 1, "mode": "idle",
                        "min_buffers": 4098},
                       {"id": "after", "n": 1, "tag": 2, "plan": [["r", 10, 0]] * 5}]},
        life=110)
    addr = producer.address()
    env = NetworkEnvironment(4200, 64, secret=SECRET, exclusive_buffers_per_channel=1,
                             floating_buffers_per_gate=0)
    try:
        t0 = time.monotonic()
        with pytest.raises(RemoteConnectionError, match="4096 channels"):
            env.create_input_gate([(addr, "wide", s) for s in range(4097)], codec="bytes")
        refused_in = time.monotonic() - t0
        conns = env.connections()
        assert len(conns) == 1 and conns[0].is_open
        assert conns[0].num_channels == 0
        with env.create_input_gate([(addr, "after", 0)], codec="bytes") as gate:
            assert [bytes(r) for r in gate] == [record_bytes(2, i, 10) for i in range(5)]
    finally:
        env.close()
    assert refused_in < 60, refused_in

    with connect_raw(addr, segment_size=64, timeout=20) as s:
        s.sendall(b"".join(request_frame(k + 1, k, 0, "wide2") for k in range(4097)))
        msg_id, body = read_frame(s, timeout=30)
        assert msg_id == MSG_ERROR
        receiver, code, _, message = parse_error(body)
        assert (receiver, code) == (4097, 5), (receiver, code, message)
        assert "too many channels" in message
        s.sendall(frame(MSG_CLOSE))
        wait_closed(s, 20)
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 30))


@pytest.mark.timeout(60)
def test_two_peers_read_each_other_over_one_connection(children):
    """Each of two processes produces a partition and reads the other's:
    the second to connect reuses the connection the first made (each side
    picks the receiver ids of its own channels), and both get everything."""
    rng = random.Random(2)
    plans = [[["r", rng.randint(0, 700), 0] for _ in range(400)] for _ in range(2)]
    peers = [children.start("peer", {
        "num_segments": 32, "segment_size": 256,
        "partition": {"id": f"side-{k}", "n": 1, "tag": k, "plan": plans[k]}})
        for k in range(2)]
    addrs = [p.address() for p in peers]
    peers[0].send(cmd="go", specs=[[addrs[1], "side-1", 0]])
    time.sleep(0.5)                    # side 1 has accepted side 0's connection by now
    peers[1].send(cmd="go", specs=[[addrs[0], "side-0", 0]])
    for k, p in enumerate(peers):
        res = p.expect("results", 30)["results"][0]
        assert "error" not in res, res
        assert res["streams"][0] == expected_streams(1 - k, plans[1 - k], 1)[0]
    for p in peers:
        p.send(cmd="close")
    for p in peers:
        closed = p.expect("closed", 10)
        assert_clean(closed)
        assert closed["connections"] == 1, closed           # one connection, both ways
        stats = list(closed["stats"])
        assert stats[0]["buffers_in"] > 0 and stats[0]["buffers_out"] > 0, stats


@pytest.mark.timeout(60)
def test_unread_events_do_not_block_other_channels(children):
    """Two gates in one process read two partitions of one producer process
    (one connection): gate A's producer broadcasts 45 MB of events that
    nobody reads yet; gate B, read first, must still get its records (in
    one process it would: only A's producer blocks)."""
    producer = children.start("producer", {
        "num_segments": 64, "segment_size": 32768,
        "partitions": [{"id": "events", "n": 1, "tag": 1, "plan": [["E", 30000]] * 1500},
                       {"id": "data", "n": 1, "tag": 2, "plan": [["r", 100, 0]] * 3000}]})
    addr = producer.address()
    env = NetworkEnvironment(64, 32768, secret=SECRET)
    gate_a = env.create_input_gate([(addr, "events", 0)], codec="bytes")
    try:
        time.sleep(1.0)
        gate_b = env.create_input_gate([(addr, "data", 0)], codec="bytes")
        try:
            t, result = run_in_thread(lambda: sum(1 for _ in gate_b))
            t.join(3)
            stuck = t.is_alive()
            # Unblock it all: read A, then B ends.
            assert sum(1 for _ in gate_a) == 1500
            t.join(20)
            assert result.get("value") == 3000, result
            assert not stuck, "gate B got nothing while gate A's events were unread"
        finally:
            gate_b.close()
    finally:
        gate_a.close()
        env.close()
        producer.send(cmd="close")
        producer.expect("closed", 20)


def _env(**kw):
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024),
                              secret=SECRET, **kw)


@pytest.mark.timeout(30)
def test_partition_id_limits():
    """A partition id of exactly 1024 bytes of UTF-8 travels; 1025 is
    refused before anything is sent."""
    from flinkbuf.io import RecordWriter, create_partition
    prod, cons = _env(), _env()
    try:
        pid = "é" * 512
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition(pid, part)
        with pytest.raises(ValueError, match="1024"):
            prod.register_partition("é" * 512 + "x", part)
        with pytest.raises(ValueError, match="1024"):
            cons.create_input_gate([(prod.address, "x" * 1025, 0)])
        gate = cons.create_input_gate([(prod.address, pid, 0)])
        with RecordWriter(part, buffer_timeout=0) as w:
            w.emit("hello")
        assert list(gate) == ["hello"]
        gate.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(30)
def test_a_subpartition_has_one_remote_reader():
    """A second gate asking for a subpartition that has a reader is
    refused (code 5) with a clear error; the first reader goes on."""
    from flinkbuf.io import RecordWriter, create_partition
    prod, cons = _env(), _env()
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("q", part)
        first = cons.create_input_gate([(prod.address, "q", 0)])
        time.sleep(0.2)
        second = cons.create_input_gate([(prod.address, "q", 0)])
        with pytest.raises(RemoteConnectionError, match="already has a reader"):
            next(second)
        second.close()
        with RecordWriter(part, buffer_timeout=0) as w:
            w.emit(1)
        assert list(first) == [1]
        first.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(30)
def test_out_of_range_subpartition_is_refused_truthfully():
    from flinkbuf.io import create_partition
    prod, cons = _env(), _env()
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("q", part)
        gate = cons.create_input_gate([(prod.address, "q", 2 ** 32 - 1)])
        with pytest.raises(RemoteConnectionError) as info:
            next(gate)
        gate.close()
        part.release()
        message = str(info.value).split(": ", 1)[1]        # the server's words
        assert "has 1 subpartitions" in message
        assert "not 0" not in message, message
    finally:
        cons.close()
        prod.close()
