"""The live view's servers against clients that misbehave: dripping and
silent page clients neither stop the page nor delay ``close()``; a
request is bounded as a whole, not per receive; report connections at the
descriptor limit neither spin the server's thread nor stop it serving once
descriptors are free; no request, however malformed, and no client that
leaves early, prints a traceback (any request head: an HTTP reply)."""

import json
import os
import resource
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_helpers import closed_by_peer, get, get_json, wait_for

from flinkbuf.network import handshake
from flinkbuf.spark import LiveView, _collector, _live_http, _reports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _live_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("flinkbuf-live")]


def _page_socket(view):
    return socket.create_connection(view.address, timeout=10)


class _Drippers:
    """``n`` page clients that send a request's head a byte every
    ``every`` seconds, and never finish it (each on its own thread)."""

    def __init__(self, view, n, every=0.2):
        self.socks = [_page_socket(view) for _ in range(n)]
        self.closed_by_server = []
        self._stop = threading.Event()
        self._every = every
        self._threads = [threading.Thread(target=self._drip, args=(s,), daemon=True)
                         for s in self.socks]
        for t in self._threads:
            t.start()

    def _drip(self, sock):
        head = b"GET /api/view HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Drip: " + b"a" * 10_000
        for byte in head:
            if self._stop.wait(self._every):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                self.closed_by_server.append(sock)
                return

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(10)
        for s in self.socks:
            s.close()


def test_dripping_and_silent_clients_neither_stop_the_page_nor_delay_close():
    view = LiveView(interval=0.05)
    drippers = _Drippers(view, 16)
    silent = [_page_socket(view) for _ in range(16)]      # connected, never a byte
    try:
        time.sleep(0.5)                                   # each has sent something
        for _ in range(5):                                # the page answers meanwhile
            assert get_json(view.url + "api/view")["exchanges"] == []
            assert get(view.url, timeout=5)[0] == 200
        assert view._collector._services[0].connections >= 32
        started = time.monotonic()
        view.close()
        took = time.monotonic() - started
        assert took < 1.0, f"close() took {took:.2f} s"
        assert not _live_threads()
        for sock in silent:                               # their connections are closed
            assert closed_by_peer(sock, 5)
    finally:
        drippers.stop()
        for sock in silent:
            sock.close()
        view.close()


def test_a_request_is_bounded_as_a_whole_not_per_receive(monkeypatch):
    monkeypatch.setattr(_live_http, "REQUEST_TIMEOUT", 1.0)
    with LiveView(interval=0.05) as view:
        drippers = _Drippers(view, 1, every=0.1)          # 10 bytes a second: never idle
        try:
            (sock,) = drippers.socks
            started = time.monotonic()
            wait_for(lambda: drippers.closed_by_server, 10, "the server to close the dripper")
            assert time.monotonic() - started < 5      # its head would take 1,000 s
        finally:
            drippers.stop()
        assert get_json(view.url + "api/view")["exchanges"] == []


def test_past_the_connection_budget_the_oldest_page_client_goes(monkeypatch):
    monkeypatch.setattr(_live_http, "MAX_CONNECTIONS", 4)
    with LiveView(interval=0.05) as view:
        silent = [_page_socket(view) for _ in range(4)]
        try:
            time.sleep(0.3)
            assert get(view.url + "api/view", timeout=5)[0] == 200
            assert closed_by_peer(silent[0], 5)                 # the oldest made room
        finally:
            for sock in silent:
                sock.close()


# ---- no traceback, whatever a client sends ---------------------------------------------

_SERVE = textwrap.dedent("""
    import sys
    from flinkbuf.spark import LiveView
    view = LiveView(interval=0.05)
    print(view.address[1], flush=True)
    sys.stdin.read()
    view.close()
    print("closed", flush=True)
    """)


