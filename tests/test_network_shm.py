"""The shared-memory transport: what it maps and leaves behind, what it
checks of a region it is given, a peer that corrupts the rings or the
fields where it says how it runs, and when a wait looks at the ring before
it sleeps.  Every other network test runs over it too (conftest.py); kill -9
of either side is in test_network_failures.py; the waits on their own, under
sanitizers, in test_network_shm_waits.py."""

import fcntl
import mmap
import os
import socket
import struct
import termios
import time

import pytest

from flinkbuf import _testing
from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from flinkbuf.network._network import Connection, _shm_region
from helpers import run_in_thread, wait_until
from network_helpers import SECRET, num_fds, shared_memory_held

pytestmark = [pytest.mark.one_transport,
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]

HEADER = 4096
RING0_HEAD = 64          # the control page: 16 bytes, then ring 0 (head first)
RING0_BELLS = 204        # doorbells ring 0's writer rang for input (u32)
SIDE0 = 448              # side 0's line: when it last moved bytes, read, looked (i64), its CPU (i32)


def dev_shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def exchange(prod, cons, records):
    part = create_partition(prod.network_buffer_pool, 1, min_buffers=4)
    pid = f"p{time.monotonic_ns()}"
    prod.register_partition(pid, part)
    gate = cons.create_input_gate([(prod.address, pid, 0)], codec="bytes")

    def produce():
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            for r in records:
                w.emit(r)

    t, res = run_in_thread(produce)
    got = [bytes(r) for r in gate]
    t.join(10)
    assert "error" not in res, res
    gate.close()
    return got


def test_a_region_is_mapped_while_connected_and_gone_after():
    """Two environments that ask for shared memory connect through a memfd
    (mapped by both while the connection lives, with no name under
    /dev/shm), exchange records exactly, and leave no mapping and no
    descriptor behind once closed."""
    fds_before, shm_before = num_fds(), dev_shm()
    assert shared_memory_held() == []
    prod = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    cons = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    try:
        records = [os.urandom(n) for n in (0, 1, 100, 1023, 1024, 5000, 40000)] * 20
        assert exchange(prod, cons, records) == records
        assert [s["transport"] for s in cons.connection_stats()] == ["shm"]
        held = shared_memory_held()
        # both ends live in this process: two mappings, no descriptor
        assert len(held) == 2 and all("memfd:flinkbuf-shm" in h for h in held), held
        assert not any(h.startswith("fd ") for h in held), held
        assert dev_shm() == shm_before
    finally:
        cons.close()
        prod.close()
    assert wait_until(lambda: shared_memory_held() == [], 10)
    assert wait_until(lambda: num_fds() <= fds_before, 10)


def test_a_server_that_cannot_share_memory_serves_over_its_unix_socket(monkeypatch):
    """A region the server cannot make (out of memory or descriptors) is
    no failure: the connection is a Unix socket instead."""
    prod = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    cons = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")

    def no_region():
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(prod._acceptor._opener, "new_region", no_region)
    try:
        assert exchange(prod, cons, [b"a", b"b" * 3000]) == [b"a", b"b" * 3000]
        assert [s["transport"] for s in cons.connection_stats()] == ["unix"]
    finally:
        cons.close()
        prod.close()
    assert shared_memory_held() == []


@pytest.mark.parametrize("server, client, used", [
    ("shm", "unix", "unix"), ("unix", "shm", "shm"), ("shm", "tcp", "tcp"),
    ("tcp", "shm", "tcp")])
def test_the_connecting_side_chooses(server, client, used):
    """The transport is the connecting side's: shared memory when it asks
    for it and reaches the server over the server's Unix socket (a server
    without one, transport="tcp", is reached over TCP)."""
    prod = NetworkEnvironment(64, 1024, secret=SECRET, transport=server)
    cons = NetworkEnvironment(64, 1024, secret=SECRET, transport=client)
    try:
        assert exchange(prod, cons, [b"x" * 2000] * 10) == [b"x" * 2000] * 10
        assert [s["transport"] for s in cons.connection_stats()] == [used]
    finally:
        cons.close()
        prod.close()


