"""The client side of a network environment: connecting to the environment
at an address (over its same-host socket when it is on this host, else
TCP), proving the secret, and handing the connection to the table."""

from __future__ import annotations

import logging
import os
import socket

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.network import handshake, sockets
from flinkbuf.network._network import Connection
from flinkbuf.network.addresses import OwnAddresses, split_address
from flinkbuf.network.config import NetworkConfig
from flinkbuf.network.connection_table import ConnectionTable
from flinkbuf.network.transports import ConnectionOpener, SharedMemorySpec, StreamSpec

__all__ = ["Dialer"]

log = logging.getLogger("flinkbuf.network")


class _Unproven(Exception):
    """A handshake over the same-host socket failed before the server
    proved itself (its cause says how): TCP is tried next."""


class _GaveWay(Exception):
    """A connect in progress gave way to the connection the peer made to
    this process meanwhile."""


class Dialer:
    """Connects one environment to others (the client half of Flink's
    ``NettyConnectionManager``): at most one connection per peer, through
    ``table``."""

    def __init__(self, config: NetworkConfig, own: OwnAddresses, table: ConnectionTable,
                 opener: ConnectionOpener) -> None:
        self._config = config
        self._own = own
        self._table = table
        self._opener = opener

    def connection_to(self, address: str) -> Connection:
        """The open connection to the process at ``address``, made (and
        authenticated) if there is none; if that process keeps its own
        connection to this one instead, that one once it arrives.  A
        connection the peer makes to this process while this one's connect
        has not reached it yet (a firewall that drops this way and lets the
        other through) is taken instead, at once."""
        while True:
            conn = self._table.begin_dial(address)
            if conn is not None:
                return conn
            try:
                conn = self.connect(address)
            except _GaveWay:
                self._table.end_dial(address, None)
                continue                  # the peer's connection: begin_dial has it
            except handshake.DuplicateConnection as dup:
                self._table.end_dial(address, None)
                return self._table.await_connection_from(address, dup.peer)
            except BaseException:
                self._table.end_dial(address, None)
                raise
            self._table.end_dial(address, conn)
            return conn

    def connect(self, address: str) -> Connection:
        """A new connection to the environment at ``address``: over its Unix
        socket when it is on this host (and the transport is not TCP), else,
        or when that fails short of a proven answer, over TCP."""
        host, port = split_address(address)
        full = self._table.admit()
        if full is not None:
            raise RemoteConnectionError(f"cannot connect to {address}: {full}")
        here = self._own.is_this_host(host)
        seal = self._config.seals(here)
        if self._config.uses_unix_socket and here:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self._config.connect_timeout)
            try:
                sock.connect(sockets.unix_name(port))
            except OSError:
                sock.close()             # another network namespace, or no Unix socket
            else:
                self._table.reached(address)
                try:
                    return self._connect_over(sock, address, seal, fallback=True)
                except _Unproven as exc:
                    # Whoever holds the name (a process of another user, a
                    # relay) proved nothing; the TCP port is the server's own.
                    log.warning("connecting to %s over its Unix socket failed (%s): "
                                "connecting over TCP", address, exc.__cause__)
        try:
            tcp = sockets.connect_watching(host, port, self._config.connect_timeout,
                                           lambda: self._table.usable(address) is not None)
        except OSError as exc:
            raise RemoteConnectionError(f"cannot connect to {address}: {exc}") from exc
        if tcp is None:
            raise _GaveWay
        self._table.reached(address)
        return self._connect_over(tcp, address, seal)

    def _connect_over(self, sock: socket.socket, address: str, seal: bool,
                      fallback: bool = False) -> Connection:
        """Authenticate ``sock``, connected to ``address``, and run a
        connection over it, asking for sealed frames if ``seal`` (the socket
        is this method's: closed on error).  ``fallback``: a handshake that
        fails by an AuthenticationError or an OSError raises
        :class:`_Unproven` (from that error) instead."""
        c = self._config
        want_shm = c.wants_shared_memory and sock.family == socket.AF_UNIX
        loan = self._opener.loan_terms(sock) if want_shm else None    # this side lends too
        try:
            try:
                sockets.tune(sock)
                _, _, shared_fds, keys = handshake.client(
                    sock, c.secret, self._own.text, c.segment_size, c.connect_timeout,
                    shared_memory=want_shm,
                    lend_fds=None if loan is None else [loan.arena, loan.ledger], seal=seal,
                    peer_id=c.peer_id, expect_peer=self._table.expected(address))
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
            if loan is not None:
                loan.close()
            raise
        if shared_fds is None:
            if loan is not None:
                loan.close()            # a stream after all: nothing is lent
            return self._opener.open(StreamSpec(fd, address, keys))
        region, data, room, *borrowed = shared_fds
        return self._opener.open(SharedMemorySpec(
            fd, address, region, data, room, side=1, keys=keys,
            borrowed=(borrowed[0], borrowed[1]) if borrowed else None, loan=loan))
