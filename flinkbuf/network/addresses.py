"""Addresses of network environments: ``(host, port)`` or ``"host:port"``,
and what a host string says (a wildcard, this host)."""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from typing import Union

__all__ = ["Address", "OwnAddresses", "WILDCARD_HOSTS", "format_address", "host_address",
           "is_host_address", "is_loopback", "is_wildcard", "source_address",
           "split_address"]

# An address: (host, port) or "host:port".
Address = Union[tuple[str, int], str]

# Hosts a server binds to listen on every interface: never an address to dial.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (``"0.0.0.0"``, ``"::"``, or
    empty): a peer cannot dial it."""
    return host in WILDCARD_HOSTS


_LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not)
    is this machine's loopback: ``localhost``, 127.0.0.0/8 (127.0.1.1
    included, as Debian maps a host's name), ``::1``."""
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def format_address(address: Address) -> str:
    """``(host, port)`` or ``"host:port"`` as ``"host:port"``."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"an address is (host, port) or 'host:port', got {address!r}")
        return f"{host}:{int(port)}"
    if (isinstance(address, (tuple, list)) and len(address) == 2
            and isinstance(address[0], str) and isinstance(address[1], int)
            and not isinstance(address[1], bool)):
        return f"{address[0]}:{address[1]}"
    raise TypeError(f"an address is (host, port) or 'host:port', got {address!r}")


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (as :func:`format_address` makes it) as ``(host, port)``."""
    host, _, port = address.rpartition(":")
    return host, int(port)


# Documentation-only addresses (RFC 5737, RFC 3849): the source address
# toward one is that of the default route.
_ROUTE_PROBES: dict[int, tuple[str, int]] = {socket.AF_INET: ("192.0.2.1", 9),
                                              socket.AF_INET6: ("2001:db8::1", 9)}
_LOOPBACK: dict[int, str] = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}
_LOCAL_HOSTS = ("127.", "::1", "localhost")


def source_address(target: tuple[str, int]) -> str | None:
    """The address of this host the kernel sends from to reach ``target``
    (a numeric ``(host, port)``), or None when no route leads there: a
    datagram socket is "connected" to it, and no packet is sent."""
    try:
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(target)
            host = str(probe.getsockname()[0])
    except (OSError, ValueError, TypeError, OverflowError):
        return None
    return None if is_wildcard(host) else host


def host_address(family: int = socket.AF_INET) -> str:
    """A concrete address of this host that peers can dial, for a server
    bound to every interface: the source address of the default route,
    else the first address of an interface that is up (not loopback),
    else the address this host's name resolves to if a socket can bind
    it, else loopback."""
    if family in _ROUTE_PROBES:
        routed = source_address(_ROUTE_PROBES[family])
        if routed is not None:
            return routed
    for host in _interface_addresses(family):
        return host
    try:
        for *_, sockaddr in socket.getaddrinfo(socket.gethostname(), None, family,
                                                socket.SOCK_STREAM):
            host = str(sockaddr[0])
            if (not is_wildcard(host) and not host.startswith(_LOCAL_HOSTS)
                    and is_host_address(host)):
                return host
    except (OSError, UnicodeError):
        pass
    return _LOOPBACK.get(family, "127.0.0.1")


# Linux ioctls of an interface's flags and IPv4 address (<linux/sockios.h>).
_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


def _interface_addresses(family: int) -> list[str]:
    """The IPv4 addresses of this host's interfaces that are up and not
    loopback, in interface order (Linux; elsewhere, and for IPv6, none)."""
    if family != socket.AF_INET or not hasattr(socket, "if_nameindex"):
        return []
    try:
        import fcntl
        import struct
        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(probe, _SIOCGIFFLAGS, request),
                                           16)[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                found.append(socket.inet_ntoa(fcntl.ioctl(probe, _SIOCGIFADDR, request)[20:24]))
            except OSError:     # no IPv4 address on it, or gone meanwhile
                continue
    return found


def is_host_address(host: str) -> bool:
    """Whether ``host`` (a numeric address) is one of this host's: a socket
    can bind it.  A name, a wildcard or an address of another host: False."""
    if not host or is_wildcard(host):
        return False
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM,
                                   flags=getattr(socket, "AI_NUMERICHOST", 0))
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(sockaddr[:1] + (0,) + tuple(sockaddr[2:]))
            return True
        except OSError:
            continue
    return False


@dataclasses.dataclass(frozen=True)
class OwnAddresses:
    """The addresses of one environment's server: ``bound`` (what it
    bound, possibly a wildcard), ``address`` (a concrete address of this
    host where it listens: ``bound``, or for a wildcard bind
    :func:`host_address`) and ``advertised`` (what it says it is in every
    handshake and peers dial: ``advertise`` if given, else ``address``)."""

    bound: tuple[str, int]
    address: tuple[str, int]
    advertised: tuple[str, int]

    @classmethod
    def of(cls, bound: tuple[str, int], family: int, advertise: str | None) -> OwnAddresses:
        host, port = bound[0], bound[1]
        concrete = (host_address(family), port) if is_wildcard(host) else (host, port)
        return cls((host, port), concrete, (advertise or concrete[0], port))

    @property
    def text(self) -> str:
        """The advertised address as ``"host:port"``: this side's name."""
        return format_address(self.advertised)

    def is_own(self, address: str) -> bool:
        """Whether ``address`` (``"host:port"``) names this environment."""
        return address in {format_address(a) for a in (self.advertised, self.address,
                                                        self.bound)}

    def is_this_host(self, host: str) -> bool:
        """Whether ``host`` is this host: loopback, the host of one of this
        environment's addresses, or another address a socket here can bind
        (:func:`is_host_address`)."""
        return (host.startswith(_LOCAL_HOSTS)
                or host in (self.bound[0], self.address[0], self.advertised[0])
                or is_host_address(host))
