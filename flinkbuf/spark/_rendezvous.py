"""The address rendezvous of an exchange, hosted by the driver.

Before the job runs, :func:`~flinkbuf.spark.pipelined_exchange` starts a
:class:`RendezvousServer` on the driver (one thread, plus one per
connection: at most ``max_unauthenticated`` that have not proven the secret
yet, the oldest of which is dropped to make room for a new one, and at most
``max_connections`` that have).  Each task of the barrier stage connects,
proves the exchange's secret (flinkbuf's handshake: HMAC-SHA256 over fresh
nonces in both directions, compared in constant time), sends its stage id,
task attempt id (which tells its stage attempt), partition index and server
address, gets an acknowledgement once its stage attempt has it (or a
refusal), and then the addresses of all tasks once every task of that stage
attempt registered.
This replaces ``BarrierTaskContext.allGather``, which Spark answers on a
one-second poll.

A stage attempt that Spark retries registers afresh; a task of an older
attempt than the newest one seen for its stage is refused, and so is a task
attempt id registered already or (on Spark) one that Spark has not issued.
A peer that fails the handshake, sends a malformed request or waits too long
is dropped with a log line (at a limited rate); the others are not affected.
"""

import atexit
import errno
import json
import logging
import socket
import struct
import threading
import time
import weakref

from flinkbuf.errors import AuthenticationError, NoFreePortError, RemoteConnectionError
from flinkbuf.network import handshake
from flinkbuf.network.log_limit import LogLimiter

_LOG = logging.getLogger("flinkbuf.spark")
_LEN = struct.Struct(">I")
_SEGMENT_SIZE = 0            # the handshake's segment-size field: unused here
MAX_REQUEST = 4096           # bytes of a registration
_ACCEPT_SLICE = 0.2
# Connections that have not proven the secret yet, per rendezvous, at the
# least; past the budget the oldest is dropped.
UNAUTHENTICATED_BUDGET = 32
# The listening socket's backlog, at the least.
LISTEN_BACKLOG = 128
# Connections a rendezvous has room for beyond its tasks'.
MARGIN = 16


def budgets(num_tasks):
    """``(max_connections, max_unauthenticated, backlog)`` of the
    rendezvous of ``num_tasks`` tasks: every task of the stage attempt
    and of a retried one connected at once, all of one attempt handshaking
    at once and waiting to be accepted, each with a margin; the
    unauthenticated budget and the backlog never below
    ``UNAUTHENTICATED_BUDGET`` and ``LISTEN_BACKLOG``."""
    return (2 * num_tasks + MARGIN, max(UNAUTHENTICATED_BUDGET, num_tasks + MARGIN),
            max(LISTEN_BACKLOG, num_tasks + MARGIN))

# The rendezvous servers of this process that are still open.
_LIVE: "weakref.WeakSet[RendezvousServer]" = weakref.WeakSet()


