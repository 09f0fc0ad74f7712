"""The handshake that opens every connection (docs/PROTOCOL.md, section 2):
both peers prove that they know the shared secret (HMAC-SHA256 over fresh
nonces, compared in constant time) before anything else is exchanged, and
tell each other their server address and segment size; a client on the
same host may ask for the shared-memory transport, whose region the server
then passes right after (SHM_SETUP, with the descriptors attached, and the
server's buffer arena and ledger when it lends its buffers); a client that
lends its buffers passes its arena and ledger with its AUTH.  Every reply
after the challenge is bound to both nonces and to what it says by the
secret, and when either side asks for sealed frames, both derive one key per
direction from the secret and the nonces (HKDF-SHA256) for the frames that
follow (csrc/network/seal.h).  Over a Unix socket each side also says its
process id, and checks it against the kernel's word for who is at the other
end (``SO_PEERCRED``), so that a process holding the socket's name can
neither relay a handshake nor pass for a peer of another user.  Each side
also says its peer id (any string of up to 64 bytes, empty if it has none),
and a side that knows whom it expects at an address (the client: the
server it dials; the server: the client that says it is at an address)
refuses another, so that two peers with the same address (a port number
used on two hosts, behind one advertised address) are never taken for one
another."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Final, cast

from flinkbuf.errors import AuthenticationError, RemoteConnectionError

MAGIC: Final = 0x46425546
VERSION: Final = 5
HELLO, CHALLENGE, AUTH, AUTH_OK, DUPLICATE, SHM_SETUP, REFUSED = 16, 17, 18, 19, 20, 21, 22
STREAM, SHARED_MEMORY = 0, 1                # the transport field of AUTH and AUTH_OK
SHM_FDS: Final = 3                          # the region's memfd and the client's doorbells
SHM_LEND_FDS: Final = 5                     # ... and the server's buffer arena and ledger
LEND_FDS: Final = 2                         # a lender's arena and ledger (with AUTH: the client's)
MAX_FRAME: Final = 320
MAX_PEER_ID: Final = 64                     # bytes of UTF-8 in a peer id
NONCE: Final = 32
PROOF: Final = 32
SEALED: Final = 1                           # the flags of AUTH (asked for) and AUTH_OK (agreed)
LOCAL: Final = 2                            # the flags: sent over a Unix socket (with a pid)
_HEADER = struct.Struct(">IIB")
_UCRED = struct.Struct("3i")                # struct ucred: pid, uid, gid
Keys = tuple[bytes, bytes]                  # a sealed connection's (send, receive) keys


def _proof(secret: bytes, label: bytes, first: bytes, second: bytes,
           said: bytes = b"") -> bytes:
    return hmac.new(secret, label + first + second + said, hashlib.sha256).digest()


def session_keys(secret: bytes, client_nonce: bytes, server_nonce: bytes,
                 client: bool) -> Keys:
    """A sealed connection's keys, (send, receive) for the client's side
    (``client``) or the server's: one key per direction, fresh for every
    connection (both nonces are in the salt).  HKDF-SHA256 (RFC 5869): one
    extract, then a 32-byte expand per direction."""
    prk = hmac.new(client_nonce + server_nonce, secret, hashlib.sha256).digest()
    to_server, to_client = (hmac.new(prk, info + b"\x01", hashlib.sha256).digest()
                            for info in (b"flinkbuf 3 client to server",
                                         b"flinkbuf 3 server to client"))
    return (to_server, to_client) if client else (to_client, to_server)


def _frame(msg_id: int, body: bytes) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), MAGIC, msg_id) + body


def _send(sock: socket.socket, msg_id: int, body: bytes) -> None:
    sock.sendall(_frame(msg_id, body))


def _timed_out() -> Exception:
    return TimeoutError("the peer sent nothing more in time")


def _closed() -> Exception:
    return ConnectionError("the peer closed the connection")


def recv_exact(sock: socket.socket, n: int, deadline: float, *,
               timed_out: Callable[[], BaseException] = _timed_out,
               closed: Callable[[], BaseException] = _closed) -> bytes:
    """``n`` bytes from a blocking socket by ``deadline`` (time.monotonic()).
    Raises ``timed_out()`` when the deadline passes, ``closed()`` when the
    peer closes first (by default a TimeoutError and a ConnectionError)."""
    data = bytearray()
    while len(data) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timed_out()
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(data))
        except socket.timeout:
            raise timed_out() from None
        if not chunk:
            raise closed()
        data += chunk
    return bytes(data)


def _handshake_timed_out() -> AuthenticationError:
    return AuthenticationError("the peer did not complete the handshake in time")


def _handshake_closed() -> AuthenticationError:
    return AuthenticationError("the peer closed the connection during the handshake "
                               "(a wrong secret is refused this way)")


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    return recv_exact(sock, n, deadline, timed_out=_handshake_timed_out,
                      closed=_handshake_closed)


class DuplicateConnection(RemoteConnectionError):
    """The server keeps another connection to this process (one connection
    joins two processes): ``peer`` is the server's address, whose
    connection to this process's server is to be used instead."""

    def __init__(self, peer: str) -> None:
        super().__init__(f"the peer at {peer} keeps its own connection to this process")
        self.peer = peer


