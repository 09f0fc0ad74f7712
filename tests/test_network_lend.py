"""Lent buffers over shared memory: a producer in another process on this
host sends the consumer the segment a buffer is in, not its bytes; the
consumer reads the producer's arena in place, read-only, and its recycle
gives the segment back.  Nothing is reused while the other side may read
it, and a process killed with SIGKILL gives back what it held."""

import fcntl
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import wait_until
from network_helpers import (
    SECRET,
    RingSocket,
    frame,
    pool_arenas_held,
    shared_memory_held,
)

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network._network import _shm_region

pytestmark = pytest.mark.one_transport

F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_FUTURE_WRITE = 0x2, 0x4, 0x10

PRODUCER = textwrap.dedent("""
    import sys
    from flinkbuf.io import RecordWriter, create_partition
    from flinkbuf.network import NetworkEnvironment
    env = NetworkEnvironment(64, 32768, secret=bytes.fromhex(sys.argv[1]), transport="shm",
                         lend_buffers=True)
    part = create_partition(env.network_buffer_pool, 1, min_buffers=8)
    env.register_partition("p", part)
    print("{}:{}".format(*env.address), flush=True)
    with RecordWriter(part, codec="bytes", buffer_timeout=0) as w:
        for i in range(int(sys.argv[2])):
            w.emit(i.to_bytes(8, "little") * 512)
    sys.stdin.read()
""")

CONSUMER = textwrap.dedent("""
    import sys, time
    from flinkbuf.network import NetworkEnvironment
    env = NetworkEnvironment(64, 32768, secret=bytes.fromhex(sys.argv[1]), transport="shm")
    gate = env.create_input_gate([(sys.argv[2], "p", 0)], codec="bytes")
    next(gate)
    print("reading", flush=True)
    time.sleep(120)           # holds what the channel received, until killed
""")


def arena_fds():
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "memfd:flinkbuf-pool" in os.readlink(f"/proc/self/fd/{fd}"):
                fds.append(int(fd))
        except OSError:
            pass
    return fds


def record(i):
    return i.to_bytes(8, "little") * 512


def end(proc):
    """Let a child process finish (its stdin closed), or kill it if it is
    stuck: no orphan is left behind."""
    proc.stdin.close()
    try:
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def came_lent(env):
    """The stats of ``env``'s one connection, whose data buffers came lent:
    as segment numbers, a few bytes each (4 KiB records: the payload never
    crossed the rings)."""
    [stats] = env.connection_stats()
    assert stats["transport"] == "shm" and stats["buffers_in"] > 0, stats
    assert stats["bytes_in"] < 64 * stats["buffers_in"], stats
    return stats


