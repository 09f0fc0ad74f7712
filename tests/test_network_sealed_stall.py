"""A sealed record cut in half and held counts as a frame cut in half: a
relay (a plain proxy, over TCP or a Unix socket) that forwards half of a
sealed record between two real peers and holds the rest fails the consumer
at the I/O timeout, as "stalled in the middle of a frame", however the
record lies across the frames it carries; so does a peer over shared memory
that writes half a sealed record into the ring and stops there."""

import os
import socket
import struct
import threading
import time

import pytest

from flinkbuf._testing import Sealer, wire_encode
from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network._network import _shm_region
from network_helpers import SECRET, RingSocket
from test_network_seal import HANDSHAKE_FRAMES, RECORD_PREFIX, TAG
from test_network_seal import _recv_exact as recv_exact

pytestmark = pytest.mark.one_transport

SEG = 4096
IO_TIMEOUT = 2.0
SLACK = 1.5


class HalfRelay:
    """A proxy for one connection, listening on ``listener`` and dialing
    ``upstream()``: the handshake passes frame by frame, then the sealed
    records; from the server to the client it forwards records before
    number ``k`` whole, then half of record k, and holds the rest (all that
    follows) until closed."""

    def __init__(self, listener, upstream, k, keep=()):
        self.listener, self.upstream, self.k = listener, upstream, k
        self.keep = list(keep)          # sockets closed with the relay
        self.held = threading.Event()
        self.stop = threading.Event()
        self.socks = []
        self.threads = [threading.Thread(target=self._run, daemon=True)]
        self.threads[0].start()

    def _run(self):
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        server = self.upstream()
        self.socks = [client, server]
        for src, dst, way in ((client, server, "up"), (server, client, "down")):
            t = threading.Thread(target=self._pump, args=(src, dst, way), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, src, dst, way):
        try:
            for _ in range(HANDSHAKE_FRAMES[way]):
                head = recv_exact(src, 9)
                dst.sendall(head + recv_exact(src, struct.unpack_from(">I", head)[0] - 9))
            index = 0
            while not self.stop.is_set():
                prefix = recv_exact(src, RECORD_PREFIX)
                record = prefix + recv_exact(src, struct.unpack(">I", prefix)[0] + TAG)
                if way == "down" and index == self.k:
                    dst.sendall(record[:len(record) // 2])
                    self.held.set()
                    self.stop.wait()             # the rest, and what follows, is held
                    return
                dst.sendall(record)
                index += 1
        except (EOFError, OSError):
            pass

    def close(self):
        self.stop.set()
        self.listener.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(5)
        for s in self.keep:
            s.close()


def relay_to(producer, transport, k):
    """A HalfRelay to ``producer``, and the address its consumer dials.
    Over a Unix socket it takes the abstract name of a TCP port of its own
    (where an environment's Unix socket would be): everything runs in this
    process, so that the peers' process checks pass through it."""
    port = producer.address[1]
    tcp = socket.create_server(("127.0.0.1", 0))
    address = "127.0.0.1:{}".format(tcp.getsockname()[1])
    if transport == "tcp":
        return HalfRelay(tcp, lambda: socket.create_connection(("127.0.0.1", port)), k), address

    def upstream():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"\0flinkbuf-tcp-{port}")
        return s
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0flinkbuf-tcp-{}".format(tcp.getsockname()[1]))
    unix.listen(1)
    return HalfRelay(unix, upstream, k, keep=[tcp]), address   # (tcp's port names the relay)


def write(writer, n):
    """n records of 1500 bytes (ended by the writer's failure, at the end)."""
    try:
        for i in range(n):
            writer.emit(bytes([i]) * 1500)
        writer.flush()
    except Exception:                  # noqa: BLE001 - the consumer's side is what is checked
        pass


def read_until_failure(gate):
    """Iterate the gate until it raises: (records, error, when)."""
    got, error = 0, None
    try:
        for _ in gate:
            got += 1
    except RemoteConnectionError as exc:
        error = exc
    return got, error, time.monotonic()


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_relay_holding_half_a_sealed_record_fails_the_consumer_at_the_io_timeout(
        transport, k):
    kw = dict(secret=SECRET, transport=transport, encryption=True, io_timeout=IO_TIMEOUT)
    with NetworkEnvironment(64, SEG, **kw) as producer, \
            NetworkEnvironment(64, SEG, **kw) as consumer:
        part = create_partition(producer.network_buffer_pool, 1, min_buffers=8)
        producer.register_partition("p", part)
        relay, address = relay_to(producer, transport, k)
        writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.001)
        produce = threading.Thread(target=write, args=(writer, 20), daemon=True)
        try:
            gate = consumer.create_input_gate([(address, "p", 0)], codec="bytes")
            try:
                produce.start()
                assert relay.held.wait(10), "the relay never held a record"
                [stats] = consumer.connection_stats()
                t0 = time.monotonic()
                got, error, t1 = read_until_failure(gate)
            finally:
                gate.close()
        finally:
            relay.close()
            writer.fail(RuntimeError("done"))
            produce.join(10)
    assert stats["sealed"] and stats["transport"] == transport, stats
    assert error is not None and got < 20, got
    assert "in the middle of a frame" in str(error), str(error)
    assert t1 - t0 <= IO_TIMEOUT + SLACK, t1 - t0


class HalfSealedServer:
    """A producer's server over shared memory, spoken by hand in a thread:
    it passes the handshake with sealing, takes the client's partition
    request (sealed: not read) and writes half of its first sealed record
    into the ring, and nothing more."""

    def __init__(self):
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(f"\0flinkbuf-tcp-{self.port}")
        self.unix.listen(1)
        self.sent = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _run(self):
        sock, _ = self.unix.accept()
        with sock:
            sock.settimeout(30)
            hs = handshake.ServerHandshake(SECRET, self.address, SEG, seal=True,
                                           shared_memory=lambda: _shm_region(SEG),
                                           unix_peer=handshake.unix_peer(sock))
            while not hs.done:
                sock.sendall(hs.feed(sock.recv(handshake.MAX_FRAME)))
            memfd, data0, room0, data1, room1 = hs.shared_fds
            handshake.send_setup(sock, [memfd, data1, room1])
            os.close(data1)
            os.close(room1)
            ring = RingSocket(sock, memfd, data0, room0, side=0)
            try:
                record = Sealer(hs.keys[0]).seal(
                    wire_encode(("buffer", 1, 0, 0, 0, b"\0\0\0\3abc")))
                ring.sendall(record[:len(record) // 2])
                self.sent.set()
                self.done.wait(30)
            finally:
                ring.close()

    def close(self):
        self.done.set()
        self.thread.join(10)
        self.tcp.close()
        self.unix.close()


def test_a_peer_writing_half_a_sealed_record_over_shared_memory_fails_the_consumer_at_the_io_timeout():
    server = HalfSealedServer()
    try:
        with NetworkEnvironment(64, SEG, secret=SECRET, transport="shm", encryption=True,
                                io_timeout=IO_TIMEOUT) as consumer:
            gate = consumer.create_input_gate([(server.address, "p", 0)], codec="bytes")
            try:
                assert server.sent.wait(10)
                t0 = time.monotonic()
                [stats] = consumer.connection_stats()
                got, error, t1 = read_until_failure(gate)
            finally:
                gate.close()
    finally:
        server.close()
    assert stats["sealed"] and stats["transport"] == "shm", stats
    assert error is not None and got == 0
    assert "in the middle of a frame" in str(error), str(error)
    assert t1 - t0 <= IO_TIMEOUT + SLACK, t1 - t0
