"""The parts a NetworkEnvironment is made of, each on its own: the
configuration and its one sealing rule, the connection table (a stateful
model, and threads dialing at once), the addresses of a server bound to
every interface, and the sealing rule applied by the accepting side."""

import dataclasses
import itertools
import os
import socket
import threading

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from flinkbuf.errors import EnvironmentClosedError, RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from flinkbuf.network import addresses
from flinkbuf.network.addresses import (OwnAddresses, host_address, is_host_address,
                                        source_address)
from flinkbuf.network.config import NetworkConfig
from flinkbuf.network.connection_table import ConnectionTable
from helpers import wait_until
from network_helpers import SECRET

SEG = 1024


def _config(**kw):
    args = dict(host="127.0.0.1", port=0, secret=SECRET, exclusive_buffers_per_channel=2,
                floating_buffers_per_gate=8, connect_timeout=1.0, request_timeout=1.0,
                io_timeout=1.0, transport="tcp", caller_sends=None, direct_reads=None,
                lend_buffers=None, encryption=None, max_connections=4, advertise=None,
                peer_id="")
    args.update(kw)
    return NetworkConfig.of(16, SEG, **args)


# ---- the configuration -------------------------------------------------------------------

@pytest.mark.one_transport
@pytest.mark.parametrize("encryption, here, sealed", [
    (None, True, False), (None, False, True), (True, True, True), (True, False, True),
    (False, True, False), (False, False, False)])
def test_one_rule_says_what_is_sealed(encryption, here, sealed, monkeypatch):
    monkeypatch.delenv("FLINKBUF_NET_ENCRYPTION", raising=False)
    assert _config(encryption=encryption).seals(here) is sealed


@pytest.mark.one_transport
def test_the_configuration_is_frozen_and_resolved(monkeypatch):
    monkeypatch.setenv("FLINKBUF_NET_TRANSPORT", "unix")
    monkeypatch.setenv("FLINKBUF_NET_CALLER_SENDS", "0")
    config = _config(transport="auto", direct_reads=False)
    assert (config.transport, config.caller_sends, config.direct_reads) == ("unix", False, False)
    assert SECRET.hex() not in repr(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.io_timeout = 5.0                    # type: ignore[misc]
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="auto") as env:
        assert env.config.transport == "unix" and env.config.caller_sends is False


@pytest.mark.one_transport
@pytest.mark.parametrize("kw, error", [
    ({"secret": b"short"}, ValueError), ({"transport": "udp"}, ValueError),
    ({"io_timeout": -1}, ValueError), ({"max_connections": 0}, ValueError),
    ({"encryption": True, "lend_buffers": True}, ValueError), ({"caller_sends": 1}, TypeError)])
def test_the_configuration_refuses_what_the_environment_refuses(kw, error):
    with pytest.raises(error) as in_config:
        _config(**kw)
    env_kw = {k: v for k, v in kw.items() if k != "secret"}
    with pytest.raises(error) as in_env:
        NetworkEnvironment(16, SEG, secret=kw.get("secret", SECRET), **env_kw)
    assert str(in_config.value) == str(in_env.value)


# ---- the connection table ---------------------------------------------------------------

class FakeConnection:
    """What the table does with a connection: start it (once, before
    anything closes it; ``fails``: its threads cannot start), read whether
    it is open, close it."""

    _ids = itertools.count()

    def __init__(self, fails=False):
        self.id = next(self._ids)
        self.is_open = True
        self.closed = 0
        self.started = 0
        self.fails = fails

    def _start(self):
        assert self.started == 0 and self.closed == 0, self
        if self.fails:
            self.is_open = False
            raise MemoryError("cannot start the connection's threads")
        self.started += 1

    def close(self):
        self.closed += 1
        self.is_open = False

    def __repr__(self):
        return f"<conn {self.id} {'open' if self.is_open else 'closed'}>"


ADDRESSES = ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3"]
OWN = "10.0.0.2:2"


