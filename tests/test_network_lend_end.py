"""A connection's end gives back every segment lent over it, at once,
whatever the peer does, and never one that an honest consumer may still
read: a consumer lets go of what it holds (a private copy of each lent
buffer it still reads) before its side of the connection ends, so that a
hoarder that keeps lent buffers and closes loses only its own view, and a
consumer that reads a held buffer after the end reads what was sent."""

import threading
import time

import pytest

from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from helpers import wait_until
from network_helpers import SECRET, expected_streams, record_bytes

pytestmark = pytest.mark.one_transport

SEG = 32768
HOARD = 10                      # the pool's buffers, all of them lent to the hoarder
LENT = 4                        # the pool's buffers, all of them lent to a borrower
MAX_GAP = 1.5                   # what "at once" allows on a loaded machine


@pytest.fixture
def shm_children(children, monkeypatch):
    """Children that reach this process over shared memory."""
    monkeypatch.setenv("FLINKBUF_NET_TRANSPORT", "shm")
    monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", "0")
    return children


def lending_producer():
    return NetworkEnvironment(64, SEG, secret=SECRET, transport="shm", lend_buffers=True)


def address_of(env):
    return "{}:{}".format(*env.address)


def connection_to(env, peer, within=10):
    """The connection to ``peer``, once it is listed (a consumer reports its
    address before its partition request has reached this side)."""
    found = []
    assert wait_until(lambda: found.extend(c for c in env.connections() if c.peer == peer)
                      or found, within), (peer, env.connections())
    [conn] = found
    return conn


def progress(child):
    """The child consumer's latest count (0 before any report)."""
    counts = [m["progress"][0] for m in child.poll_messages() if "progress" in m]
    return counts[-1] if counts else None


@pytest.mark.parametrize("mode", ["raw", "flinkbuf"])
def test_a_hoarders_close_gives_every_lent_segment_back_at_once(shm_children, mode):
    """A hoarder (a peer that never releases: one spoken by hand, or a
    flinkbuf consumer that closes its environment with its gate unread)
    holds every buffer of the producer's pool, which starves a healthy
    consumer of the same producer; its close gives all of them back at
    once (it lives on: no process end returns them), and the healthy
    consumer gets records again."""
    children = shm_children
    with lending_producer() as env:
        part = create_partition(env.network_buffer_pool, 2, min_buffers=HOARD,
                                max_buffers=HOARD)
        env.register_partition("p", part)
        target = [1]
        writer = RecordWriter(part, lambda record, n: target[0], codec="bytes",
                              buffer_timeout=0)
        hoarder = children.start("hoarder", {
            "mode": mode, "addr": address_of(env), "sub": 1, "credit": HOARD,
            "segment_size": SEG, "num_segments": 64, "exclusive": HOARD, "floating": 0},
            life=60)
        peer = hoarder.address()
        for _ in range(HOARD):               # each record fills a buffer, lent to the hoarder
            writer.emit(b"h" * (SEG - 4))
        conn = connection_to(env, peer)
        assert wait_until(lambda: conn.stats()["buffers_lent"] == HOARD, 10), conn.stats()
        healthy = children.start("consumer", {
            "num_segments": 64, "segment_size": SEG, "gates": [[[address_of(env), "p", 0]]],
            "report": "count", "progress": True}, life=60)
        healthy.address()
        target[0] = 0

        def write():
            try:
                for _ in range(200):
                    writer.emit(b"x" * 1000)
                writer.flush()
            except Exception:                            # noqa: BLE001 - released at the end
                pass

        t = threading.Thread(target=write, daemon=True)
        t.start()
        time.sleep(1.0)
        assert not progress(healthy), "the healthy consumer read with every buffer lent"
        hoarder.send(cmd="close")
        t0 = time.monotonic()
        assert wait_until(lambda: conn.stats()["buffers_lent"] == 0, MAX_GAP, 0.01), \
            conn.stats()
        back = time.monotonic() - t0
        assert wait_until(lambda: (progress(healthy) or 0) > 0, MAX_GAP + 2, 0.01), \
            "the healthy consumer got no record after the hoarder closed"
        hoarder.expect("closed")
        assert hoarder.proc.poll() is None           # given back while it lives on
        t.join(30)
        writer.close()
        healthy.expect("results")
    assert back <= MAX_GAP, back


