"""The reading side against a hostile (or merely third-party) producer: a
fake producer's server in a thread speaks docs/PROTOCOL.md byte by byte to
an input gate of a NetworkEnvironment in this process.  Protocol errors
(sequence gaps, data without credit, unknown receivers, oversized or
malformed frames, stalls) fail the channel with a clear error, errors the
producer sends arrive as their exceptions, and every buffer goes back
(the no_leaks fixture)."""

import os
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flinkbuf.errors as fe
from flinkbuf.io import UserEvent
from flinkbuf.network import NetworkEnvironment, handshake
from helpers import run_in_thread
from network_helpers import (
    EVENT_WINDOW,
    MSG_CANCEL,
    MSG_CREDIT,
    MSG_EVENT_CREDIT,
    MSG_ERROR,
    MSG_REQUEST,
    SECRET,
    buffer_frame,
    error_frame,
    event_bytes,
    frame,
    heartbeat_answer,
    parse_error,
    recv_exact,
)

# A thread of the engine that dies with an exception fails the test.
# A fake producer speaks the wire format in plaintext to a real consumer.
pytestmark = [pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"),
              pytest.mark.plaintext_wire]

SEG = 256
ALL = 0xFFFFFFFF
END = b"\x00"


def stream_of(records):
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def chunks(data, size=SEG):
    return [data[i:i + size] for i in range(0, len(data), size)]