class TableModel(RuleBasedStateMachine):
    """The table against a model of its rules, one operation at a time."""

    def __init__(self):
        super().__init__()
        self.table = ConnectionTable(OWN, max_connections=3, connect_timeout=0.01)
        self.current = {}       # address -> the connection reads to it go over
        self.dialed = set()     # ids of the connections this process made
        self.said = {}          # id -> the peer id its peer said (dialed: the one expected)
        self.expected = {}
        self.dialing = set()
        self.reached = set()    # dialing, and the connect got through
        self.all = []
        self.closed = False

    def _usable(self, address):
        conn = self.current.get(address)
        expected = self.expected.get(address)
        if conn is not None and conn.is_open and expected in (None, self.said[conn.id]):
            return conn
        return None

    @precondition(lambda self: not self.closed)
    @rule(address=st.sampled_from(ADDRESSES))
    def begin_dial(self, address):
        if address in self.dialing:
            return                       # (a second dialer would wait for the first)
        got = self.table.begin_dial(address)
        assert got is self._usable(address)
        if got is None:
            self.dialing.add(address)

    @precondition(lambda self: not self.closed and self.dialing)
    @rule(data=st.data(), succeed=st.booleans(), starts=st.booleans())
    def end_dial(self, data, succeed, starts):
        address = data.draw(st.sampled_from(sorted(self.dialing)))
        self.dialing.discard(address)
        self.reached.discard(address)
        conn = FakeConnection(fails=not starts) if succeed else None
        if conn is not None and not starts:
            with pytest.raises(MemoryError):
                self.table.end_dial(address, conn)
            assert conn.closed == 1 and conn not in self.table.open_connections()
            return
        self.table.end_dial(address, conn)
        if conn is not None:
            self.all.append(conn)
            self.current[address] = conn
            self.dialed.add(conn.id)
            self.said[conn.id] = self.expected.get(address)

    @precondition(lambda self: not self.closed and self.dialing)
    @rule(data=st.data())
    def connect_got_through(self, data):
        address = data.draw(st.sampled_from(sorted(self.dialing)))
        self.table.reached(address)
        self.reached.add(address)

    @precondition(lambda self: not self.closed)
    @rule(address=st.sampled_from(ADDRESSES))
    def reached_without_a_dial_changes_nothing(self, address):
        if address not in self.dialing:
            self.table.reached(address)

    @precondition(lambda self: not self.closed)
    @rule(address=st.sampled_from(ADDRESSES), peer_id=st.sampled_from(["x", "y"]),
          starts=st.booleans())
    def accept(self, address, peer_id, starts):
        current = self.current.get(address)
        mine = current is not None and current.is_open and current.id in self.dialed
        keep = self.table.keep_incoming(address)
        if mine:
            assert keep is False
        elif address in self.dialing:
            # a dial whose connect has not got through gives way (a firewall
            # may drop one direction); else the smaller address wins
            assert keep is (address not in self.reached or OWN > address)
        else:
            assert keep is True
        if not keep:
            return
        if not starts:
            conn = FakeConnection(fails=True)
            with pytest.raises(MemoryError):
                self.table.add_accepted(conn, address, peer_id)
            assert conn not in self.table.open_connections()
            return
        conn = FakeConnection()
        self.all.append(conn)
        self.said[conn.id] = peer_id
        assert self.table.add_accepted(conn, address, peer_id)
        assert conn.started == 1
        if not mine and self.expected.get(address) in (None, peer_id):
            self.current[address] = conn

    @precondition(lambda self: not self.closed)
    @rule(address=st.sampled_from(ADDRESSES), peer_id=st.sampled_from(["x", "y"]))
    def expect(self, address, peer_id):
        self.table.expect({address: peer_id})
        self.expected[address] = peer_id
        assert self.table.expected(address) == peer_id

    @precondition(lambda self: any(c.is_open for c in self.all))
    @rule(data=st.data())
    def drop(self, data):
        conn = data.draw(st.sampled_from([c for c in self.all if c.is_open]))
        conn.is_open = False             # it ended (the table closes it when it reaps)

    @precondition(lambda self: not self.closed)
    @rule()
    def reap(self):
        ended = [c for c in self.all if not c.is_open and c.closed == 0]
        self.table.reap()
        assert all(c.closed == 1 for c in ended)
        self.all = [c for c in self.all if c.is_open]

    @precondition(lambda self: not self.closed and not self.dialing)
    @rule()
    def close(self):
        handed = self.table.close()
        assert sorted(c.id for c in handed) == sorted(c.id for c in self.all)
        self.closed = True

    @precondition(lambda self: self.closed)
    @rule(address=st.sampled_from(ADDRESSES))
    def a_closed_table_refuses(self, address):
        with pytest.raises(EnvironmentClosedError):
            self.table.begin_dial(address)
        conn = FakeConnection()
        assert self.table.add_accepted(conn, address, "x") is False
        assert conn.started == 0
        assert self.table.open_connections() == [] and self.table.close() == []

    @invariant()
    def open_connections_and_admission(self):
        if self.closed:
            assert self.table.open_connections() == []
            return
        live = [c for c in self.all if c.is_open]
        assert self.table.open_connections() == live
        assert all(c.started == 1 for c in live)       # listed only once running
        assert (self.table.admit() is None) is (len(live) < 3)

    @invariant()
    def entries_are_only_kept_while_they_say_something(self):
        for peer in self.table._peers.values():
            assert not peer.is_empty()
        assert len(self.table._peers) <= len(ADDRESSES)


