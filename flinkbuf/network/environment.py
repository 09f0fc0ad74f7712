"""NetworkEnvironment: one per process, the owner of its network buffers,
of a server for the partitions it registers, and of the connections to the
other processes whose partitions its input gates read.

It is a facade over parts with one job each, as Flink's
``NettyShuffleEnvironment`` composes its partition manager, connection
manager and gate factory: the configuration (:mod:`.config`), the partition
registry (:mod:`.partitions`), the gate factory (:mod:`.gates`), the
connection table (:mod:`.connection_table`), the dialer (:mod:`.dialer`),
the acceptor (:mod:`.acceptor`), and the one place that opens a connection
from a typed spec per transport (:mod:`.transports`)."""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Literal, TypedDict

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.errors import EnvironmentClosedError
from flinkbuf.io import BufferDebloatConfig, InputGate, ResultPartition, UnknownInputChannel
from flinkbuf.network import handshake
from flinkbuf.network._network import Connection
from flinkbuf.network.acceptor import Acceptor, Listeners
from flinkbuf.network.addresses import Address, OwnAddresses, format_address
from flinkbuf.network.config import (
    MAX_CONNECTIONS,
    MAX_PENDING_HANDSHAKES,
    NetworkConfig,
    Transport,
)
from flinkbuf.network.connection_table import ConnectionTable
from flinkbuf.network.dialer import Dialer
from flinkbuf.network.gates import ChannelSpec, InputGateFactory
from flinkbuf.network.partitions import PartitionRegistry
from flinkbuf.network.transports import ConnectionOpener

if TYPE_CHECKING:
    from typing_extensions import Self

    from flinkbuf.serialization import CodecName

__all__ = ["ChannelSpec", "ConnectionCounters", "ConnectionStats", "NetworkEnvironment",
           "Transport"]

log = logging.getLogger("flinkbuf.network")


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


_LIVE: "weakref.WeakSet[NetworkEnvironment]" = weakref.WeakSet()   # closed at exit


@atexit.register
def _close_all() -> None:
    for env in list(_LIVE):
        try:
            env.close()
        except Exception:           # noqa: BLE001 - exiting anyway
            log.exception("closing a network environment at exit")