class FakeProducer:
    """A server in a thread that authenticates one client, then runs
    ``scenario(self)``; afterwards it reads what the client sends until it
    closes.  Sending data buffers with ``send_data`` honours the credit the
    client granted (waiting for ADD_CREDIT), and events with ``send_event``
    the event window (waiting for ADD_EVENT_CREDIT)."""

    def __init__(self, scenario, *, seg=SEG):
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(10)
        self.address = f"127.0.0.1:{self.srv.getsockname()[1]}"
        self.seg = seg
        self.scenario = scenario
        self.error = None
        self.requests = []
        self.credits = []
        self.cancels = []
        self.errors = []
        self.credit = 0
        self.event_credit = 0
        self.seq = 0
        self.receiver = None
        self.closed = threading.Event()
        self.sent = threading.Event()
        self.sock = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="nettest-fake")
        self.thread.start()

    def _run(self):
        try:
            self.sock, _ = self.srv.accept()
            handshake.server(self.sock, SECRET, self.address, self.seg, 5)
            self.sock.settimeout(10)
            try:
                self.scenario(self)
            finally:
                self.sent.set()
            self.drain(10)
        except BaseException as exc:   # noqa: BLE001 - checked by the test
            self.error = exc
        finally:
            self.closed.set()
            if self.sock is not None:
                self.sock.close()
            self.srv.close()

    def _frame(self, timeout):
        self.sock.settimeout(timeout)
        length, magic, msg_id = struct.unpack(">IIB", recv_exact(self.sock, 9, timeout))
        assert magic == 0x46425546 and 9 <= length <= 2000, (length, magic)
        body = recv_exact(self.sock, length - 9, timeout)
        answer = heartbeat_answer(msg_id, body)      # as a peer's connection threads do
        if answer is not None:
            self.send(answer)
        if msg_id == MSG_CREDIT:
            receiver, n = struct.unpack(">II", body)
            assert n > 0
            self.credits.append((receiver, n))
            if receiver == self.receiver:
                self.credit += n
        elif msg_id == MSG_EVENT_CREDIT:
            receiver, n = struct.unpack(">II", body)
            assert n > 0
            if receiver == self.receiver:
                self.event_credit += n
        elif msg_id == MSG_CANCEL:
            self.cancels.append(struct.unpack(">I", body)[0])
        elif msg_id == MSG_ERROR:
            self.errors.append(parse_error(body))
        elif msg_id == MSG_REQUEST:
            receiver, sub, credit, n = struct.unpack_from(">IIIH", body)
            req = {"receiver": receiver, "sub": sub, "credit": credit,
                   "partition": body[14:14 + n].decode()}
            self.requests.append(req)
            return msg_id, req
        return msg_id, body

    def request(self, timeout=5):
        """The next PARTITION_REQUEST: it becomes the channel served."""
        while True:
            msg_id, req = self._frame(timeout)
            if msg_id == MSG_REQUEST:
                self.receiver, self.credit, self.seq = req["receiver"], req["credit"], 0
                self.event_credit = EVENT_WINDOW
                return req

    def wait_credit(self, timeout=5):
        deadline = time.monotonic() + timeout
        while self.credit <= 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("the reader granted no credit")
            self._frame(remaining)

    def send(self, *frames):
        self.sock.sendall(b"".join(frames))

    def send_data(self, data, backlog=0):
        self.wait_credit()
        self.credit -= 1
        self.send(buffer_frame(self.receiver, self.seq, backlog, 0, data))
        self.seq += 1

    def send_event(self, data, *, window=True):
        """An event; with ``window`` only when the event window allows
        (waiting for ADD_EVENT_CREDIT), else regardless."""
        if window:
            deadline = time.monotonic() + 10
            while self.event_credit <= 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError("the reader granted no event credit")
                self._frame(remaining)
            self.event_credit -= 1
        self.send(buffer_frame(self.receiver, self.seq, 0, 1, data))
        self.seq += 1

    def drain(self, timeout):
        """Read until the client closes (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                self._frame(remaining)
            except (EOFError, ConnectionError, OSError, TimeoutError):
                return

    def join(self, timeout=15, closed=False):
        """The scenario ran (and, with ``closed``, the client closed)."""
        assert self.sent.wait(timeout), "the fake producer's scenario did not finish"
        if closed:
            assert self.closed.wait(5), "the client did not close the connection"


@pytest.fixture
def env():
    e = NetworkEnvironment(64, SEG, secret=SECRET, exclusive_buffers_per_channel=2,
                           floating_buffers_per_gate=2, io_timeout=1.0, request_timeout=4.0)
    yield e
    e.close()


def read_all(gate, timeout=10.0):
    """(items, error) of iterating ``gate`` in a thread, bounded."""
    items = []

    def run():
        while True:
            try:
                _, item = gate.next_with_channel()
            except StopIteration:
                return
            items.append(item)

    t, result = run_in_thread(run)
    t.join(timeout)
    if t.is_alive():
        gate.close()
        t.join(5)
        raise AssertionError(f"the gate did not end within {timeout} s ({len(items)} items)")
    return items, result.get("error")


def consume(env, fake, timeout=10.0, *, after_sent=False):
    """Read the fake's partition; with ``after_sent``, only once the fake
    sent everything (so nothing is recycled before)."""
    gate = env.create_input_gate([(fake.address, "p", 0)], codec="bytes")
    try:
        if after_sent:
            assert fake.sent.wait(10)
            time.sleep(0.1)
        items, err = read_all(gate, timeout)
        if err is not None:
            # Let the connection's reader thread finish giving buffers back
            # before the gate's pools go (engine bug, see
            # test_dropping_a_gate_as_soon_as_its_connection_fails).
            time.sleep(0.05)
        return items, err
    finally:
        gate.close()


# ---- a conforming fake: the harness speaks the protocol ----------------------------------

def test_fake_producer_is_understood(env):
    """Records split across data buffers at any byte, an event, the end:
    a third-party producer that follows docs/PROTOCOL.md is read right,
    and the reader's credit never lets the sender overrun it."""
    records = [bytes([k]) * (k * 37 % 600) for k in range(40)]

    def scenario(fp):
        req = fp.request()
        assert (req["sub"], req["partition"], req["credit"]) == (0, "p", 2)
        parts = chunks(stream_of(records[:20]), 100) + chunks(stream_of(records[20:]))
        for k, c in enumerate(parts):
            fp.send_data(c, backlog=len(parts) - k - 1)
            if k == 3:
                fp.send_event(event_bytes("mid"))
        fp.send_event(END)

    fake = FakeProducer(scenario)
    items, err = consume(env, fake)
    fake.join()
    assert fake.error is None, fake.error
    assert err is None, err
    assert [i for i in items if isinstance(i, bytes)] == records
    assert UserEvent("mid") in items
    assert fake.cancels == []            # the stream ended: nothing to cancel


# ---- protocol errors: the channel fails, the peer is told -------------------------------

