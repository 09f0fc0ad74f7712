"""Sealed connections (``encryption=True``): every frame after the
handshake is authenticated and encrypted, one key per direction.  A man in
the middle that relays two real peers sees no record in the clear, and one
that flips a bit, drops, duplicates, reorders or replays a sealed record, or
cuts the stream inside one, is caught at that record: the consumer fails
with a clear error and has received exactly the records before it, none
altered.  A relay cannot strip the request for sealing either."""

import socket
import struct
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network.addresses import OwnAddresses
from helpers import wait_until

# The relays are TCP; the tests that use no relay choose their transports.
pytestmark = pytest.mark.one_transport

SECRET = b"sealed-test-secret-0123456789abcdef"
SEG = 4096
MARKER = b"plaintext-marker-that-must-not-cross-in-the-clear"
HANDSHAKE_FRAMES = {"up": 2, "down": 2}     # HELLO, AUTH / CHALLENGE, AUTH_OK
RECORD_PREFIX, TAG = 4, 16


def _recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


class Relay:
    """A TCP man in the middle for one connection: it passes the handshake
    through frame by frame, then the sealed records one by one, handing
    those of direction ``direction`` ("down": server to client, "up" the
    other way) to ``tamper(index, record, sent) -> [records to send]``
    (``sent``: the records of that direction so far).  ``captured`` holds
    every byte that crossed, per direction."""

    def __init__(self, upstream, direction="down", tamper=None, sealed=True):
        self.upstream = upstream
        self.direction = direction
        self.tamper = tamper
        self.sealed = sealed
        self.captured = {"up": bytearray(), "down": bytearray()}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.threads = []
        self._accept = threading.Thread(target=self._run, daemon=True)
        self._accept.start()

    def _run(self):
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        server = socket.create_connection(self.upstream)
        self.socks = (client, server)
        for src, dst, way in ((client, server, "up"), (server, client, "down")):
            t = threading.Thread(target=self._pump, args=(src, dst, way), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, src, dst, way):
        sent = []
        try:
            for _ in range(HANDSHAKE_FRAMES[way]):
                head = _recv_exact(src, 9)
                (length,) = struct.unpack_from(">I", head)
                self._send(dst, way, head + _recv_exact(src, length - 9))
            index = 0
            while True:
                if not self.sealed:
                    chunk = src.recv(65536)
                    if not chunk:
                        raise EOFError
                    self._send(dst, way, chunk)
                    continue
                prefix = _recv_exact(src, RECORD_PREFIX)
                (n,) = struct.unpack(">I", prefix)
                record = prefix + _recv_exact(src, n + TAG)
                out = [record]
                if way == self.direction and self.tamper is not None:
                    out = self.tamper(index, record, sent)
                for r in out:
                    self._send(dst, way, r)
                sent.append(record)
                index += 1
        except (EOFError, OSError):
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _send(self, dst, way, data):
        self.captured[way] += data
        dst.sendall(data)

    def close(self):
        self.listener.close()
        for s in getattr(self, "socks", ()):
            # shutdown first: a pump thread blocked in recv() on it holds the
            # socket open past close(), and the peer would never see its end.
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self.threads:
            t.join(5)


def _records(n):
    return [(i, MARKER + bytes([i % 251]) * (i % 700)) for i in range(n)]


def _exchange(producer, consumer, address, n, *, expect_failure=False):
    """n records from producer to consumer through ``address``: what the
    consumer received, and the error its gate raised (or None)."""
    part = create_partition(producer.network_buffer_pool, 1, min_buffers=8)
    producer.register_partition("p", part)
    writer = RecordWriter(part, "round_robin", buffer_timeout=0.001)
    sent = _records(n)

    def produce():
        try:
            for r in sent:
                writer.emit(r)
            writer.close()
        except Exception:           # noqa: BLE001 - the consumer's side is what is checked
            pass

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    gate = consumer.create_input_gate([(f"{address[0]}:{address[1]}", "p", 0)])
    got, error = [], None
    try:
        for r in gate:
            got.append(r)
    except RemoteConnectionError as exc:
        error = exc
    finally:
        gate.close()
    if not expect_failure:
        t.join(30)
    return sent, got, error


def _envs(seal_producer=True, seal_consumer=True, transport="tcp"):
    # Credit for more than two sealed records' worth of buffers (a record
    # holds up to 16 of them): a record dropped on the way is caught when
    # the next one arrives, and there is always a next one.
    kw = dict(secret=SECRET, transport=transport, io_timeout=5.0, request_timeout=10.0,
              connect_timeout=5.0, exclusive_buffers_per_channel=40)
    return (NetworkEnvironment(128, SEG, encryption=seal_producer, **kw),
            NetworkEnvironment(128, SEG, encryption=seal_consumer, **kw))