def spawn(src, *args):
    return subprocess.Popen([sys.executable, "-c", src, SECRET.hex(), *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_shared_pool_can_be_mapped_only_for_reading():
    """A shared pool's arena is a sealed memfd: it cannot shrink or grow,
    and nobody given its descriptor can map it writable."""
    before = arena_fds()
    with NetworkBufferPool(4, 4096, shared_memory=True) as nbp:
        assert nbp.shared_memory
        fds = [fd for fd in arena_fds() if fd not in before]
        assert len(fds) == 1
        fd = fds[0]
        seals = fcntl.fcntl(fd, F_GET_SEALS)
        assert seals & F_SEAL_SHRINK and seals & F_SEAL_GROW and seals & F_SEAL_FUTURE_WRITE
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
        view = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
        buf = nbp.create_buffer_pool(1, 1).request_buffer()
        buf.write(b"seen by a reader")
        assert view[:16] == b"seen by a reader"
        view.close()
        buf.recycle()
    assert not NetworkBufferPool(4, 4096).shared_memory
    with pytest.raises(TypeError):
        NetworkBufferPool(4, 4096, shared_memory=1)


def test_buffers_of_a_producer_in_another_process_are_lent_not_copied():
    """Records from a producer process arrive exactly, its buffers come as
    segment numbers (a few bytes per buffer on the wire) and every one is
    given back once read."""
    n = 4000
    prod = spawn(PRODUCER, n)
    cons = NetworkEnvironment(64, 32768, secret=SECRET, transport="shm")
    try:
        address = prod.stdout.readline().strip()
        gate = cons.create_input_gate([(address, "p", 0)], codec="bytes")
        got = 0
        for i, rec in enumerate(gate):
            assert rec == record(i)
            got += 1
        assert got == n
        stats = came_lent(cons)
        assert stats["buffers_borrowed"] == 0
        assert any(perm == "r--s" for perm in pool_arenas_held())
        gate.close()
    finally:
        try:
            end(prod)
        finally:
            cons.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


@pytest.mark.parametrize("held", [True, False])
def test_a_consumer_killed_holding_lent_buffers_gives_them_back(held):
    """A consumer process killed with SIGKILL while it holds lent buffers:
    the producer gets every segment back (its pool is whole again), and
    nothing is left mapped or open."""
    env = NetworkEnvironment(64, 32768, secret=SECRET, transport="shm",
                             lend_buffers=True)
    part = create_partition(env.network_buffer_pool, 1, min_buffers=4, max_buffers=16)
    env.register_partition("p", part)
    cons = spawn(CONSUMER, "{}:{}".format(*env.address))
    try:
        w = RecordWriter(part, codec="bytes", buffer_timeout=0)
        for i in range(12 if held else 1):
            w.emit(record(i) * 7)
        w.flush()
        assert cons.stdout.readline().strip() == "reading"
        lent = lambda: sum(s["buffers_lent"] for s in env.connection_stats())
        if held:
            assert wait_until(lambda: lent() >= 2, 10), env.connection_stats()
        os.kill(cons.pid, signal.SIGKILL)
        cons.wait(10)
        # the peer's end returns them: nothing of the pool is out any more
        pool = part.pool
        assert wait_until(lambda: pool.num_requested == pool.num_available, 10), \
            (pool.num_requested, pool.num_available, env.connection_stats())
    finally:
        if cons.poll() is None:
            cons.kill()
            cons.wait()
        env.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


LIVING_CONSUMER = textwrap.dedent("""
    import sys, time
    from flinkbuf.network import NetworkEnvironment
    env = NetworkEnvironment(64, 32768, secret=bytes.fromhex(sys.argv[1]), transport="shm",
                             exclusive_buffers_per_channel=2, floating_buffers_per_gate=0)
    gate = env.create_input_gate([(sys.argv[2], "p", 0)], codec="bytes")
    for _ in range(int(sys.argv[3])):
        next(gate)
    print("reading", flush=True)
    sys.stdin.readline()
    gate.close()              # a task ends: its gate, then its environment,
    env.close()               # and the connection; this process lives on
    print("closed", flush=True)
    sys.stdin.read()
""")


@pytest.mark.parametrize("reads", [1, 3])
def test_a_consumer_that_lives_on_gives_back_what_it_let_go_of(reads):
    """A consumer process that ends its connection and lives on (a reused
    worker) gives back every lent segment it no longer holds, those it
    never read among them, without exiting; while it reads, what it holds
    lent is bounded by its credit (2 exclusive buffers, no floating)."""
    env = NetworkEnvironment(64, 32768, secret=SECRET, transport="shm",
                             lend_buffers=True)
    part = create_partition(env.network_buffer_pool, 1, min_buffers=4, max_buffers=16)
    env.register_partition("p", part)
    cons = spawn(LIVING_CONSUMER, "{}:{}".format(*env.address), reads)
    pool = part.pool
    try:
        w = RecordWriter(part, codec="bytes", buffer_timeout=0)
        for i in range(12):
            w.emit(record(i) * 7)
        w.flush()
        assert cons.stdout.readline().strip() == "reading"
        lent = lambda: sum(s["buffers_lent"] for s in env.connection_stats())
        assert wait_until(lambda: lent() == 2, 10), env.connection_stats()
        assert not wait_until(lambda: lent() > 2, 0.5), env.connection_stats()
        assert part.subpartition(0).backlog > 0     # the rest waits for credit
        cons.stdin.write("close\n")
        cons.stdin.flush()
        assert cons.stdout.readline().strip() == "closed"
        assert wait_until(lambda: pool.num_requested == pool.num_available, 10), \
            (pool.num_requested, pool.num_available, env.connection_stats())
        assert cons.poll() is None                  # it gave them back alive
    finally:
        cons.kill()
        cons.wait()
        env.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


def test_a_producer_killed_while_lent_buffers_are_held():
    """The producer process killed with SIGKILL while this consumer holds
    its lent buffers: what arrived reads exactly, the gate then fails
    within its timeout, and nothing of the dead producer stays mapped."""
    prod = spawn(PRODUCER, 2000)
    cons = NetworkEnvironment(64, 32768, secret=SECRET, transport="shm", io_timeout=5)
    try:
        address = prod.stdout.readline().strip()
        gate = cons.create_input_gate([(address, "p", 0)], codec="bytes")
        it = iter(gate)
        assert next(it) == record(0)
        held = lambda: sum(s["buffers_borrowed"] for s in cons.connection_stats())
        assert wait_until(lambda: held() >= 2, 10), cons.connection_stats()
        os.kill(prod.pid, signal.SIGKILL)
        prod.wait(10)
        got, error = 1, None
        try:
            for i, rec in enumerate(it, start=1):
                assert rec == record(i)
                got += 1
        except Exception as exc:                       # noqa: BLE001 - checked below
            error = exc
        assert error is not None and got < 2000, got
        gate.close()
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()
        cons.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


STRIDE = 32768            # the segment size: a multiple of the cache line


def sealed_memfd(name, size, seals=0x2 | 0x4):
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, getattr(fcntl, "F_ADD_SEALS", 1033), seals)
    return fd


class HostileLender:
    """A server on this host that passes the handshake over shared memory,
    passes an arena of 4 segments and a ledger of ``ledger`` bytes, takes
    one partition request and then sends ``lent(receiver)``'s frames."""

    def __init__(self, lent, *, ledger=64 + 4, seal_arena=True):
        self.lent, self.ledger, self.seal_arena = lent, ledger, seal_arena
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(f"\0flinkbuf-tcp-{self.port}")
        self.unix.listen(1)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        sock, _ = self.unix.accept()
        with sock:
            sock.settimeout(30)           # (a loaded machine: no early close)
            hs = handshake.ServerHandshake(SECRET, f"127.0.0.1:{self.port}", STRIDE,
                                        shared_memory=lambda: _shm_region(STRIDE),
                                        unix_peer=handshake.unix_peer(sock))
            while not hs.done:
                sock.sendall(hs.feed(sock.recv(handshake.MAX_FRAME)))
            memfd, data0, room0, data1, room1 = hs.shared_fds
            arena = sealed_memfd("hostile-arena", 4 * STRIDE,
                                 0x2 | 0x4 if self.seal_arena else 0)
            ledger = sealed_memfd("hostile-ledger", self.ledger)
            handshake.send_setup(sock, [memfd, data1, room1, arena, ledger])
            for fd in (data1, room1, arena, ledger):
                os.close(fd)
            ring = RingSocket(sock, memfd, data0, room0, side=0)
            ring.settimeout(30)
            try:
                head = ring.recv(9)
                while len(head) < 9:
                    head += ring.recv(9 - len(head))
                body = b""
                while len(body) < int.from_bytes(head[:4], "big") - 9:
                    body += ring.recv(4096)
                receiver = int.from_bytes(body[:4], "big")
                for data in self.lent(receiver):
                    ring.sendall(data)
                self.done.wait(10)
            except OSError:
                pass                            # the consumer closed on us
            finally:
                ring.close()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def close(self):
        self.done.set()
        self.thread.join(10)
        self.listener.close()
        self.unix.close()


def lent_frame(receiver, seq, segment, size=16, backlog=0):
    return frame(8, struct.pack(">IIIBII", receiver, seq, backlog, 0, size, segment))


HOSTILE_LENDS = {
    "outside-the-arena": (lambda r: [lent_frame(r, 0, 4)], "outside the peer's arena"),
    "far-outside": (lambda r: [lent_frame(r, 0, 0xFFFFFFFF)], "outside the peer's arena"),
    "lent-twice": (lambda r: [lent_frame(r, 0, 1), lent_frame(r, 1, 1)], "lent already"),
    "without-credit": (lambda r: [lent_frame(r, k, k) for k in range(3)], "without credit"),
    "sequence-gap": (lambda r: [lent_frame(r, 5, 0)], "sequence gap"),
    "never-issued": (lambda r: [lent_frame(r + 7, 0, 0)], "never issued"),
    "oversized": (lambda r: [lent_frame(r, 0, 0, size=STRIDE + 1)], "lent buffer"),
    "empty": (lambda r: [lent_frame(r, 0, 0, size=0)], "empty data buffer"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(HOSTILE_LENDS))
def test_a_lender_breaking_the_rules_fails_the_connection_not_the_process(name):
    """A peer that lends segments outside its arena, twice, beyond the
    credit it was given or out of sequence fails this connection with a
    protocol error that says so; nothing of it stays mapped here."""
    lent, reason = HOSTILE_LENDS[name]
    hostile = HostileLender(lent)
    # Only the connection's reader thread reads, and this thread holds back
    # until the bad frame ended the connection: a lent buffer is still held
    # (not recycled, so not given back) when the frame after it comes.
    env = NetworkEnvironment(16, STRIDE, secret=SECRET, transport="shm", direct_reads=False,
                             exclusive_buffers_per_channel=2, floating_buffers_per_gate=0)
    gate = env.create_input_gate([(hostile.address, "p", 0)], codec="bytes")
    try:
        assert env.connection_stats(), "the gate did not connect"
        assert wait_until(lambda: not env.connection_stats(), 20), "the connection lives on"
        with pytest.raises(Exception, match=reason) as info:
            for _ in gate:          # (what came before the bad frame may be read first)
                pass
        assert not isinstance(info.value, AssertionError)
    finally:
        gate.close()
        env.close()
        hostile.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ledger, seal_arena, reason", [
    (64 + 4, False, "not sealed against shrinking"),
    (64, True, "too few for a segment"),
], ids=["arena-not-sealed", "ledger-too-small"])
def test_an_arena_or_ledger_not_as_it_should_be_is_refused(ledger, seal_arena, reason):
    hostile = HostileLender(lambda r: [], ledger=ledger, seal_arena=seal_arena)
    env = NetworkEnvironment(16, STRIDE, secret=SECRET, transport="shm")
    try:
        with pytest.raises(Exception, match=reason):
            gate = env.create_input_gate([(hostile.address, "p", 0)], codec="bytes")
            next(iter(gate))
    finally:
        env.close()
        hostile.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


