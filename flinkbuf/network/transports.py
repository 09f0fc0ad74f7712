"""Opening connections: a typed spec per transport, and the one place that
turns a spec into a running :class:`~flinkbuf.network.Connection` (the only
caller of ``Connection._open``), with what shared memory and lending take
to set up."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Callable
from typing import Union

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.io import ResultPartition
from flinkbuf.network import handshake, sockets
from flinkbuf.network._network import Connection, _memfd_of, _new_ledger, _shm_region
from flinkbuf.network.config import NetworkConfig

__all__ = ["ConnectionOpener", "Loan", "SharedMemorySpec", "StreamSpec"]

log = logging.getLogger("flinkbuf.network")


@dataclasses.dataclass(frozen=True)
class Loan:
    """What lending this environment's buffers to the process at the other
    end of a Unix socket takes: a pidfd of that process (its end gives back
    what it still holds), the arena's memfd (the pool's own: never closed
    here) and a ledger (a new memfd, closed once the connection mapped it)."""

    pidfd: int
    arena: int
    ledger: int

    def close(self) -> None:
        """Close what is this loan's own (nothing is lent after all)."""
        handshake.close_fds([self.pidfd, self.ledger])


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    """A connection over a TCP or Unix socket ``fd`` (connected and past its
    handshake) to the environment at ``peer``; sealed with ``keys`` if
    given."""

    fd: int
    peer: str
    keys: handshake.Keys | None = None

    def close(self) -> None:
        """Close the socket (the spec will not be opened)."""
        handshake.close_fds([self.fd])


@dataclasses.dataclass(frozen=True)
class SharedMemorySpec:
    """A connection over shared memory with the environment at ``peer`` on
    this host: the ``region`` (a memfd both map, closed once mapped), this
    side's two doorbells (``data``, ``room``), which ``side`` of the region
    this one is (0: the server's, 1: the client's), the Unix socket ``fd``
    that stays open beside it, ``keys`` to seal with, ``borrowed``: the
    peer's arena and ledger when it lends this side its buffers (closed
    once mapped), and ``loan`` when this side lends its own."""

    fd: int
    peer: str
    region: int
    data: int
    room: int
    side: int
    keys: handshake.Keys | None = None
    borrowed: tuple[int, int] | None = None
    loan: Loan | None = None

    def close(self) -> None:
        """Close every descriptor of the spec (it will not be opened)."""
        handshake.close_fds([self.fd, self.region, self.data, self.room,
                             *(self.borrowed or ())])
        if self.loan is not None:
            self.loan.close()


ConnectionSpec = Union[StreamSpec, SharedMemorySpec]


class ConnectionOpener:
    """Opens the connections of one environment (Flink's
    ``NettyConnectionManager`` makes its channels the same way for the
    client and the server side): both the dialer and the acceptor hand it
    a spec once a handshake ended, and it runs the connection with the
    environment's settings, partitions found by ``lookup``."""

    def __init__(self, config: NetworkConfig, pool: NetworkBufferPool, local: str,
                 lookup: Callable[[str], ResultPartition | None]) -> None:
        self._config = config
        self._pool = pool
        self._local = local
        self._lookup = lookup

    def open(self, spec: ConnectionSpec) -> Connection:
        """The connection ``spec`` says, not started yet: the connection
        table starts it once it keeps it, so that every connection that
        reads or writes is in the table.  From this call on, its socket,
        doorbells and pidfd are the connection's (closed if it cannot
        start), and its memfds are closed here once mapped.
        RemoteConnectionError if the region or a peer's arena is not as it
        should be; MemoryError if the connection cannot be allocated."""
        c = self._config
        if isinstance(spec, StreamSpec):
            return Connection._open(spec.fd, c.segment_size, self._lookup, self._local,
                                    spec.peer, c.io_timeout, c.caller_sends, c.direct_reads,
                                    None, spec.keys, start=False)
        arena, ledger = spec.borrowed if spec.borrowed is not None else (-1, -1)
        loan = spec.loan
        shared = (spec.region, spec.data, spec.room, spec.side, arena, ledger,
                  self._pool if loan is not None else None,
                  loan.pidfd if loan is not None else -1, loan.ledger if loan is not None else -1)
        try:
            return Connection._open(spec.fd, c.segment_size, self._lookup, self._local,
                                    spec.peer, c.io_timeout, c.caller_sends, c.direct_reads,
                                    shared, spec.keys, start=False)
        finally:
            handshake.close_fds([fd for fd in (spec.region, arena, ledger,
                                               loan.ledger if loan is not None else -1)
                                 if fd >= 0])

    def new_region(self) -> list[int]:
        """A region for a shared-memory connection (the acceptor's answer to
        a client that asks for one): its descriptors, the caller's."""
        return _shm_region(self._config.segment_size)

    def loan_terms(self, sock: socket.socket) -> Loan | None:
        """What lending this pool's buffers to the process at the other end
        of ``sock`` takes, or None when nothing is lent (the pool is not
        shared, the peer is this process, or it has no pidfd)."""
        arena = _memfd_of(self._pool)
        pidfd = sockets.peer_pidfd(sock) if arena >= 0 else -1
        if pidfd < 0:
            return None
        try:
            return Loan(pidfd, arena, _new_ledger(self._pool))
        except OSError as exc:
            os.close(pidfd)
            log.warning("lending no buffers over a connection: %s", exc)
            return None