@pytest.mark.parametrize("transport", ["tcp", "unix", "shm"])
@pytest.mark.parametrize("asks", ["both", "producer", "consumer"])
def test_either_side_asking_seals_the_connection_and_records_arrive_exactly(transport, asks):
    producer, consumer = _envs(asks != "consumer", asks != "producer", transport)
    with producer, consumer:
        sent, got, error = _exchange(producer, consumer, producer.address, 20_000)
        assert error is None and got == sent
        for env in (producer, consumer):
            (stats,) = env.connection_stats()
            assert stats["sealed"] is True and stats["transport"] == transport


def test_no_side_asking_leaves_the_connection_plain():
    producer, consumer = _envs(False, False)
    with producer, consumer:
        sent, got, error = _exchange(producer, consumer, producer.address, 1000)
        assert error is None and got == sent
        assert consumer.connection_stats()[0]["sealed"] is False


@pytest.mark.parametrize("sealed", [True, False])
def test_a_relay_reads_no_record_of_a_sealed_connection(sealed):
    producer, consumer = _envs(sealed, sealed)
    with producer, consumer:
        relay = Relay(producer.address, sealed=sealed)
        try:
            sent, got, error = _exchange(producer, consumer, relay.address, 2000)
            assert error is None and got == sent
            seen = bytes(relay.captured["down"])
            assert len(seen) > 2000 * len(MARKER)          # everything went through it
            assert (MARKER in seen) is (not sealed)         # plain: readable, as the control
        finally:
            relay.close()