CLIENT_PRODUCER = textwrap.dedent("""
    import sys
    from flinkbuf.io import RecordWriter, create_partition
    from flinkbuf.network import NetworkEnvironment
    env = NetworkEnvironment(64, 32768, secret=bytes.fromhex(sys.argv[1]), transport="shm",
                             lend_buffers=True)
    part = create_partition(env.network_buffer_pool, 1, min_buffers=8)
    env.register_partition("p", part)
    for _ in env.create_input_gate([(sys.argv[2], "c", 0)]):   # this side connects first
        pass
    print("{}:{}".format(*env.address), flush=True)
    with RecordWriter(part, codec="bytes", buffer_timeout=0) as w:
        for i in range(int(sys.argv[3])):
            w.emit(i.to_bytes(8, "little") * 512)
    assert part.wait_consumed(60)
    sys.stdin.read()
""")


def test_a_client_lends_its_buffers_to_the_server_too():
    """The process that opened the connection (the client) produces: its
    buffers are lent to the server's process over the same connection,
    read exactly, and all given back."""
    n = 3000
    cons = NetworkEnvironment(64, 32768, secret=SECRET, transport="shm")
    mine = create_partition(cons.network_buffer_pool, 1, min_buffers=2)
    cons.register_partition("c", mine)
    RecordWriter(mine).close()                  # nothing: the client reads it to its end
    prod = spawn(CLIENT_PRODUCER, "{}:{}".format(*cons.address), n)
    try:
        address = prod.stdout.readline().strip()
        gate = cons.create_input_gate([(address, "p", 0)], codec="bytes")
        for i, rec in enumerate(gate):
            assert rec == record(i)
        assert i == n - 1
        came_lent(cons)                            # over the one connection the client opened
        assert wait_until(lambda: cons.connection_stats()[0]["buffers_borrowed"] == 0, 10)
        gate.close()
    finally:
        try:
            end(prod)
        finally:
            cons.close()
    assert prod.returncode == 0
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("passed", ["three", "unsealed", "not-memory"])
def test_a_client_passing_wrong_descriptors_is_refused_and_the_server_serves_on(passed):
    """A client (with the secret) that passes more descriptors with its
    AUTH than a lender does, or an arena and ledger that are not sealed
    memory files, gets no connection; nothing of them stays open in the
    server, which serves the next client."""
    env = NetworkEnvironment(16, STRIDE, secret=SECRET, transport="shm")
    mine = create_partition(env.network_buffer_pool, 1, min_buffers=2)
    env.register_partition("c", mine)
    RecordWriter(mine).close()
    before = set(os.listdir("/proc/self/fd"))
    if passed == "not-memory":
        fds = [os.open("/dev/null", os.O_RDONLY), os.open("/dev/null", os.O_RDONLY)]
    else:
        fds = [sealed_memfd("a", 4 * STRIDE, 0), sealed_memfd("l", 64 + 4, 0)]
        if passed == "three":
            fds.append(os.dup(fds[0]))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(f"\0flinkbuf-tcp-{env.address[1]}")
        try:
            _, _, region, _ = handshake.client(sock, SECRET, "127.0.0.1:1", STRIDE, 5.0,
                                            shared_memory=True, lend_fds=fds)
            handshake.close_fds(region or [])          # (not used: refused after it)
        except (OSError, handshake.AuthenticationError):
            pass                                       # refused in the handshake
        sock.settimeout(5.0)
        try:
            while sock.recv(4096):                     # or closed right after it
                pass
        except OSError:
            pass
    finally:
        sock.close()
        handshake.close_fds(fds)
    peer = NetworkEnvironment(16, STRIDE, secret=SECRET, transport="shm")
    try:
        assert list(peer.create_input_gate([("{}:{}".format(*env.address), "c", 0)])) == []
    finally:
        peer.close()
    def theirs():                 # what the server may still hold of the client's
        links = []
        for fd in set(os.listdir("/proc/self/fd")) - before:
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return [ln for ln in links if ln.startswith(("/memfd:a ", "/memfd:l ", "/dev/null"))]
    assert wait_until(lambda: theirs() == [], 10), theirs()
    env.close()
    assert wait_until(lambda: shared_memory_held() == [], 10), shared_memory_held()


