"""Hostile peers against a server process that at the same time serves a
legitimate consumer process: wrong or no secret, garbage, silent clients,
and an authenticated peer sending a fuzzed frame stream.  The server
refuses (and logs) or closes the offending connection, keeps serving the
legitimate peer, never crashes, and allocates nothing past its caps."""

import os
import socket
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flinkbuf.errors import AuthenticationError
from flinkbuf.network import handshake
from network_helpers import (
    MSG_BUFFER,
    MSG_CLOSE,
    MSG_ERROR,
    SECRET,
    Children,
    buffer_frame,
    cancel_frame,
    connect_raw,
    credit_frame,
    error_frame,
    frame,
    parse_buffer,
    parse_error,
    read_frame,
    request_frame,
    split_frames,
    wait_closed,
)

# A thread of the engine that dies with an exception fails the test.  The
# hostile peers speak raw TCP to one server for the whole module.
pytestmark = [pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"),
              pytest.mark.one_transport]

SEG = 4096
CONNECT_TIMEOUT = 1.5
IO_TIMEOUT = 2.0
MB = 1 << 20
ALL = 0xFFFFFFFF


class Server:
    """A producer process serving "live" (endless records) to a legitimate
    consumer process, plus "spare" (64 subpartitions, finished, nothing in
    them) and "idle" (64 subpartitions nobody writes) for raw clients."""

    def __init__(self):
        self.children = Children()
        self.proc = self.children.start("producer", {
            "num_segments": 256, "segment_size": SEG, "connect_timeout": CONNECT_TIMEOUT,
            "io_timeout": IO_TIMEOUT,
            "partitions": [
                {"id": "live", "n": 1, "tag": 1, "mode": "endless", "size": 300,
                 "min_buffers": 8, "buffer_timeout": 0.001, "pace": 0.002},
                {"id": "spare", "n": 64, "tag": 2, "plan": []},
                {"id": "idle", "n": 64, "tag": 3, "mode": "idle"},
            ]}, life=240)
        hello = self.proc.expect("addr")
        self.address = hello["addr"]
        self.host, _, port = self.address.rpartition(":")
        self.sockaddr = (self.host, int(port))
        self.legit = self.children.start("consumer", {
            "num_segments": 32, "segment_size": SEG, "gates": [[[self.address, "live", 0]]],
            "report": "count", "progress": True}, life=240)
        self.count = 0
        self.next_idle = 0

    def served(self):
        """The legitimate consumer's record count now."""
        for m in self.legit.poll_messages():
            if "progress" in m:
                self.count = m["progress"][0]
            if "gate_error" in m:
                raise AssertionError(f"the legitimate consumer failed: {m}")
        return self.count

    def assert_still_serving(self):
        before = self.served()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if self.served() > before:
                break
        assert self.served() > before, "the legitimate consumer got nothing more"
        assert self.proc.proc.poll() is None, self.proc.stderr()[-3000:]

    def idle_subpartition(self):
        self.next_idle += 1
        assert self.next_idle < 64
        return self.next_idle

    def refusals(self):
        return self.proc.stderr().count("refused a connection")

    def shutdown(self):
        try:
            self.assert_still_serving()
            self.proc.send(cmd="close")
            closed = self.proc.expect("closed", 20)
            assert closed["counters"] in (None, {"standalone_segments": 0, "live_buffers": 0,
                                                 "segments_out": 0}), closed
            assert closed["threads"] == [], closed
            assert self.proc.wait_exit(10) == 0
            # The legitimate consumer sees its connection end, and cleans up.
            legit = self.legit.expect("results", 20)["results"][0]
            assert legit["error"]["type"] == "RemoteConnectionError", legit
            count, last, violations = legit["streams"][0]
            assert violations == 0 and count == last + 1, legit
            closed = self.legit.expect("closed", 20)
            assert closed["counters"] in (None, {"standalone_segments": 0, "live_buffers": 0,
                                                 "segments_out": 0}), closed
        finally:
            self.children.stop_all()


@pytest.fixture(scope="module")
def server():
    s = Server()
    s.legit.expect("progress", 20)
    yield s
    s.shutdown()


def raw(server, **kw):
    kw.setdefault("segment_size", SEG)
    return connect_raw(server.address, **kw)


def assert_refused_and_logged(server, before, timeout=CONNECT_TIMEOUT + 3):
    deadline = time.monotonic() + timeout
    while server.refusals() <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.refusals() > before, server.proc.stderr()[-2000:]


# ---- before the handshake ----------------------------------------------------------------

