# Connection: one authenticated socket to another process, run by the C
# reader and writer threads of csrc/network/.  Included by _network.pyx.

cdef int _copy_utf8(str text, char *buf, size_t cap) noexcept:
    """``text`` as UTF-8 into ``buf`` (NUL-terminated, cut to fit)."""
    cdef bytes raw
    cdef size_t n
    if cap == 0:
        return 0
    try:
        raw = text.encode("utf-8", "replace")
    except BaseException:
        raw = b"?"
    n = <size_t>len(raw)
    if n >= cap:
        n = cap - 1
    memcpy(buf, <const char *>raw, n)
    buf[n] = 0
    return 0


cdef int _find_subpartition(void *ctx, const char *partition_id, size_t n,
                            uint32_t subpartition, fb_subpart_t **sp, void **owner,
                            fb_localpool_t **pool, char *err, size_t errlen) noexcept with gil:
    """A PARTITION_REQUEST arrived: the registered partition's subpartition
    (its owner reference taken), or an error code and message."""
    cdef Connection conn = <Connection>ctx
    cdef ResultPartition part
    try:
        try:
            pid = partition_id[:n].decode("utf-8")
        except UnicodeDecodeError:          # a peer's bytes: an answer, not a traceback
            _copy_utf8("a partition id is UTF-8, and this one is not", err, errlen)
            return FB_NET_ERR_NOT_FOUND
        found = conn._lookup(pid)
        if found is None:
            _copy_utf8(f"no partition {pid!r} is registered at {conn._local}", err, errlen)
            return FB_NET_ERR_NOT_FOUND
        part = <ResultPartition>found
        if subpartition >= <uint32_t>part._n:
            _copy_utf8(f"partition {pid!r} has {part._n} subpartitions: there is no "
                       f"subpartition {<object>subpartition}", err, errlen)
            return FB_NET_ERR_REFUSED
        Py_INCREF(part)
        part._reader_attached()         # until _release_owner
        owner[0] = <void *>part
        sp[0] = &(<ResultSubpartition>part._subpartitions[subpartition])._c
        pool[0] = &part._pool._c if part._pool is not None else NULL
        return 0
    except BaseException as exc:
        write_unraisable(conn)
        _copy_utf8(f"the server could not look the partition up: {exc!r}", err, errlen)
        return FB_NET_ERR_REFUSED


cdef void _describe_failure(void *ctx, void *owner, char *tname, size_t tlen,
                            char *message, size_t mlen) noexcept with gil:
    cdef ResultPartition part = <ResultPartition>owner
    try:
        cause = part._cause
        if cause is None:
            _copy_utf8("", tname, tlen)
            _copy_utf8("the producer failed", message, mlen)
        else:
            _copy_utf8(type(cause).__name__, tname, tlen)
            _copy_utf8(str(cause), message, mlen)
    except BaseException:
        write_unraisable(part)


cdef void _release_owner(void *ctx, void *owner) noexcept with gil:
    """The connection is done with a partition _find_subpartition gave it
    (the subpartition's reader ended, or the request was not served) and no
    buffer of it is lent to the peer any more: its reader in another
    process is done."""
    cdef ResultPartition part = <ResultPartition>owner
    try:
        part._reader_detached()
    except BaseException:
        write_unraisable(part)
    Py_DECREF(part)


def _memfd_of(NetworkBufferPool pool not None):
    """The memfd of a shared pool's arena (to pass to a peer), or -1."""
    return fb_netpool_memfd(&pool._c)


def _new_ledger(NetworkBufferPool pool not None):
    """A new ledger (a sealed memfd, the caller's to close) for lending
    buffers of ``pool``'s arena over one connection."""
    cdef int fd = fb_ledger_new(pool._c.num_segments)
    if fd < 0:
        import os
        raise OSError(errno, f"cannot make a ledger: {os.strerror(errno)}")
    return fd


def _shm_region(int32_t segment_size):
    """A fresh region for the shared-memory transport, sized for
    ``segment_size``: its descriptors (memfd, the server's data and room
    doorbells, the client's), each the caller's to close."""
    cdef int fds[5]
    cdef int rc = fb_shm_region_new(fb_shm_ring_size(segment_size), fds)
    if rc != 0:
        import os
        raise OSError(rc, f"cannot make a shared memory region: {os.strerror(rc)}")
    return [fds[i] for i in range(FB_SHM_NFDS)]


