# ResultPartition and its subpartitions.  Included by _io.pyx.

cdef enum:
    _P_LIVE = 0
    _P_FINISHED = 1
    _P_FAILED = 2
    _P_RELEASED = 3


@cython.final
@cython.no_gc_clear
cdef class _ConsumeSignal:
    """What a producer sleeps on while every subpartition it may write to is
    blocked: posted whenever a consumer takes an item."""

    def __cinit__(self):
        self._initialized = False
        if fb_signal_init(&self._c) != FB_OK:
            raise MemoryError()
        self._initialized = True

    def __dealloc__(self):
        if self._initialized:
            fb_signal_free(&self._c)
            self._initialized = False


@cython.final
@cython.no_gc_clear
cdef class ResultSubpartition:
    """One subpartition of a :class:`ResultPartition`: a FIFO of finished
    buffers and events for one consumer, with its backlog (data buffers
    queued and not yet taken).  Made by the partition."""

    def __cinit__(self):
        self._initialized = False
        self._index = -1

    def __init__(self):
        raise TypeError("subpartitions are made by ResultPartition")

    def __dealloc__(self):
        if not self._initialized:
            return
        try:
            self._terminate(FB_SP_RELEASED)     # _pool is still referenced here
        except BaseException:
            write_unraisable(self)
        fb_subpart_free(&self._c)
        self._initialized = False

    cdef int _add_buffer(self, Buffer buf, int32_t kind, bint last) except -1:
        """Hand ``buf`` (of the partition's pool, its sole reference) to the
        queue as an item; the C result code.  The buffer is gone either way:
        queued, or recycled when the queue refuses it."""
        cdef fb_item_t item
        item.pool = buf._lp
        item.index = buf._index
        item.data = buf._data
        item.size = <int32_t>buf._writer
        item.kind = kind
        buf._detach()
        cdef int rc = fb_subpart_add(&self._c, item, last)
        if rc != FB_OK:
            fb_item_dispose(&item)
            self._pool._recycled_in_c()
        return rc

    cdef int _add_bytes(self, bytes payload, bint last) except -1:
        """Queue a copy of an event's bytes; the C result code."""
        cdef fb_item_t item
        cdef Py_ssize_t n = len(payload)
        item.data = <char *>malloc(n if n else 1)
        if item.data == NULL:
            raise MemoryError()
        memcpy(item.data, <const char *>payload, n)
        item.pool = NULL
        item.index = -1
        item.kind = FB_ITEM_EVENT
        item.size = <int32_t>n
        cdef int rc = fb_subpart_add(&self._c, item, last)
        if rc != FB_OK:
            fb_item_dispose(&item)
        return rc

    cdef int32_t _terminate(self, int32_t state) except -1:
        """Release or fail: everything queued goes back to its pool now; the
        number of items dropped.  (Never allocates and never fails in C, so
        __dealloc__ can always give everything back.)"""
        cdef fb_item_t *items = NULL
        cdef int32_t n = fb_subpart_terminate(&self._c, state, &items)
        if n > 0:
            fb_items_dispose(items, n)
            if self._pool is not None:
                self._pool._recycled_in_c()
        return n

    @property
    def index(self):
        return self._index

    @property
    def backlog(self):
        """Finished data buffers queued for the consumer."""
        return fb_subpart_backlog(&self._c)

    @property
    def buffer_size(self):
        """The buffer size its consumer announced (buffer debloating): the
        writer finishes this subpartition's buffers at that many bytes;
        None until a consumer announces one (whole segments)."""
        cdef int32_t size = fb_subpart_buffer_size(&self._c)
        return None if size == 0 else abs(size)

    @property
    def num_queued(self):
        """Buffers and events queued."""
        return fb_subpart_size(&self._c)

    @property
    def is_released(self):
        """True once the consumer released it (or the partition was released)."""
        return fb_subpart_state(&self._c) == FB_SP_RELEASED

    @property
    def is_failed(self):
        return fb_subpart_state(&self._c) == FB_SP_FAILED

    def __repr__(self):
        return (f"<flinkbuf.ResultSubpartition index={self._index} "
                f"backlog={fb_subpart_backlog(&self._c)}>")


