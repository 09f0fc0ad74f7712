"""The live view's HTTP side, served without threads of its own: the
report server's thread (:mod:`flinkbuf.spark._collector`) accepts the
page's connections, reads each request's head as it arrives (never
blocking on a client), answers it at once (the page, its script, the JSON
or the Prometheus text) and writes the reply as fast as the client reads.

Budgets, so that no client can hold the view or its end: a request's head
is at most ``MAX_HEAD`` bytes and must have arrived ``REQUEST_TIMEOUT``
seconds after the connection, however slowly it drips; its reply must
have been read ``REPLY_TIMEOUT`` seconds after it is ready; at most
``MAX_CONNECTIONS`` connections are open (past that the oldest goes).  A
connection is closed after its reply (HTTP/1.0).  Nothing a client sends
or fails to read makes a traceback: a malformed request is answered 400
(or what fits), a client that goes early costs a line at DEBUG (logger
``flinkbuf.spark``)."""

import functools
import http.server
import io
import json
import logging
import re
import selectors
import socket
import time
import urllib.parse

from flinkbuf.network.addresses import is_loopback
from flinkbuf.spark import _live_page, _prometheus, _rendezvous

_LOG = logging.getLogger("flinkbuf.spark")
MAX_CONNECTIONS = 64         # page connections open at once; past it the oldest goes
MAX_HEAD = 65536             # bytes of a request's line and headers
REQUEST_TIMEOUT = 10.0       # seconds from the connection to its request's last header
REPLY_TIMEOUT = 30.0         # seconds from the reply being ready to its last byte read
MAX_SEQ = 2 ** 63 - 1
_SEQ = re.compile(r"[0-9]{1,19}\Z")
_RECV = 16384

