"""The same-host socket cannot be squatted.  A server listens on an abstract
Unix socket whose name derives from its TCP port, so any local process can
bind that name first.  Whoever holds it, of this user or of another one,
relaying, refusing or silent, reads no record and alters none: the client
checks the user at the other end before it sends anything, both sides bind
their handshake to the process the kernel says is at the other end
(``SO_PEERCRED``), and the client falls back to the server's TCP port, where
the exchange completes."""

import logging
import os
import pwd
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.errors import AuthenticationError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from helpers import run_in_thread, wait_until

pytestmark = pytest.mark.one_transport

SECRET = b"squat-test-secret-0123456789abcdef"
SEG = 4096
MARKER = b"record-marker-a-squatter-must-never-see"
SQUATTER = Path(__file__).with_name("squatter.py")


def _nobody():
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _free_port():
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


class Squatter:
    """tests/squatter.py on a fresh port, in its own process, as ``uid``
    (None: this process's user)."""

    def __init__(self, tmp_path, mode, uid=None):
        self.port = _free_port()
        self.capture = tmp_path / "captured"
        self.capture.touch()
        if uid is not None:
            os.chown(tmp_path, uid, -1)
            os.chown(self.capture, uid, -1)
        args = [sys.executable, str(SQUATTER), str(self.port), mode, str(self.capture)]
        if uid is not None:
            args.append(str(uid))
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def captured(self):
        return self.capture.read_bytes()

    def close(self):
        self.proc.kill()
        self.proc.wait(10)


def _records(n):
    return [(i, MARKER + bytes([i % 251]) * (i % 300)) for i in range(n)]


def _exchange(producer, consumer, n=3000):
    part = create_partition(producer.network_buffer_pool, 1, min_buffers=8)
    producer.register_partition("p", part)
    writer = RecordWriter(part, "round_robin", buffer_timeout=0.001)
    sent = _records(n)

    def produce():
        for r in sent:
            writer.emit(r)
        writer.close()

    t, res = run_in_thread(produce)
    gate = consumer.create_input_gate([(producer.address, "p", 0)])
    try:
        got = list(gate)
    finally:
        gate.close()
    t.join(30)
    assert "error" not in res, res
    return sent, got


def _envs(port, transport, **kw):
    kw = dict(secret=SECRET, transport=transport, connect_timeout=3.0, io_timeout=10.0,
              request_timeout=10.0, **kw)
    return NetworkEnvironment(64, SEG, port=port, **kw), NetworkEnvironment(64, SEG, **kw)


SQUATTERS = [("relay", "same"), ("refuse", "same"), ("silent", "same"), ("relay", "other"),
             ("refuse", "other")]


@pytest.mark.parametrize("transport", ["unix", "shm"])
@pytest.mark.parametrize("mode,user", SQUATTERS)
def test_a_squatter_on_the_socket_name_reads_nothing_and_the_exchange_goes_over_tcp(
        tmp_path, transport, mode, user, caplog):
    if user == "other" and os.geteuid() != 0:
        pytest.skip("a squatter of another user needs root to start it")
    squatter = Squatter(tmp_path, mode, None if user == "same" else _nobody())
    try:
        caplog.set_level(logging.INFO, logger="flinkbuf.network")
        producer, consumer = _envs(squatter.port, transport)
        with producer, consumer:
            sent, got = _exchange(producer, consumer)
            assert got == sent                            # nothing lost, nothing altered
            assert [s["transport"] for s in consumer.connection_stats()] == ["tcp"]
            assert [s["transport"] for s in producer.connection_stats()] == ["tcp"]
        seen = squatter.captured()
        assert MARKER not in seen
        if user == "other":
            assert seen == b""                            # refused before the first byte
            assert "runs as another user" in caplog.text
        elif mode == "relay":
            # The server saw an AUTH made for a Unix socket arrive over TCP.
            assert "another process relayed it" in caplog.text
        assert "connecting over TCP" in caplog.text
    finally:
        squatter.close()


