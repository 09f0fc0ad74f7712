"""One connection joins two processes, also when both connect to each other
at the same moment: the connection made by the smaller address is kept, the
other side's is refused in the handshake (DUPLICATE) and that side uses the
kept one.  In this process (two environments), so the no_leaks fixture
checks every buffer."""

import socket
import threading
import time

import pytest

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network.connection_table import ConnectionTable
from flinkbuf.network.dialer import Dialer
from helpers import run_in_thread, wait_until
from network_helpers import SECRET

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def make_env(**kw):
    kw.setdefault("secret", SECRET)
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024), **kw)


def open_connections(env):
    return len(env.connection_stats())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["auto", "tcp", "unix", "shm"])
def test_peers_that_connect_to_each_other_at_once_share_one_connection(monkeypatch, transport):
    """Both environments start connecting to the other at the same moment
    (each waits for the other before its handshake): each ends up with one
    open connection, the same one, and records flow both ways over it."""
    real_connect = Dialer.connect
    for round_ in range(5):
        both_dialing = threading.Barrier(2, timeout=10)

        def connect(self, address):
            both_dialing.wait()
            return real_connect(self, address)

        monkeypatch.setattr(Dialer, "connect", connect)
        a, b = make_env(transport=transport), make_env(transport=transport)
        try:
            pa = create_partition(a.network_buffer_pool, 1)
            a.register_partition("from-a", pa)
            pb = create_partition(b.network_buffer_pool, 1)
            b.register_partition("from-b", pb)
            (ta, ga), (tb, gb) = (
                run_in_thread(b.create_input_gate, [(a.address, "from-a", 0)], codec="bytes"),
                run_in_thread(a.create_input_gate, [(b.address, "from-b", 0)], codec="bytes"))
            ta.join(20)
            tb.join(20)
            assert "error" not in ga and "error" not in gb, (ga, gb)
            monkeypatch.setattr(Dialer, "connect", real_connect)
            for part, tag in ((pa, b"a"), (pb, b"b")):
                with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
                    for i in range(100):
                        w.emit(tag + bytes([i]))
            assert [bytes(r) for r in ga["value"]] == [b"a" + bytes([i]) for i in range(100)]
            assert [bytes(r) for r in gb["value"]] == [b"b" + bytes([i]) for i in range(100)]
            assert (open_connections(a), open_connections(b)) == (1, 1), round_
            sa, sb = a.connection_stats()[0], b.connection_stats()[0]
            assert (sa["peer"], sb["peer"]) == (_name(b), _name(a))
            assert sa["buffers_in"] >= 1 and sb["buffers_in"] >= 1   # both ways over it
            ga["value"].close()
            gb["value"].close()
        finally:
            b.close()
            a.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "unix", "shm"])
def test_a_process_setting_up_a_peers_connection_does_not_dial_that_peer(monkeypatch,
                                                                        transport):
    """The smaller address has kept the larger's connection in the
    handshake but not set it up yet, and starts connecting to the larger,
    which is still connecting too (and so would keep that one as well): the
    smaller waits for the connection it is setting up and uses it, so each
    ends up with one connection, not two."""
    a, b = make_env(transport=transport), make_env(transport=transport)
    small, large = sorted([a, b], key=_name)
    kept = threading.Event()
    real_keep = ConnectionTable.keep_accepting

    def keep_slowly(self, accepting, peer):
        keep = real_keep(self, accepting, peer)
        if self is small._table and keep and not kept.is_set():
            kept.set()
            time.sleep(0.5)         # its reply waits: the larger is still connecting
        return keep

    monkeypatch.setattr(ConnectionTable, "keep_accepting", keep_slowly)
    try:
        ps, pl = _registered(small, "from-small"), _registered(large, "from-large")
        tl, gl = run_in_thread(large.create_input_gate, [(small.address, "from-small", 0)],
                               codec="bytes")
        assert kept.wait(10)
        ts, gs = run_in_thread(small.create_input_gate, [(large.address, "from-large", 0)],
                               codec="bytes")
        tl.join(20)
        ts.join(20)
        assert "error" not in gl and "error" not in gs, (gl, gs)
        _both_ways([(ps, b"s", gl["value"]), (pl, b"l", gs["value"])])
        assert (open_connections(small), open_connections(large)) == (1, 1)
        assert not any(p.accepting for e in (small, large) for p in e._table._peers.values())
        gl["value"].close()
        gs["value"].close()
    finally:
        b.close()
        a.close()


def _registered(env, name):
    """A partition of one subpartition registered in ``env`` as ``name``."""
    part = create_partition(env.network_buffer_pool, 1)
    env.register_partition(name, part)
    return part


