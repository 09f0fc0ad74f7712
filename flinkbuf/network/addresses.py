"""Addresses of network environments: ``(host, port)`` or ``"host:port"``,
and what a host string says (a wildcard, this host)."""

from __future__ import annotations

from typing import Union

__all__ = ["Address", "WILDCARD_HOSTS", "format_address", "is_wildcard", "split_address"]

# An address: (host, port) or "host:port".
Address = Union[tuple[str, int], str]

# Hosts a server binds to listen on every interface: never an address to dial.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (``"0.0.0.0"``, ``"::"``, or
    empty): a peer cannot dial it."""
    return host in WILDCARD_HOSTS


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
