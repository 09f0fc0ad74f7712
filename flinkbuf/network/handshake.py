"""The handshake that opens every connection (docs/PROTOCOL.md, section 2):
both peers prove that they know the shared secret (HMAC-SHA256 over fresh
nonces, compared in constant time) before anything else is exchanged, and
tell each other their server address and segment size."""

import hashlib
import hmac
import os
import socket
import struct
import time

from flinkbuf.errors import AuthenticationError, RemoteConnectionError

MAGIC = 0x46425546
VERSION = 1
HELLO, CHALLENGE, AUTH, AUTH_OK = 16, 17, 18, 19
MAX_FRAME = 256
NONCE = 32
_HEADER = struct.Struct(">IIB")


def _proof(secret, label, first, second):
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


def _send(sock, msg_id, body):
    sock.sendall(_HEADER.pack(_HEADER.size + len(body), MAGIC, msg_id) + body)


def _recv_exact(sock, n, deadline):
    data = bytearray()
    while len(data) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AuthenticationError("the peer did not complete the handshake in time")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(data))
        except socket.timeout:
            raise AuthenticationError("the peer did not complete the handshake in time") \
                from None
        if not chunk:
            raise AuthenticationError("the peer closed the connection during the handshake "
                                      "(a wrong secret is refused this way)")
        data += chunk
    return bytes(data)


def _recv(sock, expected, deadline):
    length, magic, msg_id = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if magic != MAGIC:
        raise AuthenticationError(f"the peer does not speak flinkbuf's protocol "
                                  f"(magic number 0x{magic:08x})")
    if msg_id != expected:
        raise AuthenticationError(f"message {msg_id} during the handshake, expected {expected}")
    if not _HEADER.size <= length <= MAX_FRAME:
        raise AuthenticationError(f"a handshake frame of {length} bytes")
    return _recv_exact(sock, length - _HEADER.size, deadline)


def _address_field(address):
    raw = address.encode("utf-8")
    if len(raw) > 200:
        raise ValueError(f"address {address!r} is too long")
    return struct.pack(">H", len(raw)) + raw


def _parse_tail(body, what):
    """A string and a u32 at the end of a handshake body."""
    try:
        (n,) = struct.unpack_from(">H", body, 0)
        address = body[2:2 + n].decode("utf-8")
        (segment_size,) = struct.unpack_from(">I", body, 2 + n)
    except (struct.error, UnicodeDecodeError):
        raise AuthenticationError(f"a malformed {what}") from None
    if len(body) != 2 + n + 4:
        raise AuthenticationError(f"a malformed {what}")
    return address, segment_size


def client(sock, secret, address, segment_size, timeout):
    """Authenticate a connected socket as the client; returns the server's
    (address, segment_size).  AuthenticationError if either side fails to
    prove the secret; RemoteConnectionError if the segment sizes differ."""
    deadline = time.monotonic() + timeout
    client_nonce = os.urandom(NONCE)
    _send(sock, HELLO, struct.pack(">H", VERSION) + client_nonce)
    body = _recv(sock, CHALLENGE, deadline)
    if len(body) != 2 + 2 * NONCE:
        raise AuthenticationError("a malformed challenge")
    (version,) = struct.unpack_from(">H", body)
    if version != VERSION:
        raise AuthenticationError(f"the server speaks protocol version {version}, "
                                  f"this side {VERSION}")
    server_nonce, server_proof = body[2:2 + NONCE], body[2 + NONCE:]
    if not hmac.compare_digest(server_proof,
                               _proof(secret, b"flinkbuf-server", client_nonce, server_nonce)):
        raise AuthenticationError("the server did not prove that it knows the shared secret")
    _send(sock, AUTH, _proof(secret, b"flinkbuf-client", server_nonce, client_nonce)
          + _address_field(address) + struct.pack(">I", segment_size))
    peer, peer_segment_size = _parse_tail(_recv(sock, AUTH_OK, deadline), "authentication reply")
    if peer_segment_size != segment_size:
        raise RemoteConnectionError(
            f"the peer at {peer} uses segments of {peer_segment_size} bytes, this side "
            f"{segment_size}: both sides of a connection need the same segment size")
    return peer, peer_segment_size


def server(sock, secret, address, segment_size, timeout):
    """Authenticate an accepted socket as the server; returns the client's
    (address, segment_size).  AuthenticationError if the client does not
    prove the secret (nothing is sent back then)."""
    deadline = time.monotonic() + timeout
    body = _recv(sock, HELLO, deadline)
    if len(body) != 2 + NONCE:
        raise AuthenticationError("a malformed hello")
    (version,) = struct.unpack_from(">H", body)
    if version != VERSION:
        raise AuthenticationError(f"the client speaks protocol version {version}, "
                                  f"this side {VERSION}")
    client_nonce = body[2:]
    server_nonce = os.urandom(NONCE)
    _send(sock, CHALLENGE, struct.pack(">H", VERSION) + server_nonce
          + _proof(secret, b"flinkbuf-server", client_nonce, server_nonce))
    body = _recv(sock, AUTH, deadline)
    if len(body) < NONCE:
        raise AuthenticationError("a malformed authentication")
    if not hmac.compare_digest(body[:NONCE],
                               _proof(secret, b"flinkbuf-client", server_nonce, client_nonce)):
        raise AuthenticationError("the client did not prove that it knows the shared secret")
    peer, peer_segment_size = _parse_tail(body[NONCE:], "authentication")
    _send(sock, AUTH_OK, _address_field(address) + struct.pack(">I", segment_size))
    if peer_segment_size != segment_size:
        raise RemoteConnectionError(
            f"the client at {peer} uses segments of {peer_segment_size} bytes, this side "
            f"{segment_size}")
    return peer, peer_segment_size