def _both_ways(flows, count=50):
    """Each of ``flows``, ``(partition, tag, gate)``: ``count`` records
    tagged ``tag`` written to the partition arrive in order at the gate."""
    for part, tag, _ in flows:
        with RecordWriter(part, codec="bytes", buffer_timeout=None) as w:
            for i in range(count):
                w.emit(tag + bytes([i]))
    for _, tag, gate in flows:
        assert [bytes(r) for r in gate] == [tag + bytes([i]) for i in range(count)]


def _name(env):
    """The address ``env`` says it is in its handshakes."""
    return "%s:%d" % env.advertised_address


def _keeps(env, peer):
    """Whether ``env`` keeps a connection from ``peer`` (the rule its
    acceptor runs)."""
    return env._table.keep_incoming(_name(peer))


def _set_dialing(env, peer, dialing, reached=True):
    """Make ``env``'s table say it is (or is not) connecting to ``peer``,
    its connect through (``reached``: its handshake under way) or not yet."""
    with env._table._lock:
        entry = env._table._peer(_name(peer))
        entry.dialing = dialing
        entry.reached = dialing and reached


def test_the_rule_that_decides_which_connection_is_kept():
    """An open connection this side made wins over a new one; of two made
    at once, the one made by the smaller address; with neither, the new one
    is kept (an accepted connection does not refuse another: its peer is
    only who it says it is)."""
    a, b = make_env(), make_env()
    try:
        small, large = sorted([a, b], key=_name)
        assert _keeps(small, large)
        _set_dialing(small, large, True)
        _set_dialing(large, small, True)
        assert not _keeps(small, large)    # its own wins
        assert _keeps(large, small)        # the other's wins
        _set_dialing(small, large, True, reached=False)
        assert _keeps(small, large)        # its own has not got through: the other's wins
        _set_dialing(small, large, False)
        _set_dialing(large, small, False)
        part = create_partition(large.network_buffer_pool, 1)
        large.register_partition("p", part)
        gate = small.create_input_gate([(large.address, "p", 0)], codec="bytes")
        assert wait_until(lambda: open_connections(large) == 1, 5)
        assert not _keeps(small, large)    # the one it made wins
        assert _keeps(large, small)        # one it accepted does not
        gate.close()
        part.release()
    finally:
        b.close()
        a.close()