# ---- a region handed to the transport -------------------------------------------------------

def open_side(region, side=1):
    """A connection over one end of a socketpair, as `side` of `region`
    (memfd, data0, room0, data1, room1); the other end and the other
    side's doorbells stay the test's."""
    a, b = socket.socketpair()
    memfd = region[0]
    data, room = (region[3], region[4]) if side == 1 else (region[1], region[2])
    conn = Connection._open(a.detach(), 1024, lambda pid: None, "here:1", "there:2", 5.0,
                            True, True, (memfd, data, room, side))
    return conn, b


def close_quietly(*fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def fails_when_the_peer_writes(write):
    """A connection as side 1 of a fresh region, whose peer (the test, as
    side 0) calls write(mapping) and rings: the connection must fail with
    a ConnectionError (which it returns)."""
    region = _shm_region(1024)
    memfd, data0 = region[0], region[1]
    conn, peer_sock = open_side(region)
    try:
        with mmap.mmap(memfd, os.fstat(memfd).st_size) as m:
            write(m)
            os.write(data0, b"!")           # the bell: side 1 may sleep
            assert wait_until(lambda: not conn.is_open, 5)
        assert isinstance(conn.error, ConnectionError)
        return conn.error
    finally:
        conn.close()
        peer_sock.close()
        close_quietly(memfd, *region[1:3])


def test_a_peer_that_corrupts_the_ring_indices_fails_the_connection():
    """A head past what the ring holds is a protocol error: the connection
    fails with a clear error; nothing is read outside the ring."""
    error = fails_when_the_peer_writes(
        lambda m: struct.pack_into("<Q", m, RING0_HEAD, 1 << 40))
    assert "Protocol error" in str(error), error


def test_a_peer_that_writes_garbage_frames_fails_the_connection():
    """Bytes in the ring are decoded like bytes from a socket: garbage is a
    protocol error, not a crash."""
    junk = b"\xff" * 64

    def write(m):
        m[HEADER:HEADER + len(junk)] = junk
        struct.pack_into("<Q", m, RING0_HEAD, len(junk))

    error = fails_when_the_peer_writes(write)
    assert "protocol" in str(error).lower(), error


def test_the_peer_process_ending_ends_the_connection():
    """The peer's end of the Unix socket closing (its process died) fails
    the connection at once, though the rings say nothing."""
    region = _shm_region(1024)
    conn, peer_sock = open_side(region)
    try:
        peer_sock.close()
        assert wait_until(lambda: not conn.is_open, 5)
        assert isinstance(conn.error, ConnectionError)
    finally:
        conn.close()
        close_quietly(*region[:3])


def sealed_memfd(size, header=None, seals=None):
    fd = os.memfd_create("flinkbuf-shm-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if header is not None:
        os.pwrite(fd, header, 0)
    if seals is None:
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


VERSION = 2              # of the region's layout (docs/PROTOCOL.md, section 2.1)
GOOD_HEADER = struct.pack("<III", 0x46425348, VERSION, 16384)
BAD_REGIONS = {
    "unsealed": lambda: sealed_memfd(HEADER + 2 * 16384, GOOD_HEADER, seals=0),
    "shrinkable": lambda: sealed_memfd(HEADER + 2 * 16384, GOOD_HEADER,
                                       seals=fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL),
    "too small": lambda: sealed_memfd(100, GOOD_HEADER[:12]),
    "size mismatch": lambda: sealed_memfd(HEADER + 16384, GOOD_HEADER),
    "bad magic": lambda: sealed_memfd(HEADER + 2 * 16384, struct.pack("<III", 1, 1, 16384)),
    "bad version": lambda: sealed_memfd(HEADER + 2 * 16384,
                                        struct.pack("<III", 0x46425348, 9, 16384)),
    "the version before": lambda: sealed_memfd(HEADER + 2 * 16384,
                                               struct.pack("<III", 0x46425348, 1, 16384)),
    "ring not a power of two": lambda: sealed_memfd(
        HEADER + 2 * 12288, struct.pack("<III", 0x46425348, VERSION, 12288)),
    "ring too small": lambda: sealed_memfd(HEADER + 2 * 1024,
                                           struct.pack("<III", 0x46425348, VERSION, 1024)),
}


@pytest.mark.parametrize("kind", sorted(BAD_REGIONS))
def test_a_region_that_is_not_as_it_should_be_is_refused(kind):
    """A region whose seals, size or header are wrong is refused with a
    clear error (the socket and doorbells are closed; nothing is mapped)."""
    fds_before = num_fds()
    memfd = BAD_REGIONS[kind]()
    d0, d1 = socket.socketpair()
    r0, r1 = socket.socketpair()
    a, b = socket.socketpair()
    try:
        with pytest.raises(RemoteConnectionError, match="cannot share memory with there:2"):
            Connection._open(a.detach(), 1024, lambda pid: None, "here:1", "there:2", 5.0,
                             True, True, (memfd, d1.detach(), r1.detach(), 1))
    finally:
        for s in (d0, r0, b):
            s.close()
        os.close(memfd)
    assert shared_memory_held() == []
    assert num_fds() == fds_before


def test_doorbells_that_are_not_sockets_are_refused():
    region = _shm_region(1024)
    rp, wp = os.pipe()
    a, b = socket.socketpair()
    try:
        with pytest.raises(RemoteConnectionError, match="needs Unix sockets"):
            Connection._open(a.detach(), 1024, lambda pid: None, "here:1", "there:2", 5.0,
                             True, True, (region[0], rp, region[4], 1))
    finally:
        b.close()
        close_quietly(wp, *region[:4])
    assert shared_memory_held() == []


def test_auto_is_a_unix_socket_in_a_process_bound_to_one_cpu(monkeypatch):
    """transport="auto" is shared memory, unless the process may run on one
    CPU only (both sides would take turns on it: a Unix socket is faster)."""
    monkeypatch.delenv("FLINKBUF_NET_TRANSPORT", raising=False)
    allowed = os.sched_getaffinity(0)
    for cpus, used in (({min(allowed)}, "unix"), (allowed, "shm" if len(allowed) > 1 else "unix")):
        os.sched_setaffinity(0, cpus)
        try:
            prod = NetworkEnvironment(64, 1024, secret=SECRET)
            cons = NetworkEnvironment(64, 1024, secret=SECRET)
        finally:
            os.sched_setaffinity(0, allowed)
        try:
            assert exchange(prod, cons, [b"y" * 100] * 5) == [b"y" * 100] * 5
            assert [s["transport"] for s in cons.connection_stats()] == [used]
        finally:
            cons.close()
            prod.close()


def test_a_client_gone_before_auth_ok_leaves_no_region_behind():
    """The server makes a region when an authenticated client asks for
    shared memory; a client that leaves before the answer goes out (the
    send fails) costs no descriptor and no mapping."""
    from flinkbuf.network import handshake

    server = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    try:
        fds_before = num_fds()
        for _ in range(5):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(f"\0flinkbuf-tcp-{server.address[1]}")
            nonce = os.urandom(handshake.NONCE)
            sock.sendall(handshake._frame(handshake.HELLO,
                                          struct.pack(">H", handshake.VERSION) + nonce))
            body = sock.recv(handshake.MAX_FRAME)[9:]
            server_nonce = body[2:2 + handshake.NONCE]
            tail = handshake._tail("127.0.0.1:1", 1024, handshake.SHARED_MEMORY, local=True)
            proof = handshake._proof(SECRET, b"flinkbuf-client", server_nonce, nonce, tail)
            sock.sendall(handshake._frame(handshake.AUTH, proof + tail))
            sock.close()                 # before AUTH_OK: the server's send fails
        assert wait_until(lambda: num_fds() <= fds_before and shared_memory_held() == [], 10)
    finally:
        server.close()


# ---- when a wait looks at the ring ------------------------------------------------------------

def unread_bells(fd):
    """Bytes sent on the doorbell ``fd`` that its other end has not read."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]


def test_a_waiter_whose_peer_is_quiet_sleeps_without_looking():
    """A peer that moves no bytes (it sleeps, or has nothing to send) is not
    looked at: the connection's reader sleeps on its doorbell at once, and a
    bell with nothing in the ring behind it is emptied and slept on again,
    still without looking."""
    region = _shm_region(1024)
    data0 = region[1]
    conn, peer_sock = open_side(region)
    try:
        assert wait_until(lambda: _testing.shm_waits(conn)["sleeps"] >= 1, 5)
        for _ in range(3):
            os.write(data0, b"!")
            assert wait_until(lambda: unread_bells(data0) == 0, 5)
        waits = _testing.shm_waits(conn)
        assert waits["looks"] == 0 and waits["looks_paid"] == 0, waits
        assert 1 <= waits["sleeps"] <= waits["waits"], waits
        assert conn.is_open
    finally:
        conn.close()
        peer_sock.close()
        close_quietly(*region[:3])


def test_a_peer_writing_garbage_where_it_says_how_it_runs_changes_nothing():
    """What a side publishes about itself (when it last moved and read
    bytes, its CPU) and its count of doorbells are hints the other side only
    reads: garbage there (times at the ends of the range or in the future,
    any CPU, counts that never match) makes the connection neither look at
    the ring nor fail, and a frame written after it is read as any other."""
    region = _shm_region(1024)
    memfd, data0 = region[0], region[1]
    conn, peer_sock = open_side(region)
    try:
        with mmap.mmap(memfd, os.fstat(memfd).st_size) as m:
            for t in (2**63 - 1, -2**63, -1, 0, time.monotonic_ns() + 10**9):
                struct.pack_into("<qqqi", m, SIDE0, t, t, t, (t >> 7) % 4096 - 1)
                struct.pack_into("<I", m, RING0_BELLS, t & 0xFFFFFFFF)
                os.write(data0, b"!")
                assert wait_until(lambda: unread_bells(data0) == 0, 5)
            assert conn.is_open
            assert _testing.shm_waits(conn)["looks"] == 0
            close = _testing.wire_encode(("close",))
            m[HEADER:HEADER + len(close)] = close
            struct.pack_into("<Q", m, RING0_HEAD, len(close))
            os.write(data0, b"!")
            assert wait_until(lambda: not conn.is_open, 5)
        assert "the peer closed the connection" in str(conn.error), conn.error
    finally:
        conn.close()
        peer_sock.close()
        close_quietly(memfd, *region[1:3])


def test_the_wait_counters_of_connections():
    """A connection over shared memory counts its waits (those that found
    nothing at once), the looks among them and the looks that paid, and its
    sleeps; a connection over a socket has no such counters."""
    prod = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    cons = NetworkEnvironment(64, 1024, secret=SECRET, transport="shm")
    sock_cons = NetworkEnvironment(64, 1024, secret=SECRET, transport="unix")
    try:
        records = [os.urandom(n) for n in (10, 3000, 40000)] * 50
        assert exchange(prod, cons, records) == records
        assert exchange(prod, sock_cons, records) == records
        [shm] = cons._table.open_connections()
        [unix] = sock_cons._table.open_connections()
        assert (shm.transport, unix.transport) == ("shm", "unix")
        assert _testing.shm_waits(unix) is None
        waits = _testing.shm_waits(shm)
        assert waits["waits"] >= 1, waits
        assert waits["looks_paid"] <= waits["looks"] <= waits["waits"], waits
        assert waits["sleeps"] <= waits["waits"], waits
    finally:
        sock_cons.close()
        cons.close()
        prod.close()
