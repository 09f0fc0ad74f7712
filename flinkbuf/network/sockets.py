"""The sockets of a network environment: how they are tuned, where the
same-host socket lives, and what the kernel tells of the process at the
other end of one."""

from __future__ import annotations

import errno
import os
import select
import socket
import time
from collections.abc import Callable

from flinkbuf.errors import AuthenticationError
from flinkbuf.network import handshake

__all__ = ["KEEPALIVE", "SOCKET_BUFFER", "connect_watching", "peer_pidfd", "recv_handshake",
           "tune", "unix_name"]

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

_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)

# How often a connect in progress looks whether it may give up.
CONNECT_SLICE = 0.05


def connect_watching(host: str, port: int, timeout: float,
                     give_up: Callable[[], bool]) -> socket.socket | None:
    """A TCP socket connected to ``(host, port)`` within ``timeout``
    seconds, as :func:`socket.create_connection` makes it (its errors
    too: TimeoutError "timed out"), or None as soon as ``give_up()``,
    asked every ``CONNECT_SLICE`` seconds while the connect is in
    progress, is true (the socket is closed then)."""
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            err = sock.connect_ex(sockaddr)
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            while err in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("timed out")
                if poller.poll(1000 * min(CONNECT_SLICE, remaining)):
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                elif give_up():
                    sock.close()
                    return None
            if err:
                raise OSError(err, os.strerror(err))
            sock.settimeout(timeout)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last if last is not None else OSError(f"no address for {host}")


def tune(sock: socket.socket) -> None:
    """Large buffers; on TCP, no Nagle delay and dead-peer detection."""
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


def unix_name(port: int) -> str:
    """The abstract Unix socket (Linux) an environment listens on beside its
    TCP port: derived from the port, so a peer that knows ``host:port``
    knows it too (ports are unique per host).  Anyone may bind an abstract
    name first; the handshake still proves the secret, and a peer that
    cannot use the name connects over TCP."""
    return f"\0flinkbuf-tcp-{port}"


def recv_handshake(sock: socket.socket, fds: list[int]) -> bytes:
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


def peer_pidfd(sock: socket.socket) -> int:
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
