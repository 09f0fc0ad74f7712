"""Dead-peer detection: a TCP peer whose host vanishes (no FIN, no RST) is
found by TCP keepalive (and TCP_USER_TIMEOUT while data is unacknowledged);
the channels over it fail with RemoteConnectionError, and every buffer goes
back.  The behaviour is checked for real in a network namespace of its own
whose loopback goes down mid-stream (Linux, root or user namespaces)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from flinkbuf.network import NetworkEnvironment, sockets
from network_helpers import ROOT, SECRET

# Every test here chooses TCP itself.
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux"),
              pytest.mark.one_transport]


def _tcp_sockets_to(port):
    """This process's connected TCP sockets with ``port`` at one end
    (duplicates of their fds; a listening socket has no peer)."""
    found, seen = [], set()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if not link.startswith("socket:") or link in seen:
                continue
            seen.add(link)                    # the duplicates made here: same inode
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family == socket.AF_INET and s.type == socket.SOCK_STREAM:
                ends = (s.getsockname()[1], s.getpeername()[1])
                if port in ends:
                    found.append(s)
                    continue
        except OSError:
            pass
        s.close()
    return found


def test_tcp_connections_probe_for_dead_peers():
    """Both ends of a connection (the dialling one and the accepted one)
    have keepalive and a user timeout: what the design counts on."""
    from flinkbuf import RecordWriter, create_partition
    idle, interval, count = sockets.KEEPALIVE
    with NetworkEnvironment(32, 4096, secret=SECRET, transport="tcp") as server, \
            NetworkEnvironment(32, 4096, secret=SECRET, transport="tcp") as client:
        part = create_partition(server.network_buffer_pool, 1, min_buffers=4)
        server.register_partition("p", part)
        gate = client.create_input_gate([(server.address, "p", 0)])
        writer = RecordWriter(part, "round_robin", buffer_timeout=0)
        writer.emit(1)
        assert next(iter(gate)) == 1
        socks = _tcp_sockets_to(server.address[1])   # connected ones: both ends
        try:
            assert len(socks) == 2, [(s.getsockname(), s.getpeername()) for s in socks]
            for s in socks:
                assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == interval
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == count
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) \
                    == 1000 * (idle + interval * count)
        finally:
            for s in socks:
                s.close()
        writer.close()
        gate.close()


# Runs in a network namespace of its own: its loopback is the "network".
_CHILD = textwrap.dedent("""
    import json, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from flinkbuf import RecordWriter, create_partition
    import flinkbuf.buffer as core
    from flinkbuf.errors import RemoteConnectionError
    from flinkbuf.network import NetworkEnvironment, sockets
    sockets.KEEPALIVE = (1, 1, 2)            # dead after about 3 s
    secret = bytes.fromhex(sys.argv[2])
    out = {}
    kw = dict(secret=secret, transport="tcp", io_timeout=120, request_timeout=120)
    with NetworkEnvironment(32, 4096, **kw) as prod, NetworkEnvironment(32, 4096, **kw) as cons:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=4)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)])
        writer = RecordWriter(part, "round_robin", buffer_timeout=0)
        it = iter(gate)
        for i in range(10):
            writer.emit(i)
            assert next(it) == i
        subprocess.run(["ip", "link", "set", "lo", "down"], check=True)
        t0 = time.monotonic()
        try:
            next(it)                             # nothing comes: the host is "gone"
            out["consumer"] = "no error"
        except RemoteConnectionError as exc:
            out["consumer"] = ["RemoteConnectionError", str(exc), time.monotonic() - t0]
        except BaseException as exc:
            out["consumer"] = [type(exc).__name__, str(exc), time.monotonic() - t0]
        deadline = time.monotonic() + 30
        while (prod.connections() or cons.connections()) and time.monotonic() < deadline:
            time.sleep(0.05)
        out["open_after"] = [len(prod.connections()), len(cons.connections()),
                             time.monotonic() - t0]
        gate.close()
        try:
            writer.close()
        except Exception:
            pass
    import gc; gc.collect()
    out["counters"] = core.debug_counters()
    print(json.dumps(out))
""")


def _can_unshare():
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    r = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"],
                       capture_output=True, timeout=10)
    return r.returncode == 0


@pytest.mark.timeout(120)
def test_a_vanished_host_fails_the_channels_within_the_keepalive_time():
    if not _can_unshare():
        pytest.skip("needs a network namespace of its own (unshare -n and ip; root)")
    r = subprocess.run(["unshare", "-n", sys.executable, "-X", "faulthandler", "-c", _CHILD,
                        ROOT, SECRET.hex()], capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    kind, message, waited = out["consumer"]
    assert kind == "RemoteConnectionError", out
    assert "timed out" in message.lower(), out
    # keepalive (1 s idle + 2 probes 1 s apart) or the user timeout (3 s):
    # well before io_timeout and request_timeout (120 s)
    assert 1.5 < waited < 20, out
    assert out["open_after"][:2] == [0, 0], out
    assert out["counters"] in (None, {}) or not any(out["counters"].values()), out
