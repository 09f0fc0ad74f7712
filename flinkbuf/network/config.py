"""The configuration of a network environment: its arguments checked once,
the process's environment variables applied, and the transport chosen;
frozen, so that every part of the environment reads the same values."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from typing import Literal, cast

from flinkbuf.checks import check_int, check_seconds
from flinkbuf.io import BufferDebloatConfig
from flinkbuf.network import handshake
from flinkbuf.network.addresses import is_wildcard

__all__ = ["MAX_CONNECTIONS", "MAX_PENDING_HANDSHAKES", "NetworkConfig", "Transport",
           "TRANSPORTS"]

Transport = Literal["auto", "tcp", "unix", "shm"]
TRANSPORTS: tuple[Transport, ...] = ("auto", "tcp", "unix", "shm")

# The defaults of max_connections and of max_pending_handshakes: the connections
# an environment keeps open, and those accepted and not authenticated yet.
MAX_CONNECTIONS = 256
MAX_PENDING_HANDSHAKES = 128

# Unix sockets with abstract names, descriptor passing and memfds.
UNIX = hasattr(socket, "AF_UNIX") and sys.platform.startswith("linux")


def switch(value: object, name: str, variable: str, default: bool | None = True) -> bool | None:
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


def _transport_override() -> Transport:
    """What ``transport="auto"`` means in this process: the environment
    variable ``FLINKBUF_NET_TRANSPORT`` (one of the transports) if set."""
    setting = os.environ.get("FLINKBUF_NET_TRANSPORT", "")
    if setting == "":
        return "auto"
    if setting in TRANSPORTS:
        return setting
    raise ValueError(f"the environment variable FLINKBUF_NET_TRANSPORT must be one of "
                     f"{', '.join(repr(t) for t in TRANSPORTS)} (or unset), got {setting!r}")


def same_host_transport() -> Transport:
    """What transport="auto" means between processes on one host: the
    fastest in bench/bench_network.py.  Shared memory (bulk, records and
    round trips), unless this process may run on one CPU only: then both
    sides take turns on it, and a Unix socket's round trip is faster."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return "shm" if cpus > 1 else "unix"


def _check_secret(secret: object) -> bytes:
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"secret must be bytes, got {type(secret).__name__}")
    secret = bytes(secret)
    if len(secret) < 16:
        raise ValueError("secret must be at least 16 bytes (use secrets.token_bytes(32))")
    return secret


def _check_advertise(advertise: object) -> str | None:
    if advertise is None:
        return None
    if not isinstance(advertise, str):
        raise TypeError(f"advertise must be a str or None, got {type(advertise).__name__}")
    if is_wildcard(advertise):
        raise ValueError(f"advertise must be a host peers can dial, got {advertise!r}")
    return advertise


def _check_transport(transport: object) -> Literal["tcp", "unix", "shm"]:
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(repr(t) for t in TRANSPORTS)}, "
                         f"got {transport!r}")
    if transport == "auto":
        transport = _transport_override()
    if transport == "auto":
        transport = same_host_transport()
    return cast(Literal["tcp", "unix", "shm"], transport)


DEBLOAT_BY_DEFAULT = True