class NetworkEnvironment:
    """The network stack of one process (Flink's NetworkEnvironment).

    It owns the process's :class:`NetworkBufferPool` (``num_segments`` of
    ``segment_size`` bytes; ``network_buffer_pool``), a server at ``host``
    / ``port`` (default: loopback, a free port; ``address`` is where it
    listens, a concrete address of this host also when ``host`` is a
    wildcard such as ``"0.0.0.0"``) that serves the partitions registered with
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
    both sides.  ``max_pending_handshakes``: the connections accepted and
    not authenticated yet, bounded apart so that a flood of sockets that
    never authenticate cannot take their place: past it, the one that has
    waited longest for its next message is refused (a peer whose handshake
    moves is never pushed out by a silent socket).  Many peers that dial
    at once (the tasks of a wide exchange) need it at least as large as
    their number; the listening sockets' backlog is as large too.

    ``encryption``: whether frames after the handshake are sealed,
    AES-256-GCM with one key per direction derived from ``secret`` and the
    handshake's fresh nonces, so that nobody without the secret can read a
    record or alter, drop, duplicate, reorder or replay one without the
    connection failing at that frame (nothing of it is delivered).
    ``None`` (the default, unless ``FLINKBUF_NET_ENCRYPTION`` is ``0`` or
    ``1``): connections with other hosts are sealed, connections within
    this host are not (their bytes never leave the kernel, and the
    same-host socket is bound to the process the kernel names at its other
    end), whichever side made them; ``True``: every connection; ``False``:
    this side asks for none (a peer that asks still gets a sealed one: a
    connection is sealed when either side asks).  ``connection_stats()`` says which are.  ``True`` excludes
    ``lend_buffers`` (a lent buffer is read in place).  Bulk records cost
    the most (the cipher runs at a few GB/s a core), small records and
    round trips little (docs/PROTOCOL.md, section 2.2; README).

    ``advertise``: the host peers reach this environment at, when it is not
    the one the server listens at (peers reach this host through a NAT, or
    by another of its addresses); ``advertised_address`` is ``(advertise,
    port)``, what this environment says it is in every handshake, and the
    address peers dial (default: ``address``).
    ``peer_id``: a name for this environment (at most 64 bytes of UTF-8)
    said in every handshake; :meth:`expect_peers` tells which peer id each
    peer address must say, so that two peers with the same address (a port
    number used on two hosts behind one advertised address) are never
    taken for one another.

    ``buffer_debloat`` (a bool, or a :class:`~flinkbuf.io.BufferDebloatConfig`;
    None: ``FLINKBUF_NET_BUFFER_DEBLOAT`` as above, else on) and the
    ``buffer_debloat_*`` keywords: buffer debloating for the input gates
    this environment makes (see :class:`~flinkbuf.io.BufferDebloatConfig`):
    each gate measures the rate it consumes at and tells its producers the
    buffer size that keeps ``buffer_debloat_target`` seconds of data in
    flight toward it, so that a slow consumer's records wait behind less.
    """

    def __init__(self, num_segments: int, segment_size: int = 32768, *,
                 host: str = "127.0.0.1", port: int = 0, secret: bytes | bytearray | memoryview,
                 exclusive_buffers_per_channel: int = 2, floating_buffers_per_gate: int = 8,
                 connect_timeout: float = 10.0, request_timeout: float = 30.0,
                 io_timeout: float = 60.0, transport: Transport = "auto",
                 caller_sends: bool | None = None, direct_reads: bool | None = None,
                 lend_buffers: bool | None = None, encryption: bool | None = None,
                 max_connections: int = MAX_CONNECTIONS, advertise: str | None = None,
                 peer_id: str = "", buffer_debloat: bool | BufferDebloatConfig | None = None,
                 buffer_debloat_target: float | None = None,
                 buffer_debloat_period: float | None = None,
                 buffer_debloat_samples: int | None = None,
                 buffer_debloat_threshold: int | None = None,
                 buffer_debloat_min_size: int | None = None,
                 max_pending_handshakes: int = MAX_PENDING_HANDSHAKES) -> None:
        debloat = {"buffer_debloat": buffer_debloat,
                   "buffer_debloat_target": buffer_debloat_target,
                   "buffer_debloat_period": buffer_debloat_period,
                   "buffer_debloat_samples": buffer_debloat_samples,
                   "buffer_debloat_threshold": buffer_debloat_threshold,
                   "buffer_debloat_min_size": buffer_debloat_min_size}
        config = NetworkConfig.of(
            num_segments, segment_size, host=host, port=port, secret=secret,
            exclusive_buffers_per_channel=exclusive_buffers_per_channel,
            floating_buffers_per_gate=floating_buffers_per_gate,
            connect_timeout=connect_timeout, request_timeout=request_timeout,
            io_timeout=io_timeout, transport=transport, caller_sends=caller_sends,
            direct_reads=direct_reads, lend_buffers=lend_buffers, encryption=encryption,
            max_connections=max_connections, advertise=advertise, peer_id=peer_id,
            buffer_debloat=debloat, max_pending_handshakes=max_pending_handshakes)
        self._config = config
        self._closed = False
        self._closing = threading.Lock()
        # Shared, to lend: a peer on this host that connects over shared
        # memory reads this process's buffers in place.
        self._nbp = NetworkBufferPool(num_segments, segment_size,
                                      shared_memory=config.lend_buffers)
        try:
            self._listeners = Listeners(config)
        except BaseException:
            self._nbp.destroy()
            raise
        self._own = OwnAddresses.of(self._listeners.bound, self._listeners.family, advertise)
        self._partitions = PartitionRegistry()
        self._table = ConnectionTable(self._own.text, config.max_connections,
                                      config.connect_timeout)
        opener = ConnectionOpener(config, self._nbp, self._own.text, self._partitions.lookup)
        self._dialer = Dialer(config, self._own, self._table, opener)
        self._gates = InputGateFactory(config, self._nbp, self._own, self._partitions,
                                       self._dialer.connection_to)
        self._acceptor = Acceptor(config, self._listeners, self._own, self._table, opener)
        self._acceptor.start()
        _LIVE.add(self)

    # ---- addresses and settings ----------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` where the server listens: the address it bound,
        or, bound to every interface (a ``host`` such as ``"0.0.0.0"``), a
        concrete address of this host (the one on its default route)."""
        return self._own.address

    @property
    def bound_address(self) -> tuple[str, int]:
        """``(host, port)`` the server bound, as given (possibly a wildcard)."""
        return self._own.bound

    @property
    def advertised_address(self) -> tuple[str, int]:
        """``(host, port)`` peers dial: ``(advertise, port)``, by default
        :attr:`address`."""
        return self._own.advertised

    @property
    def peer_id(self) -> str:
        """This environment's peer id, said in every handshake."""
        return self._config.peer_id

    @property
    def config(self) -> NetworkConfig:
        """The settings this environment runs with (its arguments, checked,
        with the environment variables applied and the transport chosen)."""
        return self._config

    @property
    def network_buffer_pool(self) -> NetworkBufferPool:
        """The pool every buffer of this environment comes from: create the
        partitions this process serves from it."""
        return self._nbp

    @property
    def is_closed(self) -> bool:
        return self._closed

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
        self._table.expect({format_address(a): handshake.check_peer_id(p)
                            for a, p in peers.items()})

    # ---- connections ------------------------------------------------------------------

    def connections(self) -> list[Connection]:
        """The open connections (a snapshot)."""
        return self._table.open_connections()

    def connection_stats(self) -> list[ConnectionStats]:
        """Per open connection: the peer's address, the transport
        (``"shm"``, ``"unix"`` or ``"tcp"``) and the bytes, frames and buffers
        in and out (a list: two processes may have two connections)."""
        return [{"peer": c.peer, **c.stats()} for c in self._table.open_connections()]

    # ---- partitions and gates -----------------------------------------------------------

    def register_partition(self, partition_id: str, partition: ResultPartition) -> None:
        """Serve ``partition`` as ``partition_id`` (a str of at most 1024
        bytes of UTF-8) to remote readers; readers that asked before are
        served once it is registered (their requests are retried)."""
        self._partitions.register(partition_id, partition)

    def create_input_gate(self, specs: Iterable[ChannelSpec], *, codec: CodecName = "typed",
                          max_record_size: int = 64 << 20, name: str | None = None,
                          buffer_debloat: bool | BufferDebloatConfig | None = None
                          ) -> InputGate:
        """An :class:`InputGate` over ``specs``, each ``(address,
        partition_id, subpartition)``: a :class:`RemoteInputChannel` for a
        partition of another process (``address`` is that process's
        environment's), a :class:`LocalInputChannel` for one registered here
        (this environment's address), and for an ``address`` of None (not
        known yet) an :class:`~flinkbuf.io.UnknownInputChannel`, which
        :meth:`update_input_channel` turns into one of the other two once it
        is known; the gate reads its other channels meanwhile.
        ``buffer_debloat``: the gate's debloating, when not the
        environment's (a bool: the environment's settings, on or off)."""
        return self._gates.create_input_gate(specs, codec=codec,
                                             max_record_size=max_record_size, name=name,
                                             buffer_debloat=buffer_debloat)

    def update_input_channel(self, channel: UnknownInputChannel, address: Address) -> None:
        """Read through ``channel`` (an unknown channel of a gate that
        :meth:`create_input_gate` made here) the partition it names at
        ``address``, now known: connects as ``create_input_gate`` does for
        a channel of that address (with its errors) and puts the channel
        made in ``channel``'s place (:meth:`UnknownInputChannel.update
        <flinkbuf.io.UnknownInputChannel.update>`).  Any thread may call
        it.  ValueError for a channel this environment did not make, or one
        updated or failed already, or whose gate is closed."""
        self._gates.update_input_channel(channel, address)

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """End every connection (a clean CLOSE_REQUEST first), stop the
        server and destroy the buffer pool (lazily: buffers still out stay
        valid until recycled).  Idempotent."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        self._gates.close()
        conns = self._table.close()        # waiters raise: the environment is closed
        self._partitions.close()
        _LIVE.discard(self)
        self._acceptor.close()
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
        return (f"<flinkbuf.network.NetworkEnvironment address={self._own.text} "
                f"segments={self._nbp.num_segments}x{self._config.segment_size} {state}>")