def test_a_squatter_of_another_user_cannot_reach_a_server(tmp_path, caplog):
    """A process of another user that connects to the server's Unix socket
    gets no challenge: it is refused at its HELLO, and the server says why."""
    if os.geteuid() != 0:
        pytest.skip("a client of another user needs root to start it")
    caplog.set_level(logging.WARNING, logger="flinkbuf.network")
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="unix") as server:
        script = (
            "import os, socket, struct, sys\n"
            f"os.setgid({_nobody()}); os.setuid({_nobody()})\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "s.settimeout(10)\n"
            f"s.connect('\\0flinkbuf-tcp-{server.address[1]}')\n"
            f"s.sendall(struct.pack('>IIB', 43, {handshake.MAGIC}, {handshake.HELLO})"
            f" + struct.pack('>H', {handshake.VERSION}) + os.urandom(32))\n"
            "sys.stdout.write(repr(s.recv(100)))\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        assert out == "b''"
        assert wait_until(lambda: "runs as another user (uid" in caplog.text, 5)
        assert server.connection_stats() == []


def _unix_client(server, tail):
    """Run a handshake with the server's Unix socket by hand, saying
    ``tail`` in AUTH with a valid proof; the server's reply (b'' if it
    closed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(f"\0flinkbuf-tcp-{server.address[1]}")
        nonce = os.urandom(handshake.NONCE)
        s.sendall(handshake._frame(handshake.HELLO, struct.pack(">H", handshake.VERSION) + nonce))
        body = handshake._recv(s, handshake.CHALLENGE, time.monotonic() + 5)
        server_nonce = body[2:2 + handshake.NONCE]
        proof = handshake._proof(SECRET, b"flinkbuf-client", server_nonce, nonce, tail)
        s.sendall(handshake._frame(handshake.AUTH, proof + tail))
        try:
            return s.recv(1024)
        except ConnectionResetError:
            return b""


@pytest.mark.parametrize("claim", ["another pid", "not local"])
def test_the_server_refuses_a_proven_auth_that_another_process_sent(claim, caplog):
    """Over its Unix socket the server takes an AUTH only from the process
    the kernel says is at the other end: one that says another pid, or
    that it was sent over TCP, was relayed (by whoever holds the name) and
    is refused, though its proof is right."""
    caplog.set_level(logging.WARNING, logger="flinkbuf.network")
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="unix") as server:
        if claim == "another pid":
            tail = handshake.Said("127.0.0.1:1", SEG, handshake.STREAM, handshake.LOCAL,
                                  os.getpid() + 1).encode()
        else:
            tail = handshake.Said("127.0.0.1:1", SEG, handshake.STREAM, 0, 0).encode()
        assert _unix_client(server, tail) == b""
        assert wait_until(lambda: "another process holds this host's socket name" in caplog.text,
                          5)
        # The same handshake, honest, is accepted.
        honest = handshake._tail("127.0.0.1:1", SEG, handshake.STREAM, local=True)
        reply = _unix_client(server, honest)
        assert reply[8] == handshake.AUTH_OK


@pytest.mark.parametrize("lie", ["pid", "uid"])
def test_the_client_refuses_a_server_that_is_not_the_process_at_the_other_end(
        lie, monkeypatch):
    """The client checks the user at the other end of its Unix socket before
    it sends a byte, and that the server's proven AUTH_OK names the process
    at the other end: when the kernel names another one, it refuses."""
    cs, ss = socket.socketpair()
    with cs, ss:
        hs = handshake.ServerHandshake(SECRET, "server:1", SEG,
                                       unix_peer=handshake.unix_peer(ss))
        pid, uid = handshake.unix_peer(cs)
        fake = (pid + 1, uid) if lie == "pid" else (pid, uid + 1)
        monkeypatch.setattr(handshake, "unix_peer", lambda sock: fake)

        def serve():
            while not hs.done:
                data = ss.recv(handshake.MAX_FRAME)
                if not data:
                    return
                ss.sendall(hs.feed(data))

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with pytest.raises(AuthenticationError) as err:
            handshake.client(cs, SECRET, "client:2", SEG, 5.0)
        cs.close()
        t.join(5)
        if lie == "pid":
            assert "is not the process at the other end" in str(err.value)
            assert hs.done                                  # refused after AUTH_OK
        else:
            assert "runs as another user" in str(err.value)
            assert not hs.done and hs._client_nonce is None  # not a byte was sent


@given(st.text(max_size=50), st.integers(0, 2**32 - 1),
       st.sampled_from([handshake.STREAM, handshake.SHARED_MEMORY]),
       st.booleans(), st.one_of(st.none(), st.integers(1, 2**32 - 1)))
def test_what_a_side_says_round_trips(address, segment_size, transport, sealed, pid):
    flags = (handshake.SEALED if sealed else 0) | (handshake.LOCAL if pid else 0)
    said = handshake.Said(address, segment_size, transport, flags, pid or 0)
    back = handshake.Said.decode(said.encode(), "test")
    assert (back.address, back.segment_size, back.transport, back.flags, back.pid) == (
        address, segment_size, transport, flags, pid or 0)


@given(st.binary(max_size=80))
def test_any_bytes_are_what_a_side_says_or_refused_as_malformed(body):
    try:
        said = handshake.Said.decode(body, "test")
    except AuthenticationError as exc:
        assert "a malformed test" in str(exc)
    else:
        assert said.encode() == body          # one encoding per value: nothing else passes
        assert (said.pid != 0) == bool(said.flags & handshake.LOCAL)