test_the_connection_table_keeps_its_rules = pytest.mark.one_transport(TableModel.TestCase)


@pytest.mark.one_transport
def test_threads_dialing_one_address_make_one_connection():
    """Of many threads that want a connection to one address, one dials;
    the others wait for it and get the same connection."""
    table = ConnectionTable(OWN, max_connections=8, connect_timeout=1.0)
    dials, got = [], []
    start = threading.Barrier(8)

    def want():
        start.wait()
        conn = table.begin_dial(ADDRESSES[0])
        if conn is None:
            dials.append(1)
            conn = FakeConnection()
            threading.Event().wait(0.05)          # the dial takes a while
            table.end_dial(ADDRESSES[0], conn)
        got.append(conn)

    threads = [threading.Thread(target=want) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(dials) == 1 and len(got) == 8 and len(set(map(id, got))) == 1


@pytest.mark.one_transport
def test_a_failed_dial_lets_the_next_thread_dial():
    table = ConnectionTable(OWN, max_connections=8, connect_timeout=1.0)
    assert table.begin_dial(ADDRESSES[0]) is None
    waiter = {}
    t = threading.Thread(target=lambda: waiter.update(got=table.begin_dial(ADDRESSES[0])))
    t.start()
    t.join(0.2)
    assert t.is_alive()                      # it waits for the first dial
    table.end_dial(ADDRESSES[0], None)       # which fails
    t.join(5)
    assert waiter == {"got": None}           # so it dials itself
    assert table.keep_incoming(ADDRESSES[0]) is (OWN > ADDRESSES[0])


@pytest.mark.one_transport
def test_a_dial_ending_after_close_closes_its_connection():
    table = ConnectionTable(OWN, max_connections=8, connect_timeout=1.0)
    assert table.begin_dial(ADDRESSES[0]) is None
    assert table.close() == []
    conn = FakeConnection()
    with pytest.raises(EnvironmentClosedError):
        table.end_dial(ADDRESSES[0], conn)
    assert conn.closed == 1 and conn.started == 0


def _address(env):
    return "%s:%d" % env.address


@pytest.mark.parametrize("late", ["add_accepted", "end_dial"])
def test_a_connection_is_listed_before_it_reads_or_writes(late, monkeypatch):
    """However late a table takes a connection in (its acceptor's or its
    dialer's thread descheduled), nothing goes over the connection before:
    whoever reads a record over it finds it listed on both sides."""
    with NetworkEnvironment(32, SEG, secret=SECRET) as dialer, \
            NetworkEnvironment(32, SEG, secret=SECRET) as acceptor:
        writers = []
        for env in (dialer, acceptor):
            part = create_partition(env.network_buffer_pool, 1)
            env.register_partition("p", part)
            writers.append(RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0))
            writers[-1].emit(_address(env).encode())
        table = (acceptor if late == "add_accepted" else dialer)._table
        real = getattr(table, late)

        def slow(*args):
            threading.Event().wait(0.3)
            return real(*args)

        monkeypatch.setattr(table, late, slow)
        got = []

        def read_from_acceptor():
            gate = dialer.create_input_gate([(_address(acceptor), "p", 0)], codec="bytes")
            got.append(bytes(next(gate)))
            got.append([c.peer for c in acceptor.connections()])
            gate.close()

        t = threading.Thread(target=read_from_acceptor)
        t.start()
        if late == "end_dial":
            # the acceptor has the connection while the dialer has not taken
            # it in yet, and reads over it
            assert wait_until(lambda: acceptor.connections(), 10)
            gate = acceptor.create_input_gate([(_address(dialer), "p", 0)], codec="bytes")
            assert bytes(next(gate)) == _address(dialer).encode()
            assert [c.peer for c in dialer.connections()] == [_address(acceptor)]
            gate.close()
        t.join(30)
        assert got == [_address(acceptor).encode(), [_address(dialer)]]
        assert [c.peer for c in dialer.connections()] == [_address(acceptor)]
        for writer in writers:
            writer.close()