cdef str _transport_of(int fd):
    """The transport of a connected socket: ``"unix"`` or ``"tcp"``."""
    import socket
    sock = socket.socket(fileno=fd)         # reads the family; detached at once
    try:
        return "unix" if sock.family == socket.AF_UNIX else "tcp"
    finally:
        sock.detach()


@cython.final
@cython.no_gc_clear
cdef class Connection:
    """One connection to another process, carrying every channel between
    the two (in both directions).  Made by the network environment once the
    peer is authenticated; the socket is the connection's from then on."""

    def __cinit__(self, token=None):
        self._c = NULL
        self._shm = NULL
        _refuse_bare(token, "connections")

    def __init__(self, token=None):
        raise TypeError("connections are made by NetworkEnvironment")

    @staticmethod
    def _open(int fd, int32_t segment_size, lookup, str local, str peer, double io_timeout,
              bint caller_sends=True, bint direct_reads=True, shared=None, keys=None,
              bint start=True):
        """A connection over ``fd`` (connected, authenticated, owned from
        here on), running unless ``start`` is False (then :meth:`_start`
        runs it).  ``lookup(partition_id)`` finds a registered
        partition or returns None; ``caller_sends`` and ``direct_reads``
        are the environment's (see NetworkEnvironment).  ``shared`` is
        ``(memfd, data_fd, room_fd, side, peer_arena, peer_ledger,
        lend_pool, pidfd, ledger)`` for the shared-memory transport over
        the Unix socket ``fd``: the doorbells and ``pidfd`` (-1: none) are
        owned from here on, the memfds stay the caller's.  Buffers the peer
        lends are read from ``peer_arena`` (its buffer arena's memfd, -1:
        it lends none), its loans kept in ``peer_ledger``; this side lends
        buffers of ``lend_pool`` (a shared NetworkBufferPool, or None) to
        the peer process ``pidfd``, its loans kept in ``ledger``
        (:func:`_new_ledger`, -1: none).  ``keys``: ``(send, receive)``, 32
        bytes each, to seal every frame with (AES-256-GCM; None: plain).
        RemoteConnectionError if the region, the arena or a ledger is not
        as it should be."""
        cdef Connection conn = Connection.__new__(Connection, _MADE_HERE)
        cdef fb_conn_callbacks_t cb
        cdef fb_transport_t *t
        cdef char err[256]
        cdef int memfd, data_fd, room_fd, side, peer_arena = -1, pidfd = -1, ledger = -1
        cdef int peer_ledger = -1
        cdef NetworkBufferPool lend_pool = None
        cdef const unsigned char *tx_key = NULL
        cdef const unsigned char *rx_key = NULL
        if keys is not None:
            tx, rx = keys
            if (not isinstance(tx, bytes) or not isinstance(rx, bytes)
                    or len(tx) != FB_SEAL_KEY or len(rx) != FB_SEAL_KEY):
                raise ValueError(f"keys are two byte strings of {FB_SEAL_KEY} bytes")
            tx_key, rx_key = tx, rx
        cb.ctx = <void *>conn           # borrowed: the threads end before conn does
        cb.find_subpartition = _find_subpartition
        cb.describe_failure = _describe_failure
        cb.release_owner = _release_owner
        conn._lookup = lookup
        conn._local = local
        conn._peer = peer
        if shared is None:
            conn._transport = _transport_of(fd)
            t = fb_transport_socket(fd)
        else:
            if len(shared) == 4:                 # no lending either way
                shared = (*shared, -1, -1, None, -1, -1)
            (memfd, data_fd, room_fd, side, peer_arena, peer_ledger, lend_pool, pidfd,
             ledger) = shared
            conn._transport = "shm"
            err[0] = 0
            t = fb_transport_shm(fd, memfd, data_fd, room_fd, side, err, sizeof(err))
            conn._shm = t           # lives as long as conn._c (its transport)
            if t == NULL:
                import os
                for owned in (fd, data_fd, room_fd, pidfd):
                    if owned >= 0:
                        os.close(owned)
                raise RemoteConnectionError(
                    f"cannot share memory with {peer}: {err.decode('utf-8', 'replace')}")
        if t == NULL:
            import os
            os.close(fd)
            raise MemoryError("cannot allocate a connection")
        if tx_key != NULL:
            t = fb_transport_sealed(t, tx_key, rx_key)       # owns t, even if it fails
            if t == NULL:
                if pidfd >= 0:
                    import os
                    os.close(pidfd)
                raise MemoryError("cannot allocate a sealed connection")
            conn._sealed = True
        conn._c = fb_conn_new(t, segment_size, &cb, io_timeout)   # owns t, even if it fails
        if conn._c == NULL:
            if pidfd >= 0:
                import os
                os.close(pidfd)
            raise MemoryError("cannot allocate a connection")
        if lend_pool is not None and pidfd >= 0 and ledger >= 0:
            # (what is lent keeps its partition, so its pool and arena, alive)
            if fb_conn_lend(conn._c, &lend_pool._c, pidfd, ledger) != 0:    # takes pidfd
                import os
                os.close(pidfd)
        elif pidfd >= 0:
            import os
            os.close(pidfd)
        if peer_arena >= 0 and fb_conn_borrow(conn._c, peer_arena, peer_ledger, err,
                                              sizeof(err)) != 0:
            raise RemoteConnectionError(
                f"cannot read the buffers {peer} lends: {err.decode('utf-8', 'replace')}")
        fb_conn_set_caller_sends(conn._c, caller_sends)
        fb_conn_set_direct_reads(conn._c, direct_reads)
        if start:
            conn._start()
        return conn

    def _start(self):
        """Run a connection :meth:`_open` made with ``start=False``: its
        threads read and write from here on.  Once, before anything else
        uses it; MemoryError (and the connection is failed) if the threads
        cannot start."""
        cdef int rc
        self._check()
        rc = fb_conn_start(self._c)
        if rc == FB_ESTATE:
            raise RuntimeError("the connection was started or closed before")
        if rc != FB_OK:
            raise MemoryError("cannot start the connection's threads")

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                fb_conn_close(self._c)
            fb_conn_decref(self._c)
            self._c = NULL

    cdef int _check(self) except -1:
        if self._c == NULL:
            raise RuntimeError("the connection is not initialised")
        return 0

    def close(self):
        """Send a CLOSE_REQUEST, end both threads and fail what is still
        open on the connection.  Idempotent."""
        cdef object keep = self
        if self._c != NULL:
            with nogil:
                fb_conn_close(self._c)

    @property
    def is_open(self):
        return self._c != NULL and bool(fb_conn_is_open(self._c))

    @property
    def peer(self):
        """The address of the peer's own server."""
        return self._peer

    @property
    def transport(self):
        """``"shm"`` (shared memory with a process on this host), ``"unix"``
        (a Unix socket: the peer is on this host) or
        ``"tcp"``."""
        return self._transport

    cdef object _error(self):
        """The error the connection ended with, or None while it is open."""
        cdef char msg[FB_NET_MAX_MESSAGE]
        if self._c == NULL:
            return RemoteConnectionError("the connection is not initialised")
        cdef int code = fb_conn_error(self._c, msg, sizeof(msg))
        if code == 0:
            return None
        return RemoteConnectionError(f"connection to {self._peer}: {msg.decode('utf-8', 'replace')}")

    @property
    def error(self):
        """Why the connection ended (a RemoteConnectionError), or None."""
        return self._error()

    def stats(self):
        """Bytes, frames and buffers in and out so far; ``frames_in_direct``:
        of ``frames_in``, those a consumer's thread waiting on its gate read
        from the socket itself; ``buffers_lent`` / ``buffers_borrowed``:
        over shared memory, this side's buffers the peer reads in place now,
        and the peer's this side does; ``sealed``: every frame is sealed
        (authenticated and encrypted)."""
        self._check()
        cdef fb_conn_stats_t st
        fb_conn_stats(self._c, &st)
        return {"transport": self._transport, "sealed": self._sealed,
                "bytes_in": st.bytes_in, "bytes_out": st.bytes_out,
                "frames_in": st.frames_in, "frames_out": st.frames_out,
                "buffers_in": st.buffers_in, "buffers_out": st.buffers_out,
                "frames_in_direct": st.frames_in_direct,
                "buffers_lent": fb_conn_lent(self._c),
                "buffers_borrowed": fb_conn_borrowed(self._c)}

    cdef dict _shm_waits(self):
        """The wait counters of the shared-memory transport (csrc/network/shm.h's
        fb_shm_stats_t), or None on another transport."""
        cdef fb_shm_stats_t st
        if self._c == NULL or self._shm == NULL:
            return None
        fb_shm_stats(self._shm, &st)
        return {"waits": st.waits, "looks": st.looks, "looks_paid": st.looks_paid,
                "sleeps": st.sleeps}

    @property
    def num_channels(self):
        self._check()
        return fb_conn_num_channels(self._c)

    def __repr__(self):
        state = "open" if self.is_open else "closed"
        return f"<flinkbuf.network.Connection peer={self._peer!r} {state}>"