def _black_hole():
    """A listening socket whose queue is full: a connect to it hangs (the
    kernel drops its SYN), as through a firewall that drops it."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(0)
    queued = socket.create_connection(sink.getsockname(), timeout=5)
    return sink, queued


@pytest.mark.one_transport
@pytest.mark.timeout(120)
@pytest.mark.parametrize("blocked", ["small", "large"])
@pytest.mark.parametrize("first", ["blocked", "open"])
def test_a_dial_that_cannot_get_through_gives_way_to_the_peers_connection(monkeypatch,
                                                                           blocked, first):
    """One process's connects to the other hang (a firewall drops that
    direction) while the other way is open: whichever dials first, and
    whichever has the smaller address, the blocked side gives up its
    connect as soon as the peer's connection arrives and reads over it, so
    each ends up with one connection, both ways over it, long before the
    connect timeout."""
    from flinkbuf.network import sockets

    a, b = make_env(transport="tcp", connect_timeout=60.0), make_env(transport="tcp",
                                                                     connect_timeout=60.0)
    sink, queued = _black_hole()
    small, large = sorted([a, b], key=_name)
    stuck, other = (small, large) if blocked == "small" else (large, small)
    real = sockets.connect_watching
    dialing = threading.Event()

    def connect_watching(host, port, timeout, give_up):
        if threading.current_thread().name == "stuck-dials":
            dialing.set()
            return real(*sink.getsockname(), timeout, give_up)
        return real(host, port, timeout, give_up)

    monkeypatch.setattr(sockets, "connect_watching", connect_watching)
    try:
        p_stuck, p_other = _registered(stuck, "from-stuck"), _registered(other, "from-other")

        def stuck_reads():
            threading.current_thread().name = "stuck-dials"
            return stuck.create_input_gate([(other.address, "from-other", 0)], codec="bytes")

        def other_reads():
            return other.create_input_gate([(stuck.address, "from-stuck", 0)], codec="bytes")

        if first == "blocked":
            t1, g_stuck = run_in_thread(stuck_reads)
            assert dialing.wait(10)
            t2, g_other = run_in_thread(other_reads)
        else:
            t2, g_other = run_in_thread(other_reads)
            t2.join(20)
            t1, g_stuck = run_in_thread(stuck_reads)
        t1.join(30)
        t2.join(30)
        assert "value" in g_stuck and "value" in g_other, (g_stuck, g_other)
        _both_ways([(p_stuck, b"s", g_other["value"]), (p_other, b"o", g_stuck["value"])])
        assert (open_connections(stuck), open_connections(other)) == (1, 1)
        g_stuck["value"].close()
        g_other["value"].close()
    finally:
        queued.close()
        sink.close()
        b.close()
        a.close()


def test_a_duplicate_reply_names_the_server_and_is_not_an_authentication():
    """The handshake: a server that keeps another connection answers the
    authenticated client with DUPLICATE (its address), not AUTH_OK; a
    server that wants it answers AUTH_OK as before."""
    for keep in (False, True):
        cs, ss = socket.socketpair()
        with cs, ss:
            hs = handshake.ServerHandshake(SECRET, "server:1", 1024, keep=lambda peer: keep,
                                           unix_peer=handshake.unix_peer(ss))

            def serve():
                while not hs.done:
                    reply = hs.feed(ss.recv(handshake.MAX_FRAME))
                    if reply:
                        ss.sendall(reply)

            t, res = run_in_thread(serve)
            if keep:
                assert handshake.client(cs, SECRET, "client:2", 1024, 5.0) == ("server:1", 1024, None,
                                                                               None)
            else:
                with pytest.raises(handshake.DuplicateConnection) as err:
                    handshake.client(cs, SECRET, "client:2", 1024, 5.0)
                assert err.value.peer == "server:1"
                assert isinstance(err.value, RemoteConnectionError)
            t.join(5)
            assert "error" not in res, res
            assert hs.duplicate is (not keep)
            assert hs.peer == ("client:2", 1024)


@pytest.mark.timeout(60)
def test_a_refused_duplicate_waits_for_the_kept_connection_only_so_long(monkeypatch):
    """If the connection the peer keeps never arrives, the refused side says
    so within its connect timeout instead of waiting for ever."""
    a = make_env(connect_timeout=1.0)
    b = make_env(connect_timeout=1.0)
    try:
        # b pretends to be connecting to a, with the smaller address winning
        # being b's: a's connection is refused, and b's never comes.
        monkeypatch.setattr(b._table, "_keeps", lambda peer: False)
        part = create_partition(b.network_buffer_pool, 1)
        b.register_partition("p", part)
        with pytest.raises(RemoteConnectionError, match="did not arrive within 1 s"):
            a.create_input_gate([(b.address, "p", 0)], codec="bytes")
        assert open_connections(a) == 0 and open_connections(b) == 0
        part.release()
    finally:
        b.close()
        a.close()


@pytest.mark.parametrize("transport", ["tcp", "unix", "shm"])
@pytest.mark.parametrize("order", ["before", "after"])
def test_a_peer_that_claims_another_process_s_address_does_not_lock_it_out(order, transport):
    """A holder of the secret that connects first (or later) claiming to
    be process P does not make P's own connection fail: the server keeps
    a connection from P as it arrives, and reads from P over the newest
    one that said it is P.  Only a connection this side made itself (whose
    peer answered at P's address) refuses another."""
    from network_helpers import connect_raw
    with make_env(transport=transport) as server, make_env(transport=transport) as p:
        p_address = f"{p.address[0]}:{p.address[1]}"
        server_address = f"{server.address[0]}:{server.address[1]}"
        parts = []
        for env in (server, p):
            part = create_partition(env.network_buffer_pool, 1, min_buffers=4)
            parts.append(part)
            env.register_partition("p", part)
            writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.001)
            writer.emit(b"from " + env.address[1].to_bytes(2, "big"))
            writer.close()
        impostors = []
        if order == "before":
            impostors.append(connect_raw(server_address, SECRET, 1024, own_address=p_address))
            assert wait_until(lambda: open_connections(server) == 1, 5)
        gate = p.create_input_gate([(server.address, "p", 0)], codec="bytes")
        assert list(gate) == [b"from " + server.address[1].to_bytes(2, "big")]
        gate.close()
        if order == "after":
            impostors.append(connect_raw(server_address, SECRET, 1024, own_address=p_address))
            assert wait_until(lambda: open_connections(server) == 2, 5)
        # The server reading from P: over P's own connection when P's is the
        # newest, and never stuck.
        if order == "before":
            gate = server.create_input_gate([(p.address, "p", 0)], codec="bytes")
            assert list(gate) == [b"from " + p.address[1].to_bytes(2, "big")]
            gate.close()
        for s in impostors:
            s.close()
        for part in parts:
            part.release()
