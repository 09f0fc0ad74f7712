"""The acceptor survives anything a peer or the process's limits do to it:
floods of silent or authenticated sockets in a process of 1,024
descriptors, a connection that cannot be set up, an unexpected error in a
handshake.  It refuses that one connection, logs once per cause at a
limited rate, backs off while out of descriptors instead of spinning, and
serves again as soon as descriptors free; authenticated connections are
capped with a clear refusal on both sides."""

import logging
import os
import socket
import time

import pytest

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.network import NetworkEnvironment, handshake
from flinkbuf.network import acceptor as acceptor_module
from flinkbuf.network import sockets as sockets_module
from flinkbuf.network import transports as transports_module
from flinkbuf.network.log_limit import LogLimiter
from helpers import wait_until
from network_helpers import SECRET, connect_raw

pytestmark = pytest.mark.one_transport

SEG = 4096


def _spare_descriptors():
    """How many descriptors this process may open (its soft limit raised
    to the hard one first: the floods below open many)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Served:
    """A producer child (with ``nofile`` descriptors and ``max_connections``)
    serving endless records, as partitions "live0" and "live1", to
    legitimate consumer children."""

    def __init__(self, children, nofile=1024, max_connections=256):
        self.proc = children.start("producer", {
            "num_segments": 128, "segment_size": SEG, "connect_timeout": 2.0,
            "io_timeout": 30.0, "rlimit_nofile": nofile, "max_connections": max_connections,
            "partitions": [{"id": f"live{k}", "n": 1, "tag": 1 + k, "mode": "endless",
                            "size": 300, "min_buffers": 8, "buffer_timeout": 0.001,
                            "pace": 0.002} for k in range(2)]},
            life=240)
        self.address = self.proc.expect("addr")["addr"]
        self.children = children
        self.consumers = []
        self.counts = {}

    def consumer(self, k):
        c = self.children.start("consumer", {
            "num_segments": 32, "segment_size": SEG, "connect_timeout": 10.0,
            "gates": [[[self.address, f"live{k}", 0]]], "report": "count", "progress": True},
            life=240)
        self.consumers.append(c)
        self.counts[c.pid] = 0
        return c

    def received(self, c):
        for m in c.poll_messages():
            if "gate_error" in m or "fatal" in m:
                raise AssertionError(f"a legitimate consumer failed: {m}")
            if "progress" in m:
                self.counts[c.pid] = m["progress"][0]
        return self.counts[c.pid]

    def assert_serving(self, c, within=10.0):
        before = self.received(c)
        assert wait_until(lambda: self.received(c) > before + 10, within), \
            self.proc.stderr()[-3000:]
        assert self.proc.proc.poll() is None, self.proc.stderr()[-3000:]

    def log(self):
        return self.proc.stderr()


def _authenticated_flood(address, limit, timeout=1.0):
    """Authenticated raw connections to ``address`` until one fails (or
    ``limit``): the sockets, and the error that ended it."""
    socks, error = [], None
    for i in range(limit):
        try:
            socks.append(connect_raw(address, segment_size=SEG, timeout=timeout,
                                     own_address=f"127.0.0.1:{i + 1}"))
        except (OSError, RemoteConnectionError, handshake.AuthenticationError) as exc:
            error = exc
            break
    return socks, error


@pytest.mark.timeout(180)
def test_out_of_descriptors_the_acceptor_backs_off_and_serves_again(children):
    """A server limited to 1,024 descriptors, flooded with authenticated
    connections (no cap short of the limit) until it cannot set one up or
    accept one: it refuses them, does not spin (little CPU while the flood
    stands), logs a bounded number of lines, keeps its consumer served,
    and takes a new consumer as soon as the flood goes."""
    served = Served(children, nofile=1024, max_connections=100_000)
    first = served.consumer(0)
    served.assert_serving(first)
    socks, error = _authenticated_flood(served.address, 600)
    try:
        assert error is not None, "1,024 descriptors held more than 600 connections"
        assert len(socks) > 100
        # The flood stands: more sockets knock while the server has no
        # descriptor to take them with.
        host, _, port = served.address.rpartition(":")
        knocking = [socket.create_connection((host, int(port)), timeout=5)
                    for _ in range(50)]
        cpu0, t0 = cpu_seconds(served.proc.pid), time.monotonic()
        time.sleep(3.0)
        busy = (cpu_seconds(served.proc.pid) - cpu0) / (time.monotonic() - t0)
        served.assert_serving(first)
        # The producer's writer and the first consumer's connection run the
        # whole time; an acceptor spinning on accept() would take a core.
        assert busy < 0.5, f"the server used {busy:.0%} of a CPU while out of descriptors"
        log = served.log()
        assert "cannot accept connections now ([Errno 24]" in log, log[-3000:]
        for s in knocking:
            s.close()
    finally:
        for s in socks:
            s.close()
    # Descriptors free as the connections close: a new consumer is served.
    second = served.consumer(1)
    served.assert_serving(second, within=20.0)
    served.assert_serving(first)
    log = served.log()
    assert "Traceback" not in log, log[-5000:]
    assert len(log.splitlines()) < 400, f"{len(log.splitlines())} lines of log"


@pytest.mark.timeout(120)
def test_a_flood_of_silent_sockets_does_not_lock_a_consumer_out(children):
    """1,100 silent sockets against a server of 1,024 descriptors (more
    than it could hold): the pending handshakes are bounded apart, the one
    waiting longest goes first, and a consumer that connects in the middle
    of the flood is served."""
    served = Served(children, nofile=1024)
    host, _, port = served.address.rpartition(":")
    silent = []
    try:
        for _ in range(min(1100, _spare_descriptors() - 200)):
            try:
                silent.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                break
        assert len(silent) > acceptor_module.MAX_PENDING_HANDSHAKES
        c = served.consumer(0)
        served.assert_serving(c, within=20.0)
        log = served.log()
        assert "connections were waiting for their handshake" in log
        assert "more like it, not logged" in log or log.count("refused a connection") < 40
        assert len(log.splitlines()) < 400, f"{len(log.splitlines())} lines of log"
    finally:
        for s in silent:
            s.close()


def test_max_connections_refuses_clearly_on_both_sides(caplog):
    caplog.set_level(logging.WARNING, logger="flinkbuf.network")
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="tcp",
                            max_connections=3) as server:
        address = f"{server.address[0]}:{server.address[1]}"
        socks = [connect_raw(address, segment_size=SEG, own_address=f"127.0.0.1:{i + 1}")
                 for i in range(3)]
        try:
            assert wait_until(lambda: len(server.connections()) == 3, 5)
            with pytest.raises(handshake.Refused, match=r"has 3 connections open.*max_connections"):
                connect_raw(address, segment_size=SEG, own_address="127.0.0.1:4")
            assert wait_until(lambda: "max_connections" in caplog.text, 5)
            socks.pop().close()              # one goes: the next is taken
            assert wait_until(lambda: len(server.connections()) == 2, 5)
            socks.append(connect_raw(address, segment_size=SEG, own_address="127.0.0.1:5"))
        finally:
            for s in socks:
                s.close()
    # The client's side: an environment at its limit does not dial more.
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="tcp") as a, \
            NetworkEnvironment(16, SEG, secret=SECRET, transport="tcp") as b, \
            NetworkEnvironment(64, SEG, secret=SECRET, transport="tcp",
                               max_connections=1) as client:
        from flinkbuf.io import create_partition
        for env in (a, b):
            part = create_partition(env.network_buffer_pool, 1)
            env.register_partition("p", part)
        gate = client.create_input_gate([(a.address, "p", 0)])
        try:
            with pytest.raises(RemoteConnectionError, match="max_connections"):
                client.create_input_gate([(b.address, "p", 0)])
        finally:
            gate.close()


@pytest.mark.parametrize("where", ["set-up", "handshake", "start"])
def test_one_connection_that_cannot_be_set_up_is_refused_and_the_next_is_served(
        where, monkeypatch, caplog):
    """An error while accepting, handshaking or starting one connection (out
    of memory or descriptors, or anything unexpected) refuses that one and
    leaves the acceptor running."""
    caplog.set_level(logging.INFO, logger="flinkbuf.network")
    failures = [1]

    def once(real, exc):
        def wrapper(*args, **kwargs):
            if failures:
                failures.pop()
                raise exc
            return real(*args, **kwargs)
        return wrapper

    if where == "set-up":
        monkeypatch.setattr(sockets_module, "tune",
                            once(sockets_module.tune, OSError(24, "Too many open files")))
    elif where == "handshake":
        monkeypatch.setattr(handshake.ServerHandshake, "feed",
                            once(handshake.ServerHandshake.feed, RuntimeError("unexpected")))
    else:
        class Shim:                      # (an extension type's methods cannot be patched)
            _open = staticmethod(once(transports_module.Connection._open,
                                      MemoryError("cannot allocate a connection")))
        monkeypatch.setattr(transports_module, "Connection", Shim)
    with NetworkEnvironment(16, SEG, secret=SECRET, transport="tcp") as server:
        address = f"{server.address[0]}:{server.address[1]}"
        with pytest.raises((OSError, handshake.AuthenticationError, RemoteConnectionError)):
            s = connect_raw(address, segment_size=SEG, timeout=3)
            try:                         # started, then dropped: the peer sees it end
                assert s.recv(1) == b""
                raise ConnectionError("closed")
            finally:
                s.close()
        assert not failures
        assert server._acceptor.is_alive()
        connect_raw(address, segment_size=SEG).close()
        assert wait_until(lambda: any(w in caplog.text for w in
                                      ("could not set up", "the acceptor of",
                                       "could not start")), 5), caplog.text


def test_the_log_is_rate_limited_per_cause(caplog):
    """LogLimiter: per cause (its digits aside), a burst, then one message
    per interval, which says how many were left out."""
    caplog.set_level(logging.INFO, logger="flinkbuf.test")
    limited = LogLimiter(logging.getLogger("flinkbuf.test"), burst=10, interval=0.2)
    for i in range(200):
        limited(logging.WARNING, f"cause a from 127.0.0.1:{i}", "a happened")
    limited(logging.WARNING, "cause b", "b happened")
    assert caplog.text.count("a happened") == 10
    assert caplog.text.count("b happened") == 1
    time.sleep(0.25)
    limited(logging.WARNING, "cause a from 10.0.0.1:1", "a happened")
    assert "a happened (and 190 more like it, not logged)" in caplog.text
    assert caplog.text.count("a happened") == 11


def test_the_log_limiter_forgets_causes_beyond_its_bound():
    limited = LogLimiter(logging.getLogger("flinkbuf.test"))
    for i in range(3 * LogLimiter.MAX_CAUSES):
        limited(logging.DEBUG, f"cause {chr(65 + i % 26)}{chr(65 + i // 26 % 26)}"
                f"{chr(65 + i // 676)}", "x")
    assert len(limited._budgets) <= LogLimiter.MAX_CAUSES
