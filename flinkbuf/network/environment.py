"""NetworkEnvironment: one per process, the owner of its network buffers,
of a server for the partitions it registers, and of the connections to the
other processes whose partitions its input gates read."""

from __future__ import annotations

import atexit
import collections
import errno
import functools
import logging
import os
import selectors
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Union, cast

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.checks import check_int, check_seconds
from flinkbuf.errors import (
    AuthenticationError,
    PartitionNotFoundError,
    RemoteConnectionError,
)
from flinkbuf.io import InputGate, LocalInputChannel, ResultPartition, UnknownInputChannel
from flinkbuf.network import handshake
from flinkbuf.network.addresses import Address, format_address, is_wildcard, split_address
from flinkbuf.network.log_limit import LogLimiter
from flinkbuf.network._network import (
    Connection,
    FloatingBuffers,
    RemoteInputChannel,
    _memfd_of,
    _new_ledger,
    _shm_region,
    make_floating_buffers,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from flinkbuf.serialization import CodecName

__all__ = ["NetworkEnvironment"]

Transport = Literal["auto", "tcp", "unix", "shm"]
# A channel of create_input_gate: (address, partition id, subpartition).
ChannelSpec = tuple[Union[Address, None], str, int]


_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


def _recv_handshake(sock: socket.socket, fds: list[int]) -> bytes:
    """What a client sent during its handshake; over a Unix socket the
    descriptors it passed join ``fds`` (a client that lends passes its
    arena and ledger with its AUTH; any more: AuthenticationError)."""
    if sock.family != socket.AF_UNIX:
        return sock.recv(handshake.MAX_FRAME)
    data, got, flags, _ = socket.recv_fds(sock, handshake.MAX_FRAME, handshake.LEND_FDS,
                                          getattr(socket, "MSG_CMSG_CLOEXEC", 0))
    fds.extend(got)
    if len(fds) > handshake.LEND_FDS or flags & getattr(socket, "MSG_CTRUNC", 0):
        raise AuthenticationError("the client passed more descriptors than a lender does")
    return data


# Connection._open's ``shared``: (memfd, data_fd, room_fd, side, peer_arena,
# peer_ledger, lend_pool, pidfd, ledger).
SharedSpec = tuple[int, int, int, int, int, int, NetworkBufferPool | None, int, int]


def _close_mapped(shared: SharedSpec) -> None:
    """Close what Connection._open maps, or refuses, and does not keep: the
    region's memfd, the peer's arena and ledger, and this side's ledger."""
    handshake.close_fds([fd for fd in (shared[0], shared[4], shared[5], shared[8]) if fd >= 0])


def _peer_pidfd(sock: socket.socket) -> int:
    """A pidfd of the process at the other end of a Unix socket (its end
    gives back the buffers lent to it), or -1 when that is this process or
    no pidfd can be had: then nothing is lent."""
    try:
        peer = handshake.unix_peer(sock)
        pid = peer[0] if peer is not None else 0
        if pid <= 0 or pid == os.getpid():
            return -1
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD))
        except OSError:
            return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return -1


class ConnectionCounters(TypedDict):
    """What :meth:`Connection.stats` returns: the transport and the bytes,
    frames and buffers in and out so far (``frames_in_direct``: of
    ``frames_in``, those a consumer's thread waiting on its gate read
    itself), whether its frames are sealed (``encryption``), and, over
    shared memory, the buffers of this side's the peer
    reads in place now (``buffers_lent``) and the peer's this side does
    (``buffers_borrowed``)."""

    transport: Literal["unix", "tcp", "shm"]
    sealed: bool
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    buffers_in: int
    buffers_out: int
    frames_in_direct: int
    buffers_lent: int
    buffers_borrowed: int


class ConnectionStats(ConnectionCounters):
    """One connection of :meth:`NetworkEnvironment.connection_stats`."""

    peer: str


log = logging.getLogger("flinkbuf.network")

_LIVE: "weakref.WeakSet[NetworkEnvironment]" = weakref.WeakSet()   # closed at exit
# Connections accepted and not authenticated yet, per environment; past this
# the one that has waited longest for its next message is dropped (a flood
# of idle sockets cannot lock legitimate peers out, nor take the descriptors
# authenticated connections need).
MAX_PENDING_HANDSHAKES = 128
# Out of descriptors, the acceptor stops accepting for a back-off from
# ACCEPT_BACKOFF[0] s, doubling up to ACCEPT_BACKOFF[1] s while it lasts.
ACCEPT_BACKOFF = (0.01, 0.5)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@atexit.register
def _close_all() -> None:
    for env in list(_LIVE):
        try:
            env.close()
        except Exception:           # noqa: BLE001 - exiting anyway
            log.exception("closing a network environment at exit")


def _switch(value: object, name: str, variable: str,
            default: bool | None = True) -> bool | None:
    """An on/off keyword: True or False as given; None: the environment
    variable ``variable`` if it is set (``0`` or ``1``), else ``default``."""
    if value is None:
        setting = os.environ.get(variable, "")
        if setting not in ("", "0", "1"):
            raise ValueError(f"the environment variable {variable} must be 0 or 1 (or unset), "
                             f"got {setting!r}")
        return default if setting == "" else setting == "1"
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True, False or None, got {type(value).__name__}")
    return value


_TRANSPORTS = ("auto", "tcp", "unix", "shm")


def _transport_override() -> Transport:
    """What ``transport="auto"`` means in this process: the environment
    variable ``FLINKBUF_NET_TRANSPORT`` (one of the transports) if set."""
    setting = os.environ.get("FLINKBUF_NET_TRANSPORT", "")
    if setting == "":
        return "auto"
    if setting in _TRANSPORTS:
        return cast(Transport, setting)
    raise ValueError(f"the environment variable FLINKBUF_NET_TRANSPORT must be one of "
                     f"{', '.join(repr(t) for t in _TRANSPORTS)} (or unset), got {setting!r}")