def _send_message(sock, doc):
    body = json.dumps(doc).encode("utf-8")
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_message(sock, limit, deadline):
    (length,) = _LEN.unpack(handshake.recv_exact(sock, _LEN.size, deadline))
    if length > limit:
        raise ValueError(f"a message of {length} bytes (at most {limit})")
    try:
        doc = json.loads(handshake.recv_exact(sock, length, deadline).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("a malformed message") from None
    if not isinstance(doc, dict):
        raise ValueError("a malformed message")
    return doc


def _is_int(value, minimum=0):
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value < 2**31


class _Attempt:
    def __init__(self, num_tasks):
        self.addresses = [None] * num_tasks
        self.tids = [None] * num_tasks
        self.registered = 0
        self.superseded = False

    @property
    def complete(self):
        return self.registered == len(self.addresses)


class RendezvousServer:
    """The driver's side: serves the registrations of ``num_tasks`` tasks
    per stage attempt, authenticated with ``secret``.  ``address`` is the
    ``(host, port)`` tasks connect to (``advertise`` as host, the bound
    port).  Every wait lasts at most ``timeout`` seconds.  Its budgets
    (``max_connections``, ``max_unauthenticated`` and the backlog) follow
    ``num_tasks`` (:func:`budgets`) unless given.  :meth:`close`
    (idempotent) stops the thread and closes every socket.
    ``issued_task_ids()``, if given, returns the task attempt id Spark will
    issue next (None: unknown): a registration with that id or a later one
    is refused, as nobody could have it yet.  ``port``: the port to bind
    (0: any free one); if it is taken, the next ones, up to
    ``port_retries`` more (as Spark binds ``spark.driver.port``)."""

    def __init__(self, secret, num_tasks, *, host="127.0.0.1", advertise=None, timeout=60.0,
                 max_connections=None, max_unauthenticated=None, issued_task_ids=None,
                 port=0, port_retries=0):
        self._secret = secret
        self._num_tasks = num_tasks
        self._timeout = timeout
        connections, unauthenticated, backlog = budgets(num_tasks)
        self._max_connections = (max_connections if max_connections is not None
                                 else connections)
        self._max_unauthenticated = (max_unauthenticated if max_unauthenticated is not None
                                     else unauthenticated)
        self._issued_task_ids = issued_task_ids
        self._unauthenticated = {}   # connection -> when it was accepted
        self._log_limited = LogLimiter(_LOG)   # per cause: 10 lines at once, then one per 5 s
        self._lock = threading.Condition()
        self._attempts = {}          # stage id -> its newest attempt
        self.attempts_started = 0
        self._conns = set()
        self._handlers = set()
        self._closed = False
        self._released = False
        self._last_activity = time.monotonic()
        self.refused = 0             # connections dropped (bad peer, stale attempt, ...)
        self._sock = bind_in_range(
            lambda p: listener(host, p, min(backlog, self._max_connections)), host, port,
            port_retries, "the exchange's rendezvous on the driver", "rendezvous_port")
        self._sock.settimeout(_ACCEPT_SLICE)
        self.address = (advertise or host, self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"flinkbuf-rendezvous-{self.address[1]}")
        self._thread.start()
        _LIVE.add(self)

    def stages(self):
        """The ids of the stages whose tasks have registered."""
        with self._lock:
            return list(self._attempts)

    def _count_refused(self):
        with self._lock:
            self.refused += 1

    @property
    def closed(self):
        return self._closed

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return f"<RendezvousServer {self.address[0]}:{self.address[1]} {state}>"

    def release(self):
        """The exchange's result is gone on the driver: keep serving while
        tasks register, and close once no task has registered for
        ``timeout`` seconds (a job over an RDD made from the result across a
        shuffle, or a retried stage attempt, still finds it)."""
        with self._lock:
            self._released = True
            self._last_activity = time.monotonic()

    def _idle_after_release(self):
        with self._lock:
            return (self._released and not self._conns
                    and time.monotonic() - self._last_activity > self._timeout)

    def close(self):
        """Stop serving: the listening socket and every connection close,
        waiting tasks are dropped (they fail), the threads end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns)
            self._lock.notify_all()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)   # ends an accept() waiting now (Linux)
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(self._timeout)
        for handler in list(self._handlers):
            if handler is not threading.current_thread():
                handler.join(self._timeout)
        _LIVE.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- the accepting thread ------------------------------------------------------

    def _serve(self):
        try:
            while not self._closed:
                try:
                    conn, peer = self._sock.accept()
                except socket.timeout:
                    if self._idle_after_release():
                        self.close()
                    continue
                except OSError:
                    if self._closed:
                        break
                    time.sleep(_ACCEPT_SLICE)
                    continue
                with self._lock:
                    if self._closed:
                        conn.close()
                        continue
                    # Sockets that have not proven the secret have a budget of
                    # their own: past it the oldest goes, so that a flood of
                    # them cannot keep the tasks out (a task proves it at once).
                    oldest = None
                    if len(self._unauthenticated) >= self._max_unauthenticated:
                        oldest = min(self._unauthenticated, key=self._unauthenticated.get)
                        del self._unauthenticated[oldest]
                    self._unauthenticated[conn] = time.monotonic()
                    self._conns.add(conn)
                if oldest is not None:
                    self._count_refused()
                    self._log_limited(logging.WARNING, "evicted",
                                      "flinkbuf rendezvous: dropped a connection that had not "
                                      "authenticated yet: %d others were waiting",
                                      self._max_unauthenticated)
                    try:
                        oldest.shutdown(socket.SHUT_RDWR)   # its handler sees the end
                    except OSError:
                        pass
                handler = threading.Thread(target=self._handle, args=(conn, peer), daemon=True,
                                           name=f"flinkbuf-rendezvous-{self.address[1]}-peer")
                self._handlers.add(handler)
                handler.start()
        finally:
            self._sock.close()
            # Handlers that are still waiting end once their connection is shut.
            with self._lock:
                conns = list(self._conns)
            for conn in conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # ---- one registration per connection ---------------------------------------------

    def _handle(self, conn, peer):
        try:
            try:
                deadline = time.monotonic() + self._timeout
                host, port = self.address
                handshake.server(conn, self._secret, f"{host}:{port}", _SEGMENT_SIZE,
                                 self._timeout)
                with self._lock:
                    self._unauthenticated.pop(conn, None)
                    authenticated = len(self._conns) - len(self._unauthenticated)
                    if authenticated > self._max_connections:
                        raise RemoteConnectionError(
                            f"{authenticated - 1} authenticated connections open already")
                    self._last_activity = time.monotonic()
                request = _recv_message(conn, MAX_REQUEST, deadline)
                stage, tid, index, address = self._parse(request)
                reply = self._join(stage, tid, index, address)
                if not isinstance(reply, dict):
                    # Acknowledged once it is recorded: the task's records
                    # flow only after its stage attempt knows it.
                    _send_message(conn, {"registered": True})
                    reply = self._await(stage, reply, time.monotonic() + self._timeout)
                _send_message(conn, reply)
                if "error" in reply:
                    self._count_refused()
                    _LOG.warning("flinkbuf rendezvous: refused task %s (task attempt %s) of "
                                 "stage %s from %s: %s", index, tid, stage, peer,
                                 reply["error"])
            except (AuthenticationError, RemoteConnectionError, TimeoutError, ConnectionError,
                    ValueError, OSError) as exc:
                self._count_refused()
                if not self._closed:
                    self._log_limited(logging.WARNING, type(exc).__name__,
                                      "flinkbuf rendezvous: dropped a "
                                      "peer at %s: %s", peer, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._unauthenticated.pop(conn, None)
                self._last_activity = time.monotonic()
            conn.close()
            self._handlers.discard(threading.current_thread())

    def _parse(self, request):
        stage, tid = request.get("stage"), request.get("task_attempt_id")
        index, address = request.get("index"), request.get("address")
        num_tasks = request.get("num_tasks")
        if not (_is_int(stage) and isinstance(tid, int) and not isinstance(tid, bool)
                and 0 <= tid < 2**63 and _is_int(index)
                and isinstance(address, str) and 0 < len(address) <= 300):
            raise ValueError("a malformed registration")
        if num_tasks != self._num_tasks or index >= self._num_tasks:
            raise ValueError(f"task {index} of {num_tasks}: this exchange has "
                             f"{self._num_tasks} tasks")
        if self._issued_task_ids is not None:
            issued = self._issued_task_ids()
            if issued is not None and tid >= issued:
                raise ValueError(f"task attempt {tid}: Spark has issued task attempt ids "
                                 f"below {issued} only")
        return stage, tid, index, address

    def _attempt_of(self, stage, tid, index):
        """The stage attempt a task belongs to, or an error message.

        PySpark does not tell a task its stage attempt number, but its task
        attempt id: Spark numbers the tasks of one barrier stage attempt
        consecutively as it launches them all at once, and launches a
        retried attempt after the tasks of the failed one.  So a task joins
        the current attempt of its stage if its id lies within ``num_tasks``
        of the ids registered there and its slot is free; a later id starts
        a newer attempt (the current one is dropped, its waiting tasks
        refused); an earlier id belongs to an older attempt and is refused."""
        n = self._num_tasks
        current = self._attempts.get(stage)
        if current is not None:
            if tid in current.tids:
                return (f"task attempt {tid} registered already, as task "
                        f"{current.tids.index(tid)}")
            taken = current.tids[index]
            lo, hi = min(t for t in current.tids if t is not None), \
                max(t for t in current.tids if t is not None)
            if taken is None and max(hi, tid) - min(lo, tid) < n:
                return current
            if tid <= (taken if taken is not None else lo):
                return (f"task attempt {tid} belongs to an older attempt of stage {stage} "
                        f"than the one registering now")
            current.superseded = True
            self._lock.notify_all()
        current = self._attempts[stage] = _Attempt(n)
        self.attempts_started += 1
        return current

    def _join(self, stage, tid, index, address):
        """Add one task to its stage attempt: the attempt, or an error reply."""
        with self._lock:
            entry = self._attempt_of(stage, tid, index)
            if isinstance(entry, str):
                return {"error": entry}
            if entry.complete:
                return {"error": f"stage {stage} has all its tasks already"}
            entry.addresses[index] = address
            entry.tids[index] = tid
            entry.registered += 1
            if entry.complete:
                self._lock.notify_all()
            return entry

    def _await(self, stage, entry, deadline):
        """Wait until the stage attempt ``entry`` is complete; returns the
        reply (the addresses, or an error)."""
        with self._lock:
            while not entry.complete:
                if self._closed:
                    return {"error": "the rendezvous closed"}
                if entry.superseded:
                    return {"error": f"a newer attempt of stage {stage} started"}
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"error": f"{entry.registered} of {self._num_tasks} tasks of stage "
                                     f"{stage} registered within {self._timeout:g} s"}
                self._lock.wait(remaining)
            return {"addresses": list(entry.addresses), "task_attempt_ids": list(entry.tids)}


def listener(host, port, backlog):
    """A TCP socket listening on ``host`` (IPv4 or IPv6) at ``port`` (0:
    any free one), with ``backlog``; closed again if that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_in_range(bind, host, port, retries, what, option):
    """``bind(port)`` for ``port`` and, while the port is taken, each of
    the next ``retries`` ports (as Spark binds its own ports, up to
    ``spark.port.maxRetries`` more); port 0 is any free port.  Raises
    :class:`~flinkbuf.errors.NoFreePortError` naming ``what`` and the
    ``option`` that sets the port when every port is taken."""
    last = port if port == 0 else min(65535, port + retries)
    for p in range(port, last + 1):
        try:
            return bind(p)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise NoFreePortError(
        errno.EADDRINUSE,
        f"{what} found no free port on {host} in {port}-{last} ({option}={port} and "
        f"{retries} more; port_retries, or the session's spark.port.maxRetries, says how many)")


class Addresses(list):
    """The addresses of the tasks of a stage attempt, in task order, and
    their task attempt ids (``task_attempt_ids``)."""

    def __init__(self, addresses, task_attempt_ids):
        super().__init__(addresses)
        self.task_attempt_ids = task_attempt_ids


def _unreachable(host, port, exc, connect_timeout):
    """The error of a task that could not connect to the rendezvous."""
    where = f"the exchange's rendezvous on the driver at {host}:{port}"
    pin = ("pin its port with rendezvous_port= and let the executors connect to it, as to "
           "spark.driver.port")
    if isinstance(exc, ConnectionRefusedError):
        return RemoteConnectionError(
            f"{where} refused the connection ({exc}): it is closed (it closes once the "
            f"exchange's result is no longer referenced on the driver, and at "
            f"close_rendezvous()), or a firewall on the driver rejects connections to that "
            f"port ({pin})")
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return RemoteConnectionError(
            f"could not connect to {where} within {connect_timeout:g} s (connect_timeout): "
            f"the driver must accept connections from the executors on that port (does a "
            f"firewall drop them? {pin})")
    return RemoteConnectionError(
        f"could not reach {where} ({exc}): the executors must be able to connect to the "
        f"driver at that address (spark.driver.host)")


def register(rendezvous, secret, *, stage, task_attempt_id, index, num_tasks, address,
             timeout, connect_timeout=None):
    """The task's side: register ``address`` as task ``index`` (task
    attempt ``task_attempt_id``) of stage ``stage`` at the driver's ``rendezvous`` (host,
    port) and return every task's address once all have registered (an
    :class:`Addresses`, which has their task attempt ids too).  Connecting,
    the handshake and the driver's acknowledgement take at most
    ``connect_timeout`` seconds (default: ``timeout``), the answer at most
    ``timeout``."""
    return Registration(rendezvous, secret, stage=stage, task_attempt_id=task_attempt_id,
                        index=index, num_tasks=num_tasks, address=address, timeout=timeout,
                        connect_timeout=connect_timeout).answer()


class Registration:
    """A task's registration at the driver's rendezvous, made and
    acknowledged by the driver when constructed (:func:`register`'s
    arguments and errors; a refusal is raised here): :meth:`answer` waits for
    every task's address, and :meth:`cancel`, from another thread, ends
    that wait with an error.  A task registers before its records flow, so
    that it cannot fail before its stage attempt knows it: a retried
    attempt's tasks then never join an older one."""

    def __init__(self, rendezvous, secret, *, stage, task_attempt_id, index, num_tasks, address,
                 timeout, connect_timeout=None):
        host, port = rendezvous
        self._where = f"{host}:{port}"
        self._index, self._num_tasks = index, num_tasks
        self._deadline = time.monotonic() + timeout
        if connect_timeout is None:
            connect_timeout = timeout
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise _unreachable(host, port, exc, connect_timeout) from None
        try:
            try:
                handshake.client(sock, secret, address, _SEGMENT_SIZE, connect_timeout)
            except AuthenticationError as exc:
                raise AuthenticationError(f"the exchange's rendezvous on the driver at "
                                          f"{self._where}: {exc}") from None
            _send_message(sock, {"stage": stage, "task_attempt_id": task_attempt_id,
                                 "index": index, "num_tasks": num_tasks, "address": address})
            # The driver acknowledges once the task is part of its stage
            # attempt (or refuses it at once).
            self._sock = sock
            self._check(self._receive(min(self._deadline,
                                          time.monotonic() + connect_timeout)),
                        "registered")
        except BaseException:
            sock.close()
            raise

    def answer(self):
        """Every task's address, once all have registered (or an error)."""
        try:
            reply = self._receive(self._deadline)
        finally:
            self._sock.close()
        self._check(reply, "addresses")
        addresses = reply.get("addresses")
        tids = reply.get("task_attempt_ids")
        n = self._num_tasks
        if not (isinstance(addresses, list) and len(addresses) == n
                and all(isinstance(a, str) for a in addresses)
                and isinstance(tids, list) and len(tids) == n
                and all(_is_int(t, 0) or (isinstance(t, int) and not isinstance(t, bool)
                                          and 0 <= t < 2**63) for t in tids)):
            raise RemoteConnectionError("the exchange's rendezvous sent a malformed answer")
        return Addresses(addresses, tids)

    def _receive(self, deadline):
        try:
            return _recv_message(self._sock, 1024 + 320 * self._num_tasks, deadline)
        except (TimeoutError, ConnectionError, ValueError, OSError) as exc:
            raise RemoteConnectionError(f"the exchange's rendezvous on the driver at "
                                        f"{self._where} gave no answer: {exc}") from None

    def _check(self, reply, expected):
        if "error" in reply:
            raise RemoteConnectionError(f"the exchange's rendezvous refused task "
                                        f"{self._index}: {reply['error']}")
        if expected not in reply:
            raise RemoteConnectionError("the exchange's rendezvous sent a malformed answer")

    def cancel(self):
        """Stop waiting for the answer (the task failed)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def close_all():
    """Close every rendezvous server of this process that is still open."""
    for server in list(_LIVE):
        server.close()


atexit.register(close_all)