class Refused(RemoteConnectionError):
    """The server proved the secret and refused this connection (it has
    as many connections as it takes, or expects another peer at this
    side's address); the message says why."""


class PeerMismatch(AuthenticationError):
    """The server proved the secret but says it is another peer than the
    one expected at the address dialed (another process of the same
    secret holds that address)."""


def check_peer_id(peer_id: object, name: str = "peer_id") -> str:
    """``peer_id`` if it is a str of at most MAX_PEER_ID bytes of UTF-8."""
    if not isinstance(peer_id, str):
        raise TypeError(f"{name} must be a str, got {type(peer_id).__name__}")
    if len(peer_id.encode("utf-8")) > MAX_PEER_ID:
        raise ValueError(f"{name} {peer_id!r} is longer than {MAX_PEER_ID} bytes of UTF-8")
    return peer_id


def mismatch(address: str, said: str, expected: str) -> str:
    """Why a peer that says it is ``said`` is not the one expected at
    ``address``."""
    return (f"{address} is {said or 'a peer without an id'}, not {expected}: another peer "
            f"holds that address (is it advertised by two hosts?)")


def _recv(sock: socket.socket, expected: int, deadline: float,
          alternatives: tuple[int, ...] = ()) -> bytes:
    length, magic, msg_id = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if msg_id in alternatives and magic == MAGIC and _HEADER.size <= length <= MAX_FRAME:
        raise _Alternative(msg_id, _recv_exact(sock, length - _HEADER.size, deadline))
    if magic != MAGIC:
        raise AuthenticationError(f"the peer does not speak flinkbuf's protocol "
                                  f"(magic number 0x{magic:08x})")
    if msg_id != expected:
        raise AuthenticationError(f"message {msg_id} during the handshake, expected {expected}")
    if not _HEADER.size <= length <= MAX_FRAME:
        raise AuthenticationError(f"a handshake frame of {length} bytes")
    return _recv_exact(sock, length - _HEADER.size, deadline)


class _Alternative(Exception):
    """Another message _recv was told to accept came (its id and body)."""


def _address_field(address: str) -> bytes:
    raw = address.encode("utf-8")
    if len(raw) > 200:
        raise ValueError(f"address {address!r} is too long")
    return struct.pack(">H", len(raw)) + raw


def _reason_field(reason: str) -> bytes:
    raw = reason.encode("utf-8")[:200]
    return struct.pack(">H", len(raw)) + raw


def _parse_reason(body: bytes) -> str:
    if len(body) < 2 or struct.unpack_from(">H", body)[0] != len(body) - 2:
        raise AuthenticationError("a malformed refusal")
    return body[2:].decode("utf-8", "replace")


class Said:
    """What a side says of itself in AUTH, AUTH_OK and DUPLICATE: its
    server's address, its segment size, the transport (asked for or
    granted), its flags, with ``LOCAL`` its process id, and its peer id."""

    __slots__ = ("address", "segment_size", "transport", "flags", "pid", "peer_id")

    def __init__(self, address: str, segment_size: int, transport: int, flags: int,
                 pid: int, peer_id: str = "") -> None:
        self.address = address
        self.segment_size = segment_size
        self.transport = transport
        self.flags = flags
        self.pid = pid
        self.peer_id = peer_id

    def encode(self) -> bytes:
        raw = self.peer_id.encode("utf-8")
        if len(raw) > MAX_PEER_ID:
            raise ValueError(f"peer id {self.peer_id!r} is too long")
        return _address_field(self.address) + struct.pack(
            ">IBBIB", self.segment_size, self.transport, self.flags, self.pid, len(raw)) + raw

    @classmethod
    def decode(cls, body: bytes, what: str) -> Said:
        """AuthenticationError("a malformed <what>") unless ``body`` is one."""
        try:
            (n,) = struct.unpack_from(">H", body, 0)
            address = body[2:2 + n].decode("utf-8")
            segment_size, transport, flags, pid, m = struct.unpack_from(">IBBIB", body, 2 + n)
            peer_id = body[2 + n + 11:2 + n + 11 + m].decode("utf-8")
        except (struct.error, UnicodeDecodeError):
            raise AuthenticationError(f"a malformed {what}") from None
        if (len(body) != 2 + n + 11 + m or m > MAX_PEER_ID
                or transport not in (STREAM, SHARED_MEMORY)
                or flags & ~(SEALED | LOCAL) or (pid != 0) != bool(flags & LOCAL)):
            raise AuthenticationError(f"a malformed {what}")
        return cls(address, segment_size, transport, flags, pid, peer_id)