def _bad(fp, kind):
    req = fp.request()
    r = req["receiver"]
    if kind == "sequence-gap":
        fp.send(buffer_frame(r, 0, 0, 0, b"\0\0\0\1a"), buffer_frame(r, 2, 0, 0, b"\0\0\0\1b"))
    elif kind == "data-without-credit":
        for seq in range(req["credit"] + 1):
            fp.send(buffer_frame(r, seq, 0, 0, b"\0\0\0\1x"))
    elif kind == "never-issued-receiver":
        fp.send(buffer_frame(r + 1000, 0, 0, 0, b"\0\0\0\1x"))
    elif kind == "receiver-zero":
        fp.send(buffer_frame(0, 0, 0, 0, b"\0\0\0\1x"))
    elif kind == "oversized-buffer":
        fp.send(buffer_frame(r, 0, 0, 0, bytes(SEG + 1)))
    elif kind == "oversized-event":
        fp.send(buffer_frame(r, 0, 0, 1, b"\x01" + bytes(SEG)))
    elif kind == "size-mismatch":
        fp.send(buffer_frame(r, 0, 0, 0, b"\0\0\0\1x", size=4))
    elif kind == "empty-data-buffer":
        fp.send(buffer_frame(r, 0, 0, 0, b""))
    elif kind == "unknown-data-type":
        fp.send(buffer_frame(r, 0, 0, 2, b"\0\0\0\1x"))
    elif kind == "wrong-magic":
        fp.send(frame(6, bytes(8), magic=0xDEADBEEF))
    elif kind == "unknown-message":
        fp.send(frame(11))
    elif kind == "huge-length":
        fp.send(frame(0, b"", length=0xFFFFFFF0))
    elif kind == "malformed-error":
        fp.send(frame(MSG_ERROR, struct.pack(">IBH", r, 1, 300) + b"x" * 8))


PROTOCOL_ERRORS = {
    "sequence-gap": "sequence gap",
    "data-without-credit": "without credit",
    "never-issued-receiver": "never issued",
    "receiver-zero": "never issued",
    "oversized-buffer": "buffer response frame",
    "oversized-event": "buffer response frame",
    "size-mismatch": "buffer response of",
    "empty-data-buffer": "empty data buffer",
    "unknown-data-type": "data type",
    "wrong-magic": "wrong magic",
    "unknown-message": "unknown message id",
    "huge-length": "buffer response frame",
    "malformed-error": "malformed error",
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(PROTOCOL_ERRORS))
def test_protocol_error_from_the_producer_fails_the_channel(env, kind):
    fake = FakeProducer(lambda fp: _bad(fp, kind))
    items, err = consume(env, fake, after_sent=True)
    fake.join(closed=True)
    assert fake.error is None, fake.error
    assert isinstance(err, fe.RemoteConnectionError), repr(err)
    assert PROTOCOL_ERRORS[kind] in str(err), str(err)
    # The producer was told why, then the connection closed.
    assert [e[:3] for e in fake.errors] == [(ALL, 4, "ProtocolError")], fake.errors
    assert items in ([], [b"a"], [b"x"], [b"x"] * 2, [b"x"] * 3)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("event,error", [
    (b"", "empty event"),
    (b"\x07", "unknown event kind"),
    (b"\x00\x00", "unknown event kind"),
    (b"\x01\xff\xff", ""),
])
def test_malformed_event_fails_the_gate_cleanly(env, event, error):
    def scenario(fp):
        fp.request()
        fp.send_data(stream_of([b"ok"]))
        fp.send_event(event)
        fp.send_event(END)

    fake = FakeProducer(scenario)
    items, err = consume(env, fake)
    fake.join()
    assert items == [b"ok"]
    assert isinstance(err, fe.CorruptRecordError), repr(err)
    assert error in str(err)


# ---- errors the producer sends ------------------------------------------------------------

def test_producer_failure_arrives_as_remote_error(env):
    def scenario(fp):
        req = fp.request()
        fp.send_data(stream_of([b"a", b"b"]))
        fp.send(error_frame(req["receiver"], 1, "KeyError", "no such key: 'k'"))

    fake = FakeProducer(scenario)
    items, err = consume(env, fake)
    fake.join()
    assert isinstance(err, fe.ProducerFailedError), repr(err)
    cause = err.__cause__
    assert isinstance(cause, fe.RemoteError)
    assert (cause.type_name, cause.message) == ("KeyError", "no such key: 'k'")


