# RemoteInputChannel and a gate's floating buffers.  Included by _network.pyx.

@cython.final
@cython.no_gc_clear
cdef class FloatingBuffers:
    """The floating buffers of one input gate (Flink's): a local pool whose
    segments its remote channels borrow when their senders' backlog grows,
    and which they give back when the consumer recycles them."""

    def __cinit__(self, token=None):
        self._f = NULL
        _refuse_bare(token, "floating buffers")

    def __init__(self, token=None):
        raise TypeError("floating buffers are made by NetworkEnvironment")

    @staticmethod
    cdef FloatingBuffers _make(LocalBufferPool pool):
        cdef FloatingBuffers fl = FloatingBuffers.__new__(FloatingBuffers, _MADE_HERE)
        fl._pool = pool
        fl._f = fb_floating_new(&pool._c)
        if fl._f == NULL:
            raise MemoryError()
        return fl

    def __dealloc__(self):
        # Every channel that borrows from us holds us: they are closed now.
        if self._f != NULL:
            with nogil:
                fb_floating_detach(self._f)
            fb_floating_decref(self._f)
            self._f = NULL
        if self._pool is not None:
            self._pool.destroy()

    @property
    def pool(self):
        return self._pool


def make_floating_buffers(LocalBufferPool pool not None):
    """The floating buffers of a gate over ``pool`` (made for them)."""
    return FloatingBuffers._make(pool)


cdef object _remote_failure(int code, str tname, str message):
    """The exception a failed remote channel's consumer sees (see
    RemoteInputChannel._channel_error / _failure)."""
    if code == FB_NET_ERR_PRODUCER_FAILED:
        return RemoteError(tname, message)
    if code == FB_NET_ERR_NOT_FOUND:
        return PartitionNotFoundError(message)
    if code == FB_NET_ERR_RELEASED:
        return PartitionReleasedError(message)
    return RemoteConnectionError(message)