@pytest.mark.parametrize("ends", ["consumer", "producer"])
def test_a_lent_buffer_held_across_the_connections_end_reads_what_was_sent(shm_children, ends):
    """A consumer reads one record of a lent buffer that holds several, and
    the connection ends (its own side first, or the producer's); the
    producer takes every segment back and writes other bytes into all of
    them; the consumer then reads the rest of the records it held: exactly
    those that were sent."""
    children = shm_children
    plan = [["r", 1000, 0] for _ in range(60)]       # about 32 records a buffer
    with lending_producer() as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=8, max_buffers=8)
        env.register_partition("p", part)
        cons = children.start("consumer", {
            "num_segments": 64, "segment_size": SEG, "gates": [[[address_of(env), "p", 0]]],
            "pause_after": 1}, life=60)
        peer = cons.address()
        writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=None)
        for i, op in enumerate(plan):
            writer.emit(record_bytes(1, i, op[1]))
        writer.flush()
        cons.expect("paused")
        conn = connection_to(env, peer)
        assert conn.stats()["buffers_lent"] >= 1, conn.stats()
        if ends == "consumer":
            cons.send(cmd="drop_connections")
            cons.expect("dropped")
        else:
            conn.close()
        pool = part.pool
        assert wait_until(lambda: pool.num_requested == pool.num_available, 10), \
            (pool.num_requested, pool.num_available)
        overwrite(env, part)
        cons.send(cmd="resume")
        [result] = cons.expect("results")["results"]
        writer.fail(RuntimeError("done"))
    read = result["streams"][0]
    assert len(read) > 5, result                    # more than the record read before the end
    assert read == expected_streams(1, plan, 1)[0][:len(read)], result


def test_a_lender_that_ends_first_takes_nothing_back_that_is_still_borrowed(shm_children):
    """The lender ends the connection first, its reader in the middle of a
    frame (its own shutdown then reads as the transport's end, not the
    peer's): every segment it lent stays out while the borrower, which
    lives on and has not let go, may read it; the lender writes other
    bytes into every segment it has, and the borrower still reads what was
    sent; once the borrower lets go, every segment comes back."""
    children = shm_children
    with lending_producer() as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=LENT,
                                max_buffers=LENT)
        env.register_partition("p", part)
        borrower = children.start("borrower", {
            "addr": address_of(env), "sub": 0, "credit": LENT, "segment_size": SEG}, life=30)
        peer = borrower.address()
        writer = RecordWriter(part, codec="bytes", buffer_timeout=0)
        for i in range(LENT):                   # each record fills a buffer
            writer.emit(record_bytes(1, i, SEG - 4))
        while borrower.expect("lent")["lent"] < LENT:
            pass
        conn = connection_to(env, peer)
        pool = part.pool
        assert pool.num_requested - pool.num_available == LENT
        bytes_in = conn.stats()["bytes_in"]
        borrower.send(cmd="stall")
        stall = borrower.expect("stalled")["stalled"]
        assert wait_until(lambda: conn.stats()["bytes_in"] == bytes_in + stall, 10), \
            (bytes_in, stall, conn.stats())
        conn.close()                            # its reader gone: what it did is done
        out = pool.num_requested - pool.num_available
        overwrite(env, part)
        borrower.send(cmd="check")
        check = borrower.expect("intact")
        # (taken back, the segments would hold the lender's other bytes)
        assert (out, check) == (LENT, {"intact": True, "held": LENT}), \
            f"the lender took back segments still borrowed ({out} out): {check}"
        borrower.send(cmd="let_go")
        borrower.expect("let_go")
        assert wait_until(lambda: pool.num_requested == pool.num_available, 10), \
            (pool.num_requested, pool.num_available)
        borrower.send(cmd="close")
        borrower.expect("closed")
        writer.fail(RuntimeError("done"))


def overwrite(env, part):
    """Fill every free segment of the environment's pool, and of the
    partition's, with other bytes."""
    pools = [part.pool]
    nbp = env.network_buffer_pool
    if nbp.num_available_segments:
        pools.append(nbp.create_buffer_pool(1, nbp.num_available_segments))
    for pool in pools:
        taken = []
        while (buf := pool.request_buffer()) is not None:
            buf.write(b"\xee" * buf.capacity)
            taken.append(buf)
        for buf in taken:
            buf.recycle()
    for pool in pools[1:]:
        pool.destroy()