class _Handler(http.server.BaseHTTPRequestHandler):
    """One request, from its head in memory to its reply in memory
    (``reply``): the standard library's parsing and answers, none of its
    sockets."""

    server_version = "flinkbuf-live"
    sys_version = ""
    default_request_version = "HTTP/1.0"   # errors before the version say their status too

    def __init__(self, head, client_address, view):
        self.view = view
        super().__init__(head, client_address, None)

    def setup(self):
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()

    def finish(self):
        self.reply = self.wfile.getvalue()

    def log_message(self, format, *args):       # noqa: A002 - the base class's name
        _LOG.debug("flinkbuf live view: %s - %s", self.address_string(), format % args)

    def _refusal(self):
        """Why this request is refused (a view on loopback serves loopback
        clients, and only under a loopback name: a page elsewhere cannot
        read it through a name of its own that points here), or None."""
        if not self.view.loopback:
            return None
        if not is_loopback(self.client_address[0]):
            return "this live view serves its own host only"
        host = self.headers.get("Host")
        if host is None:
            return None                       # not a browser: browsers always name the host
        if host.startswith("["):
            name = host[1:host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if not is_loopback(name):
            return f"this live view answers to a loopback address, not to {host!r}"
        return None

    def _send(self, status, body, content_type, head=False):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy",
                         "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; "
                         "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                         "base-uri 'none'; form-action 'none'")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _text(self, status, text, head=False):
        self._send(status, (text + "\n").encode("utf-8"), "text/plain; charset=utf-8", head)

    def do_HEAD(self):
        self._serve(head=True)

    def do_GET(self):
        self._serve(head=False)

    def _serve(self, head):
        refusal = self._refusal()
        if refusal is not None:
            self._text(403, refusal, head)
            return
        try:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        except ValueError as exc:
            self._text(400, f"a malformed request target: {exc}", head)
            return
        view = self.view
        if url.path in ("/", "/index.html"):
            self._send(200, _live_page.HTML.encode("utf-8"), "text/html; charset=utf-8", head)
        elif url.path == "/live.js":
            self._send(200, _live_page.SCRIPT.encode("utf-8"),
                       "text/javascript; charset=utf-8", head)
        elif url.path == "/api/view":
            since = query.get("since", ["0"])[-1]
            if not _SEQ.match(since) or int(since) > MAX_SEQ:
                self._text(400, f"since must be an integer in [0, {MAX_SEQ}], got "
                                f"{since[:40]!r}", head)
                return
            body = json.dumps(view.snapshot(since=int(since)), separators=(",", ":"))
            self._send(200, body.encode("utf-8"), "application/json", head)
        elif url.path == "/metrics":
            self._send(200, view.prometheus().encode("utf-8"), _prometheus.CONTENT_TYPE, head)
        elif url.path == "/favicon.ico":
            self._send(204, b"", "image/x-icon", head)
        else:
            self._text(404, "not found: the live view serves /, /api/view and /metrics", head)

    def do_POST(self):
        self._text(405, "the live view only answers GET")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST


def answer(head, client_address, view):
    """The reply (bytes) to a request whose head is ``head``; a failure of
    the view's own is answered 500 and logged in a line."""
    try:
        return _Handler(head, client_address, view).reply
    except Exception as exc:                 # noqa: BLE001 - the view's bug, not the client's
        _LOG.error("flinkbuf live view: answering %s failed: %s: %s", client_address[0],
                   type(exc).__name__, exc)
        _LOG.debug("flinkbuf live view: the failure", exc_info=True)
        body = b"the live view failed to answer; its log says why\n"
        return (b"HTTP/1.0 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


def _end_of_head(data):
    """Where the head in ``data`` ends (after its empty line), or -1."""
    ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
    return min(ends) if ends else -1


class _Client:
    __slots__ = ("sock", "address", "since", "deadline", "inbox", "outbox")

    def __init__(self, sock, address, now):
        self.sock = sock
        self.address = address
        self.since = now
        self.deadline = now + REQUEST_TIMEOUT
        self.inbox = bytearray()
        self.outbox = None           # the reply once there is one


class PageServer:
    """The view's HTTP server on ``host``:``port`` (``sock``: its
    listening socket, ``address``: where it listens).  The report
    server's thread calls :meth:`attach` once, :meth:`accepted` with each
    connection, and :meth:`expire` and :meth:`release` as it does for its
    own connections; nothing here blocks or runs in another thread."""

    def __init__(self, host, port, view):
        self.sock = _rendezvous.listener(host, port, 128)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self._view = view
        self._selector = None
        self._clients = {}                   # socket -> _Client, oldest first

    def attach(self, selector):
        self._selector = selector

    @property
    def connections(self):
        return len(self._clients)

    def accepted(self, sock, address):
        sock.setblocking(False)
        now = time.monotonic()
        while len(self._clients) >= MAX_CONNECTIONS:
            oldest = next(iter(self._clients.values()))
            self._close(oldest, "dropped: too many connections are open")
        client = _Client(sock, address, now)
        self._clients[sock] = client
        self._selector.register(sock, selectors.EVENT_READ,
                                functools.partial(self._ready, client))

    def _ready(self, client, mask):
        if client.sock not in self._clients:
            return                           # closed earlier in this round
        if mask & selectors.EVENT_READ and client.outbox is None:
            self._read(client)
        if client.outbox is not None and client.sock in self._clients:
            self._write(client)

    def _read(self, client):
        try:
            data = client.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(client, f"it went before its request: {exc}")
            return
        client.inbox += data
        end = _end_of_head(client.inbox)
        if end < 0 and data and len(client.inbox) <= MAX_HEAD:
            return                           # more to come
        if end < 0 and len(client.inbox) > MAX_HEAD:
            self._reply(client, b"HTTP/1.0 431 Request Header Fields Too Large\r\n"
                                b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            return
        if end < 0 and not client.inbox:
            self._close(client, None)        # closed without asking anything
            return
        head = bytes(client.inbox[:end] if end >= 0 else client.inbox)
        self._reply(client, answer(head, client.address, self._view))

    def _reply(self, client, reply):
        client.outbox = memoryview(reply)
        client.inbox = bytearray()
        client.deadline = time.monotonic() + REPLY_TIMEOUT
        self._selector.modify(client.sock, selectors.EVENT_WRITE,
                              functools.partial(self._ready, client))

    def _write(self, client):
        try:
            sent = client.sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(client, f"it went before its reply: {exc}")
            return
        client.outbox = client.outbox[sent:]
        if not client.outbox:
            try:
                client.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._close(client, None)

    def expire(self, now):
        """Close the connections past their deadline."""
        for client in list(self._clients.values()):
            if now > client.deadline:
                self._close(client, "its request did not arrive in time" if client.outbox
                            is None else "it did not read its reply in time")

    def _close(self, client, why):
        if self._clients.pop(client.sock, None) is None:
            return
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        if why is not None:
            _LOG.debug("flinkbuf live view: closed the connection of %s: %s",
                       "%s:%s" % client.address[:2], why)

    def release(self):
        """Close every connection and the listening socket."""
        for client in list(self._clients.values()):
            self._close(client, None)
        self.sock.close()
