"""The driver's report server of a live view: one thread that accepts the
tasks' connections, runs flinkbuf's handshake with each (the view's
secret; a peer that does not prove it is dropped), decodes their messages
(:mod:`flinkbuf.spark._reports`) and hands them to the view's store.

Budgets, as the exchange's rendezvous has them: at most
``unauthenticated_budget`` connections that have not proven the secret
(past that the oldest goes), each for at most ``handshake_timeout``
seconds: ``UNAUTHENTICATED_BUDGET``, raised as exchanges register
(:meth:`Collector.expect`) to let all of an exchange's tasks handshake at
once; at most ``max_connections`` that have (the next is refused in
the handshake); a connection that sends nothing for ``idle_timeout``
seconds, a malformed message or more than ``MAX_MESSAGE`` bytes in one is
dropped, and so is its task's report stream (the store marks the task
lost).  Every drop is counted (``refused``) and logged at a limited rate;
nothing a peer sends can stop the thread or reach another connection.
``max_connections`` is 4,096 at most and by default fits the process's
descriptors (:func:`connection_cap`); an ``accept`` that finds none left
(EMFILE, ENFILE; or fails otherwise but for the one connection) pauses
that listening socket, for longer each time up to ``MAX_BACKOFF`` seconds,
instead of trying again at once: connections wait in the listening
socket's backlog until descriptors are free.
"""

import errno
import logging
import resource
import selectors
import socket
import threading
import time

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.network import handshake
from flinkbuf.network.log_limit import LogLimiter
from flinkbuf.spark import _rendezvous, _reports

_LOG = logging.getLogger("flinkbuf.spark")
UNAUTHENTICATED_BUDGET = 32  # at the least; raised to an exchange's tasks (expect)
LISTEN_BACKLOG = 128         # the report socket's backlog, at the least
MARGIN = 16                  # connections beyond an exchange's tasks
MAX_CONNECTIONS = 4096
OTHER_CONNECTIONS = 64       # the page's connections, which share the thread and the limit
MIN_BACKOFF = 0.05           # seconds a listening socket pauses when descriptors run out ...
MAX_BACKOFF = 1.0            # ... doubling up to this
# accept() failing for that connection only: the next is tried at once; any other
# failure (no descriptor left, EMFILE or ENFILE, no memory) pauses the socket.
_CONNECTION_FAILED = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN,
                      errno.ENOPROTOOPT, errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH,
                      errno.EOPNOTSUPP, errno.ENETUNREACH)
_SLICE = 0.2                 # seconds between the thread's checks of its deadlines
_RECV = 65536