@cython.no_gc_clear
cdef class ResultPartition:
    """The output of one producer task: ``num_subpartitions`` queues of
    finished buffers (one per consumer), filled with buffers of ``pool``.

    The pool is usually made for the partition: at least
    ``num_subpartitions + 1`` buffers (Flink's minimum, so that every
    subpartition can hold a partly filled buffer while another is in flight)
    and ``num_subpartitions`` channels for per-subpartition accounting (so
    ``max_buffers_per_channel`` applies).  A pool made without channels is
    accepted too.

    A :class:`RecordWriter` writes records into it; consumers read a
    subpartition through a :class:`LocalInputChannel` of an
    :class:`InputGate`.  ``finish()`` ends every subpartition with
    EndOfPartition, ``fail(exc)`` makes consumers raise
    :class:`ProducerFailedError`, ``release()`` drops everything queued.
    Buffers queued when the partition is garbage collected are recycled.

    Lifecycle, as in Flink: the producer finishes the partition (or fails
    it); what is queued stays until each consumer has read its
    subpartition to the end, and a consumer's gate releases its
    subpartition when it is done (or closes early).  ``release()`` is for
    dropping a partition whose consumers will not read it.  As a context
    manager on the producer's side: a normal exit finishes the partition
    (closing its RecordWriter if that is still open, which hands over its
    partly filled buffers first), an exception fails it with that
    exception; neither releases it.

    ``buffer_debloat`` (a bool or a :class:`BufferDebloatConfig`): its
    consumers' gates debloat buffers (see :class:`BufferDebloatConfig`),
    so each subpartition starts with buffers of ``buffer_debloat_min_size``
    bytes (default the config's, 256) until its consumer announces a size.
    """

    def __cinit__(self):
        self._subpartitions = []
        self._n = 0
        self._state = _P_LIVE
        self._cap = -1

    def __init__(self, LocalBufferPool pool not None, num_subpartitions, *, name=None,
                 buffer_debloat=None, buffer_debloat_min_size=None):
        if self._n:
            raise RuntimeError("ResultPartition is already initialised")
        _check_name(name)
        cdef BufferDebloatConfig debloat = BufferDebloatConfig.from_options(
            buffer_debloat, buffer_debloat_min_size=buffer_debloat_min_size)
        cdef int32_t n = as_int32(num_subpartitions, "num_subpartitions", 1)
        cdef int32_t pool_channels = pool.num_subpartitions
        if pool_channels not in (0, n):
            raise ValueError(
                f"the pool counts buffers for {pool_channels} channels, the partition has "
                f"{n} subpartitions: create the pool with num_subpartitions={n} (or 0)")
        if pool.min_buffers < n + 1:
            raise ValueError(
                f"a partition of {n} subpartition(s) needs a pool of at least {n + 1} "
                f"buffers (min_buffers), got {pool.min_buffers}")
        if pool.is_destroyed:
            raise PoolDestroyedError("buffer pool is destroyed")
        self._pool = pool
        self._segment_size = pool.network_buffer_pool.segment_size
        self._pool_channels = pool_channels
        cap = pool.max_buffers_per_channel
        self._cap = -1 if cap is None else cap
        self._name = name
        self._signal = _ConsumeSignal()
        cdef ResultSubpartition sp
        cdef int32_t i
        for i in range(n):
            sp = ResultSubpartition.__new__(ResultSubpartition)
            if fb_subpart_init(&sp._c, &self._signal._c) != FB_OK:
                raise MemoryError()
            sp._initialized = True
            sp._index = i
            sp._signal = self._signal
            sp._pool = pool
            sp._limit = FB_UNBOUNDED
            if debloat._enabled:      # small until its consumer's gate announces a size
                fb_subpart_set_buffer_size(&sp._c, -min(debloat._min_size, self._segment_size))
            self._subpartitions.append(sp)
        self._n = n

    cdef int _follow_debloat(self, ResultSubpartition sp) except -1:
        cdef int32_t size = fb_subpart_buffer_size(&sp._c)
        cdef int32_t limit, demand = 0
        cdef ResultSubpartition other
        if size == sp._seen_size and sp._count == sp._seen_count:
            return 0
        sp._seen_size = size
        sp._seen_count = sp._count
        if not self._pool_channels:
            return 0
        # A debloated channel keeps what its in-flight data takes: the count
        # its local consumer said (the buffer it reads among them), or one
        # buffer for a consumer over a connection, whose own credit holds
        # the rest.  Before a consumer said a size (size <= 0), no bound.
        if size <= 0 or size >= self._segment_size:
            limit = FB_UNBOUNDED
        else:
            limit = sp._count if sp._count > 0 else 1
        if limit != sp._limit:
            sp._limit = limit
            self._pool._set_channel_limit(sp._index, None if limit == FB_UNBOUNDED else limit)
        for other in self._subpartitions:
            if other._limit == FB_UNBOUNDED or demand >= FB_UNBOUNDED - other._limit:
                demand = FB_UNBOUNDED
                break
            demand += other._limit
        if demand != self._demand:
            self._demand = demand
            self._pool._set_demand(None if demand == FB_UNBOUNDED else demand)
        return 0

    def _debloat_given_back(self):
        """Segments the partition's pool gave back to its NetworkBufferPool
        because its debloated subpartitions need fewer buffers (0 when none
        did, or debloating is off)."""
        return self._pool._debloat_given_back()

    cdef int _raise_for_rc(self, int rc, int32_t index) except -1:
        cdef ResultSubpartition sp
        if rc == FB_OK:
            return 0
        if rc == FB_ERELEASED:
            raise PartitionReleasedError(
                f"subpartition {index} of {self._describe()} was released by its consumer")
        if rc == FB_EFAILED:
            sp = <ResultSubpartition>self._subpartitions[index]
            raise ProducerFailedError(f"{self._describe()} has failed") from sp._cause
        if rc == FB_ESTATE:
            raise RuntimeError(f"{self._describe()} is finished: nothing can be added")
        if rc == FB_ENOMEM:
            raise MemoryError()
        raise RuntimeError(f"internal error {rc} in subpartition {index}")

    cdef bytes _encode_event(self, object event):
        """A user event's bytes; it must fit one buffer of the pool."""
        cdef bytes data = _serialize_event(event)
        if len(data) > self._segment_size:
            raise ValueError(f"an event of {len(data)} bytes does not fit one buffer of the "
                             f"partition's pool ({self._segment_size} bytes): events travel "
                             "in one buffer each")
        return data

    cdef int _add_event_all(self, bytes payload, bint last, RecordWriter writer) except -1:
        """Queue an event to every live subpartition (released ones are
        skipped).  A user event first waits for room (MAX_QUEUED_EVENTS);
        ``writer`` (or None) counts that wait as its back-pressured time."""
        cdef ResultSubpartition sp
        cdef int rc
        for sp in self._subpartitions:
            if not last:
                self._await_event_room(sp, writer)
            rc = sp._add_bytes(payload, last)
            if rc == FB_ERELEASED:
                continue
            self._raise_for_rc(rc, sp._index)
        return 0

    cdef int _await_event_room(self, ResultSubpartition sp, RecordWriter writer) except -1:
        """Wait (without the GIL) while ``sp`` holds MAX_QUEUED_EVENTS events
        its consumer has not taken; a released subpartition has room (the
        event is skipped).  Raises if the partition or the writer fails."""
        if fb_subpart_events(&sp._c) < _MAX_EVENTS:
            return 0
        cdef object keep = self          # alive across the nogil waits
        cdef _ConsumeSignal signal = self._signal
        cdef uint64_t seen
        cdef int64_t deadline, t0 = fb_monotonic_ns()
        if writer is not None:
            writer._bp_since = t0
        try:
            while True:
                seen = fb_signal_seq(&signal._c)
                if (fb_subpart_events(&sp._c) < _MAX_EVENTS
                        or fb_subpart_state(&sp._c) == FB_SP_RELEASED):
                    return 0
                if writer is not None:
                    writer._check_partition()
                self._check_live()
                deadline = fb_deadline_after(FB_WAIT_SLICE)
                with nogil:
                    fb_signal_wait(&signal._c, seen, deadline)
                PyErr_CheckSignals()
        finally:
            if writer is not None:
                writer._bp_ns += fb_monotonic_ns() - t0
                writer._bp_since = 0

    def _describe(self):
        return f"result partition {self._name!r}" if self._name is not None else "result partition"

    cdef int _check_initialised(self) except -1:
        if self._n == 0:
            raise RuntimeError("ResultPartition is not initialised (its __init__ was not called)")
        return 0

    def _check_live(self):
        self._check_initialised()
        if self._state == _P_FAILED:
            raise ProducerFailedError(f"{self._describe()} has failed") from self._cause
        if self._state == _P_RELEASED:
            raise PartitionReleasedError(f"{self._describe()} was released")
        if self._state == _P_FINISHED:
            raise RuntimeError(f"{self._describe()} is finished")

    def add_buffer(self, subpartition, Buffer buffer not None):
        """Queue a finished buffer for ``subpartition``; the partition takes
        it over (the consumer recycles it).  A buffer whose ``data_type`` is
        ``EVENT_BUFFER`` holds an encoded event and travels as one (waiting,
        like :meth:`broadcast_event`, while the consumer holds
        ``MAX_QUEUED_EVENTS``).  The buffer must be of this partition's pool,
        with no other reference and no exported view (ValueError /
        ExportedBufferError; it is left untouched).  If the partition or the
        subpartition can no longer take it, the buffer is recycled and the
        error raised."""
        self._check_initialised()
        cdef int32_t index = _as_subpartition(subpartition, self._n)
        if buffer._pool is not self._pool:
            raise ValueError("the buffer is not from this partition's pool")
        buffer._check_detachable()
        cdef int32_t kind = FB_ITEM_EVENT if buffer._data_type == 1 else FB_ITEM_DATA
        cdef ResultSubpartition sp = <ResultSubpartition>self._subpartitions[index]
        try:
            self._check_live()
            if kind == FB_ITEM_EVENT:
                self._await_event_room(sp, None)
        except BaseException:
            buffer._release()
            raise
        cdef int rc = sp._add_buffer(buffer, kind, False)
        if rc != FB_OK:
            self._raise_for_rc(rc, index)

    def broadcast_event(self, event):
        """Queue a user :class:`Event` to every subpartition (in-band: after
        what is queued already), waiting while a consumer has
        ``MAX_QUEUED_EVENTS`` events it has not taken.  Writers flush
        first: use :meth:`RecordWriter.broadcast_event`."""
        self._check_live()
        self._add_event_all(self._encode_event(event), False, None)

    def finish(self):
        """End every subpartition with EndOfPartition; nothing can be added
        afterwards.  If the partition's :class:`RecordWriter` is still open
        it is closed, which hands over its partly filled buffers first.
        Idempotent."""
        if self._state == _P_FINISHED:
            return
        writer = self._open_writer()
        if writer is not None:
            writer.close()          # flushes, then _finish()
        else:
            self._finish()

    cdef int _finish(self) except -1:
        if self._state == _P_FINISHED:
            return 0
        self._check_live()
        self._add_event_all(_END_OF_PARTITION_BYTES, True, None)
        self._state = _P_FINISHED
        return 0

    def _open_writer(self):
        """The partition's RecordWriter if it is alive and open, else None."""
        writer = self._writer() if self._writer is not None else None
        if writer is None or writer.is_closed:
            return None
        return writer

    def fail(self, exc=None):
        """The producer failed: drop and recycle whatever is queued, and make
        every consumer raise :class:`ProducerFailedError` from ``exc``, the
        producer's exception (an instance; TypeError for anything else).
        ``None`` fails without one: the cause is then a ``RuntimeError("producer
        failed")``.  No-op on a partition that is already failed or released."""
        _check_failure_cause(exc)
        if self._state in (_P_FAILED, _P_RELEASED):
            return
        if exc is None:
            exc = RuntimeError("producer failed")
        self._cause = exc
        self._state = _P_FAILED
        cdef ResultSubpartition sp
        for sp in self._subpartitions:
            sp._cause = exc
        for sp in self._subpartitions:    # gives back what is queued; cannot fail
            sp._terminate(FB_SP_FAILED)

    def release(self):
        """Drop and recycle everything queued; consumers see the partition
        as released (:class:`PartitionReleasedError`).  For a partition that
        will not be read (any more); a producer that is done calls
        :meth:`finish` instead.  Idempotent."""
        if self._state == _P_RELEASED:
            return
        if self._state != _P_FAILED:
            self._state = _P_RELEASED
        cdef ResultSubpartition sp
        for sp in self._subpartitions:
            sp._terminate(FB_SP_RELEASED)

    # ---- consumption ---------------------------------------------------------

    cdef int _reader_attached(self) except -1:
        """A reader outside this process's gates (a connection serving a
        subpartition to another process) holds the partition: it is not
        consumed until that reader is done."""
        self._readers += 1
        return 0

    cdef int _reader_detached(self) except -1:
        """That reader is done (it sent the subpartition's last item or its
        error, its reader went away, or its connection ended) and holds
        nothing of the partition (no buffer of it is lent any more)."""
        self._readers -= 1
        if self._signal is not None:
            fb_signal_post(&self._signal._c)
        return 0

    cdef int32_t _reader_count(self) noexcept:
        """Readers in other processes that hold the partition now."""
        return self._readers

    cdef bint _is_consumed(self) except -1:
        cdef ResultSubpartition sp
        if self._readers > 0:
            return False
        for sp in self._subpartitions:
            if not fb_subpart_drained(&sp._c):
                return False
        return True

    def wait_consumed(self, timeout=None, *, reset_on_progress=False):
        """Wait (without the GIL) until the consumers have taken everything:
        every subpartition was read to its end (its reader took the
        EndOfPartition that finishing the partition queues), or was
        released or failed, and no reader in another process still has
        something of it in flight (a connection of a
        :class:`~flinkbuf.network.NetworkEnvironment` sending a
        subpartition's last buffers and EndOfPartition, or the producer's
        error; a connection that drops ends its readers at once) or holds
        one of its buffers lent over shared memory.

        True once that is so (at once if it is already), False if
        ``timeout`` seconds (None: no limit) pass first.  With
        ``reset_on_progress``, ``timeout`` counts from the consumers' last
        step (a buffer or event taken, a subpartition released, a reader
        in another process done) instead of from the call: consumers that
        keep reading are waited for however long they take, and the wait
        gives up once none has moved for ``timeout`` seconds.

        A producer whose process must stay up until its remote consumers
        have everything (its environment's connections end when it closes)
        waits here after closing its writer; a partition that is not
        finished is not consumed."""
        self._check_initialised()
        cdef double limit = as_timeout(timeout)
        if not isinstance(reset_on_progress, bool):
            raise TypeError(f"reset_on_progress must be True or False, got "
                            f"{type(reset_on_progress).__name__}")
        cdef bint restart = reset_on_progress
        cdef object keep = self          # alive across the nogil waits
        cdef _ConsumeSignal signal = self._signal
        cdef uint64_t seen, last = fb_signal_seq(&signal._c)
        cdef int64_t deadline = FB_WAIT_FOREVER if limit < 0 else fb_deadline_after(limit)
        cdef int64_t slice_end
        while True:
            seen = fb_signal_seq(&signal._c)
            if self._is_consumed():
                return True
            if restart and seen != last and limit >= 0:
                last = seen
                deadline = fb_deadline_after(limit)
            if deadline != FB_WAIT_FOREVER and fb_monotonic_ns() >= deadline:
                return False
            slice_end = fb_deadline_after(FB_WAIT_SLICE)
            if slice_end > deadline:
                slice_end = deadline
            with nogil:
                fb_signal_wait(&signal._c, seen, slice_end)
            PyErr_CheckSignals()

    def subpartition(self, index):
        return self._subpartitions[_as_subpartition(index, self._n)]

    def backlog(self, index):
        """Finished data buffers queued for subpartition ``index``."""
        return self.subpartition(index).backlog

    def backlogs(self):
        cdef ResultSubpartition sp
        return [fb_subpart_backlog(&sp._c) for sp in self._subpartitions]

    @property
    def num_subpartitions(self):
        return self._n

    @property
    def pool(self):
        return self._pool

    @property
    def name(self):
        return self._name

    @property
    def is_finished(self):
        return self._state == _P_FINISHED

    @property
    def is_failed(self):
        return self._state == _P_FAILED

    @property
    def is_released(self):
        """True once the partition was released (not: one consumer left)."""
        return self._state == _P_RELEASED

    @property
    def failure_cause(self):
        return self._cause

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """The producer is done: on a normal exit the partition is finished
        (see :meth:`finish`; nothing queued is dropped, the consumers read
        it to the end), on an exception it fails with that exception (see
        :meth:`fail`).  It is not released."""
        if exc_type is None:
            if self._state == _P_LIVE:
                self.finish()
            return False
        cause = exc if isinstance(exc, BaseException) else None
        writer = self._open_writer()
        if writer is not None:
            writer.fail(cause)      # drops its buffers, then fails the partition
        else:
            self.fail(cause)
        return False

    def __repr__(self):
        state = ("live", "finished", "failed", "released")[self._state]
        return (f"<flinkbuf.ResultPartition name={self._name!r} "
                f"num_subpartitions={self._n} {state}>")