def _tail(address: str, segment_size: int, transport: int, flags: int = 0,
          local: bool = False, peer_id: str = "") -> bytes:
    """What a side says (:class:`Said`), encoded; ``local``: over a Unix
    socket (the LOCAL flag and this process's id)."""
    return Said(address, segment_size, transport, flags | (LOCAL if local else 0),
                os.getpid() if local else 0, peer_id).encode()


def unix_peer(sock: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end of a Unix socket, as the
    kernel recorded them when it connected (pid 0: in a pid namespace this
    process cannot see); None for any other socket."""
    if sock.family != getattr(socket, "AF_UNIX", None):
        return None
    pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                _UCRED.size))
    return pid, uid


def check_same_user(peer: tuple[int, int] | None, who: str) -> None:
    """AuthenticationError unless the process at the other end of a Unix
    socket (``peer``, from :func:`unix_peer`) runs as this process's user."""
    if peer is not None and peer[1] != os.getuid():
        raise AuthenticationError(
            f"the {who} at the other end of the Unix socket (pid {peer[0]}) runs as another "
            f"user (uid {peer[1]}, this process {os.getuid()}): refused")


def _check_local(said: Said, peer: tuple[int, int] | None, who: str) -> None:
    """AuthenticationError unless ``said`` came straight from the process at
    the other end of this socket: over a Unix socket (``peer``) it says that
    it was sent over one, with that process's id; over any other socket it
    says it was not.  A mismatch means that another process relayed it."""
    if peer is None:
        if said.flags & LOCAL:
            raise AuthenticationError(
                f"the {who} sent its handshake over a Unix socket, and it arrived over TCP: "
                "another process relayed it (one holding this host's socket name?)")
    elif not said.flags & LOCAL or said.pid != peer[0]:
        raise AuthenticationError(
            f"the {who} that proved the secret (pid {said.pid or 'unknown'}) is not the "
            f"process at the other end of the Unix socket (pid {peer[0]}): another process "
            "holds this host's socket name and relays")


def _proven(body: bytes, secret: bytes, label: bytes, first: bytes, second: bytes,
            refusal: str) -> bytes:
    """The rest of a message that starts with the proof of ``label`` over
    the nonces and that rest; AuthenticationError(refusal) if the proof is
    wrong."""
    if len(body) < PROOF or not hmac.compare_digest(
            body[:PROOF], _proof(secret, label, first, second, body[PROOF:])):
        raise AuthenticationError(refusal)
    return body[PROOF:]


def _reply_refused(what: str) -> str:
    return (f"the {what} does not prove that it comes from a holder of the shared secret "
            f"(altered on the way?)")


def close_fds(fds: list[int]) -> None:
    """Close descriptors, ignoring those closed already."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _recv_setup(sock: socket.socket, deadline: float) -> list[int]:
    """The SHM_SETUP frame and the descriptors that come with it."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _handshake_timed_out()
    sock.settimeout(remaining)
    try:
        data, fds, flags, _ = socket.recv_fds(sock, _HEADER.size, SHM_LEND_FDS,
                                              getattr(socket, "MSG_CMSG_CLOEXEC", 0))
    except socket.timeout:
        raise _handshake_timed_out() from None
    try:
        if not data:
            raise _handshake_closed()
        if len(data) < _HEADER.size:
            data += _recv_exact(sock, _HEADER.size - len(data), deadline)
        if (_HEADER.unpack(data) != (_HEADER.size, MAGIC, SHM_SETUP)
                or len(fds) not in (SHM_FDS, SHM_LEND_FDS)
                or flags & getattr(socket, "MSG_CTRUNC", 0)):
            raise RemoteConnectionError("the peer sent a malformed shared memory set-up")
    except BaseException:
        close_fds(list(fds))
        raise
    return list(fds)


def send_setup(sock: socket.socket, fds: list[int]) -> None:
    """Pass the shared-memory region's descriptors to the client (the
    server's step after AUTH_OK said SHARED_MEMORY): the memfd, the
    client's two doorbells and, if the server lends its buffers, the memfd
    of its buffer arena and the ledger of this connection's loans."""
    socket.send_fds(sock, [_frame(SHM_SETUP, b"")], fds)


def client(sock: socket.socket, secret: bytes, address: str, segment_size: int,
           timeout: float, *, shared_memory: bool = False,
           lend_fds: list[int] | None = None,
           seal: bool = False, peer_id: str = "",
           expect_peer: str | None = None) -> tuple[str, int, list[int] | None, Keys | None]:
    """Authenticate a connected socket as the client; returns the server's
    address and segment size, and, when ``shared_memory`` was asked for and
    the server agreed, the region's descriptors (memfd, data and room
    doorbells, and the server's buffer arena and ledger if it lends
    buffers: the caller's to close), else None.  ``lend_fds`` (with
    ``shared_memory``): this side's arena and ledger, passed with AUTH for
    the server to read the buffers this side lends (they stay the
    caller's).  ``seal``: ask for sealed frames; the last item is the
    connection's (send, receive) keys when either side asked for them, else
    None.  ``peer_id``: this side's, said in AUTH; ``expect_peer``: the
    peer id the server must say (None: any).  AuthenticationError if
    either side fails to prove the secret; PeerMismatch if the server says
    another peer id than ``expect_peer``; RemoteConnectionError if the
    segment sizes differ; DuplicateConnection if the server keeps another
    connection to this process.  Over a Unix socket, AuthenticationError
    too if the process at the other end runs as another user or is not the
    one that proves the secret (a relay)."""
    deadline = time.monotonic() + timeout
    local = unix_peer(sock)
    check_same_user(local, "server")
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
    tail = _tail(address, segment_size, SHARED_MEMORY if shared_memory else STREAM,
                 SEALED if seal else 0, local=local is not None, peer_id=peer_id)
    auth = _frame(AUTH, _proof(secret, b"flinkbuf-client", server_nonce, client_nonce, tail)
                  + tail)
    if shared_memory and lend_fds:
        socket.send_fds(sock, [auth], lend_fds)     # (a few hundred bytes: sent whole)
    else:
        sock.sendall(auth)
    try:
        reply = _recv(sock, AUTH_OK, deadline, alternatives=(DUPLICATE, REFUSED))
    except _Alternative as alt:
        msg_id, body = alt.args
        if msg_id == REFUSED:
            said = _proven(body, secret, b"flinkbuf-refused", client_nonce, server_nonce,
                           _reply_refused("refusal"))
            raise Refused(f"the server refused the connection: {_parse_reason(said)}") \
                from None
        said = _proven(body, secret, b"flinkbuf-duplicate", client_nonce, server_nonce,
                       _reply_refused("duplicate reply"))
        duplicate = Said.decode(said, "duplicate reply")
        _check_local(duplicate, local, "server")
        if expect_peer is not None and duplicate.peer_id != expect_peer:
            raise PeerMismatch(mismatch(duplicate.address, duplicate.peer_id, expect_peer)) \
                from None
        raise DuplicateConnection(duplicate.address) from None
    said = _proven(reply, secret, b"flinkbuf-accept", client_nonce, server_nonce,
                   _reply_refused("authentication reply"))
    accepted = Said.decode(said, "authentication reply")
    _check_local(accepted, local, "server")
    if expect_peer is not None and accepted.peer_id != expect_peer:
        raise PeerMismatch(mismatch(accepted.address, accepted.peer_id, expect_peer))
    peer, peer_segment_size = accepted.address, accepted.segment_size
    transport, flags = accepted.transport, accepted.flags
    if transport == SHARED_MEMORY and not shared_memory:
        raise AuthenticationError("the server chose shared memory, which was not asked for")
    if seal and not flags & SEALED:
        raise AuthenticationError("the server did not agree to seal the connection")
    if peer_segment_size != segment_size:
        raise RemoteConnectionError(
            f"the peer at {peer} uses segments of {peer_segment_size} bytes, this side "
            f"{segment_size}: both sides of a connection need the same segment size")
    fds = _recv_setup(sock, deadline) if transport == SHARED_MEMORY else None
    keys = (session_keys(secret, client_nonce, server_nonce, client=True)
            if flags & SEALED else None)
    return peer, peer_segment_size, fds, keys


class ServerHandshake:
    """The server's side of the handshake as a state machine fed with what
    the client sent, so that one thread can run the handshakes of many
    pending connections (a client that connects and sends nothing costs a
    socket, not a thread).  ``feed(data)`` returns the bytes to send back;
    once ``done``, ``peer`` is the client's (address, segment_size).  It
    raises AuthenticationError if the client does not prove the secret
    (nothing is sent back then), RemoteConnectionError if the segment sizes
    differ (after AUTH_OK, so that the client learns why).  ``keep(address)``
    (optional) decides, once the client proved the secret, whether this
    connection is wanted: if not, the reply is DUPLICATE instead of AUTH_OK
    and ``duplicate`` is set (the server then closes it).  When the client
    asks for shared memory and ``shared_memory`` is given, it is called for
    a region (its descriptors; OSError: the connection stays a stream):
    ``shared_fds`` holds them once AUTH_OK said so, for the server to pass
    on (:func:`send_setup`) and to close.  The connection is sealed when
    the client asks for it or ``seal`` is set: ``keys`` then holds the
    server's (send, receive) keys once done, else None.  ``admit()``
    (optional), once the client proved the secret, returns why this
    connection cannot be taken (then the reply is REFUSED, with that reason,
    and ``feed`` raises RemoteConnectionError after it), or None.  ``unix_peer``:
    the client's (pid, uid) when the connection is a Unix socket
    (:func:`unix_peer`), None for TCP; a client of another user, or one
    whose AUTH another process relayed, is refused.  ``peer_id``: this
    side's, said in AUTH_OK and DUPLICATE; ``peer_id`` of the handshake,
    once done, is the client's.  ``expect_peer(address)`` (optional): the
    peer id expected of a client at ``address`` (None: any); a client that
    says another is refused (REFUSED, with the reason)."""

    def __init__(self, secret: bytes, address: str, segment_size: int,
                 keep: Callable[[str], bool] | None = None,
                 shared_memory: Callable[[], list[int]] | None = None,
                 seal: bool = False, unix_peer: tuple[int, int] | None = None,
                 admit: Callable[[], str | None] | None = None, peer_id: str = "",
                 expect_peer: Callable[[str], str | None] | None = None) -> None:
        self._secret = secret
        self._own_id = peer_id
        self._expect_peer = expect_peer
        self.peer_id = ""
        self._admit = admit
        self._unix_peer = unix_peer
        self._seal = seal
        self.keys: Keys | None = None
        self._keep = keep
        self._shared_memory = shared_memory
        self.shared_fds: list[int] | None = None
        self.duplicate = False
        self._address = address
        self._segment_size = segment_size
        self._buf = bytearray()
        self._expect = HELLO
        self._client_nonce: bytes | None = None
        self._server_nonce: bytes | None = None
        self.done = False
        self.peer: tuple[str, int] | None = None
        # AUTH_OK or REFUSED, sent before a size mismatch or a refusal ends it.
        self.reply_before_refusal = b""
        self.refused: str | None = None

    def feed(self, data: bytes) -> bytes:
        if self.done:
            raise AuthenticationError("the client sent more before the handshake ended")
        self._buf += data
        out = bytearray()
        while not self.done and len(self._buf) >= _HEADER.size:
            length, magic, msg_id = _HEADER.unpack_from(self._buf)
            if magic != MAGIC:
                raise AuthenticationError(f"the peer does not speak flinkbuf's protocol "
                                          f"(magic number 0x{magic:08x})")
            if msg_id != self._expect:
                raise AuthenticationError(f"message {msg_id} during the handshake, "
                                          f"expected {self._expect}")
            if not _HEADER.size <= length <= MAX_FRAME:
                raise AuthenticationError(f"a handshake frame of {length} bytes")
            if len(self._buf) < length:
                break
            body = bytes(self._buf[_HEADER.size:length])
            del self._buf[:length]
            out += self._step(body)
        if self.done and self._buf:
            self.discard()
            raise AuthenticationError("the client sent more before the handshake ended")
        if self.refused is not None:
            self.reply_before_refusal = bytes(out)
            raise RemoteConnectionError(self.refused)
        if self.done and self.peer[1] != self._segment_size:
            self.reply_before_refusal = bytes(out)
            raise RemoteConnectionError(
                f"the client at {self.peer[0]} uses segments of {self.peer[1]} bytes, this "
                f"side {self._segment_size}")
        return bytes(out)

    def discard(self) -> None:
        """Close the shared-memory region's descriptors, if any (a
        connection that will not be used)."""
        if self.shared_fds is not None:
            close_fds(self.shared_fds)
            self.shared_fds = None

    def _step(self, body: bytes) -> bytes:
        if self._expect == HELLO:
            check_same_user(self._unix_peer, "client")
            if len(body) != 2 + NONCE:
                raise AuthenticationError("a malformed hello")
            (version,) = struct.unpack_from(">H", body)
            if version != VERSION:
                raise AuthenticationError(f"the client speaks protocol version {version}, "
                                          f"this side {VERSION}")
            self._client_nonce = body[2:]
            self._server_nonce = os.urandom(NONCE)
            self._expect = AUTH
            return _frame(CHALLENGE, struct.pack(">H", VERSION) + self._server_nonce
                          + _proof(self._secret, b"flinkbuf-server", self._client_nonce,
                                   self._server_nonce))
        client_nonce, server_nonce = cast(bytes, self._client_nonce), cast(bytes,
                                                                          self._server_nonce)
        said = _proven(body, self._secret, b"flinkbuf-client", server_nonce, client_nonce,
                       "the client did not prove that it knows the shared secret")
        claim = Said.decode(said, "authentication")
        _check_local(claim, self._unix_peer, "client")
        address, segment_size, transport, flags = (claim.address, claim.segment_size,
                                                   claim.transport, claim.flags)
        self.peer = (address, segment_size)
        self.peer_id = claim.peer_id
        self.done = True
        expected = self._expect_peer(address) if self._expect_peer is not None else None
        reason = (mismatch(address, claim.peer_id, expected)
                  if expected is not None and expected != claim.peer_id else None)
        if reason is None and self._admit is not None:
            reason = self._admit()
        if reason is not None:
            self.refused = reason
            return self._reply(REFUSED, b"flinkbuf-refused", _reason_field(reason))
        if (segment_size == self._segment_size and self._keep is not None
                and not self._keep(address)):
            self.duplicate = True
            return self._reply(DUPLICATE, b"flinkbuf-duplicate",
                               _tail(self._address, self._segment_size, STREAM,
                                     local=self._unix_peer is not None, peer_id=self._own_id))
        if (transport == SHARED_MEMORY and segment_size == self._segment_size
                and self._shared_memory is not None):
            try:
                self.shared_fds = self._shared_memory()
            except OSError:
                self.shared_fds = None       # out of memory or descriptors: a stream it is
        sealed = self._seal or bool(flags & SEALED)
        if sealed:
            self.keys = session_keys(self._secret, client_nonce, server_nonce, client=False)
        return self._reply(AUTH_OK, b"flinkbuf-accept",
                           _tail(self._address, self._segment_size,
                                 STREAM if self.shared_fds is None else SHARED_MEMORY,
                                 SEALED if sealed else 0, local=self._unix_peer is not None,
                                 peer_id=self._own_id))

    def _reply(self, msg_id: int, label: bytes, said: bytes) -> bytes:
        return _frame(msg_id, _proof(self._secret, label, cast(bytes, self._client_nonce),
                                     cast(bytes, self._server_nonce), said) + said)


def server(sock: socket.socket, secret: bytes, address: str, segment_size: int,
           timeout: float) -> tuple[str, int]:
    """Authenticate an accepted socket as the server, blocking; returns the
    client's (address, segment_size).  For a peer that then speaks its own
    protocol over the socket: a client that asks for sealed frames is
    refused.  See :class:`ServerHandshake`."""
    deadline = time.monotonic() + timeout
    hs = ServerHandshake(secret, address, segment_size, unix_peer=unix_peer(sock))
    while not hs.done:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AuthenticationError("the peer did not complete the handshake in time")
        sock.settimeout(remaining)
        try:
            data = sock.recv(MAX_FRAME)
        except socket.timeout:
            raise AuthenticationError("the peer did not complete the handshake in time") \
                from None
        if not data:
            raise AuthenticationError("the peer closed the connection during the handshake")
        try:
            reply = hs.feed(data)
        except AuthenticationError:
            raise
        except RemoteConnectionError:
            sock.sendall(hs.reply_before_refusal)
            raise
        if hs.keys is not None:
            raise AuthenticationError("the client asked for sealed frames, which this server "
                                      "does not speak")
        sock.sendall(reply)
    return cast("tuple[str, int]", hs.peer)
