"""Peer ids and advertised addresses: an environment says its peer id in
every handshake and dials, and is dialed at, its advertised address; one
told whom to expect at an address (expect_peers) refuses another peer
there, both as the client (the server it reached) and as the server (a
client that says it is at that address)."""

import pytest

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.io import LocalInputChannel, RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from network_helpers import SECRET

pytestmark = pytest.mark.timeout(60)


def make_env(**kw):
    kw.setdefault("secret", SECRET)
    kw.setdefault("connect_timeout", 5.0)
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024), **kw)


def _address(env):
    return "%s:%d" % env.advertised_address


def _serve(env, name="p"):
    part = create_partition(env.network_buffer_pool, 1)
    env.register_partition(name, part)
    return part


def test_records_flow_between_the_expected_peers():
    with make_env(peer_id="task attempt 1") as a, make_env(peer_id="task attempt 2") as b:
        a.expect_peers({_address(b): "task attempt 2"})
        b.expect_peers({_address(a): "task attempt 1"})
        part = _serve(a)
        gate = b.create_input_gate([(_address(a), "p", 0)], codec="bytes")
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            for i in range(50):
                w.emit(b"%d" % i)
        assert list(gate) == [b"%d" % i for i in range(50)]
        gate.close()
        assert a.peer_id == "task attempt 1"


def test_a_server_that_says_another_peer_id_is_refused():
    """The client expects task attempt 9 at a's address and reaches task
    attempt 1 there (as when the same port is used on another host)."""
    with make_env(peer_id="task attempt 1") as a, make_env(peer_id="task attempt 2") as b:
        part = _serve(a)
        b.expect_peers({_address(a): "task attempt 9"})
        with pytest.raises(AuthenticationError,
                           match=rf"{_address(a)} is task attempt 1, not task attempt 9"):
            b.create_input_gate([(_address(a), "p", 0)], codec="bytes")
        assert b.connection_stats() == []


def test_a_client_that_says_another_peer_id_for_an_expected_address_is_refused():
    """The server expects task attempt 7 at the client's address; the
    client there says it is task attempt 2: refused, and told why."""
    with make_env(peer_id="task attempt 1") as a, make_env(peer_id="task attempt 2") as b:
        _serve(a)
        a.expect_peers({_address(b): "task attempt 7"})
        with pytest.raises(RemoteConnectionError,
                           match=rf"{_address(b)} is task attempt 2, not task attempt 7"):
            b.create_input_gate([(_address(a), "p", 0)], codec="bytes")
        assert a.connection_stats() == []


def test_an_environment_bound_to_every_interface_advertises_another_address():
    with make_env(host="0.0.0.0", advertise="127.0.0.1") as a, make_env() as b:
        assert a.bound_address[0] == "0.0.0.0"
        assert a.advertised_address == ("127.0.0.1", a.address[1])
        part = _serve(a)
        gate = b.create_input_gate([(_address(a), "p", 0)], codec="bytes")
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            w.emit(b"x")
        assert list(gate) == [b"x"]
        gate.close()
        # what the peer's connection says this side is: the advertised address
        (stats,) = b.connection_stats()
        assert stats["peer"] == _address(a)
        # its own partitions, by either address, are read locally
        for own in (_address(a), "0.0.0.0:%d" % a.address[1]):
            local = _serve(a, "q" + own)
            g = a.create_input_gate([(own, "q" + own, 0)], codec="bytes")
            assert isinstance(g.channels[0], LocalInputChannel)
            with RecordWriter(local, codec="bytes", buffer_timeout=None) as w:
                w.emit(b"y")
            assert list(g) == [b"y"]
            g.close()


@pytest.mark.parametrize("kw, error, match", [
    ({"advertise": "0.0.0.0"}, ValueError, "advertise must be a host peers can dial"),
    ({"advertise": ""}, ValueError, "advertise must be a host peers can dial"),
    ({"advertise": 5}, TypeError, "advertise must be a str or None, got int"),
    ({"peer_id": b"x"}, TypeError, "peer_id must be a str, got bytes"),
    ({"peer_id": "x" * 65}, ValueError, "longer than 64 bytes"),
])
def test_bad_advertise_and_peer_id_are_refused(kw, error, match):
    with pytest.raises(error, match=match):
        make_env(**kw)


def test_expect_peers_checks_its_argument():
    with make_env() as a:
        with pytest.raises(TypeError, match="peers must be a dict"):
            a.expect_peers([("127.0.0.1:1", "x")])
        with pytest.raises(ValueError, match="an address is"):
            a.expect_peers({"nowhere": "x"})
        with pytest.raises(ValueError, match="longer than 64 bytes"):
            a.expect_peers({"127.0.0.1:1": "y" * 65})


def test_said_carries_the_peer_id_and_refuses_a_malformed_one():
    said = handshake.Said("10.0.0.1:7100", 4096, handshake.STREAM, 0, 0, "task attempt 17")
    back = handshake.Said.decode(said.encode(), "test")
    assert (back.address, back.peer_id) == ("10.0.0.1:7100", "task attempt 17")
    body = said.encode()
    for bad in (body[:-1], body + b"x", body[:-16] + bytes([200]) + body[-15:]):
        with pytest.raises(AuthenticationError, match="a malformed test"):
            handshake.Said.decode(bad, "test")