def debloat_config(options: object) -> BufferDebloatConfig:
    """The debloating of an environment's gates: ``options`` is a
    BufferDebloatConfig, or a dict of the ``buffer_debloat*`` keywords as
    given (``buffer_debloat`` None: the environment variable
    ``FLINKBUF_NET_BUFFER_DEBLOAT``, ``0`` or ``1``, if set)."""
    if isinstance(options, BufferDebloatConfig):
        return options
    kw = dict(options) if isinstance(options, dict) else {}
    if not isinstance(kw.get("buffer_debloat"), BufferDebloatConfig):
        kw["buffer_debloat"] = switch(kw.get("buffer_debloat"), "buffer_debloat",
                                      "FLINKBUF_NET_BUFFER_DEBLOAT", DEBLOAT_BY_DEFAULT)
    return BufferDebloatConfig.from_options(**kw)


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """What a :class:`~flinkbuf.network.NetworkEnvironment` was asked for,
    checked, with its switches resolved (see its docstring for each).

    ``transport`` is the one this environment uses to reach processes on
    its own host (``"auto"`` resolved); ``encryption`` stays None for the
    default rule (:meth:`seals`); ``lend_buffers`` is True only where
    lending can happen (not with ``encryption=True``)."""

    num_segments: int
    segment_size: int
    host: str
    port: int
    secret: bytes = dataclasses.field(repr=False)
    exclusive_buffers_per_channel: int
    floating_buffers_per_gate: int
    connect_timeout: float
    request_timeout: float
    io_timeout: float
    transport: Literal["tcp", "unix", "shm"]
    caller_sends: bool
    direct_reads: bool
    lend_buffers: bool
    encryption: bool | None
    max_connections: int
    advertise: str | None
    peer_id: str
    buffer_debloat: BufferDebloatConfig
    max_pending_handshakes: int = MAX_PENDING_HANDSHAKES

    @classmethod
    def of(cls, num_segments: int, segment_size: int, *, host: str, port: int,
           secret: object, exclusive_buffers_per_channel: int, floating_buffers_per_gate: int,
           connect_timeout: float, request_timeout: float, io_timeout: float,
           transport: object, caller_sends: bool | None, direct_reads: bool | None,
           lend_buffers: bool | None, encryption: bool | None, max_connections: int,
           advertise: str | None, peer_id: str, buffer_debloat: object = None,
           max_pending_handshakes: int = MAX_PENDING_HANDSHAKES) -> NetworkConfig:
        """The configuration of these arguments (TypeError or ValueError,
        naming the argument, for one that is not right).  The pool's two
        sizes are checked by the pool itself."""
        secret = _check_secret(secret)
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, got {type(host).__name__}")
        advertise = _check_advertise(advertise)
        peer_id = handshake.check_peer_id(peer_id)
        resolved = _check_transport(transport)
        check_int(port, "port", 0, 65535)
        exclusive = check_int(exclusive_buffers_per_channel, "exclusive_buffers_per_channel", 1)
        floating = check_int(floating_buffers_per_gate, "floating_buffers_per_gate", 0)
        timeouts = (check_seconds(connect_timeout, "connect_timeout"),
                    check_seconds(request_timeout, "request_timeout"),
                    check_seconds(io_timeout, "io_timeout"))
        check_int(max_connections, "max_connections", 1)
        check_int(max_pending_handshakes, "max_pending_handshakes", 1)
        sends = bool(switch(caller_sends, "caller_sends", "FLINKBUF_NET_CALLER_SENDS"))
        reads = bool(switch(direct_reads, "direct_reads", "FLINKBUF_NET_DIRECT_READS"))
        seal = switch(encryption, "encryption", "FLINKBUF_NET_ENCRYPTION", default=None)
        lend = switch(lend_buffers, "lend_buffers", "FLINKBUF_NET_LEND_BUFFERS", default=False)
        debloat = debloat_config(buffer_debloat)
        if seal and lend_buffers:
            raise ValueError("lend_buffers=True and encryption=True exclude each other: a lent "
                             "buffer is read in place, never sealed")
        return cls(num_segments=num_segments, segment_size=segment_size, host=host, port=port,
                   secret=secret, exclusive_buffers_per_channel=exclusive,
                   floating_buffers_per_gate=floating, connect_timeout=timeouts[0],
                   request_timeout=timeouts[1], io_timeout=timeouts[2], transport=resolved,
                   caller_sends=sends, direct_reads=reads,
                   lend_buffers=bool(lend) and seal is not True and UNIX, encryption=seal,
                   max_connections=max_connections, advertise=advertise, peer_id=peer_id,
                   buffer_debloat=debloat, max_pending_handshakes=max_pending_handshakes)

    @property
    def uses_unix_socket(self) -> bool:
        """Whether peers on this host are reached over a Unix socket (or
        shared memory set up over one) rather than TCP."""
        return self.transport in ("unix", "shm") and UNIX

    @property
    def wants_shared_memory(self) -> bool:
        return self.transport == "shm" and UNIX

    def seals(self, peer_on_this_host: bool) -> bool:
        """Whether this side asks for sealed frames on a connection with a
        peer (dialed or accepted: one rule for both): always with
        ``encryption=True``, never with False, and with None (the default)
        when the peer is on another host."""
        if self.encryption is not None:
            return self.encryption
        return not peer_on_this_host