@pytest.mark.one_transport
def test_waiting_for_the_peer_s_own_connection_is_bounded():
    table = ConnectionTable(OWN, max_connections=8, connect_timeout=0.2)
    with pytest.raises(RemoteConnectionError, match="did not arrive within 0.2 s"):
        table.await_connection_from(ADDRESSES[0], ADDRESSES[0])
    conn = FakeConnection()
    assert table.add_accepted(conn, ADDRESSES[1], "x")
    assert table.await_connection_from(ADDRESSES[0], ADDRESSES[1]) is conn
    assert table.begin_dial(ADDRESSES[0]) is conn


# ---- addresses ------------------------------------------------------------------------

def test_a_server_bound_to_every_interface_listens_at_a_concrete_address():
    with NetworkEnvironment(32, SEG, secret=SECRET, host="0.0.0.0") as server, \
            NetworkEnvironment(32, SEG, secret=SECRET) as client:
        assert server.bound_address[0] == "0.0.0.0"
        host, port = server.address
        assert host != "0.0.0.0" and is_host_address(host) and port == server.bound_address[1]
        assert server.advertised_address == server.address
        part = create_partition(server.network_buffer_pool, 1)
        server.register_partition("p", part)
        gate = client.create_input_gate([(server.address, "p", 0)], codec="bytes")
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            w.emit(b"over a concrete address")
        assert list(gate) == [b"over a concrete address"]
        gate.close()
        (stats,) = client.connection_stats()
        assert stats["peer"] == "%s:%d" % server.address       # what it says it is
        # within this host: sealed only when every connection is
        assert stats["sealed"] is (os.environ.get("FLINKBUF_NET_ENCRYPTION") == "1")


@pytest.mark.one_transport
def test_host_address_is_an_address_of_this_host():
    assert is_host_address(host_address())
    assert not is_host_address("0.0.0.0") and not is_host_address("192.0.2.254")
    assert not is_host_address("not an address")
    # the source toward a host: loopback's own, or none where nothing leads
    assert source_address(("127.0.0.1", 9)) == "127.0.0.1"
    assert source_address(("not an address", 9)) is None
    assert source_address(("127.0.0.1", 1 << 20)) is None


@pytest.mark.one_transport
def test_host_address_falls_back_without_a_route(monkeypatch):
    real = socket.socket

    class NoRoute(real):
        def connect(self, address):
            if self.type == socket.SOCK_DGRAM:
                raise OSError(101, "Network is unreachable")
            return super().connect(address)

    monkeypatch.setattr(socket, "socket", NoRoute)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    # without a route: an interface's address, when one is up
    interfaces = addresses._interface_addresses(socket.AF_INET)
    assert host_address() == (interfaces[0] if interfaces else "127.0.0.1")
    assert all(is_host_address(a) and not a.startswith("127.") for a in interfaces)
    # nor an interface: loopback, never the address of a name no socket binds
    monkeypatch.setattr(addresses, "_interface_addresses", lambda family: [])
    monkeypatch.setattr(socket, "gethostname", lambda: "192.0.2.254")
    assert host_address() == "127.0.0.1"
    assert addresses._interface_addresses(socket.AF_INET6) == []


# ---- the sealing rule, accepting side ---------------------------------------------------

class _Elsewhere(OwnAddresses):
    """An environment's addresses to which every other host is elsewhere."""

    def is_this_host(self, host):
        return False


@pytest.mark.one_transport
@pytest.mark.parametrize("server_encryption, sealed", [(None, True), (False, False)])
def test_the_accepting_side_seals_a_connection_from_another_host(server_encryption, sealed,
                                                                  monkeypatch):
    """The acceptor applies the same rule as the dialer: by default a
    connection from another host is sealed even when its client did not
    ask (the client here says encryption=False)."""
    monkeypatch.delenv("FLINKBUF_NET_ENCRYPTION", raising=False)
    with NetworkEnvironment(32, SEG, secret=SECRET, transport="tcp",
                            encryption=server_encryption) as server, \
            NetworkEnvironment(32, SEG, secret=SECRET, transport="tcp",
                               encryption=False) as client:
        own = server._acceptor._own
        monkeypatch.setattr(server._acceptor, "_own",
                            _Elsewhere(own.bound, own.address, own.advertised))
        part = create_partition(server.network_buffer_pool, 1)
        server.register_partition("p", part)
        gate = client.create_input_gate([(server.address, "p", 0)], codec="bytes")
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            w.emit(b"x" * 100)
        assert list(gate) == [b"x" * 100]
        gate.close()
        for env in (server, client):
            assert [s["sealed"] for s in env.connection_stats()] == [sealed]
