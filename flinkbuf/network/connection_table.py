"""The connection table of a network environment: which connection reaches
each peer, which are being built, which peer id each peer must say, how
many connections are open, and which ended.

One connection joins two processes.  Per peer address the table holds the
live connection reads to that address go over, or one being built (this
process dialing it, or the acceptor setting up one that peer made; Flink's
``PartitionRequestClientFactory`` keeps a connection in build-up the same
way), and the peer id expected there.  Every connection the environment
runs is in the table, with whether this process dialed it (its peer
answered at the address dialed, so it is that peer's) and the peer id its
peer said."""

from __future__ import annotations

import dataclasses
import threading
import time

from flinkbuf.errors import EnvironmentClosedError, RemoteConnectionError
from flinkbuf.network._network import Connection

__all__ = ["ConnectionTable"]


class _Peer:
    """What the table knows of one peer address."""

    __slots__ = ("conn", "dialing", "reached", "accepting", "expected")

    def __init__(self) -> None:
        self.conn: Connection | None = None     # what reads to this address go over
        self.dialing = False                    # this process is connecting to it
        self.reached = False                    # ... and its connect got through
        self.accepting = 0                      # its connections the acceptor is setting up
        self.expected: str | None = None        # the peer id it must say

    def is_empty(self) -> bool:
        return (self.conn is None and not self.dialing and not self.accepting
                and self.expected is None)


@dataclasses.dataclass
class _Record:
    """What the table knows of one connection."""

    dialed: bool                # this process made it
    peer_id: str | None         # what its peer said (dialed: the id expected, if any)