@pytest.mark.timeout(30)
def test_wrong_secret_is_refused(server):
    before = server.refusals()
    with pytest.raises(AuthenticationError, match="did not prove"):
        raw(server, secret=b"not-the-secret-but-long-enough!!")
    assert_refused_and_logged(server, before)
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_no_secret_is_refused(server):
    """An empty secret, and a peer that skips the handshake and asks for a
    partition at once: refused, nothing sent back."""
    before = server.refusals()
    with pytest.raises(AuthenticationError):
        raw(server, secret=b"")
    assert_refused_and_logged(server, before)
    before = server.refusals()
    with socket.create_connection(server.sockaddr, timeout=5) as s:
        s.sendall(request_frame(1, 0, 10, "live"))
        assert wait_closed(s, CONNECT_TIMEOUT + 2) == b""
    assert_refused_and_logged(server, before)
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_proof_replay_is_refused(server):
    """A client that answers the challenge with a proof it cannot have
    (HMAC with another key, or the server's own proof sent back)."""
    for forge in ("zeros", "echo"):
        before = server.refusals()
        with socket.create_connection(server.sockaddr, timeout=5) as s:
            s.sendall(frame(handshake.HELLO,
                            struct.pack(">H", handshake.VERSION) + os.urandom(32)))
            msg_id, body = read_frame(s)
            assert msg_id == handshake.CHALLENGE
            proof = bytes(32) if forge == "zeros" else body[34:66]
            addr = b"127.0.0.1:1"
            s.sendall(frame(handshake.AUTH, proof + struct.pack(">H", len(addr)) + addr
                            + struct.pack(">IB", SEG, handshake.STREAM)))
            assert wait_closed(s, CONNECT_TIMEOUT + 2) == b""
        assert_refused_and_logged(server, before)
    server.assert_still_serving()


GARBAGE = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "random": bytes(range(256)) * 4,
    "hello-huge-length": struct.pack(">IIB", 0xFFFFFFFF, 0x46425546, 16) + b"\0" * 64,
    "hello-short": struct.pack(">IIB", 12, 0x46425546, 16) + b"\0\1\2",
    "zero-length": struct.pack(">IIB", 0, 0x46425546, 16),
    "wrong-version": frame(16, struct.pack(">H", handshake.VERSION + 1) + bytes(32)),
    "auth-first": frame(18, bytes(32) + b"\0\0" + struct.pack(">IB", SEG, 0)),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_before_handshake_is_refused(server, name):
    before = server.refusals()
    t0 = time.monotonic()
    with socket.create_connection(server.sockaddr, timeout=5) as s:
        s.sendall(GARBAGE[name])
        got = wait_closed(s, CONNECT_TIMEOUT + 2)
    assert got == b"", got[:100]
    assert time.monotonic() - t0 < CONNECT_TIMEOUT + 2
    assert_refused_and_logged(server, before)
    server.assert_still_serving()


@pytest.mark.timeout(60)
@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_random_bytes_before_handshake(server, data):
    with socket.create_connection(server.sockaddr, timeout=5) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return
        got = wait_closed(s, CONNECT_TIMEOUT + 2)
    # Only a well-formed HELLO gets anything back (the challenge).
    for msg_id, _ in split_frames(got):
        assert msg_id == 17


@pytest.mark.timeout(30)
def test_silent_client_is_dropped_after_connect_timeout(server):
    t0 = time.monotonic()
    with socket.create_connection(server.sockaddr, timeout=5) as s:
        assert wait_closed(s, CONNECT_TIMEOUT + 3) == b""
    took = time.monotonic() - t0
    assert CONNECT_TIMEOUT - 0.3 <= took <= CONNECT_TIMEOUT + 2, took
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_many_silent_clients_do_not_stop_established_peers(server):
    """40 idle sockets (more than the 32 handshakes a server runs at once):
    the established legitimate peer goes on meanwhile, and once they are
    dropped new peers are accepted again."""
    idle = [socket.create_connection(server.sockaddr, timeout=5) for _ in range(40)]
    try:
        time.sleep(0.3)
        server.assert_still_serving()
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    raw(server).close()
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_new_peer_can_connect_while_silent_clients_wait(server):
    idle = [socket.create_connection(server.sockaddr, timeout=5) for _ in range(40)]
    try:
        time.sleep(0.3)
        raw(server).close()
    finally:
        for s in idle:
            s.close()
        time.sleep(CONNECT_TIMEOUT)


# ---- after the handshake: protocol errors -----------------------------------------------