@pytest.mark.parametrize("code,exc", [
    (3, fe.PartitionReleasedError),
    (5, fe.RemoteConnectionError),
    (4, fe.RemoteConnectionError),
    (99, fe.RemoteConnectionError),
])
def test_error_codes_map_to_errors(env, code, exc):
    def scenario(fp):
        req = fp.request()
        fp.send(error_frame(req["receiver"], code, "X", f"code {code}"))

    fake = FakeProducer(scenario)
    items, err = consume(env, fake)
    fake.join()
    assert isinstance(err, exc), repr(err)
    assert f"code {code}" in str(err)


def test_connection_wide_error_and_long_messages(env):
    """An ERROR_RESPONSE for the whole connection (receiver 0xFFFFFFFF)
    fails the channel; a 60 KB message is cut, not trusted."""
    def scenario(fp):
        fp.request()
        fp.send(error_frame(ALL, 4, "ProtocolError", "why: " + "m" * 60000))

    fake = FakeProducer(scenario)
    items, err = consume(env, fake)
    fake.join()
    assert isinstance(err, fe.RemoteConnectionError), repr(err)
    assert "why: mmm" in str(err) and len(str(err)) < 5000


def test_not_found_then_served_on_retry(env):
    """Code 2 (not found): the request is sent again (same receiver id,
    credit again), and the retried stream's sequence starts at 0."""
    def scenario(fp):
        req = fp.request()
        fp.send(error_frame(req["receiver"], 2, "PartitionNotFoundError", "not yet"))
        again = fp.request()
        assert again["receiver"] == req["receiver"] and again["credit"] == req["credit"]
        fp.send(error_frame(req["receiver"], 2, "PartitionNotFoundError", "not yet"))
        fp.request()
        fp.send_data(stream_of([b"late"]))
        fp.send_event(END)

    fake = FakeProducer(scenario)
    t0 = time.monotonic()
    items, err = consume(env, fake)
    fake.join()
    assert fake.error is None, fake.error
    assert err is None, err
    assert items == [b"late"]
    assert time.monotonic() - t0 >= 0.14          # 50 ms, then 100 ms of backoff


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["stall", "close"])
def test_producer_dying_mid_frame(env, how):
    """A producer that stops in the middle of a frame: after the I/O timeout
    (1 s here), or at once when it closes, the channel fails."""
    def scenario(fp):
        req = fp.request()
        whole = buffer_frame(req["receiver"], 0, 0, 0, stream_of([b"x" * 100]))
        fp.send(whole[:40])
        if how == "stall":
            time.sleep(2)
        else:
            fp.sock.shutdown(socket.SHUT_RDWR)

    fake = FakeProducer(scenario)
    t0 = time.monotonic()
    items, err = consume(env, fake)
    took = time.monotonic() - t0
    fake.join()
    assert isinstance(err, fe.RemoteConnectionError), repr(err)
    if how == "stall":
        assert "stalled" in str(err) and 0.9 <= took <= 2.9, (str(err), took)
    else:
        assert "middle of a frame" in str(err) and took < 1.0, (str(err), took)


# ---- events need no buffer credit, but their own window ------------------------------------

@pytest.mark.timeout(30)
def test_event_flood_is_bounded_and_delivered_in_order(env):
    """200 events of 200 bytes: while the consumer does not read, the
    producer can send the event window (16) and no more; once the consumer
    reads, each event taken is granted back and all arrive, in order, with
    the data around them."""
    progress = []

    def scenario(fp):
        fp.request()
        fp.send_data(stream_of([b"first"]))
        for k in range(200):
            fp.send_event(event_bytes(("ev", k, "p" * 180)))
            progress.append(k)
        fp.send_data(stream_of([b"last"]))
        fp.send_event(END)

    fake = FakeProducer(scenario)
    gate = env.create_input_gate([(fake.address, "p", 0)], codec="bytes")
    try:
        time.sleep(0.5)
        assert len(progress) == EVENT_WINDOW       # blocked: the window is full
        items, err = read_all(gate)
    finally:
        gate.close()
    fake.join()
    assert err is None, err
    assert fake.error is None, fake.error
    assert items[0] == b"first" and items[-1] == b"last"
    assert [e.payload[1] for e in items[1:-1]] == list(range(200))