class ConnectionTable:
    """Every connection of one environment, and per peer address the one in
    use or in build-up (module docstring).  Thread-safe: one lock, and a
    condition that wakes waiters when a connection arrives, a build-up
    ends, or the table closes."""

    def __init__(self, own: str, max_connections: int, connect_timeout: float) -> None:
        self._own = own
        self._max = max_connections
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._peers: dict[str, _Peer] = {}
        self._conns: dict[Connection, _Record] = {}
        self._closed = False

    # ---- reading --------------------------------------------------------------------

    def open_connections(self) -> list[Connection]:
        """The open connections (a snapshot, oldest first)."""
        with self._lock:
            return [c for c in self._conns if c.is_open]

    def expect(self, peers: dict[str, str]) -> None:
        """The peer id each address (``"host:port"``) must say."""
        with self._lock:
            for address, peer_id in peers.items():
                self._peer(address).expected = peer_id

    def expected(self, address: str) -> str | None:
        """The peer id the peer at ``address`` must say, or None (any)."""
        with self._lock:
            peer = self._peers.get(address)
            return peer.expected if peer is not None else None

    def admit(self) -> str | None:
        """Why one more connection cannot be taken (``max_connections``
        are open), or None."""
        with self._lock:
            n = sum(1 for c in self._conns if c.is_open)
        if n >= self._max:
            return (f"{self._own} has {n} connections open, as many as it takes "
                    f"(max_connections)")
        return None

    # ---- dialing --------------------------------------------------------------------

    def begin_dial(self, address: str) -> Connection | None:
        """The open connection to ``address`` if there is one, else None,
        and this process is dialing ``address`` until :meth:`end_dial`.
        Waits while another thread of this process dials it, and (at most
        ``connect_timeout``) while the acceptor sets up a connection from
        it: dialing then would make a second one, which the peer, dialing
        too, would keep as well."""
        accepting_until: float | None = None
        with self._changed:
            while True:
                if self._closed:
                    raise EnvironmentClosedError
                conn = self._usable(address)
                if conn is not None:
                    return conn
                peer = self._peer(address)
                if peer.dialing:
                    self._changed.wait()
                    continue
                if peer.accepting:
                    now = time.monotonic()
                    if accepting_until is None:
                        accepting_until = now + self._connect_timeout
                    if now < accepting_until:
                        self._changed.wait(accepting_until - now)
                        continue
                peer.dialing = True
                peer.reached = False
                return None

    def reached(self, address: str) -> None:
        """This process's dial to ``address`` got through (the handshake
        follows): from now on a connection from that peer is kept or
        refused as :meth:`keep_incoming` says of two handshakes at once."""
        with self._lock:
            peer = self._peers.get(address)
            if peer is not None and peer.dialing:
                peer.reached = True

    def usable(self, address: str) -> Connection | None:
        """The open connection to ``address`` (to the peer expected there),
        or None."""
        with self._lock:
            return self._usable(address)

    def end_dial(self, address: str, conn: Connection | None) -> None:
        """The dial :meth:`begin_dial` began ended, with the connection this
        process made, not started (kept as the one to ``address``, and
        started) or None.  A table closed meanwhile closes ``conn`` and
        raises EnvironmentClosedError; MemoryError if it cannot start."""
        with self._changed:
            peer = self._peer(address)
            peer.dialing = peer.reached = False
            self._changed.notify_all()
            failed = None
            if conn is not None and not self._closed:
                try:
                    self._start(conn)
                except MemoryError as exc:
                    failed = exc
                else:
                    peer.conn = conn
                    self._conns[conn] = _Record(True, peer.expected)
                    return
            self._prune(address)
        if conn is not None:
            conn.close()
            if failed is not None:
                raise failed
            raise EnvironmentClosedError

    def await_connection_from(self, address: str, peer_address: str) -> Connection:
        """The connection the process at ``address`` (which calls itself
        ``peer_address``) made to this one, once the acceptor has it; from
        then on also the one to ``address``.  RemoteConnectionError if it
        does not come within ``connect_timeout``."""
        def arrived() -> bool:
            return (self._usable(peer_address) is not None
                    and self._usable(address, self._peers[peer_address].conn) is not None)

        with self._changed:
            if not self._changed.wait_for(lambda: self._closed or arrived(),
                                          self._connect_timeout):
                raise RemoteConnectionError(
                    f"connecting to {address}: the peer keeps its own connection to this "
                    f"process, which did not arrive within {self._connect_timeout:g} s")
            if self._closed:
                raise EnvironmentClosedError
            conn = self._peers[peer_address].conn
            self._peer(address).conn = conn
            return conn          # type: ignore[return-value]  # (arrived)

    # ---- accepting ------------------------------------------------------------------

    def keep_incoming(self, peer_address: str) -> bool:
        """Whether a connection the process at ``peer_address`` made to this
        one is kept.  One connection joins two processes: an open one this
        process made to it wins over a new one; when both are connecting to
        each other at once, the connection made by the smaller address wins
        (the other side's is refused with DUPLICATE, and that side waits for
        this one), unless this process's connect has not got through yet:
        the peer's is kept, and this process's dial gives way to it (a
        firewall may drop one direction only).  A connection accepted earlier from a process that said
        it is at ``peer_address`` does not refuse a new one: anyone with the
        secret may say so, and the process really there would then wait for
        a connection that never comes."""
        with self._lock:
            return self._keeps(peer_address)

    def _keeps(self, peer_address: str) -> bool:
        peer = self._peers.get(peer_address)
        if peer is None:
            return True
        conn = peer.conn
        if conn is not None and conn.is_open and self._dialed(conn):
            return False
        if peer.dialing:
            return not peer.reached or self._own > peer_address
        return True

    def keep_accepting(self, accepting: list[str], peer_address: str) -> bool:
        """The handshake's ``keep`` for one accepted connection: whether it
        is kept (:meth:`keep_incoming`), and if so, in the same step, that a
        connection from ``peer_address`` is in build-up until
        :meth:`done_accepting` (``accepting``: that connection's record of
        it)."""
        with self._lock:
            keep = self._keeps(peer_address)
            if keep and not accepting:
                self._peer(peer_address).accepting += 1
                accepting.append(peer_address)
            return keep

    def done_accepting(self, accepting: list[str]) -> None:
        """A connection :meth:`keep_accepting` kept is running or gone: a
        dialer waiting for it looks again."""
        if not accepting:
            return
        with self._changed:
            for address in accepting:
                peer = self._peers.get(address)
                if peer is not None:
                    peer.accepting -= 1
                    self._prune(address)
            accepting.clear()
            self._changed.notify_all()

    def add_accepted(self, conn: Connection, peer_address: str, peer_id: str) -> bool:
        """Keep, and start, a connection the acceptor made from the process
        that says it is ``peer_id`` at ``peer_address``: the one to that
        address, unless this process dialed that peer itself or the peer id
        is not the one expected.  False if the table is closed, MemoryError
        if the connection cannot start (the caller closes it either way)."""
        with self._changed:
            if self._closed:
                return False
            self._start(conn)
            self._conns[conn] = _Record(False, peer_id)
            peer = self._peer(peer_address)
            current = peer.conn
            if ((current is None or not current.is_open or not self._dialed(current))
                    and self._is_expected(peer_address, conn)):
                peer.conn = conn              # the newest accepted one
            self._changed.notify_all()
            return True

    # ---- ending ---------------------------------------------------------------------

    def reap(self) -> None:
        """Forget the connections that ended, and close them (their sockets
        go now)."""
        with self._lock:
            dead = [c for c in self._conns if not c.is_open]
            if not dead:
                return
            for conn in dead:
                del self._conns[conn]
            for address, peer in list(self._peers.items()):
                if peer.conn is not None and not peer.conn.is_open:
                    peer.conn = None
                    self._prune(address)
        for conn in dead:
            conn.close()

    def close(self) -> list[Connection]:
        """Refuse everything from now on (waiters raise) and hand over
        every connection, for the caller to close."""
        with self._changed:
            self._closed = True
            conns = list(self._conns)
            self._conns.clear()
            self._peers.clear()
            self._changed.notify_all()
            return conns

    # ---- the lock held ------------------------------------------------------------------

    @staticmethod
    def _start(conn: Connection) -> None:
        """Start ``conn`` as the table takes it, under the lock (whoever
        lists or closes connections finds it not kept yet, or running): every
        connection that has read or written is listed.  MemoryError if its
        threads cannot start."""
        conn._start()

    def _peer(self, address: str) -> _Peer:
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _Peer()
        return peer

    def _prune(self, address: str) -> None:
        peer = self._peers.get(address)
        if peer is not None and peer.is_empty():
            del self._peers[address]

    def _dialed(self, conn: Connection) -> bool:
        record = self._conns.get(conn)
        return record is not None and record.dialed

    def _is_expected(self, address: str, conn: Connection) -> bool:
        """Whether ``conn`` is to the peer expected at ``address``."""
        peer = self._peers.get(address)
        expected = peer.expected if peer is not None else None
        record = self._conns.get(conn)
        return expected is None or (record is not None and record.peer_id == expected)

    def _usable(self, address: str, conn: Connection | None = None) -> Connection | None:
        """``conn`` (by default, the one to ``address``) if it is open and
        to the peer expected at ``address``, else None."""
        if conn is None:
            peer = self._peers.get(address)
            conn = peer.conn if peer is not None else None
        if conn is not None and conn.is_open and self._is_expected(address, conn):
            return conn
        return None
