"""The server side of a network environment: its listening sockets (TCP,
and a Unix socket beside it for peers on this host) and one thread that
accepts connections and runs their handshakes, many at a time."""

from __future__ import annotations

import errno
import functools
import logging
import selectors
import socket
import threading
import time
from typing import Any, cast

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.network import handshake, sockets
from flinkbuf.network.addresses import OwnAddresses
from flinkbuf.network.config import MAX_PENDING_HANDSHAKES, NetworkConfig
from flinkbuf.network.connection_table import ConnectionTable
from flinkbuf.network.log_limit import LogLimiter
from flinkbuf.network.transports import ConnectionOpener, SharedMemorySpec, StreamSpec

__all__ = ["ACCEPT_BACKOFF", "Acceptor", "LISTEN_BACKLOG", "Listeners",
           "MAX_PENDING_HANDSHAKES"]

log = logging.getLogger("flinkbuf.network")

# An environment's max_pending_handshakes (MAX_PENDING_HANDSHAKES, 128, by
# default, as flinkbuf.network.config defines it) bounds the connections
# accepted and not authenticated yet; past it the one that has waited longest
# for its next message is dropped (a flood of idle sockets cannot lock
# legitimate peers out, nor take the descriptors authenticated connections
# need).  The listening sockets' backlog: this, or max_pending_handshakes if
# larger.
LISTEN_BACKLOG = 128
# Out of descriptors, the acceptor stops accepting for a back-off from
# ACCEPT_BACKOFF[0] s, doubling up to ACCEPT_BACKOFF[1] s while it lasts.
ACCEPT_BACKOFF = (0.01, 0.5)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

_WAKE = object()                     # the selector key of the acceptor's wake-up socket


class Listeners:
    """The listening sockets of one environment: TCP at ``host``/``port``
    and, when peers on this host are reached over a Unix socket, one at
    the abstract name the TCP port gives (:func:`sockets.unix_name`); each
    with a backlog of ``LISTEN_BACKLOG`` or ``max_pending_handshakes``,
    whichever is larger (the kernel may cap it: ``net.core.somaxconn``)."""

    def __init__(self, config: NetworkConfig) -> None:
        backlog = max(LISTEN_BACKLOG, config.max_pending_handshakes)
        self.tcp = socket.create_server((config.host, config.port), backlog=backlog)
        self.tcp.setblocking(False)
        bound = self.tcp.getsockname()
        self.bound: tuple[str, int] = (bound[0], bound[1])
        self.unix: socket.socket | None = None
        if config.uses_unix_socket:
            try:
                self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.unix.bind(sockets.unix_name(self.bound[1]))
                self.unix.listen(backlog)
                self.unix.setblocking(False)
            except OSError as exc:
                log.info("no Unix socket beside %s:%d (%s): TCP only", *self.bound, exc)
                if self.unix is not None:
                    self.unix.close()
                self.unix = None

    @property
    def family(self) -> int:
        return int(self.tcp.family)

    def all(self) -> list[socket.socket]:
        return [s for s in (self.tcp, self.unix) if s is not None]

    def close(self) -> None:
        for server in self.all():
            try:
                server.close()
            except OSError:
                pass


class _PendingHandshake:
    """A connection accepted and not authenticated yet: its handshake, the
    time by which it must end, the peer's address, the descriptors it
    passed, when it last sent something, and the address its peer gave
    once the handshake chose to keep it (until it runs or is gone)."""

    __slots__ = ("hs", "deadline", "peer", "fds", "progress", "accepting")

    def __init__(self, hs: handshake.ServerHandshake, deadline: float, peer: Any,
                 progress: float, accepting: list[str]) -> None:
        self.hs = hs
        self.deadline = deadline
        self.peer = peer
        self.fds: list[int] = []
        self.progress = progress
        self.accepting = accepting


_Pending = dict[socket.socket, _PendingHandshake]