def expect_protocol_error(server, data, reason, *, before=b""):
    """Send ``before`` + ``data`` on an authenticated connection: the server
    answers ERROR_RESPONSE (whole connection, code 4) naming ``reason``,
    then closes."""
    with raw(server) as s:
        s.sendall(before + data)
        got = wait_closed(s, 5)
    frames = split_frames(got)
    errors = [parse_error(body) for msg_id, body in frames if msg_id == MSG_ERROR]
    assert errors, f"no error response before the close: {frames}"
    receiver, code, type_name, message = errors[-1]
    assert (receiver, code, type_name) == (ALL, 4, "ProtocolError"), errors[-1]
    assert reason in message, message
    return frames


PROTOCOL_ERRORS = {
    "wrong-magic": (frame(6, bytes(8), magic=0x12345678), "wrong magic"),
    "unknown-message": (frame(3), "unknown message id 3"),
    "unknown-message-255": (frame(255, b"xyz"), "unknown message id 255"),
    "length-below-header": (frame(6, b"", length=5), "frame length 5"),
    "credit-of-zero": (credit_frame(1, 0), "credit of 0"),
    "credit-too-large": (credit_frame(1, 0x80000000), "credit of"),
    "credit-wrong-length": (frame(6, bytes(9)), "for message 6"),
    "cancel-wrong-length": (frame(4, bytes(3)), "for message 4"),
    "close-with-body": (frame(5, b"x"), "close request"),
    "buffer-never-issued": (buffer_frame(1, 0, 0, 0, b"abc"), "never issued"),
    "buffer-oversized": (buffer_frame(1, 0, 0, 0, b"", size=SEG + 1, length=9 + 17 + SEG + 1),
                         "buffer response frame"),
    "buffer-huge-length": (frame(MSG_BUFFER, b"", length=0xFFFFFFFF), "buffer response frame"),
    "buffer-short": (frame(MSG_BUFFER, bytes(10)), "buffer response frame"),
    "error-huge-length": (frame(MSG_ERROR, b"", length=1 << 30), "error response frame"),
    "error-malformed": (frame(MSG_ERROR, struct.pack(">IBH", 1, 1, 500) + bytes(10)),
                        "malformed error"),
    "request-id-too-long": (request_frame(9, 0, 1, "x" * 1025), "partition request frame"),
    "request-malformed": (frame(2, struct.pack(">IIIH", 9, 0, 1, 50) + b"abc"),
                          "malformed partition request"),
    "request-reserved-id": (request_frame(ALL, 0, 1, "live"), "reserved"),
    "request-credit-too-large": (request_frame(9, 0, 0x80000000, "nope"), "initial credit"),
    # well-formed, but this connection mapped no arena of the peer's, and lent nothing
    "buffer-lent": (frame(8, struct.pack(">IIIBII", 1, 0, 0, 0, 16, 3)), "no arena of the peer"),
    "release": (frame(9, struct.pack(">III", ALL, 1, 3)), "which was not lent"),
    "release-malformed": (frame(9, struct.pack(">III", ALL, 2, 3)), "release of 2 segments"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(PROTOCOL_ERRORS))
def test_protocol_error_closes_only_that_connection(server, name):
    data, reason = PROTOCOL_ERRORS[name]
    expect_protocol_error(server, data, reason)
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_credit_overflow_on_a_served_channel(server):
    sub = server.idle_subpartition()
    expect_protocol_error(server, credit_frame(5, 0x7FFFFFFF), "credit overflow",
                          before=request_frame(5, sub, 1, "idle"))
    server.assert_still_serving()


@pytest.mark.timeout(30)
def test_requests_that_cannot_be_served_are_refused_not_fatal(server):
    """Refusals (code 5: a subpartition with a reader already, one out of
    range, a receiver id in use) and not-found (code 2) answer the request
    and keep the connection; then a valid request on it is served."""
    sub = server.idle_subpartition()
    with raw(server) as s:
        s.sendall(request_frame(1, 0, 1, "live")          # the legitimate peer's
                  + request_frame(2, 64, 1, "spare")      # out of range
                  + request_frame(3, 0, 1, "no-such-partition")
                  + request_frame(4, sub, 1, "idle")      # served
                  + request_frame(4, sub + 1, 1, "idle"))  # receiver id in use
        answers = {}
        for _ in range(4):
            msg_id, body = read_frame(s)
            assert msg_id == MSG_ERROR, (msg_id, body)
            receiver, code, _, message = parse_error(body)
            answers[receiver] = (code, message)
        assert answers[1][0] == 5 and "already has a reader" in answers[1][1], answers
        assert answers[2][0] == 5 and "64 subpartitions" in answers[2][1], answers
        assert answers[3][0] == 2, answers
        assert answers[4][0] == 5 and "in use" in answers[4][1], answers
        # The spare partition is finished: a request is served its end.
        s.sendall(request_frame(7, server.idle_subpartition(), 1, "spare"))
        msg_id, body = read_frame(s)
        assert msg_id == MSG_BUFFER, (msg_id, body)
        receiver, seq, backlog, data_type, data = parse_buffer(body)
        assert (receiver, seq, data_type, data) == (7, 0, 1, b"\x00")
        s.sendall(frame(MSG_CLOSE))
        assert wait_closed(s, 5) == b""
    server.assert_still_serving()


# ---- after the handshake: fuzzed frame streams -----------------------------------------------

u32 = st.integers(0, 0xFFFFFFFF)
small_id = st.one_of(st.integers(0, 8), u32)


def _frames():
    text = st.text(max_size=12)
    return st.one_of(
        st.builds(credit_frame, small_id, st.one_of(st.just(0), st.integers(1, 5), u32)),
        st.builds(cancel_frame, small_id),
        st.builds(request_frame, small_id, st.integers(0, 70), u32,
                  st.one_of(st.sampled_from(["live", "spare", "idle", "nope"]), text)),
        st.builds(lambda r, q, b, t, d: buffer_frame(r, q, b, t, d), small_id, u32, u32,
                  st.integers(0, 3), st.binary(max_size=40)),
        st.builds(error_frame, small_id, st.integers(0, 255), text, text),
        st.builds(lambda i, body, n: frame(i, body, length=n), st.integers(0, 255),
                  st.binary(max_size=30), st.one_of(u32, st.integers(0, 60))),
        st.builds(lambda i, body, m: frame(i, body, magic=m), st.integers(0, 7),
                  st.binary(max_size=20), u32),
        st.binary(min_size=1, max_size=50),
    )


@pytest.mark.timeout(120)
@settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_frames(), min_size=1, max_size=8))
def test_fuzzed_frame_stream_closes_only_that_connection(server, frames):
    """Any frame stream from an authenticated peer, followed by 70 KB of
    0xFF (a wrong magic number whatever frame it lands in): the server
    closes that connection within the I/O timeout, what it sent before is
    frames, and the legitimate peer is still served."""
    rss_before = server.proc.rss()
    with raw(server) as s:
        try:
            s.sendall(b"".join(frames) + b"\xff" * 70000)
        except OSError:
            pass                       # closed already
        got = wait_closed(s, IO_TIMEOUT + 3)
    frames_back = split_frames(got)
    for k, (msg_id, body) in enumerate(frames_back):
        # a CLOSE_REQUEST may only end it (after the error that says why)
        assert msg_id in (MSG_BUFFER, MSG_ERROR) or (
            msg_id == MSG_CLOSE and k == len(frames_back) - 1), msg_id
        if msg_id == MSG_ERROR:
            assert parse_error(body)[1] in (1, 2, 3, 4, 5)
    assert server.proc.proc.poll() is None, server.proc.stderr()[-3000:]
    assert server.proc.rss() < rss_before + 30 * MB
    assert server.served() >= 0