def _raw(port, data, *, read=True, reset=False):
    """Send ``data`` to the page server; its reply (b"" if it closed
    without one), or None without reading (``reset``: abort the
    connection at once)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(data)
        if not read:
            return None
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def _status(reply):
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else None


BAD_TARGETS = ["/api/view?since=9223372036854775808", "/api/view?since=-1",
               "/api/view?since=1e3", "/api/view?since=", "/api/view?since=%ff",
               "/api/view?since=%D9%A3", "/api/view?since=1_0", "/api/view?since=%205",
               "/api/view?since=" + "9" * 5000, "http://[bad/api/view", "/api/view?since=0x10"]


def test_no_request_and_no_client_that_leaves_prints_a_traceback():
    env = dict(os.environ, PYTHONPATH=ROOT)
    child = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        port = int(child.stdout.readline())
        for target in BAD_TARGETS:
            reply = _raw(port, f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert _status(reply) == 400, (target, reply[:200])
        assert _status(_raw(port, b"GET /api/view?since=9223372036854775807 HTTP/1.0\r\n\r\n")) \
            == 200
        for head in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                     b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
                     b"GET / HTTP/1.1\r\nHost: \xff\xfe[::\r\n\r\n",
                     b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
                     b"GET " + b"/" * 70_000 + b" HTTP/1.1\r\n\r\n",
                     b"GET / HTTP/1.1\r\nHost: 127.0.0.1"):    # the client stops writing
            reply = _raw(port, head)
            assert reply == b"" or 400 <= _status(reply) < 600 or _status(reply) == 200, \
                (head[:40], reply[:200])
        # Clients that leave before their reply, politely and not.
        for target in ("/api/view", "/metrics", "/live.js", "/"):
            request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            _raw(port, request, read=False)
            _raw(port, request, read=False, reset=True)
            _raw(port, request[:10], read=False, reset=True)
        assert _status(_raw(port, b"GET /api/view HTTP/1.0\r\n\r\n")) == 200
        out, err = child.communicate(b"", timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert out == b"closed\n" and child.returncode == 0
    assert err == b"", err.decode(errors="replace")


@pytest.fixture(scope="module")
def shared_view():
    with LiveView(interval=0.05) as view:
        yield view


_TOKEN = st.sampled_from(["GET", "HEAD", "POST", "/", "/api/view", "?", "since", "=", "&",
                          "%", "%ff", "9" * 20, "-", "HTTP/1.0", "HTTP/1.1", " ", "\r\n",
                          "Host:", "localhost", "[", "]", ":", "\x00", "é"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.lists(_TOKEN, max_size=30).map(lambda t: "".join(t).encode("utf-8"))))
def test_any_request_head_gets_an_http_reply_and_never_a_failure(shared_view, head):
    reply = _live_http.answer(head + b"\r\n\r\n", ("127.0.0.1", 1), shared_view)
    if reply:                                  # nothing, for a head without a request line
        assert reply.startswith(b"HTTP/1."), reply[:80]
        assert _status(reply) != 500, reply[:300]


# ---- the report server at the descriptor limit ---------------------------------------------

def test_the_report_connections_cap_fits_the_descriptors():
    assert _collector.connection_cap(-1) == _collector.MAX_CONNECTIONS      # no limit
    assert _collector.connection_cap(1_000_000) == _collector.MAX_CONNECTIONS
    budgets = _collector.UNAUTHENTICATED_BUDGET + _live_http.MAX_CONNECTIONS
    for limit in (256, 1024, 4096, 8192):
        cap = _collector.connection_cap(limit)
        assert cap + budgets <= limit // 2 and cap >= 1
    assert _collector.connection_cap(10) == 1
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with LiveView() as view:
        assert view._collector.max_connections == _collector.connection_cap(soft)


_AT_THE_LIMIT = textwrap.dedent("""
    import json, os, resource, sys, time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    from flinkbuf.spark import LiveView
    view = LiveView(interval=0.05)
    print(json.dumps({"report": view.report_address, "page": view.address,
                      "cap": view._collector.max_connections,
                      "secret": view._secret.hex()}), flush=True)
    hog = []
    while True:
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    print("full", flush=True)
    sys.stdin.readline()                        # the parent's connections wait
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(2.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"cpu": cpu}), flush=True)
    for fd in hog:
        os.close(fd)
    print("freed", flush=True)
    sys.stdin.read()
    view.close()
    """)


def test_report_connections_at_the_descriptor_limit_do_not_spin_and_are_served_later():
    env = dict(os.environ, PYTHONPATH=ROOT)
    child = subprocess.Popen([sys.executable, "-c", _AT_THE_LIMIT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             text=True)
    waiting = []
    try:
        info = json.loads(child.stdout.readline())
        assert info["cap"] == _collector.connection_cap(256)
        assert child.stdout.readline() == "full\n"
        # Connections the child cannot accept yet: they wait in its backlog.
        waiting = [socket.create_connection(tuple(info["report"]), timeout=30)
                   for _ in range(3)]
        page = socket.create_connection(tuple(info["page"]), timeout=30)
        waiting.append(page)
        page.sendall(b"GET /api/view HTTP/1.0\r\n\r\n")
        child.stdin.write("measure\n")
        child.stdin.flush()
        cpu = json.loads(child.stdout.readline())["cpu"]
        # Refused for 2 s: a thread that retried at once would have used them all.
        assert cpu < 0.5, f"the view used {cpu:.2f} s of CPU in 2 s at the limit"
        assert child.stdout.readline() == "freed\n"
        # Descriptors free again: each waiting connection is served.
        secret = bytes.fromhex(info["secret"])
        for sock in waiting[:3]:                      # each authenticates
            handshake.client(sock, secret, "127.0.0.1:1", _reports.SEGMENT_SIZE, 20)
        page.settimeout(20)
        reply = b""
        while chunk := page.recv(65536):
            reply += chunk
        assert reply.startswith(b"HTTP/1.0 200 ") and b'"exchanges":[]' in reply
        assert get(f"http://127.0.0.1:{info['page'][1]}/api/view", timeout=20)[0] == 200
        out, err = child.communicate("", timeout=30)
        assert child.returncode == 0, err
        assert "Traceback" not in err
    finally:
        for sock in waiting:
            sock.close()
        if child.poll() is None:
            child.kill()
            child.communicate()


def test_an_exchange_wider_than_the_cap_is_followed_with_a_warning(caplog):
    with LiveView() as view:
        cap = view._collector.max_connections = 8      # as with ulimit -n 208
        view._target("narrow", "fits", cap)
        assert not caplog.records
        with caplog.at_level("WARNING", logger="flinkbuf.spark"):
            view._target("wide", "does not fit", cap + 1)
        (record,) = caplog.records
        assert f"{cap + 1} tasks" in record.getMessage() and "ulimit -n" in record.getMessage()
        assert {e["id"] for e in view.snapshot()["exchanges"]} == {"narrow", "wide"}