def _flip(k):
    def tamper(i, record, sent):
        if i != k:
            return [record]
        b = bytearray(record)
        b[len(b) // 2] ^= 0x10
        return [bytes(b)]
    return tamper


def _drop(k):
    return lambda i, record, sent: [] if i == k else [record]


def _duplicate(k):
    return lambda i, record, sent: [record, record] if i == k else [record]


def _reorder(k):
    held = []

    def tamper(i, record, sent):
        if i == k:
            held.append(record)
            return []
        if i == k + 1:
            return [record, *held]
        return [record]
    return tamper


def _replay(k):                                     # an earlier record again, after record k
    return lambda i, record, sent: [record, (sent or [record])[0]] if i == k else [record]


def _prefix(k):                                     # a length prefix altered: out of range
    def tamper(i, record, sent):
        return [b"\xff\xff\xff\xff" + record[4:]] if i == k else [record]
    return tamper


TAMPERS = {"flip": _flip, "drop": _drop, "duplicate": _duplicate, "reorder": _reorder,
           "replay": _replay, "length": _prefix}
# The record (counted as received) at which each is caught, after record k was tampered.
CAUGHT_AFTER = {"flip": 0, "drop": 0, "reorder": 0, "duplicate": 1, "replay": 1, "length": 0}


@pytest.mark.parametrize("k", [0, 6])
@pytest.mark.parametrize("kind", sorted(TAMPERS))
def test_a_tampered_record_fails_the_consumer_at_that_record_and_nothing_wrong_arrives(kind, k):
    producer, consumer = _envs()
    with producer, consumer:
        relay = Relay(producer.address, "down", TAMPERS[kind](k))
        try:
            sent, got, error = _exchange(producer, consumer, relay.address, 50_000,
                                         expect_failure=True)
        finally:
            relay.close()
    assert error is not None, "the tampered stream was accepted"
    assert got == sent[:len(got)]                   # exactly the records before it
    assert len(got) < len(sent)
    why = str(error)
    if kind == "length":
        assert "length out of range" in why
    else:
        assert "integrity check" in why and f"record {k + CAUGHT_AFTER[kind]} " in why


def test_a_tampered_record_toward_the_producer_fails_the_connection():
    """Credit travels from the consumer: a flipped bit there is caught by
    the producer's side, which ends the connection; the consumer fails
    instead of waiting."""
    producer, consumer = _envs()
    with producer, consumer:
        relay = Relay(producer.address, "up", _flip(1))
        try:
            sent, got, error = _exchange(producer, consumer, relay.address, 50_000,
                                         expect_failure=True)
        finally:
            relay.close()
    assert error is not None and got == sent[:len(got)] and len(got) < len(sent)


def test_a_stream_cut_inside_a_record_fails_clearly():
    def cut(i, record, sent):
        return [record[:len(record) // 2], None] if i == 4 else [record]

    class CutRelay(Relay):
        def _send(self, dst, way, data):
            if data is None:
                raise EOFError
            super()._send(dst, way, data)

    producer, consumer = _envs()
    with producer, consumer:
        relay = CutRelay(producer.address, "down", cut)
        try:
            sent, got, error = _exchange(producer, consumer, relay.address, 50_000,
                                         expect_failure=True)
        finally:
            relay.close()
    assert error is not None and got == sent[:len(got)]
    assert "inside sealed record 4" in str(error)


class Rewriter(Relay):
    """Rewrites the handshake's AUTH (up) or AUTH_OK (down) with ``fix``."""

    def __init__(self, upstream, way, fix):
        self.way, self.fix, self.count = way, fix, {"up": 0, "down": 0}
        super().__init__(upstream, sealed=False)

    def _send(self, dst, way, data):
        self.count[way] += 1
        if way == self.way and self.count[way] == 2:
            data = self.fix(data)
        super()._send(dst, way, data)


def _clear_flags(frame):   # AUTH and AUTH_OK end with u8 flags, u32 pid, an empty peer id
    assert frame[-1] == 0                       # the peer id's length
    return frame[:-6] + bytes([frame[-6] & ~handshake.SEALED]) + frame[-5:]


@pytest.mark.parametrize("way", ["up", "down"])
def test_a_relay_cannot_strip_the_request_for_sealing(way, caplog):
    """Clearing the flag in AUTH (the client's request) makes the server
    refuse the client's proof; clearing it in AUTH_OK (the server's
    agreement) makes the client refuse the server's."""
    producer, consumer = _envs(False, True)           # the consumer (client) asks
    with producer, consumer:
        relay = Rewriter(producer.address, way, _clear_flags)
        try:
            with pytest.raises(AuthenticationError) as info:
                consumer.create_input_gate([(f"{relay.address[0]}:{relay.address[1]}", "p", 0)])
        finally:
            relay.close()
        if way == "up":
            assert wait_until(lambda: "the client did not prove that it knows the shared secret"
                              in caplog.text, 5), caplog.text
        else:
            assert "authentication reply does not prove" in str(info.value)
        assert consumer.connection_stats() == []
        # The server took the handshake as done when it sent its (proven)
        # AUTH_OK; the connection it started ends as the client closes.
        assert wait_until(lambda: producer.connection_stats() == [], 5), \
            producer.connection_stats()


def test_lending_and_sealing_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        NetworkEnvironment(16, SEG, secret=SECRET, encryption=True, lend_buffers=True)


def test_the_encryption_variable_is_the_default(monkeypatch):
    monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", "1")
    producer, consumer = (NetworkEnvironment(64, SEG, secret=SECRET, transport="tcp"),
                          NetworkEnvironment(64, SEG, secret=SECRET, transport="tcp",
                                             encryption=False))
    with producer, consumer:
        sent, got, error = _exchange(producer, consumer, producer.address, 100)
        assert got == sent and consumer.connection_stats()[0]["sealed"] is True
    monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", "yes")
    with pytest.raises(ValueError, match="FLINKBUF_NET_ENCRYPTION"):
        NetworkEnvironment(16, SEG, secret=SECRET)
    with pytest.raises(TypeError, match="encryption"):
        NetworkEnvironment(16, SEG, secret=SECRET, encryption="on")


@given(st.binary(min_size=16, max_size=64), st.binary(min_size=32, max_size=32),
       st.binary(min_size=32, max_size=32))
def test_session_keys_pair_up_differ_per_direction_and_depend_on_both_nonces(secret, cn, sn):
    c_send, c_recv = handshake.session_keys(secret, cn, sn, client=True)
    s_send, s_recv = handshake.session_keys(secret, cn, sn, client=False)
    assert (c_send, c_recv) == (s_recv, s_send)
    assert c_send != c_recv and len(c_send) == len(c_recv) == 32
    other = bytes([sn[0] ^ 1]) + sn[1:]
    assert handshake.session_keys(secret, cn, other, client=True)[0] != c_send
    other = bytes([cn[0] ^ 1]) + cn[1:]
    assert handshake.session_keys(secret, other, sn, client=True)[0] != c_send


class _Elsewhere(OwnAddresses):
    """An environment's addresses to which every other host is elsewhere."""

    def is_this_host(self, host):
        return False


@pytest.mark.parametrize("variable", ["", "0", "1"])
def test_by_default_connections_to_other_hosts_are_sealed_and_within_this_host_not(
        variable, monkeypatch):
    """encryption=None: a client seals a connection to another host and
    leaves one within its host plain, unless FLINKBUF_NET_ENCRYPTION says
    (0: none, 1: all)."""
    if variable:
        monkeypatch.setenv("FLINKBUF_NET_ENCRYPTION", variable)
    else:
        monkeypatch.delenv("FLINKBUF_NET_ENCRYPTION", raising=False)
    for elsewhere in (False, True):
        kw = dict(secret=SECRET, transport="tcp", exclusive_buffers_per_channel=4)
        with NetworkEnvironment(64, SEG, **kw) as producer, \
                NetworkEnvironment(64, SEG, **kw) as consumer:
            if elsewhere:           # the producer is on another host, as the consumer sees it
                own = consumer._dialer._own
                monkeypatch.setattr(consumer._dialer, "_own", _Elsewhere(
                    own.bound, own.address, own.advertised))
            sent, got, error = _exchange(producer, consumer, producer.address, 500)
            assert error is None and got == sent
            expected = {"": elsewhere, "0": False, "1": True}[variable]
            for env in (producer, consumer):
                assert [s["sealed"] for s in env.connection_stats()] == [expected]