def _unix_name(port: int) -> str:
    """The abstract Unix socket (Linux) an environment listens on beside its
    TCP port: derived from the port, so a peer that knows ``host:port``
    knows it too (ports are unique per host).  Anyone may bind an abstract
    name first; the handshake still proves the secret, and a peer that
    cannot use the name connects over TCP."""
    return f"\0flinkbuf-tcp-{port}"


_UNIX = hasattr(socket, "AF_UNIX") and sys.platform.startswith("linux")


def _same_host_transport() -> Transport:
    """What transport="auto" means between processes on one host: the
    fastest in bench/bench_network.py.  Shared memory (bulk, records and
    round trips), unless this process may run on one CPU only: then both
    sides take turns on it, and a Unix socket's round trip is faster."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return "shm" if cpus > 1 else "unix"


_LOCAL_HOSTS = ("127.", "::1", "localhost")


# Dead-peer detection on TCP (a peer whose host vanished sends no FIN or RST):
# keepalive probes after KEEPALIVE[0] s idle, every KEEPALIVE[1] s, the
# connection fails after KEEPALIVE[2] unanswered ones; and data unacknowledged
# for as long (TCP_USER_TIMEOUT) fails it too, since no probe goes while data
# is in flight.  A Unix socket's peer is on this host: its end is seen at once.
KEEPALIVE: tuple[int, int, int] = (10, 5, 3)


# Socket buffers with room for many segments in flight, so that a send of
# several buffers rarely stops halfway (the rest would go to the writer
# thread, a hand-off per batch).  Credit bounds what is in flight, so this is
# an upper limit, not memory in use; the kernel caps it at
# net.core.wmem_max / rmem_max.
SOCKET_BUFFER = 2 << 20


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass
    if sock.family == getattr(socket, "AF_UNIX", None):
        return
    idle, interval, count = KEEPALIVE
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", count),
                        ("TCP_USER_TIMEOUT", 1000 * (idle + interval * count))):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Unproven(Exception):
    """A handshake over the same-host socket failed before the server
    proved itself (its cause says how): TCP is tried next."""


_WAKE = object()                     # the selector key of the acceptor's wake-up socket


class _PendingHandshake:
    """A connection accepted and not authenticated yet: its handshake, the
    time by which it must end, the peer's address, the descriptors it
    passed, and when it last sent something."""

    __slots__ = ("hs", "deadline", "peer", "fds", "progress", "accepting")

    def __init__(self, hs: handshake.ServerHandshake, deadline: float, peer: Any,
                 progress: float, accepting: list[str]) -> None:
        self.hs = hs
        self.deadline = deadline
        self.peer = peer
        self.fds: list[int] = []
        self.progress = progress
        # The address its peer gave, once the handshake chose to keep the
        # connection (until it is running or gone): see _keep_accepting.
        self.accepting = accepting


_Pending = dict[socket.socket, _PendingHandshake]

class NetworkEnvironment:
    """The network stack of one process (Flink's NetworkEnvironment).

    It owns the process's :class:`NetworkBufferPool` (``num_segments`` of
    ``segment_size`` bytes; ``network_buffer_pool``), a server at ``host``
    / ``port`` (default: loopback, a free port; ``address`` is what it
    bound) that serves the partitions registered with
    :meth:`register_partition`, and the connections its input gates read
    over.  One connection per pair of processes carries all their channels.
    Every peer first proves it knows ``secret`` (HMAC challenge-response in
    both directions); a peer without it gets nothing.

    Remote channels use Flink's credit-based flow control:
    ``exclusive_buffers_per_channel`` buffers per channel plus
    ``floating_buffers_per_gate`` per gate, all from this environment's
    pool.  A consumer that stops reading stops its producer, across the
    connection, through the producer's exhausted buffer pool.

    Timeouts (seconds): ``connect_timeout`` for connecting and the
    handshake; ``request_timeout`` for a partition request (retried while
    the producer has not registered the partition yet) and for a gate's
    buffers; ``io_timeout`` for a peer that stops in the middle of a frame.
    A dropped connection fails its channels at once (their consumers raise
    :class:`RemoteConnectionError`).  Use as a context manager, or call
    :meth:`close`.

    ``transport`` is how this environment reaches processes on its own
    host (processes on other hosts are always reached over TCP):
    ``"shm"``, shared memory (frames cross through rings that both
    processes map, with no system call while both are busy; the region has
    no name in any file system and goes with the processes); ``"unix"``, a
    Unix socket; ``"tcp"``, TCP over loopback; ``"auto"`` (the default),
    whichever of these is fastest here: shared memory, or a Unix socket in
    a process bound to a single CPU.  A peer whose environment does not
    take shared memory is reached over its Unix socket instead, one
    without a Unix socket (another network namespace) over TCP.
    ``connection_stats()`` tells which transport each connection uses.

    Two ways of saving a thread switch per buffer, both on by default
    (docs/ARCHITECTURE.md, "Across processes"):

    ``caller_sends``: when the connection's writer thread is idle, a
    producer's flush sends the buffer in the producer's own thread, and a
    consumer's recycle sends the credit it grants in the consumer's;
    never blocking (what the socket does not take at once is left to the
    writer thread), but with the GIL held, as the calling thread holds it.
    Off: every send goes through the writer thread, which holds no GIL.
    ``direct_reads``: a consumer whose gate is empty receives from the
    socket itself while nobody else reads it (without the GIL), instead
    of waiting for the connection's reader thread to hand each buffer
    over.  Off: every receive goes through the reader thread.  With both
    on, a producer whose ``emit`` waits for a buffer also reads the
    connection itself (the credit that frees one) and sends at once.
    Records, order and flow control are the same either way; turn one
    off to measure what it saves, or ``caller_sends`` off when other
    Python threads of a busy process should not wait for the GIL while a
    producer or consumer thread sends.  ``None`` (the default) is on,
    unless the environment variable ``FLINKBUF_NET_CALLER_SENDS`` or
    ``FLINKBUF_NET_DIRECT_READS`` is set (``0``: off, ``1``: on), which
    lets a benchmark switch environments it does not construct itself
    (the tasks of a Spark job); ``True`` or ``False`` here wins over the
    variable.  Likewise ``FLINKBUF_NET_TRANSPORT`` (``tcp``, ``unix`` or
    ``shm``) says what ``transport="auto"`` means.

    ``lend_buffers`` (off by default; ``FLINKBUF_NET_LEND_BUFFERS`` as
    above): over shared memory, data buffers of this environment's pool
    are lent to a peer in another process instead of copied through the
    rings: the peer reads them in place (as read-only buffers) and
    its recycle gives them back; credit bounds them as it bounds copied
    ones, and a buffer is never reused while the peer may still read it,
    whether its process ends or lives on.  It saves the two copies through
    the rings, at the price of buffers that stay out until the consumer is
    done with them (a larger working set); on a 2-vCPU host the copying
    rings measured as fast or faster (docs/ARCHITECTURE.md).  The pool is
    then a shared one (:class:`NetworkBufferPool` ``shared_memory``).

    ``max_connections``: the connections this environment keeps open at
    most, made and accepted (each costs two threads and a few
    descriptors); beyond it, a connection is refused with a clear error on
    both sides.  Connections accepted and not authenticated yet are bounded
    apart (``MAX_PENDING_HANDSHAKES`` of this module, 128), so that a flood
    of sockets that never authenticate cannot take their place.

    ``encryption``: whether frames after the handshake are sealed,
    AES-256-GCM with one key per direction derived from ``secret`` and the
    handshake's fresh nonces, so that nobody without the secret can read a
    record or alter, drop, duplicate, reorder or replay one without the
    connection failing at that frame (nothing of it is delivered).
    ``None`` (the default, unless ``FLINKBUF_NET_ENCRYPTION`` is ``0`` or
    ``1``): connections to other hosts are sealed, connections within this
    host are not (their bytes never leave the kernel, and the same-host
    socket is bound to the process the kernel names at its other end);
    ``True``: every connection; ``False``: none this side makes (a peer
    that asks still gets a sealed one: a connection is sealed when either
    side asks).  ``connection_stats()`` says which are.  ``True`` excludes
    ``lend_buffers`` (a lent buffer is read in place).  Bulk records cost
    the most (the cipher runs at a few GB/s a core), small records and
    round trips little (docs/PROTOCOL.md, section 2.2; README).

    ``advertise``: the host peers reach this environment at, when it is not
    the one the server binds (``host`` is a wildcard such as ``"0.0.0.0"``,
    or peers reach this host through a NAT); ``advertised_address`` is
    ``(advertise, port)``, what this environment says it is in every
    handshake, and the address peers dial (default: the bound address).
    ``peer_id``: a name for this environment (at most 64 bytes of UTF-8)
    said in every handshake; :meth:`expect_peers` tells which peer id each
    peer address must say, so that two peers with the same address (a port
    number used on two hosts behind one advertised address) are never
    taken for one another.
    """

    def __init__(self, num_segments: int, segment_size: int = 32768, *,
                 host: str = "127.0.0.1", port: int = 0, secret: bytes | bytearray | memoryview,
                 exclusive_buffers_per_channel: int = 2, floating_buffers_per_gate: int = 8,
                 connect_timeout: float = 10.0, request_timeout: float = 30.0,
                 io_timeout: float = 60.0, transport: Transport = "auto",
                 caller_sends: bool | None = None, direct_reads: bool | None = None,
                 lend_buffers: bool | None = None, encryption: bool | None = None,
                 max_connections: int = 256, advertise: str | None = None,
                 peer_id: str = "") -> None:
        if not isinstance(secret, (bytes, bytearray, memoryview)):
            raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
        secret = bytes(secret)
        if len(secret) < 16:
            raise ValueError("secret must be at least 16 bytes (use secrets.token_bytes(32))")
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, got {type(host).__name__}")
        if advertise is not None:
            if not isinstance(advertise, str):
                raise TypeError(f"advertise must be a str or None, got "
                                f"{type(advertise).__name__}")
            if not advertise or is_wildcard(advertise):
                raise ValueError(f"advertise must be a host peers can dial, got {advertise!r}")
        self._peer_id = handshake.check_peer_id(peer_id)
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(repr(t) for t in _TRANSPORTS)}, "
                             f"got {transport!r}")
        if transport == "auto":
            transport = _transport_override()
        if transport == "auto":
            transport = _same_host_transport()
        check_int(port, "port", 0, 65535)
        self._exclusive = check_int(exclusive_buffers_per_channel,
                                    "exclusive_buffers_per_channel", 1)
        self._floating = check_int(floating_buffers_per_gate, "floating_buffers_per_gate", 0)
        self._connect_timeout = check_seconds(connect_timeout, "connect_timeout")
        self._request_timeout = check_seconds(request_timeout, "request_timeout")
        self._io_timeout = check_seconds(io_timeout, "io_timeout")
        self._max_connections = check_int(max_connections, "max_connections", 1)
        self._secret = secret
        self._caller_sends = bool(_switch(caller_sends, "caller_sends",
                                          "FLINKBUF_NET_CALLER_SENDS"))
        self._direct_reads = bool(_switch(direct_reads, "direct_reads",
                                          "FLINKBUF_NET_DIRECT_READS"))
        # None: sealed when the client is on another host than its server.
        self._seal = _switch(encryption, "encryption", "FLINKBUF_NET_ENCRYPTION", default=None)
        lend = _switch(lend_buffers, "lend_buffers", "FLINKBUF_NET_LEND_BUFFERS", default=False)
        if self._seal and lend_buffers:
            raise ValueError("lend_buffers=True and encryption=True exclude each other: a lent "
                             "buffer is read in place, never sealed")
        lend = bool(lend) and self._seal is not True
        # Shared, to lend: a peer on this host that connects over shared
        # memory reads this process's buffers in place.
        self._nbp = NetworkBufferPool(num_segments, segment_size, shared_memory=lend and _UNIX)
        self._segment_size = segment_size
        self._lock = threading.Lock()
        self._partitions: dict[str, ResultPartition] = {}
        self._connections: dict[str, Connection] = {}   # peer address -> Connection we reuse
        self._all_connections: list[Connection] = []    # every Connection, to close
        # The connections this process made: their peer answered at the
        # address dialed, so they are the peer's (an accepted one is only
        # who it says it is).
        self._dialed: set[Connection] = set()
        self._connecting: dict[str, threading.Lock] = {}   # peer address -> lock while connecting
        self._dialing: set[str] = set()  # peer addresses this process is connecting to
        # Peer addresses whose connection to this process the acceptor has
        # chosen to keep and is still setting up (how many of each).
        self._accepting: collections.Counter[str] = collections.Counter()
        # Unknown channels of gates made here, and the floating buffers of
        # their gate (the remote channel they may become borrows from them).
        self._unknown: weakref.WeakKeyDictionary[UnknownInputChannel, FloatingBuffers | None] = \
            weakref.WeakKeyDictionary()
        # A partition or a connection was registered, or the environment closed.
        self._changed = threading.Condition(self._lock)
        self._closed = False
        # The acceptor's log: per cause, 10 messages at once, then one per 5 s.
        self._log_limited = LogLimiter(log)
        self._backoff = 0.0              # the acceptor's, while out of descriptors
        self._paused_until = 0.0
        try:
            self._server = socket.create_server((host, port), backlog=128)
        except BaseException:
            self._nbp.destroy()
            raise
        self._server.setblocking(False)
        bound = self._server.getsockname()
        self._address: tuple[str, int] = (bound[0], bound[1])
        self._bound_text = format_address(self._address)
        self._advertised: tuple[str, int] = (advertise or bound[0], bound[1])
        # What this environment says it is, and where peers dial it.
        self._address_text = format_address(self._advertised)
        self._expected: dict[str, str] = {}            # peer address -> its peer id
        self._peer_ids: dict[Connection, str] = {}     # what each connection's peer said
        # Beside TCP, a Unix socket for peers on this host (faster on loopback),
        # over which a client may ask for shared memory.
        self._use_unix = transport in ("unix", "shm") and _UNIX
        self._want_shm = transport == "shm" and _UNIX
        self._unix_server: socket.socket | None = None
        if self._use_unix:
            try:
                self._unix_server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._unix_server.bind(_unix_name(self._address[1]))
                self._unix_server.listen(128)
                self._unix_server.setblocking(False)
            except OSError as exc:
                log.info("no Unix socket beside %s (%s): TCP only", self._address_text, exc)
                if self._unix_server is not None:
                    self._unix_server.close()
                self._unix_server = None
        # Made here, not in the thread: close() right away finds them registered.
        # close() wakes the acceptor with a byte on _wake (closing a listening
        # socket does not end a select() on it).
        self._wake = socket.socketpair()
        for s in self._wake:
            s.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake[0], selectors.EVENT_READ, _WAKE)
        self._selector.register(self._server, selectors.EVENT_READ, self._server)
        if self._unix_server is not None:
            self._selector.register(self._unix_server, selectors.EVENT_READ, self._unix_server)
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"flinkbuf-accept-{self._address_text}")
        self._acceptor.start()
        _LIVE.add(self)

    # ---- properties ------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the server bound."""
        return self._address

    @property
    def advertised_address(self) -> tuple[str, int]:
        """``(host, port)`` peers dial: ``(advertise, port)``, by default
        the bound address."""
        return self._advertised

    @property
    def peer_id(self) -> str:
        """This environment's peer id, said in every handshake."""
        return self._peer_id

    def expect_peers(self, peers: dict[str, str]) -> None:
        """Tell which peer id the environment at each address must say
        (``{address: peer_id}``, addresses as ``"host:port"``): a
        connection to that address whose server says another is refused
        (:class:`~flinkbuf.errors.AuthenticationError`), and so is a
        connection from a client that says it is at that address with
        another.  Call it before the connections are made."""
        if not isinstance(peers, dict):
            raise TypeError(f"peers must be a dict of address -> peer id, got "
                            f"{type(peers).__name__}")
        checked = {format_address(a): handshake.check_peer_id(p) for a, p in peers.items()}
        with self._lock:
            self._expected.update(checked)

    def _expected_peer(self, address: str) -> str | None:
        with self._lock:
            return self._expected.get(address)

    def _is_expected(self, address: str, conn: Connection) -> bool:
        """Whether ``conn`` is to the peer expected at ``address`` (the lock held)."""
        expected = self._expected.get(address)
        return expected is None or self._peer_ids.get(conn) == expected

    @property
    def network_buffer_pool(self) -> NetworkBufferPool:
        """The pool every buffer of this environment comes from: create the
        partitions this process serves from it."""
        return self._nbp

    @property
    def is_closed(self) -> bool:
        return self._closed

    def connections(self) -> list[Connection]:
        """The open connections (a snapshot)."""
        with self._lock:
            return [c for c in self._all_connections if c.is_open]

    def connection_stats(self) -> list[ConnectionStats]:
        """Per open connection: the peer's address, the transport
        (``"unix"`` or ``"tcp"``) and the bytes, frames and buffers in and
        out (a list: two processes may have two connections)."""
        with self._lock:
            conns = [c for c in self._all_connections if c.is_open]
        return [{"peer": c.peer, **c.stats()} for c in conns]

    def _reap(self) -> None:
        """Close and forget connections that ended (their sockets go now)."""
        with self._lock:
            dead = [c for c in self._all_connections if not c.is_open]
            if not dead:
                return
            self._all_connections = [c for c in self._all_connections if c.is_open]
            self._dialed.difference_update(dead)
            for conn in dead:
                self._peer_ids.pop(conn, None)
            for address, conn in list(self._connections.items()):
                if not conn.is_open:
                    del self._connections[address]
        for conn in dead:
            conn.close()

    # ---- partitions this process serves -------------------------------------------------

    def register_partition(self, partition_id: str, partition: ResultPartition) -> None:
        """Serve ``partition`` as ``partition_id`` (a str of at most 1024
        bytes of UTF-8) to remote readers; readers that asked before are
        served once it is registered (their requests are retried)."""
        if not isinstance(partition_id, str):
            raise TypeError(f"partition_id must be a str, got {type(partition_id).__name__}")
        if len(partition_id.encode("utf-8")) > 1024:
            raise ValueError("partition_id is longer than 1024 bytes of UTF-8")
        if not isinstance(partition, ResultPartition):
            raise TypeError(f"expected a ResultPartition, got {type(partition).__name__}")
        with self._lock:
            self._check_open()
            if partition_id in self._partitions:
                raise ValueError(f"a partition {partition_id!r} is registered already")
            self._partitions[partition_id] = partition
            self._changed.notify_all()

    def _lookup(self, partition_id: str) -> ResultPartition | None:
        with self._lock:
            return None if self._closed else self._partitions.get(partition_id)

    # ---- input gates --------------------------------------------------------------------

    def create_input_gate(self, specs: Iterable[ChannelSpec], *, codec: CodecName = "typed",
                          max_record_size: int = 64 << 20,
                          name: str | None = None) -> InputGate:
        """An :class:`InputGate` over ``specs``, each ``(address,
        partition_id, subpartition)``: a :class:`RemoteInputChannel` for a
        partition of another process (``address`` is that process's
        environment's), a :class:`LocalInputChannel` for one registered here
        (this environment's address), and for an ``address`` of None (not
        known yet) an :class:`~flinkbuf.io.UnknownInputChannel`, which
        :meth:`update_input_channel` turns into one of the other two once it
        is known; the gate reads its other channels meanwhile."""
        specs = list(specs)
        if not specs:
            raise ValueError("an input gate needs at least one channel")
        parsed: list[tuple[str | None, str, int]] = []
        for spec in specs:
            if not isinstance(spec, (tuple, list)) or len(spec) != 3:
                raise TypeError(f"a channel spec is (address, partition_id, subpartition), "
                                f"got {spec!r}")
            address, partition_id, sub = spec
            if not isinstance(partition_id, str):
                raise TypeError(f"partition_id must be a str, got {type(partition_id).__name__}")
            if isinstance(sub, bool) or not isinstance(sub, int) or not 0 <= sub < 2 ** 32:
                raise ValueError(f"subpartition must be an int in [0, 2**32), got {sub!r}")
            parsed.append((None if address is None else format_address(address), partition_id,
                           sub))
        self._check_open()
        channels: list[LocalInputChannel | RemoteInputChannel | UnknownInputChannel] = []
        floating: FloatingBuffers | None = None
        try:
            own = (self._address_text, self._bound_text)
            remote = [s for s in parsed if s[0] not in own]     # unknown ones may be
            if remote and self._floating:
                floating = make_floating_buffers(
                    self._nbp.create_buffer_pool(self._floating, self._floating))
            for address, partition_id, sub in parsed:
                if address is None:
                    unknown = UnknownInputChannel(partition_id, sub)
                    with self._lock:
                        self._unknown[unknown] = floating
                    channels.append(unknown)
                else:
                    channels.append(self._channel_for(address, partition_id, sub, floating))
            return InputGate(channels, codec=codec, max_record_size=max_record_size, name=name)
        except BaseException:
            for ch in channels:
                if isinstance(ch, RemoteInputChannel):
                    ch._close()
            raise

    def update_input_channel(self, channel: UnknownInputChannel, address: Address) -> None:
        """Read through ``channel`` (an unknown channel of a gate that
        :meth:`create_input_gate` made here) the partition it names at
        ``address``, now known: connects as ``create_input_gate`` does for
        a channel of that address (with its errors) and puts the channel
        made in ``channel``'s place (:meth:`UnknownInputChannel.update
        <flinkbuf.io.UnknownInputChannel.update>`).  Any thread may call
        it.  ValueError for a channel this environment did not make, or one
        updated or failed already, or whose gate is closed."""
        if not isinstance(channel, UnknownInputChannel):
            raise TypeError(f"channel must be an UnknownInputChannel, got "
                            f"{type(channel).__name__}")
        address = format_address(address)
        with self._lock:
            if channel not in self._unknown:
                raise ValueError("the channel was not made by this environment's "
                                 "create_input_gate, or was updated already")
            floating = self._unknown[channel]
        if channel.channel is not None or channel.error is not None:
            raise ValueError(f"input channel {channel.index} was updated or failed already")
        self._check_open()
        real = self._channel_for(address, channel.partition_id, channel.subpartition, floating)
        try:
            channel.update(real)
        except BaseException:
            if isinstance(real, RemoteInputChannel) and real.index is None:
                real._close()           # never joined the gate: give it all back
            raise
        with self._lock:
            self._unknown.pop(channel, None)

    def _channel_for(self, address: str, partition_id: str, sub: int,
                     floating: FloatingBuffers | None) -> LocalInputChannel | RemoteInputChannel:
        """The channel reading subpartition ``sub`` of ``partition_id`` at
        ``address``: a local one for this environment's address, else a
        remote one (borrowing from ``floating``)."""
        if address in (self._address_text, self._bound_text):
            return LocalInputChannel(self._local_partition(partition_id), sub)
        return self._remote_channel(address, partition_id, sub, floating)

    def _local_partition(self, partition_id: str) -> ResultPartition:
        """The partition registered here as ``partition_id``, once it is
        (waiting up to the request timeout, as a remote request would)."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._closed or partition_id in self._partitions,
                    self._request_timeout):
                raise PartitionNotFoundError(
                    f"no partition {partition_id!r} was registered in this process within "
                    f"{self._request_timeout:g} s")
            self._check_open()
            return self._partitions[partition_id]

    def _remote_channel(self, address: str, partition_id: str, sub: int,
                        floating: FloatingBuffers | None) -> RemoteInputChannel:
        conn = self._connection_to(address)
        exclusive = self._nbp.create_buffer_pool(self._exclusive, self._exclusive)
        try:
            return RemoteInputChannel._open(conn, partition_id, sub, exclusive, floating,
                                            self._request_timeout, self._request_timeout)
        except BaseException:
            exclusive.destroy()
            raise

    # ---- connections --------------------------------------------------------------------

    def _connection_to(self, address: str) -> Connection:
        """The open connection to the process at ``address``, made (and
        authenticated) if there is none."""
        while True:
            with self._lock:
                self._check_open()
                conn = self._connections.get(address)
                if conn is not None and conn.is_open and self._is_expected(address, conn):
                    return conn
                gate = self._connecting.setdefault(address, threading.Lock())
            with gate:
                with self._changed:
                    # A connection from the peer that the acceptor keeps is
                    # on its way: dialing now would make a second one, which
                    # the peer, still dialing itself, would keep as well.
                    self._changed.wait_for(lambda: self._closed or not self._accepting[address],
                                           self._connect_timeout)
                    self._check_open()
                    conn = self._connections.get(address)
                    if conn is not None and conn.is_open and self._is_expected(address, conn):
                        return conn
                    self._dialing.add(address)
                try:
                    conn = self._connect(address)
                except handshake.DuplicateConnection as dup:
                    return self._await_connection_from(address, dup.peer)
                finally:
                    with self._lock:
                        self._dialing.discard(address)
                with self._lock:
                    self._connecting.pop(address, None)
                    if self._closed:
                        conn.close()
                        self._check_open()
                    self._connections[address] = conn
                    self._all_connections.append(conn)
                    self._dialed.add(conn)
                    expected = self._expected.get(address)
                    if expected is not None:
                        self._peer_ids[conn] = expected    # the handshake checked it
                    self._changed.notify_all()
                return conn

    def _keep_incoming(self, peer: str) -> bool:
        """Whether a connection the process at ``peer`` made to this one is
        kept (the rule of the handshake's ``keep``).  One connection joins two processes:
        an open one this process made to ``peer`` wins over a new one; when
        both are connecting to each other at once, the connection made by the
        smaller address wins (the other side's is refused with DUPLICATE,
        and that side waits for this one).  A connection accepted earlier
        from a process that said it is at ``peer`` does not refuse a new
        one: anyone with the secret may say so, and the process really at
        ``peer`` would then wait for a connection that never comes.  The
        lock held."""
        conn = self._connections.get(peer)
        if conn is not None and conn.is_open and conn in self._dialed:
            return False
        if peer in self._dialing:
            return self._address_text > peer
        return True

    def _keep_accepting(self, accepting: list[str], peer: str) -> bool:
        """The handshake's ``keep`` for one accepted connection: whether it
        is kept (:meth:`_keep_incoming`), and if so, in the same step, that
        ``peer``'s connection is being set up, until :meth:`_done_accepting`
        (``accepting``: that connection's record of it)."""
        with self._lock:
            keep = self._keep_incoming(peer)
            if keep and not accepting:
                self._accepting[peer] += 1
                accepting.append(peer)
            return keep

    def _done_accepting(self, p: _PendingHandshake) -> None:
        """A connection the handshake kept is running or gone: a dialer
        waiting for it looks again."""
        if not p.accepting:
            return
        with self._changed:
            for peer in p.accepting:
                self._accepting[peer] -= 1
                if self._accepting[peer] <= 0:
                    del self._accepting[peer]
            p.accepting.clear()
            self._changed.notify_all()

    def _admit(self) -> str | None:
        """Why one more connection cannot be taken, or None."""
        with self._lock:
            n = sum(1 for c in self._all_connections if c.is_open)
        if n >= self._max_connections:
            return (f"{self._address_text} has {n} connections open, as many as it takes "
                    f"(max_connections)")
        return None

    def _await_connection_from(self, address: str, peer: str) -> Connection:
        """The connection the process at ``address`` (which calls itself
        ``peer``) made to this one, once its handshake registered it here;
        also registered as ``address``."""
        def arrived() -> bool:
            conn = self._connections.get(peer)
            return (conn is not None and conn.is_open and self._is_expected(address, conn)
                    and self._is_expected(peer, conn))

        with self._changed:
            if not self._changed.wait_for(lambda: self._closed or arrived(),
                                          self._connect_timeout):
                raise RemoteConnectionError(
                    f"connecting to {address}: the peer keeps its own connection to this "
                    f"process, which did not arrive within {self._connect_timeout:g} s")
            self._check_open()
            conn = self._connections[peer]
            self._connections[address] = conn
            return conn

    def _is_this_host(self, host: str) -> bool:
        return (host.startswith(_LOCAL_HOSTS) or host == self._address[0]
                or host == self._advertised[0])

    def _connect(self, address: str) -> Connection:
        """A new connection to the environment at ``address``: over its Unix
        socket when it is on this host (and the transport is not TCP), else,
        or when that fails short of a proven answer, over TCP."""
        host, port = split_address(address)
        full = self._admit()
        if full is not None:
            raise RemoteConnectionError(f"cannot connect to {address}: {full}")
        seal = self._seal if self._seal is not None else not self._is_this_host(host)
        if self._use_unix and self._is_this_host(host):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self._connect_timeout)
            try:
                sock.connect(_unix_name(port))
            except OSError:
                sock.close()             # another network namespace, or no Unix socket
            else:
                try:
                    return self._connect_over(sock, address, seal, fallback=True)
                except _Unproven as exc:
                    # Whoever holds the name (a process of another user, a
                    # relay) proved nothing; the TCP port is the server's own.
                    log.warning("connecting to %s over its Unix socket failed (%s): "
                                "connecting over TCP", address, exc.__cause__)
        try:
            sock = socket.create_connection((host, port), timeout=self._connect_timeout)
        except OSError as exc:
            raise RemoteConnectionError(f"cannot connect to {address}: {exc}") from exc
        return self._connect_over(sock, address, seal)

    def _connect_over(self, sock: socket.socket, address: str, seal: bool,
                      fallback: bool = False) -> Connection:
        """Authenticate ``sock``, connected to ``address``, and run a
        connection over it, asking for sealed frames if ``seal`` (the socket
        is this method's: closed on error).
        ``fallback``: a handshake that fails by an AuthenticationError or an
        OSError raises :class:`_Unproven` (from that error) instead."""
        want_shm = self._want_shm and sock.family == socket.AF_UNIX
        lent = self._loan_terms(sock) if want_shm else None    # this side lends too
        try:
            try:
                _tune(sock)
                peer, _, shared_fds, keys = handshake.client(
                    sock, self._secret, self._address_text, self._segment_size,
                    self._connect_timeout, shared_memory=want_shm,
                    lend_fds=None if lent is None else [lent[1], lent[2]], seal=seal,
                    peer_id=self._peer_id, expect_peer=self._expected_peer(address))
                sock.settimeout(None)
                fd = sock.detach()
            except AuthenticationError as exc:
                sock.close()
                if fallback:
                    raise _Unproven from exc
                raise AuthenticationError(f"connecting to {address}: {exc}") from None
            except handshake.DuplicateConnection:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                if fallback:
                    raise _Unproven from exc
                raise RemoteConnectionError(f"connecting to {address}: {exc}") from exc
            except BaseException:
                sock.close()
                raise
        except BaseException:
            if lent is not None:
                os.close(lent[0])
                os.close(lent[2])
            raise
        return self._open_connected(fd, address, shared_fds, lent, keys)

    def _open_connected(self, fd: int, address: str, shared_fds: list[int] | None,
                        lent: tuple[int, int, int] | None,
                        keys: handshake.Keys | None) -> Connection:
        """Run the connection this side opened to ``address`` (``fd``, past
        the handshake): over shared memory if ``shared_fds`` (the region's,
        then the server's arena and ledger if it lends; closed here), this
        side lending as ``lent`` (:meth:`_loan_terms`: its pidfd is owned
        from here on, its ledger closed here) if shared memory it is;
        sealed with ``keys`` if given."""
        shared: SharedSpec | None = None
        if shared_fds is not None:
            memfd, data_fd, room_fd, *peer_lent = shared_fds
            arena, ledger = peer_lent if peer_lent else (-1, -1)
            pidfd, _, own_ledger = lent if lent is not None else (-1, -1, -1)
            shared = (memfd, data_fd, room_fd, 1, arena, ledger,
                      self._nbp if lent is not None else None, pidfd, own_ledger)
        elif lent is not None:
            handshake.close_fds([lent[0], lent[2]])   # a stream after all: nothing is lent
        try:
            return Connection._open(fd, self._segment_size, self._lookup, self._address_text,
                                    address, self._io_timeout, self._caller_sends,
                                    self._direct_reads, shared, keys)
        finally:
            if shared is not None:
                _close_mapped(shared)

    def _accept_loop(self) -> None:
        """Accept connections and run their handshakes, many at a time in
        this one thread (non-blocking sockets, a state machine each); an
        authenticated one becomes a Connection run by its C threads.  No
        peer can end it: a connection that cannot be set up is refused and
        logged (at a limited rate), and while this process is out of
        descriptors it stops accepting for a while instead of spinning."""
        sel = self._selector
        pending: _Pending = {}
        try:
            while not self._closed:
                self._reap()
                now = time.monotonic()
                self._resume_accepting(sel, now)
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
                    if key.data is _WAKE:
                        continue             # close(): the loop sees _closed
                    sock = cast(socket.socket, key.fileobj)
                    try:
                        if key.data is not True:
                            self._accept_new(sel, pending, key.data)
                        else:
                            self._handshake_step(sel, pending, sock)
                    except Exception as exc:    # noqa: BLE001 - the acceptor goes on
                        self._log_limited(logging.ERROR, "acceptor: " + type(exc).__name__,
                                          "the acceptor of %s: %s: %s", self._address_text,
                                          type(exc).__name__, exc, exc_info=True)
                        if sock in pending:
                            self._refuse(sel, pending, sock, f"{type(exc).__name__}: {exc}")
                now = time.monotonic()
                for sock, p in list(pending.items()):
                    if p.deadline <= now:
                        self._refuse(sel, pending, sock, "it did not complete the handshake "
                                     f"within {self._connect_timeout:g} s")
        finally:
            for sock, p in list(pending.items()):
                handshake.close_fds(p.fds)
                sock.close()
            sel.close()

    def _listeners(self) -> list[socket.socket]:
        return [s for s in (self._server, self._unix_server) if s is not None]

    def _pause_accepting(self, sel: selectors.BaseSelector, exc: OSError) -> None:
        """Out of descriptors (or kernel memory): stop watching the listening
        sockets for a back-off that doubles while it lasts (up to
        ACCEPT_BACKOFF[1] s), so that the acceptor neither spins on a backlog
        it cannot take nor stops for good; connections wait in the backlog."""
        low, high = ACCEPT_BACKOFF
        self._backoff = min(high, self._backoff * 2) if self._backoff else low
        self._paused_until = time.monotonic() + self._backoff
        for server in self._listeners():
            try:
                sel.unregister(server)
            except (KeyError, ValueError):
                pass
        self._log_limited(logging.WARNING, f"accept: {exc.errno}",
                          "%s cannot accept connections now (%s): it tries again in %g s",
                          self._address_text, exc, self._backoff)

    def _resume_accepting(self, sel: selectors.BaseSelector, now: float) -> None:
        if not self._paused_until or now < self._paused_until or self._closed:
            return
        self._paused_until = 0.0
        for server in self._listeners():
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
                    self._pause_accepting(sel, exc)
                else:                    # the peer gave up in the backlog: the next one
                    self._log_limited(logging.INFO, f"accept: {exc.errno}",
                                      "accepting a connection failed: %s", exc)
                    continue
                return
            self._backoff = 0.0
            try:
                if not isinstance(peer, tuple):          # a Unix socket's peer
                    peer = ("unix", sock.fileno())
                sock.setblocking(False)
                _tune(sock)
                local = handshake.unix_peer(sock)
                accepting: list[str] = []
                hs = handshake.ServerHandshake(
                    self._secret, self._address_text, self._segment_size,
                    keep=functools.partial(self._keep_accepting, accepting), admit=self._admit,
                    shared_memory=self._new_region if local is not None else None,
                    seal=self._seal is True, unix_peer=local, peer_id=self._peer_id,
                    expect_peer=self._expected_peer)
                now = time.monotonic()
                pending[sock] = _PendingHandshake(hs, now + self._connect_timeout, peer, now,
                                                  accepting)
                sel.register(sock, selectors.EVENT_READ, True)
            except (OSError, ValueError) as exc:
                pending.pop(sock, None)
                sock.close()
                self._log_limited(logging.WARNING, f"set-up: {type(exc).__name__}",
                                  "could not set up a connection from %s: %s", peer, exc)
                continue
            if len(pending) > MAX_PENDING_HANDSHAKES:
                # The one waited on longest for its next message goes: a
                # peer that holds a socket silent cannot push out one whose
                # handshake is moving.
                stalest = min(pending, key=lambda s: pending[s].progress)
                self._refuse(sel, pending, stalest, f"more than {MAX_PENDING_HANDSHAKES} "
                             "connections were waiting for their handshake, and this one "
                             "had waited longest for its next message")

    def _handshake_step(self, sel: selectors.BaseSelector, pending: _Pending,
                        sock: socket.socket) -> None:
        p = pending[sock]
        hs, fds = p.hs, p.fds
        try:
            data = _recv_handshake(sock, fds)
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
                self._done_accepting(p)

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
        shared: SharedSpec | None = None
        if hs.shared_fds is None or len(fds) != handshake.LEND_FDS:
            handshake.close_fds(fds)     # a client that lends passes its arena and ledger
            fds = [-1, -1]
        if hs.shared_fds is not None:
            memfd, data0, room0, data1, room1 = hs.shared_fds
            hs.shared_fds = None
            lent = self._loan_terms(sock)       # (pidfd, arena, ledger) or None
            try:
                handshake.send_setup(sock, [memfd, data1, room1]
                                     + (list(lent[1:]) if lent else []))
            except OSError as exc:
                handshake.close_fds([memfd, data0, room0, *fds]
                                    + ([lent[0], lent[2]] if lent else []))
                sock.close()
                self._log_limited(logging.WARNING, "pass shared memory",
                                  "could not pass shared memory to %s: %s", advertised, exc)
                return
            finally:
                os.close(data1)
                os.close(room1)
            pidfd, _, own_ledger = lent if lent is not None else (-1, -1, -1)
            shared = (memfd, data0, room0, 0, fds[0], fds[1], self._nbp, pidfd, own_ledger)
        sock.setblocking(True)
        self._start_accepted(sock.detach(), advertised, shared, hs.keys, hs.peer_id)

    def _refuse(self, sel: selectors.BaseSelector, pending: _Pending, sock: socket.socket,
                why: str) -> None:
        p = pending.pop(sock)
        self._done_accepting(p)
        p.hs.discard()                   # a region made for it, if its AUTH_OK did not go
        handshake.close_fds(p.fds)       # descriptors it passed
        try:
            sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        self._log_limited(logging.WARNING, "refused: " + why,
                          "refused a connection from %s:%s: %s", p.peer[0], p.peer[1], why)

    def _new_region(self) -> list[int]:
        return _shm_region(self._segment_size)

    def _loan_terms(self, sock: socket.socket) -> tuple[int, int, int] | None:
        """What lending this pool's buffers to the process at the other
        end of ``sock`` takes: a pidfd of it, the arena's memfd (the
        pool's: not to close) and a new ledger; None when nothing is lent
        (the pool is not shared, the peer is this process, or no pidfd)."""
        arena = _memfd_of(self._nbp)
        pidfd = _peer_pidfd(sock) if arena >= 0 else -1
        if pidfd < 0:
            return None
        try:
            return pidfd, arena, _new_ledger(self._nbp)
        except OSError as exc:
            os.close(pidfd)
            log.warning("lending no buffers over a connection: %s", exc)
            return None

    def _start_accepted(self, fd: int, advertised: str, shared: SharedSpec | None = None,
                        keys: handshake.Keys | None = None, peer_id: str = "") -> None:
        """Run an authenticated connection; ``shared``: over shared memory,
        what Connection._open takes (its memfds closed here); ``keys``: sealed
        with them."""
        try:
            with self._lock:
                if self._closed:
                    os.close(fd)
                    if shared is not None:     # this side's doorbells and pidfd
                        handshake.close_fds([fd for fd in (shared[1], shared[2], shared[7])
                                             if fd >= 0])
                    return
                try:
                    conn = Connection._open(
                        fd, self._segment_size, self._lookup, self._address_text, advertised,
                        self._io_timeout, self._caller_sends, self._direct_reads, shared, keys)
                except (RemoteConnectionError, MemoryError, OSError) as exc:
                    self._log_limited(logging.WARNING, f"start: {type(exc).__name__}",
                                      "could not start a connection from %s: %s",
                                      advertised, exc)
                    return
                self._add_accepted(conn, advertised, peer_id)
        finally:
            if shared is not None:
                _close_mapped(shared)

    def _add_accepted(self, conn: Connection, advertised: str, peer_id: str = "") -> None:
        """Keep an accepted connection (the lock held)."""
        self._all_connections.append(conn)
        self._peer_ids[conn] = peer_id
        current = self._connections.get(advertised)
        if ((current is None or not current.is_open or current not in self._dialed)
                and self._is_expected(advertised, conn)):
            self._connections[advertised] = conn      # the newest accepted one
        self._changed.notify_all()

    # ---- lifecycle ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the network environment is closed")

    def close(self) -> None:
        """End every connection (a clean CLOSE_REQUEST first), stop the
        server and destroy the buffer pool (lazily: buffers still out stay
        valid until recycled).  Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._all_connections)
            self._all_connections.clear()
            self._dialed.clear()
            self._peer_ids.clear()
            self._connections.clear()
            self._partitions.clear()
            self._changed.notify_all()      # waiters raise: the environment is closed
        _LIVE.discard(self)
        for server in self._listeners():
            try:
                server.close()
            except OSError:
                pass
        try:
            self._wake[1].send(b"x")
        except OSError:
            pass
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(5)
        for s in self._wake:
            s.close()
        for conn in conns:
            conn.close()
        self._nbp.destroy()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"<flinkbuf.network.NetworkEnvironment address={self._address_text} "
                f"segments={self._nbp.num_segments}x{self._segment_size} {state}>")