# ---- hypothesis: whatever the producer sends -------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("records"), st.lists(st.binary(max_size=2 * SEG), max_size=6),
              st.integers(1, SEG), st.one_of(st.integers(0, 4), st.integers(0, 0xFFFFFFFF))),
    st.tuples(st.just("event"), st.integers(-(1 << 31), 1 << 31)),
    st.tuples(st.just("gap")),
    st.tuples(st.just("overrun")),
    st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("error"), st.integers(0, 255), st.sampled_from([True, False])),
    st.tuples(st.just("raw-event"),
              st.sampled_from([b"", b"\x02", b"\x00\x00", b"\x01", b"\x03\x01", b"\x00"])),
), max_size=8)


@pytest.mark.timeout(120)
@settings(max_examples=int(os.environ.get("NETTEST_EXAMPLES", "20")),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_any_producer_stream_ends_cleanly(ops):
    """Records and events, then anything (gaps, overruns, garbage, errors,
    raw events): the consumer gets a prefix of the records in order, then
    the end or a flinkbuf error, within a bound, and every buffer comes
    back."""
    sent = []

    def scenario(fp):
        req = fp.request()
        r = req["receiver"]
        for op in ops:
            if op[0] == "records":
                sent.extend(op[1])
                for c in chunks(stream_of(op[1]), op[2]):
                    fp.send_data(c, backlog=op[3])      # any backlog, even a lie
            elif op[0] == "event":
                fp.send_event(event_bytes(op[1]))
                sent.append(op[1])
            elif op[0] == "gap":
                fp.seq += 1
            elif op[0] == "overrun":
                for _ in range(fp.credit + 1):
                    sent.append(b"o")
                    fp.send(buffer_frame(r, fp.seq, 0, 0, stream_of([b"o"])))
                    fp.seq += 1
            elif op[0] == "garbage":
                fp.send(op[1])
            elif op[0] == "error":
                # (not found for the channel would make it ask again, and
                # this fake never answers a second request)
                code = 3 if op[1] == 2 and op[2] else op[1]
                fp.send(error_frame(r if op[2] else ALL, code, "E", "m"))
            else:
                fp.send_event(op[1])
        fp.send_event(END)

    env = NetworkEnvironment(64, SEG, secret=SECRET, exclusive_buffers_per_channel=1,
                             floating_buffers_per_gate=1, io_timeout=1.0, request_timeout=2.0)
    try:
        fake = FakeProducer(scenario)
        items, err = consume(env, fake, timeout=15)
        fake.join()
    finally:
        env.close()
    assert err is None or isinstance(err, (fe.FlinkbufError, ConnectionError)), repr(err)
    got = [i.payload if isinstance(i, UserEvent) else i for i in items]
    assert got == sent[:len(got)], (got, sent)


@pytest.mark.timeout(30)
def test_gate_close_is_prompt_while_the_producer_stalls_mid_buffer():
    stop = threading.Event()

    def scenario(fp):
        req = fp.request()
        whole = buffer_frame(req["receiver"], 0, 0, 0, stream_of([b"x" * 100]))
        fp.send(whole[:40])
        stop.wait(10)

    env = NetworkEnvironment(64, SEG, secret=SECRET, io_timeout=3.0)
    try:
        fake = FakeProducer(scenario)
        gate = env.create_input_gate([(fake.address, "p", 0)], codec="bytes")
        time.sleep(0.3)
        t0 = time.monotonic()
        gate.close()
        took = time.monotonic() - t0
        assert took < 1.0, f"gate.close() took {took:.1f} s"
    finally:
        stop.set()
        env.close()


def test_events_beyond_the_window_are_a_protocol_error(env):
    """A producer that sends more events than the reader granted breaks the
    protocol: the connection ends with that reason, nothing is held."""
    def scenario(fp):
        fp.request()
        for k in range(EVENT_WINDOW + 1):
            fp.send_event(event_bytes(k), window=False)

    fake = FakeProducer(scenario)
    gate = env.create_input_gate([(fake.address, "p", 0)], codec="bytes")
    try:
        fake.join()
        time.sleep(0.3)        # all arrived before the consumer takes (and grants) any
        items, err = read_all(gate)
    finally:
        gate.close()
    assert isinstance(err, fe.RemoteConnectionError), err
    assert f"more than {EVENT_WINDOW} events outstanding" in str(err)