@pytest.mark.timeout(30)
def test_server_survived_fuzzing(server):
    """After everything above: the server still serves, new authenticated
    peers are accepted, and its memory is bounded."""
    raw(server).close()
    server.assert_still_serving()
    assert server.proc.rss() < 200 * MB


@pytest.mark.timeout(60)
def test_request_flood_from_a_peer_that_does_not_read_is_bounded():
    children = Children()
    try:
        server = children.start("producer", {
            "num_segments": 16, "segment_size": SEG,
            "partitions": [{"id": "x", "n": 1, "tag": 1, "mode": "idle"}]})
        addr = server.address()
        time.sleep(0.2)
        before = server.rss()
        batch = b"".join(request_frame(1000 + k, 0, 1, "no-such-partition")
                         for k in range(10000))
        with connect_raw(addr, segment_size=SEG, rcvbuf=4096) as s:
            s.settimeout(3)
            try:
                for _ in range(40):              # 400,000 requests, 11 MB
                    s.sendall(batch)
            except OSError:
                pass                             # it stopped reading, or closed: fine
            time.sleep(0.5)
            grown = server.rss() - before
        assert server.proc.poll() is None
        assert grown < 20 * MB, f"the server grew by {grown / MB:.0f} MB"
    finally:
        children.stop_all()