@cython.final
@cython.no_gc_clear
cdef class RemoteInputChannel(InputChannel):
    """Reads one subpartition of a partition in another process over a
    connection, with Flink's credit-based flow control: the channel's
    exclusive buffers plus buffers borrowed from its gate's floating ones
    are the sender's credit; a buffer the consumer recycles becomes credit
    again.  Made by :meth:`NetworkEnvironment.create_input_gate`."""

    def __cinit__(self, token=None):
        self._c = NULL
        _refuse_bare(token, "remote input channels")

    def __init__(self, token=None):
        raise TypeError("remote input channels are made by "
                        "NetworkEnvironment.create_input_gate()")

    @staticmethod
    def _open(Connection conn not None, str partition_id, uint32_t subpartition,
              LocalBufferPool exclusive not None, FloatingBuffers floating,
              double buffer_timeout, double request_timeout):
        """A channel over ``conn`` that receives into ``exclusive`` (a pool
        of its own, all of whose buffers it takes now, waiting up to
        ``buffer_timeout``) and borrows from ``floating`` (or None); its
        partition request is retried while the partition is not registered,
        for up to ``request_timeout`` seconds."""
        conn._check()
        cdef bytes pid = partition_id.encode("utf-8")
        if len(pid) > FB_NET_MAX_PARTITION_ID:
            raise ValueError(f"a partition id is at most {FB_NET_MAX_PARTITION_ID} bytes of "
                             f"UTF-8, got {len(pid)}")
        cdef RemoteInputChannel ch = RemoteInputChannel.__new__(RemoteInputChannel, _MADE_HERE)
        ch._conn = conn
        ch._exclusive = exclusive
        ch._floating = floating
        ch._partition_id = partition_id
        ch._subpartition = subpartition
        ch._c = fb_inchan_new(conn._c, <const char *>pid, len(pid), subpartition,
                              &exclusive._c, floating._f if floating is not None else NULL,
                              fb_deadline_after(request_timeout))
        if ch._c == NULL:
            raise MemoryError()
        cdef int32_t k, n = exclusive._c.min_buffers
        cdef Buffer buf
        cdef int32_t index
        for k in range(n):
            buf = exclusive._request_blocking(FB_NO_CHANNEL, buffer_timeout)
            index = buf._index
            buf._detach()                 # the channel holds the segment now
            if fb_inchan_add_exclusive(ch._c, index) != FB_OK:
                exclusive._c.ops.recycle(&exclusive._c, index)
                raise RuntimeError("internal error: an exclusive buffer was refused")
        cdef int rc = fb_inchan_open(ch._c)
        if rc == FB_ECLOSED:
            raise conn._error() or RemoteConnectionError(f"the connection to {conn._peer} "
                                                         "is closed")
        if rc == FB_EINVAL:
            raise RemoteConnectionError(f"the connection to {conn._peer} carries "
                                        f"{FB_NET_MAX_CHANNELS} channels already")
        if rc != FB_OK:
            raise MemoryError()
        return ch

    def __dealloc__(self):
        if self._c != NULL:
            with nogil:
                fb_inchan_close(self._c)
            fb_inchan_decref(self._c)
            self._c = NULL
        if self._exclusive is not None:
            self._exclusive.destroy()

    def _close(self):
        """Give everything back now (a gate that could not be made)."""
        cdef object keep = self
        if self._c != NULL:
            with nogil:
                fb_inchan_close(self._c)

    # ---- the InputChannel contract (input_gate.pxd) ------------------------------------

    cdef int _connect(self, InputGate gate, int32_t index) except -1:
        if self._c == NULL:
            raise ValueError("channel is not initialised")
        if self._index >= 0:
            raise ValueError("the channel already belongs to an input gate")
        if fb_subpart_connect(fb_inchan_queue(self._c), &gate._c, index) != FB_OK:
            raise ValueError("the remote channel was released (its gate closed)")
        fb_inchan_attach_reader(self._c, &gate._c)   # a gate takes its first channel's
        self._index = index
        return 0

    cdef int _poll(self, fb_item_t *out) except -1:
        cdef int rc = fb_subpart_poll(fb_inchan_queue(self._c), out)
        if rc == FB_OK and out.kind == FB_ITEM_EVENT:
            fb_inchan_event_taken(self._c)      # the sender may send one more event
        elif rc == FB_OK:
            fb_inchan_buffer_taken(self._c)     # debloated: room for one more credit
        return rc

    cdef int _reader_dry(self) except -1:
        if self._c != NULL:
            fb_inchan_reader_dry(self._c)       # debloated: credit held back goes out
        return 0

    cdef object _take(self, fb_item_t *item):
        cdef LocalBufferPool pool = None
        if fb_lease_is(item.pool):           # lent by the producer: read in place
            return lent_buffer(item.pool, item.index, item.size)
        if item.pool == &self._exclusive._c:
            pool = self._exclusive
        elif self._floating is not None and item.pool == &self._floating._pool._c:
            pool = self._floating._pool
        return item_object(item, pool)

    cdef int _release(self, InputGate gate) except -1:
        cdef object keep = self
        fb_inchan_detach_reader(self._c, &gate._c)
        fb_subpart_disconnect(fb_inchan_queue(self._c), &gate._c)
        with nogil:
            fb_inchan_close(self._c)
        return 0

    cdef int _disconnect(self, InputGate gate) except -1:
        fb_inchan_detach_reader(self._c, &gate._c)
        fb_subpart_disconnect(fb_inchan_queue(self._c), &gate._c)
        self._index = -1
        return 0

    cdef int _discard(self) except -1:
        self._close()
        return 0

    cdef tuple _error_info(self):
        cdef char tname[128]
        cdef char msg[FB_NET_MAX_MESSAGE]
        cdef int code = fb_inchan_error(self._c, tname, sizeof(tname), msg, sizeof(msg))
        return (code, tname.decode("utf-8", "replace"), msg.decode("utf-8", "replace"))

    cdef object _failure(self):
        code, tname, message = self._error_info()
        return _remote_failure(code, tname, message)

    cdef object _channel_error(self):
        code, tname, message = self._error_info()
        if code == FB_NET_ERR_PRODUCER_FAILED:
            return None                   # the gate raises ProducerFailedError from it
        err = _remote_failure(code, tname, message)
        if isinstance(err, RemoteConnectionError) or isinstance(err, PartitionNotFoundError):
            err.args = (f"input channel {self._index} (partition {self._partition_id!r}, "
                        f"subpartition {self._subpartition} at {self._conn._peer}): "
                        f"{message}",)
        return err

    cdef int32_t _backlog(self) except -1:
        cdef fb_inchan_stats_t st
        fb_inchan_stats(self._c, &st)
        return st.backlog

    cdef object _source_pool(self):
        return None

    cdef int _announce_buffer_size(self, int32_t size, int32_t count) except -1:
        """``size`` is sent to the producer as NEW_BUFFER_SIZE (the latest
        size, at most one a millisecond; before the request is served, right
        after it).  Of ``count`` buffers the producer keeps one (the one it
        fills: see ResultPartition._follow_debloat) and the channel the
        rest, at least one."""
        with nogil:
            fb_inchan_announce_buffer_size(self._c, size)
            fb_inchan_set_buffer_limit(self._c, max(1, count - 1) if count > 0 else 0)
        return 0

    cdef int32_t _buffers_in_use(self) except -1:
        """The buffers that arrived and wait in the channel's queue, those
        the channel holds for its sender (the credit it may fill), the
        sender's backlog as it last said, and one for the two in part
        ahead of a record (the one its producer fills and the one the
        consumer reads), as a local channel counts them; 0 when there are
        none of the others."""
        cdef fb_inchan_stats_t st
        fb_inchan_stats(self._c, &st)
        cdef int32_t n = (st.exclusive_available + st.floating_available + st.queued
                          + max(0, st.backlog))
        return n + 1 if n > 0 else 0          # (none at all: closed, or nothing to come)

    cdef int32_t _segment_size(self) except -1:
        return self._exclusive._c.net.segment_size

    cdef object _own_buffer_counters(self):
        """The exclusive buffers (in use: not held for the sender), what
        arrived, and the gate's floating buffers: TaskMetrics' input buffer
        metrics."""
        cdef fb_inchan_stats_t st
        fb_inchan_stats(self._c, &st)
        return (st.exclusive_total - st.exclusive_available, st.exclusive_total,
                st.bytes_in, st.buffers_in,
                self._floating._pool if self._floating is not None else None)

    # ---- introspection -----------------------------------------------------------------

    @property
    def partition_id(self):
        return self._partition_id

    @property
    def subpartition(self):
        return self._subpartition

    @property
    def peer(self):
        """The address of the producer's process."""
        return self._conn._peer

    @property
    def floating_buffers(self):
        """The gate's floating buffers this channel borrows from, or None."""
        return self._floating

    @property
    def receiver_id(self):
        return fb_inchan_receiver_id(self._c)

    def stats(self):
        """Buffers held for the sender (exclusive and floating), exclusive
        buffers in all, the sender's last backlog, data buffers that arrived
        and wait to be read (queued), and what arrived."""
        cdef fb_inchan_stats_t st
        fb_inchan_stats(self._c, &st)
        return {"exclusive_available": st.exclusive_available,
                "floating_available": st.floating_available,
                "exclusive_total": st.exclusive_total, "backlog": st.backlog,
                "queued": st.queued, "buffers_in": st.buffers_in, "bytes_in": st.bytes_in}

    def __repr__(self):
        return (f"<flinkbuf.network.RemoteInputChannel partition={self._partition_id!r} "
                f"subpartition={self._subpartition} peer={self._conn._peer!r}>")
