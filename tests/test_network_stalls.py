"""A thread that reads a connection on others' behalf never waits on it
longer than its own wait.  An authenticated peer (it has the secret) that
drips a frame a byte at a time, or floods requests and never reads the
answers, into the connection that a producer's thread reads while it waits
for a buffer, or that a consumer's thread reads while it waits on its gate,
must not stop the records of anyone else: a healthy consumer of the same
producer, or the other channels of the same gate, get records all along."""

import os
import socket
import threading
import time

import pytest

from flinkbuf.network import handshake
from flinkbuf.network._network import _shm_region
from network_helpers import SECRET, RingSocket, frame, request_frame

SEG = 4096
IO_TIMEOUT = 30.0        # far longer than the tests: a stall is never ended by it
MAX_GAP = 1.0            # the longest a healthy consumer may go without a record
FIRST_WITHIN = 10.0      # a child's start, import and connects on a loaded machine; a
                         # stall lasts until IO_TIMEOUT


TRANSPORTS = ["tcp", "unix", "shm"]


def connect_as_peer(address, transport):
    """A socket (or, over shared memory, a RingSocket) to the environment at
    ``address`` past the handshake, over TCP, its Unix socket or shared
    memory, sending whatever the test wants from then on."""
    host, _, port = address.rpartition(":")
    if transport in ("unix", "shm"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"\0flinkbuf-tcp-{port}")
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.connect((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    _, _, fds, _ = handshake.client(sock, SECRET, "127.0.0.1:1", SEG, 5.0,
                                 shared_memory=transport == "shm")
    if fds is not None:
        for lent in fds[3:]:            # the server's arena and ledger: this peer borrows nothing
            os.close(lent)
    peer = sock if fds is None else RingSocket(sock, *fds[:3], side=1)
    peer.settimeout(5.0)
    return peer


def accept_as_peer(sock, address, transport):
    """The server's side of the handshake on an accepted socket (a
    RingSocket over shared memory when the client asks for it)."""
    if transport != "shm":
        handshake.server(sock, SECRET, address, SEG, 5.0)
        return sock
    hs = handshake.ServerHandshake(SECRET, address, SEG,
                                   shared_memory=lambda: _shm_region(SEG),
                                   unix_peer=handshake.unix_peer(sock))
    sock.settimeout(5.0)
    while not hs.done:
        sock.sendall(hs.feed(sock.recv(handshake.MAX_FRAME)))
    memfd, data0, room0, data1, room1 = hs.shared_fds
    handshake.send_setup(sock, [memfd, data1, room1])
    os.close(data1)
    os.close(room1)
    return RingSocket(sock, memfd, data0, room0, side=0)


class Progress:
    """A consumer child's record count, sampled as it reports (every 50 ms):
    the longest time the count stood still."""

    def __init__(self, child, index=0):
        self.child, self.index = child, index
        self.count, self.since = 0, time.monotonic()
        self.longest = 0.0

    def sample(self):
        now = time.monotonic()
        for m in self.child.poll_messages():
            if "gate_error" in m or "error" in m:
                raise AssertionError(f"the healthy consumer failed: {m}")
            if "progress" in m and m["progress"][self.index] > self.count:
                self.count = m["progress"][self.index]
                self.since = now
        self.longest = max(self.longest, now - self.since)

    def watch(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.05)
            self.sample()

    def reset(self):
        self.sample()
        self.longest = 0.0

    def first(self, what):
        """Wait (at most FIRST_WITHIN) for the child's first record, then
        watch for gaps from there on."""
        end = time.monotonic() + FIRST_WITHIN
        while not self.count and time.monotonic() < end:
            time.sleep(0.05)
            self.sample()
        assert self.count > 0, f"{what} delivered nothing in {FIRST_WITHIN} s"
        self.reset()


def producer_with_a_peer_as_pool_waiter(children, transport):
    """A producer writing endlessly to subpartition 0 of "p" for a healthy
    consumer, whose pool's waiter (the connection its thread reads while it
    waits for a buffer) is a hostile peer's: that peer requested
    subpartition 1 first, with no credit."""
    prod = children.start("producer", {
        "num_segments": 64, "segment_size": SEG, "io_timeout": IO_TIMEOUT,
        "partitions": [{"id": "p", "n": 2, "tag": 1, "mode": "endless", "size": 200,
                        "selector": "global", "min_buffers": 4}]}, life=120)
    address = prod.expect("addr")["addr"]
    peer = connect_as_peer(address, transport)
    peer.sendall(request_frame(1, 1, 0, "p"))
    time.sleep(0.3)                     # served: its connection became the pool's waiter
    consumer = children.start("consumer", {
        "num_segments": 32, "segment_size": SEG, "io_timeout": IO_TIMEOUT, "exclusive": 1,
        "floating": 0, "gates": [[[address, "p", 0]]], "report": "count", "progress": True},
        life=120)
    progress = Progress(consumer)
    progress.first("the healthy consumer")
    return prod, peer, progress


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_peer_dripping_a_frame_into_the_pools_waiter_stops_nobody(children, transport):
    _, peer, progress = producer_with_a_peer_as_pool_waiter(children, transport)
    credit = frame(6, (1).to_bytes(4, "big") + (1).to_bytes(4, "big"))
    try:
        for byte in credit[:7]:          # 7 bytes of a frame, one at a time
            peer.send(bytes([byte]))
            progress.watch(0.8)
        assert progress.longest < MAX_GAP, (
            f"the healthy consumer waited {progress.longest:.1f} s for a record")
        before = progress.count
        progress.watch(1.0)
        assert progress.count > before
    finally:
        peer.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_peer_flooding_requests_into_the_pools_waiter_stops_nobody(children, transport):
    """Requests in small bursts that the peer never answers' reads: once
    the producer's answers fill the socket, the control queue fills, and the
    request that finds it full must not hold up the producer's thread."""
    _, peer, progress = producer_with_a_peer_as_pool_waiter(children, transport)
    burst = b"".join(request_frame(1000 + k, 0, 1, "no-such-partition") for k in range(100))
    stop = threading.Event()

    def flood():
        peer.settimeout(0.2)
        while not stop.wait(0.005):      # it never reads the answers
            try:
                peer.sendall(burst)
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                return

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        progress.watch(10.0)
        assert progress.longest < MAX_GAP, (
            f"the healthy consumer waited {progress.longest:.1f} s for a record")
    finally:
        stop.set()
        t.join(5)
        peer.close()


class DrippingProducer:
    """A hostile server: it passes the handshake, takes one partition
    request, sends the first `head` bytes of a buffer response for it, then
    one more byte every `interval` s (never the whole frame)."""

    def __init__(self, transport, head=20, interval=0.8):
        self.transport, self.head, self.interval = transport, head, interval
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.unix = None
        if transport in ("unix", "shm"):
            self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.unix.bind(f"\0flinkbuf-tcp-{self.port}")
            self.unix.listen(4)
        self.stop = threading.Event()
        self.conns = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _run(self):
        sock, _ = (self.unix or self.listener).accept()
        self.conns.append(sock)
        sock = accept_as_peer(sock, self.address, self.transport)
        self.conns.append(sock)
        sock.settimeout(5.0)
        header = sock.recv(9)
        body = b""
        while len(body) < int.from_bytes(header[:4], "big") - 9:
            body += sock.recv(4096)
        receiver = body[:4]
        # Let the consumer's thread, waiting on its gate, read this
        # connection itself before anything comes.
        if self.stop.wait(1.0):
            return
        payload = b"x" * 100
        fields = receiver + (0).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"\x00" \
            + len(payload).to_bytes(4, "big")
        data = frame(0, fields + payload)
        sock.sendall(data[:self.head])
        for byte in data[self.head:-1]:
            if self.stop.wait(self.interval):
                return
            sock.send(bytes([byte]))

    def close(self):
        self.stop.set()
        for s in [*self.conns, self.listener, self.unix]:
            if s is not None:
                s.close()


@pytest.mark.parametrize("head", [5, 20, 40], ids=["in-header", "in-fields", "in-body"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_producer_stalled_mid_frame_pauses_no_other_channel_of_the_gate(children, transport,
                                                                          head):
    """The stalled producer's channel is the gate's first (its connection is
    the one the consumer's thread reads while it waits); the other channel,
    from a healthy producer, keeps delivering."""
    hostile = DrippingProducer(transport, head=head)
    try:
        prod = children.start("producer", {
            "num_segments": 64, "segment_size": SEG, "io_timeout": IO_TIMEOUT,
            "partitions": [{"id": "live", "n": 1, "tag": 1, "mode": "endless", "size": 200,
                            "pace": 0.002, "buffer_timeout": 0.001}]}, life=120)
        healthy = prod.expect("addr")["addr"]
        consumer = children.start("consumer", {
            "num_segments": 32, "segment_size": SEG, "io_timeout": IO_TIMEOUT,
            "gates": [[[hostile.address, "p", 0], [healthy, "live", 0]]],
            "report": "count", "progress": True}, life=120)
        progress = Progress(consumer)
        progress.first("the healthy channel")
        progress.watch(5.0)
        assert progress.longest < MAX_GAP, (
            f"the gate waited {progress.longest:.1f} s for a record of the healthy channel")
    finally:
        hostile.close()