class Acceptor:
    """Accepts the connections other environments make to this one (the
    server half of Flink's ``NettyConnectionManager``).  One thread runs
    every pending handshake as a state machine over non-blocking sockets; an
    authenticated connection is opened by ``opener`` and kept in ``table``.
    No peer can end the thread: a connection that cannot be set up is
    refused and logged (at a limited rate), and while the process is out of
    descriptors it stops accepting for a while instead of spinning."""

    def __init__(self, config: NetworkConfig, listeners: Listeners, own: OwnAddresses,
                 table: ConnectionTable, opener: ConnectionOpener) -> None:
        self._config = config
        self._listeners = listeners
        self._own = own
        self._table = table
        self._opener = opener
        self._closed = False
        self._log_limited = LogLimiter(log)   # per cause, 10 at once, then one per 5 s
        self._backoff = 0.0                   # while out of descriptors
        self._paused_until = 0.0
        # Made here, not in the thread: close() right away finds them
        # registered.  close() wakes the thread with a byte on _wake (closing
        # a listening socket does not end a select() on it).
        self._wake = socket.socketpair()
        for s in self._wake:
            s.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake[0], selectors.EVENT_READ, _WAKE)
        for server in listeners.all():
            self._selector.register(server, selectors.EVENT_READ, server)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"flinkbuf-accept-{own.text}")

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        """Whether the accepting thread runs."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop accepting: close the listening sockets, end the thread
        (waiting up to 5 s) and drop the handshakes still pending."""
        self._closed = True
        self._listeners.close()
        try:
            self._wake[1].send(b"x")
        except OSError:
            pass
        if self._thread.ident is None:
            self._selector.close()               # (the thread closes it as it ends)
        elif self._thread is not threading.current_thread():
            self._thread.join(5)
        for s in self._wake:
            s.close()

    # ---- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        sel = self._selector
        pending: _Pending = {}
        try:
            while not self._closed:
                self._table.reap()
                now = time.monotonic()
                self._resume(sel, now)
                wakes = [p.deadline for p in pending.values()] + [now + 0.2]
                if self._paused_until:
                    wakes.append(self._paused_until)
                try:
                    events = sel.select(max(0.0, min(wakes) - now))
                except OSError:            # the server socket was closed under us
                    if self._closed:
                        return
                    raise
                for key, _ in events:
                    if key.data is not _WAKE:    # the wake: the loop sees _closed
                        self._on_ready(sel, pending, key)
                now = time.monotonic()
                for sock, p in list(pending.items()):
                    if p.deadline <= now:
                        self._refuse(sel, pending, sock, "it did not complete the handshake "
                                     f"within {self._config.connect_timeout:g} s")
        finally:
            for sock, p in list(pending.items()):
                handshake.close_fds(p.fds)
                sock.close()
            sel.close()

    def _on_ready(self, sel: selectors.BaseSelector, pending: _Pending,
                  key: selectors.SelectorKey) -> None:
        sock = cast(socket.socket, key.fileobj)
        try:
            if key.data is not True:
                self._accept_new(sel, pending, key.data)
            else:
                self._handshake_step(sel, pending, sock)
        except Exception as exc:    # noqa: BLE001 - the acceptor goes on
            self._log_limited(logging.ERROR, "acceptor: " + type(exc).__name__,
                              "the acceptor of %s: %s: %s", self._own.text,
                              type(exc).__name__, exc, exc_info=True)
            if sock in pending:
                self._refuse(sel, pending, sock, f"{type(exc).__name__}: {exc}")

    def _pause(self, sel: selectors.BaseSelector, exc: OSError) -> None:
        """Out of descriptors (or kernel memory): stop watching the listening
        sockets for a back-off that doubles while it lasts (up to
        ACCEPT_BACKOFF[1] s), so that the acceptor neither spins on a backlog
        it cannot take nor stops for good; connections wait in the backlog."""
        low, high = ACCEPT_BACKOFF
        self._backoff = min(high, self._backoff * 2) if self._backoff else low
        self._paused_until = time.monotonic() + self._backoff
        for server in self._listeners.all():
            try:
                sel.unregister(server)
            except (KeyError, ValueError):
                pass
        self._log_limited(logging.WARNING, f"accept: {exc.errno}",
                          "%s cannot accept connections now (%s): it tries again in %g s",
                          self._own.text, exc, self._backoff)

    def _resume(self, sel: selectors.BaseSelector, now: float) -> None:
        if not self._paused_until or now < self._paused_until or self._closed:
            return
        self._paused_until = 0.0
        for server in self._listeners.all():
            try:
                sel.register(server, selectors.EVENT_READ, server)
            except (KeyError, ValueError):
                pass

    def _accept_new(self, sel: selectors.BaseSelector, pending: _Pending,
                    server: socket.socket) -> None:
        while True:
            try:
                sock, peer = server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if self._closed:
                    return
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(sel, exc)
                    return
                # the peer gave up in the backlog: the next one
                self._log_limited(logging.INFO, f"accept: {exc.errno}",
                                  "accepting a connection failed: %s", exc)
                continue
            self._backoff = 0.0
            try:
                pending[sock] = self._pending(sock, peer)
                sel.register(sock, selectors.EVENT_READ, True)
            except (OSError, ValueError) as exc:
                pending.pop(sock, None)
                sock.close()
                self._log_limited(logging.WARNING, f"set-up: {type(exc).__name__}",
                                  "could not set up a connection from %s: %s", peer, exc)
                continue
            budget = self._config.max_pending_handshakes
            if len(pending) > budget:
                # The one waited on longest for its next message goes: a
                # peer that holds a socket silent cannot push out one whose
                # handshake is moving.
                stalest = min(pending, key=lambda s: pending[s].progress)
                self._refuse(sel, pending, stalest, f"more than {budget} connections were "
                             "waiting for their handshake (max_pending_handshakes), and this "
                             "one had waited longest for its next message")

    def _pending(self, sock: socket.socket, peer: Any) -> _PendingHandshake:
        """The handshake of a connection just accepted."""
        c = self._config
        if not isinstance(peer, tuple):          # a Unix socket's peer
            peer = ("unix", sock.fileno())
            here = True
        else:
            here = self._own.is_this_host(str(peer[0]))
        sock.setblocking(False)
        sockets.tune(sock)
        local = handshake.unix_peer(sock)
        accepting: list[str] = []
        hs = handshake.ServerHandshake(
            c.secret, self._own.text, c.segment_size,
            keep=functools.partial(self._table.keep_accepting, accepting),
            admit=self._table.admit,
            shared_memory=self._opener.new_region if local is not None else None,
            seal=c.seals(here), unix_peer=local, peer_id=c.peer_id,
            expect_peer=self._table.expected)
        now = time.monotonic()
        return _PendingHandshake(hs, now + c.connect_timeout, peer, now, accepting)

    def _handshake_step(self, sel: selectors.BaseSelector, pending: _Pending,
                        sock: socket.socket) -> None:
        p = pending[sock]
        hs = p.hs
        try:
            data = sockets.recv_handshake(sock, p.fds)
            if not data:
                raise AuthenticationError("the peer closed the connection during the handshake")
            p.progress = time.monotonic()
            reply = hs.feed(data)
            if reply:
                sock.sendall(reply)     # a few hundred bytes: the socket buffer takes them
        except (AuthenticationError, RemoteConnectionError, OSError) as exc:
            if isinstance(exc, RemoteConnectionError) and hs.reply_before_refusal:
                try:
                    sock.sendall(hs.reply_before_refusal)
                except OSError:
                    pass
            self._refuse(sel, pending, sock, str(exc))
            return
        if hs.done:
            sel.unregister(sock)
            del pending[sock]
            try:
                self._start_authenticated(sock, p)
            finally:
                self._table.done_accepting(p.accepting)

    def _start_authenticated(self, sock: socket.socket, p: _PendingHandshake) -> None:
        """Run a connection whose handshake ended (or close it: a duplicate,
        or shared memory that could not be passed)."""
        hs, fds = p.hs, p.fds
        advertised = cast("tuple[str, int]", hs.peer)[0]
        if hs.duplicate:             # the peer uses the connection this process keeps
            handshake.close_fds(fds)
            sock.close()
            log.debug("closed a second connection from %s: one connection joins two "
                      "processes", advertised)
            return
        if hs.shared_fds is None or len(fds) != handshake.LEND_FDS:
            handshake.close_fds(fds)     # a client that lends passes its arena and ledger
            fds = []
        if hs.shared_fds is None:
            sock.setblocking(True)
            self._start(StreamSpec(sock.detach(), advertised, hs.keys), hs.peer_id)
            return
        region, data0, room0, data1, room1 = hs.shared_fds
        hs.shared_fds = None
        loan = self._opener.loan_terms(sock)
        try:
            handshake.send_setup(sock, [region, data1, room1]
                                 + ([loan.arena, loan.ledger] if loan else []))
        except OSError as exc:
            handshake.close_fds([region, data0, room0, *fds])
            if loan is not None:
                loan.close()
            sock.close()
            self._log_limited(logging.WARNING, "pass shared memory",
                              "could not pass shared memory to %s: %s", advertised, exc)
            return
        finally:
            handshake.close_fds([data1, room1])
        sock.setblocking(True)
        self._start(SharedMemorySpec(sock.detach(), advertised, region, data0, room0, side=0,
                                     keys=hs.keys, borrowed=(fds[0], fds[1]) if fds else None,
                                     loan=loan), hs.peer_id)

    def _start(self, spec: StreamSpec | SharedMemorySpec, peer_id: str) -> None:
        """Open an authenticated connection and keep it (or close it: the
        environment closed meanwhile)."""
        if self._closed:
            spec.close()
            return
        try:
            conn = self._opener.open(spec)
        except (RemoteConnectionError, MemoryError, OSError) as exc:
            self._log_limited(logging.WARNING, f"start: {type(exc).__name__}",
                              "could not start a connection from %s: %s", spec.peer, exc)
            return
        try:
            kept = self._table.add_accepted(conn, spec.peer, peer_id)
        except MemoryError as exc:
            self._log_limited(logging.WARNING, "start: MemoryError",
                              "could not start a connection from %s: %s", spec.peer, exc)
            kept = False
        if not kept:
            conn.close()

    def _refuse(self, sel: selectors.BaseSelector, pending: _Pending, sock: socket.socket,
                why: str) -> None:
        p = pending.pop(sock)
        self._table.done_accepting(p.accepting)
        p.hs.discard()                   # a region made for it, if its AUTH_OK did not go
        handshake.close_fds(p.fds)       # descriptors it passed
        try:
            sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        self._log_limited(logging.WARNING, "refused: " + why,
                          "refused a connection from %s:%s: %s", p.peer[0], p.peer[1], why)