def test_nothing_is_lent_unless_asked(monkeypatch):
    """Lending is off by default (the pool is not shared, so nothing can
    be lent); ``lend_buffers=True`` or FLINKBUF_NET_LEND_BUFFERS=1 turns it
    on, and anything but a bool or None is refused."""
    with NetworkEnvironment(8, 4096, secret=SECRET, transport="shm") as env:
        assert not env.network_buffer_pool.shared_memory
    with NetworkEnvironment(8, 4096, secret=SECRET, transport="shm", lend_buffers=True) as env:
        assert env.network_buffer_pool.shared_memory
    monkeypatch.setenv("FLINKBUF_NET_LEND_BUFFERS", "1")
    with NetworkEnvironment(8, 4096, secret=SECRET, transport="shm") as env:
        assert env.network_buffer_pool.shared_memory
    with NetworkEnvironment(8, 4096, secret=SECRET, lend_buffers=False) as env:
        assert not env.network_buffer_pool.shared_memory
    monkeypatch.setenv("FLINKBUF_NET_LEND_BUFFERS", "yes")
    with pytest.raises(ValueError, match="FLINKBUF_NET_LEND_BUFFERS"):
        NetworkEnvironment(8, 4096, secret=SECRET)
    with pytest.raises(TypeError, match="lend_buffers"):
        NetworkEnvironment(8, 4096, secret=SECRET, lend_buffers=1)