def connection_cap(limit=None):
    """The authenticated report connections a server keeps at most, for a
    process that may open ``limit`` descriptors (default: its
    RLIMIT_NOFILE soft limit): ``MAX_CONNECTIONS``, or half the limit less
    the budgets of connections not yet authenticated and of the page (the
    other half for the rest of the process), at least 1."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit < 0:                              # RLIM_INFINITY
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, limit // 2 - UNAUTHENTICATED_BUDGET - OTHER_CONNECTIONS))


class _Listening:
    """A listening socket the thread accepts on, ``on_accept(sock,
    address)`` for each connection; paused until ``resume`` (monotonic
    seconds) after running out of descriptors."""

    __slots__ = ("sock", "on_accept", "resume", "backoff")

    def __init__(self, sock, on_accept):
        self.sock = sock
        self.on_accept = on_accept
        self.resume = None
        self.backoff = MIN_BACKOFF


class _Peer:
    __slots__ = ("sock", "address", "handshake", "deadline", "inbox", "outbox", "num_tasks",
                 "task", "last")

    def __init__(self, sock, address, hs, deadline):
        self.sock = sock
        self.address = address
        self.handshake = hs
        self.deadline = deadline
        self.inbox = bytearray()
        self.outbox = bytearray()
        self.num_tasks = None        # set by the hello
        self.task = None             # the store's key of the task, after the hello
        self.last = time.monotonic()


class Collector:
    """Serves ``store`` (``hello(doc, peer) -> key | str``, ``report(key,
    doc)``, ``lost(key, why)``) on ``host`` (any free port; ``address``
    is ``(advertise or host, port)``), authenticated with ``secret``.
    ``alive()``, if given, is asked every fraction of a second; once it
    returns False the collector calls ``on_dead()`` (from its thread).
    ``services``: servers the thread runs as well (the view's page,
    :class:`~flinkbuf.spark._live_http.PageServer`): each has a listening
    ``sock`` the thread accepts on for it (``accepted(sock, address)``),
    is given the thread's selector (``attach``), registers its
    connections there with a callback of the event mask, and is asked to
    ``expire(now)`` its deadlines and, when the thread ends,
    ``release()`` its sockets.  One thread serves them all and ends at
    once on :meth:`close`, which ends the thread and closes every socket
    of its own."""

    def __init__(self, store, secret, host="127.0.0.1", *, advertise=None,
                 handshake_timeout=10.0, idle_timeout=30.0, max_connections=None,
                 alive=None, on_dead=None, services=()):
        self._store = store
        self._secret = secret
        self._handshake_timeout = handshake_timeout
        self._idle_timeout = idle_timeout
        self.max_connections = connection_cap() if max_connections is None else max_connections
        self.unauthenticated_budget = UNAUTHENTICATED_BUDGET
        self._alive = alive
        self._on_dead = on_dead
        self._services = list(services)
        self._log_limited = LogLimiter(_LOG)
        self._lock = threading.Lock()
        self.refused = 0
        self._peers = {}             # socket -> _Peer
        self._closed = False
        self._sock = _rendezvous.listener(host, 0, LISTEN_BACKLOG)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        try:
            self._sock.setblocking(False)
            self._wake_r.setblocking(False)
            self._listening = [_Listening(self._sock, self._accepted)]
            self._listening += [_Listening(s.sock, s.accepted) for s in self._services]
            for listening in self._listening:
                self._selector.register(listening.sock, selectors.EVENT_READ, listening)
            self._selector.register(self._wake_r, selectors.EVENT_READ)
            for service in self._services:
                service.attach(self._selector)
        except BaseException:
            self._release()
            raise
        self.address = (advertise or host, self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"flinkbuf-live-view-{self.address[1]}")
        self._thread.start()

    def _release(self):
        for service in self._services:
            service.release()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()
        self._selector.close()

    def close(self):
        """Stop: every connection closes (tasks still reporting stop
        reporting, and run on), the thread ends (joined unless this is
        it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(10.0)

    @property
    def closed(self):
        return self._closed

    def expect(self, num_tasks):
        """An exchange of ``num_tasks`` tasks will report: room for all of
        them handshaking at once, and a margin.  The budget of connections
        not authenticated yet (never above ``max_connections``, nor below
        ``UNAUTHENTICATED_BUDGET``) and the listening socket's backlog grow
        to it; they never shrink."""
        budget = max(UNAUTHENTICATED_BUDGET, min(num_tasks + MARGIN, self.max_connections))
        with self._lock:
            if budget <= self.unauthenticated_budget or self._closed:
                return
            self.unauthenticated_budget = budget
            try:
                self._sock.listen(max(LISTEN_BACKLOG, budget))
            except OSError:                # closed meanwhile
                pass

    @property
    def connections(self):
        """(connections that proved the secret, connections that have not)."""
        with self._lock:
            pending = sum(1 for p in self._peers.values() if p.handshake is not None)
            return len(self._peers) - pending, pending

    # ---- the thread ----------------------------------------------------------------------

    def _serve(self):
        try:
            while not self._closed:
                for key, mask in self._selector.select(self._wait()):
                    self._dispatch(key.data, mask)
                now = time.monotonic()
                self._resume(now)
                self._expire(now)
                if self._alive is not None and not self._closed and not self._alive():
                    self._closed = True
                    if self._on_dead is not None:
                        self._on_dead()
        except Exception:                  # noqa: BLE001 - a bug: say so, end cleanly
            _LOG.exception("flinkbuf live view: the report server failed")
        finally:
            for peer in list(self._peers.values()):
                self._drop(peer, None, count=False)
            self._release()

    def _dispatch(self, data, mask):
        if data is None:                    # the wake-up: the loop checks why
            return
        if isinstance(data, _Listening):
            self._accept(data)
        elif isinstance(data, _Peer):
            if data.sock not in self._peers:
                return
            try:
                if mask & selectors.EVENT_WRITE:
                    self._flush(data)
                if mask & selectors.EVENT_READ and data.sock in self._peers:
                    self._read(data)
            except Exception as exc:    # noqa: BLE001 - a bug: drop this peer
                _LOG.exception("flinkbuf live view: a report failed")
                self._drop(data, f"a report failed: {type(exc).__name__}")
        else:
            try:
                data(mask)
            except Exception:          # noqa: BLE001 - the service's bug
                _LOG.exception("flinkbuf live view: serving failed")

    def _wait(self):
        """Seconds the selector may wait: a slice, or less until a paused
        listening socket resumes."""
        resumes = [listening.resume for listening in self._listening
                   if listening.resume is not None]
        if not resumes:
            return _SLICE
        return max(0.0, min(_SLICE, min(resumes) - time.monotonic()))

    def _resume(self, now):
        for listening in self._listening:
            if listening.resume is not None and now >= listening.resume:
                listening.resume = None
                self._selector.register(listening.sock, selectors.EVENT_READ, listening)

    def _accept(self, listening):
        for _ in range(64):
            try:
                sock, address = listening.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _CONNECTION_FAILED:
                    continue                 # that connection failed: the next
                self._selector.unregister(listening.sock)
                listening.resume = time.monotonic() + listening.backoff
                self._log_limited(logging.WARNING, "accept", "flinkbuf live view: accept "
                                  "failed: %s; trying again in %g s", exc, listening.backoff)
                listening.backoff = min(MAX_BACKOFF, 2 * listening.backoff)
                return
            listening.backoff = MIN_BACKOFF
            listening.on_accept(sock, address)

    def _accepted(self, sock, address):
        sock.setblocking(False)
        hs = handshake.ServerHandshake(self._secret, "%s:%s" % self.address,
                                       _reports.SEGMENT_SIZE, admit=self._admit)
        peer = _Peer(sock, address, hs, time.monotonic() + self._handshake_timeout)
        pending = [p for p in self._peers.values() if p.handshake is not None]
        if len(pending) >= self.unauthenticated_budget:
            oldest = min(pending, key=lambda p: p.deadline)
            self._drop(oldest, "evicted: too many connections have not authenticated")
        with self._lock:
            self._peers[sock] = peer
        self._selector.register(sock, selectors.EVENT_READ, peer)

    def _admit(self):
        authenticated = sum(1 for p in self._peers.values() if p.handshake is None)
        if authenticated >= self.max_connections:
            return f"{authenticated} tasks report already"
        return None

    def _read(self, peer):
        try:
            data = peer.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(peer, f"the connection failed: {exc}")
            return
        if not data:
            if peer.handshake is not None:
                self._drop(peer, "it closed the connection before it authenticated")
            else:
                self._drop(peer, "the connection closed before the task's last report",
                           count=False)
            return
        peer.last = time.monotonic()
        if peer.handshake is not None:
            self._handshake(peer, data)
            return
        peer.inbox += data
        self._messages(peer)

    def _handshake(self, peer, data):
        hs = peer.handshake
        try:
            reply = hs.feed(data)
        except AuthenticationError as exc:
            self._drop(peer, f"it did not authenticate: {exc}")
            return
        except RemoteConnectionError as exc:
            self._send(peer, hs.reply_before_refusal)
            self._drop(peer, f"refused: {exc}", linger=True)
            return
        if hs.done and hs.keys is not None:
            self._drop(peer, "it asked for sealed frames, which reports do not use")
            return
        self._send(peer, reply)
        if hs.done:
            peer.handshake = None
            peer.deadline = None

    def _messages(self, peer):
        inbox = peer.inbox
        while len(inbox) >= _reports.LENGTH.size:
            (length,) = _reports.LENGTH.unpack_from(inbox)
            if length > _reports.MAX_MESSAGE:
                self._drop(peer, f"a message of {length} bytes (at most "
                                 f"{_reports.MAX_MESSAGE})")
                return
            if len(inbox) < _reports.LENGTH.size + length:
                return
            body = bytes(inbox[_reports.LENGTH.size:_reports.LENGTH.size + length])
            del inbox[:_reports.LENGTH.size + length]
            try:
                doc = _reports.decode(body, peer.num_tasks)
            except ValueError as exc:
                self._drop(peer, f"a malformed message: {exc}")
                return
            if peer.task is None:
                key = self._store.hello(doc, "%s:%s" % peer.address[:2])
                if isinstance(key, str):
                    self._drop(peer, key)
                    return
                peer.task, peer.num_tasks = key, doc["num_tasks"]
                continue
            self._store.report(peer.task, doc)
            if doc["type"] == "end":
                peer.task = None                         # it ended: not lost
                self._drop(peer, None, count=False)     # nothing may follow the end
                return

    def _send(self, peer, data):
        peer.outbox += data
        self._flush(peer)

    def _flush(self, peer):
        if peer.outbox:
            try:
                sent = peer.sock.send(peer.outbox)
                del peer.outbox[:sent]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                peer.outbox.clear()
        if peer.sock in self._peers:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
            self._selector.modify(peer.sock, events, peer)

    def _expire(self, now):
        for service in self._services:
            service.expire(now)
        for peer in list(self._peers.values()):
            if peer.handshake is not None and now > peer.deadline:
                self._drop(peer, "it did not complete the handshake in time")
            elif peer.handshake is None and now - peer.last > self._idle_timeout:
                self._drop(peer, f"no report for {self._idle_timeout:g} s")

    def _drop(self, peer, why, *, count=True, linger=False):
        """Close ``peer``'s connection; ``why`` (None: an orderly end) is
        logged and, for a task that reported, shown as why it was lost."""
        with self._lock:
            if self._peers.pop(peer.sock, None) is None:
                return
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        if linger and peer.outbox:
            try:
                peer.sock.setblocking(True)
                peer.sock.settimeout(1.0)
                peer.sock.sendall(peer.outbox)
            except OSError:
                pass
        try:
            peer.sock.close()
        except OSError:
            pass
        if peer.task is not None:
            self._store.lost(peer.task, why or "the report connection closed")
        if why is not None and count:
            with self._lock:
                self.refused += 1
        if why is not None and not self._closed:
            self._log_limited(logging.WARNING, why.split(":")[0],
                              "flinkbuf live view: dropped reports from %s: %s",
                              "%s:%s" % peer.address[:2], why)
