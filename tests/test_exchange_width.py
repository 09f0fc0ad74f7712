"""An exchange of W tasks sizes every cap on its path from W: each task's
environment (connections, pending handshakes, the listening backlog), the
driver's rendezvous (connections, unauthenticated ones, backlog) and the
live view's report server (unauthenticated ones, backlog).  With the
sized caps, W - 1 peers that dial one task at once all get in; with the
environment's defaults, an exchange wider than 129 or 257 tasks refused
some."""

import json
import os
import resource
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.errors import AuthenticationError
from flinkbuf.io import RecordWriter, create_partition, partition_buffers
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network.config import MAX_CONNECTIONS, MAX_PENDING_HANDSHAKES
from flinkbuf.spark import LiveView, _collector, _rendezvous, _reports
from flinkbuf.spark._spec import check_options, make_spec
from flinkbuf.spark._task_environment import (
    connection_caps,
    peer_id,
    start_environment,
)
from helpers import wait_until

SECRET = b"w" * 32
SEG = 1024
PEERS = 299                    # the peers of a task of a 300-task exchange


def _listen_queue(sock):
    """``(queued, backlog)`` of a listening TCP socket: the connections
    waiting to be accepted and the most it holds (Linux's tcp_info of a
    listening socket: tcpi_unacked and tcpi_sacked)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("8x6I", info)[4:6]


def _somaxconn():
    with open("/proc/sys/net/core/somaxconn") as f:
        return int(f.read())


def _raise_descriptor_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= need


# ---- the caps follow W -----------------------------------------------------------------

@given(st.integers(1, 32768))
def test_a_task_has_room_for_its_peers_both_ways_and_never_less_than_the_defaults(n):
    max_connections, max_pending = connection_caps(n)
    assert max_connections >= max(MAX_CONNECTIONS, 2 * (n - 1) + 1)
    assert max_pending >= max(MAX_PENDING_HANDSHAKES, n)
    wider = connection_caps(n + 1)
    assert wider[0] >= max_connections and wider[1] >= max_pending


@given(st.integers(1, 32768))
def test_the_rendezvous_has_room_for_every_task_of_two_attempts(n):
    connections, unauthenticated, backlog = _rendezvous.budgets(n)
    assert connections > 2 * n
    assert unauthenticated > max(n, _rendezvous.UNAUTHENTICATED_BUDGET - 1)
    assert backlog > max(n, _rendezvous.LISTEN_BACKLOG - 1)


def _spec(n):
    options = check_options(
        n, None, num_partitions=None, key=None, selector="hash", codec="typed",
        segment_size=SEG, buffers_per_channel=2, floating_buffers=8, buffer_timeout=0.1,
        max_record_size=1 << 20, max_parallelism=None, host="127.0.0.1", timeout=10.0,
        monitor=None)
    return make_spec(options)


@pytest.mark.parametrize("n", [2, 300, 1000])
def test_the_environment_a_task_starts_follows_the_width(n):
    spec = _spec(n)
    env = start_environment(spec, n, "127.0.0.1", "127.0.0.1", peer_id(7),
                            partition_buffers(n, spec.options.buffers_per_channel))
    try:
        config = env.config
        assert (config.max_connections, config.max_pending_handshakes) == connection_caps(n)
        assert config.max_connections >= 2 * (n - 1) and config.max_pending_handshakes >= n - 1
        if n == 2:
            assert (config.max_connections, config.max_pending_handshakes) == \
                (MAX_CONNECTIONS, MAX_PENDING_HANDSHAKES)
        queued, backlog = _listen_queue(env._listeners.tcp)
        assert queued == 0
        assert backlog == min(config.max_pending_handshakes, _somaxconn())
    finally:
        env.close()


@pytest.mark.parametrize("n", [2, 300, 1000])
def test_the_rendezvous_and_the_live_view_follow_the_width(n):
    with _rendezvous.RendezvousServer(SECRET, n, timeout=5.0) as server:
        connections, unauthenticated, backlog = _rendezvous.budgets(n)
        assert (server._max_connections, server._max_unauthenticated) == \
            (connections, unauthenticated)
        assert _listen_queue(server._sock)[1] == min(backlog, connections, _somaxconn())
    with LiveView() as view:
        collector = view._collector
        assert collector.unauthenticated_budget == _collector.UNAUTHENTICATED_BUDGET
        view._target("wide", "wide", n)
        want = max(_collector.UNAUTHENTICATED_BUDGET,
                   min(n + _collector.MARGIN, collector.max_connections))
        assert collector.unauthenticated_budget == want >= min(n, collector.max_connections)
        assert _listen_queue(collector._sock)[1] == min(max(_collector.LISTEN_BACKLOG, want),
                                                        _somaxconn())
        view._target("narrow", "narrow", 2)          # a narrower one shrinks nothing
        assert collector.unauthenticated_budget == want


# ---- many peers dialing one task at once -------------------------------------------------

class _HeldHandshakes:
    """Replaces ``handshake.client``: every client, once connected, waits
    until :meth:`release` before it says anything, so that all of them
    are accepted and pending at once (peers that dial one task together)."""

    def __init__(self, monkeypatch):
        self.arrived = 0
        self._lock = threading.Lock()
        self._go = threading.Event()
        real = handshake.client

        def held(*args, **kwargs):
            with self._lock:
                self.arrived += 1
            self._go.wait(60)
            return real(*args, **kwargs)

        monkeypatch.setattr(handshake, "client", held)

    def release_once_accepted(self, n, listening, timeout=60):
        """Once ``n`` clients are connected and ``listening`` has accepted
        them all (nothing waits in its backlog), let them go."""
        assert wait_until(lambda: self.arrived == n and _listen_queue(listening)[0] == 0,
                          timeout, interval=0.02), (self.arrived, _listen_queue(listening))
        self._go.set()


@pytest.fixture(scope="module")
def peers():
    """PEERS environments, as the other tasks of a 300-task exchange."""
    _raise_descriptor_limit(12 * PEERS + 256)
    envs = [NetworkEnvironment(2, SEG, secret=SECRET, transport="tcp",
                               floating_buffers_per_gate=0) for _ in range(PEERS)]
    yield envs
    for env in envs:
        env.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("caps, connected", [
    (connection_caps(PEERS + 1), PEERS),
    ((connection_caps(PEERS + 1)[0], MAX_PENDING_HANDSHAKES), MAX_PENDING_HANDSHAKES),
    ((MAX_CONNECTIONS, connection_caps(PEERS + 1)[1]), MAX_CONNECTIONS),
], ids=["sized", "default-pending-handshakes", "default-max-connections"])
def test_every_peer_that_dials_at_once_gets_in_with_the_sized_caps(peers, caps, connected,
                                                                   monkeypatch, caplog):
    """299 peer environments dial one task's environment at once and read
    a record each from its partition of 299 subpartitions.  With the caps
    sized for 300 tasks every one does; with the default budget of pending
    handshakes only 128 of them (the rest, waiting longest, are refused),
    with the default max_connections only 256."""
    caplog.set_level("WARNING", logger="flinkbuf.network")
    center = NetworkEnvironment(PEERS + 8, SEG, secret=SECRET, transport="tcp",
                                max_connections=caps[0], max_pending_handshakes=caps[1])
    part = create_partition(center.network_buffer_pool, PEERS, min_buffers=PEERS + 1)
    center.register_partition("p", part)
    gates, errors = [None] * PEERS, [None] * PEERS

    def dial(i):
        try:
            gates[i] = peers[i].create_input_gate([(center.address, "p", i)])
        except Exception as exc:          # noqa: BLE001 - inspected below
            errors[i] = exc

    held = _HeldHandshakes(monkeypatch)
    threads = [threading.Thread(target=dial, args=(i,)) for i in range(PEERS)]
    try:
        for t in threads:
            t.start()
        held.release_once_accepted(PEERS, center._listeners.tcp)
        for t in threads:
            t.join(60)
        assert sum(g is not None for g in gates) == connected, {str(e) for e in errors if e}
        with RecordWriter(part, selector="broadcast", buffer_timeout=0) as writer:
            writer.emit("record")
        assert all(list(g) == ["record"] for g in gates if g is not None)
        refused = "waiting for their handshake" if caps[1] < PEERS else "max_connections"
        assert (refused in caplog.text) == (connected < PEERS)
    finally:
        for g in gates:
            if g is not None:
                g.close()
        center.close()


def _burst(n, connect, listening, monkeypatch):
    """``connect(i)`` for ``i`` in ``range(n)`` at once, in threads, every
    handshake held until ``listening`` accepted them all: ``{i: result or
    exception}``."""
    results = {}

    def run(i):
        try:
            results[i] = connect(i)
        except Exception as exc:          # noqa: BLE001 - inspected by the test
            results[i] = exc

    held = _HeldHandshakes(monkeypatch)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    held.release_once_accepted(n, listening)
    for t in threads:
        t.join(30)
    return results


@pytest.mark.timeout(60)
@pytest.mark.parametrize("budget", ["sized", "default"])
def test_every_task_that_registers_at_once_gets_in(budget, monkeypatch):
    """100 tasks handshake with the driver's rendezvous at once: all
    register with its budgets sized from the width; with the default
    unauthenticated budget the oldest 68 would be dropped."""
    n = 100
    extra = {} if budget == "sized" else {"max_unauthenticated": _rendezvous.UNAUTHENTICATED_BUDGET}
    with _rendezvous.RendezvousServer(SECRET, n, timeout=5.0, **extra) as server:
        results = _burst(n, lambda i: _rendezvous.register(
            server.address, SECRET, stage=1, task_attempt_id=i, index=i, num_tasks=n,
            address=f"10.0.0.1:{1000 + i}", timeout=1.0 if extra else 5.0,
            connect_timeout=5.0), server._sock, monkeypatch)
    # Dropped before they proved the secret (the rest wait for those in vain).
    dropped = [r for r in results.values() if isinstance(r, AuthenticationError)]
    if budget == "sized":
        assert all(isinstance(r, list) and len(r) == n for r in results.values()), \
            {str(r) for r in results.values() if isinstance(r, Exception)}
    else:
        assert len(dropped) == n - _rendezvous.UNAUTHENTICATED_BUDGET


@pytest.mark.timeout(60)
@pytest.mark.parametrize("registered", [True, False])
def test_every_task_of_a_wide_exchange_reaches_the_live_view(registered, monkeypatch):
    """100 tasks connect to the live view's report server at once: all
    prove the secret once their exchange is registered with the view
    (its budget then fits them); without that, the budget is 32."""
    n = 100
    with LiveView() as view:
        if registered:
            view._target("wide", "wide", n)
        address = view.report_address

        def connect(i):
            sock = socket.create_connection(address, timeout=10)
            try:
                handshake.client(sock, view._secret, f"10.0.0.1:{1000 + i}",
                                 _reports.SEGMENT_SIZE, 10)
                return sock
            except BaseException:
                sock.close()
                raise

        results = _burst(n, connect, view._collector._sock, monkeypatch)
        proven = [r for r in results.values() if isinstance(r, socket.socket)]
        try:
            assert len(proven) == (n if registered else _collector.UNAUTHENTICATED_BUDGET)
            assert wait_until(lambda: view._collector.connections == (len(proven), 0), 10)
        finally:
            for sock in proven:
                sock.close()


_LIMITED = textwrap.dedent("""
    import json, logging, resource, sys
    logging.basicConfig(level=logging.WARNING)
    from flinkbuf.io import partition_buffers
    from flinkbuf.spark import _descriptors
    from flinkbuf.spark._spec import check_options, make_spec
    from flinkbuf.spark._task_environment import peer_id, start_environment
    n = 200
    spec = make_spec(check_options(
        n, None, num_partitions=None, key=None, selector="hash", codec="typed",
        segment_size=1024, buffers_per_channel=2, floating_buffers=8, buffer_timeout=0.1,
        max_record_size=1 << 20, max_parallelism=None, host="127.0.0.1", timeout=10.0,
        monitor=None))
    for hard in (int(v) for v in sys.argv[1:]):
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        need = (_descriptors.open_descriptors() + _descriptors.OF_ENVIRONMENT
                + _descriptors.PER_CONNECTION * (n - 1))
        start_environment(spec, n, "127.0.0.1", "127.0.0.1", peer_id(1),
                          partition_buffers(n, 2)).close()
        print(json.dumps({"hard": hard, "need": need,
                          "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), flush=True)
        print("--", file=sys.stderr, flush=True)
""")


def test_a_task_makes_room_for_the_descriptors_of_its_connections():
    """A task of a 200-task exchange in a process allowed 256 descriptors
    (soft): the soft limit grows to what its connections need, up to the
    hard limit; short of that, a warning says what to raise."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hards = [4096 if hard == resource.RLIM_INFINITY else min(4096, hard), 512]
    child = subprocess.run([sys.executable, "-c", _LIMITED, *map(str, hards)],
                           capture_output=True, text=True, timeout=120, check=True)
    results = [json.loads(line) for line in child.stdout.splitlines()]
    warnings = child.stderr.split("--")
    assert [r["hard"] for r in results] == hards
    for result, logged in zip(results, warnings):
        assert result["soft"] == min(result["need"], result["hard"]) > 256
        assert ("needs about" in logged) == (result["hard"] < result["need"]), child.stderr
    assert results[1]["soft"] == 512 < results[1]["need"]       # short: the warning said so
