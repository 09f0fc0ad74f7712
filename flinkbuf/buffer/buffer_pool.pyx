# NetworkBufferPool and LocalBufferPool.  Included by _buffer.pyx.

# Passed by create_buffer_pool() alone: a LocalBufferPool made any other way
# would have no network pool under its C struct (net is NULL).
cdef object _POOL_TOKEN = object()


cdef int _raise_status(int rc, str what, object timeout=None) except -1:
    """The one translation of a csrc result code into an exception for this
    module (``what``: the pool, for the message); FB_OK raises nothing."""
    if rc == FB_OK:
        return 0
    if rc == FB_EDESTROYED:
        raise PoolDestroyedError(f"{what} is destroyed")
    if rc == FB_ETIMEDOUT:
        raise BufferRequestTimeoutError(f"no buffer of the {what} became available within "
                                        f"{timeout}s")
    if rc == FB_ENOMEM:
        raise MemoryError(f"out of memory in the {what}")
    raise RuntimeError(f"internal error: result {rc} from the {what}")


cdef int _wait_in_slices(int (*step)(void *, int64_t) noexcept nogil, void *arg,
                         double timeout) except -1:
    """Run a blocking C wait without the GIL until it ends or the timeout passes.

    The wait is cut into slices so that KeyboardInterrupt and other signals
    are seen by the main thread.  Returns the C result code."""
    cdef int64_t deadline = FB_WAIT_FOREVER if timeout < 0 else fb_deadline_after(timeout)
    cdef int64_t slice_end
    cdef int rc
    while True:
        slice_end = fb_deadline_after(FB_WAIT_SLICE)
        if slice_end > deadline:
            slice_end = deadline
        with nogil:
            rc = step(arg, slice_end)
        if rc != FB_ETIMEDOUT:
            return rc
        # Also after the last slice: callers that retry short waits in a loop
        # stay interruptible.
        PyErr_CheckSignals()
        if slice_end >= deadline:
            return rc


cdef struct _request_args:
    fb_localpool_t *lp
    int32_t channel
    int32_t index


cdef int _request_step(void *arg, int64_t deadline) noexcept nogil:
    cdef _request_args *a = <_request_args *>arg
    return fb_localpool_request_blocking(a.lp, a.channel, deadline, &a.index)


cdef int _available_step(void *arg, int64_t deadline) noexcept nogil:
    return fb_localpool_wait_available(<fb_localpool_t *>arg, deadline)


cdef struct _unpooled_args:
    fb_netpool_t *np
    int32_t n
    int32_t *out


cdef int _unpooled_step(void *arg, int64_t deadline) noexcept nogil:
    cdef _unpooled_args *a = <_unpooled_args *>arg
    return fb_netpool_request_unpooled(a.np, a.n, deadline, a.out)


def _default_alignment():
    return resource.getpagesize()


@cython.final
@cython.no_gc_clear
cdef class NetworkBufferPool:
    """All network memory of a process: ``num_segments`` segments of
    ``segment_size`` bytes, allocated up front as one arena aligned to
    ``alignment`` (a power of two >= 64, default the page size).  Segments
    sit at a stride of ``segment_size`` rounded up to 64 bytes.

    Local pools made by :meth:`create_buffer_pool` share the segments:
    each is guaranteed its ``min_buffers``, and the rest is redistributed
    among them in proportion to ``max_buffers - min_buffers`` (Flink's
    algorithm) whenever a pool is created or destroyed, or unpooled
    segments are taken or returned.

    With ``shared_memory=True`` the arena is a memory file without a name
    that processes on this host can be given to map read-only: the
    shared-memory transport then lends a consumer in another process the
    segments themselves instead of copying them.  (A process forked after
    such a pool was made shares its memory rather than getting a copy.)

    ``destroy()`` destroys every local pool (blocked requests fail with
    :class:`PoolDestroyedError`) and refuses new work; segments still out
    stay valid until recycled, and the arena is unmapped once the last one
    is back.  Use as a context manager to destroy on exit.  One made by
    ``__new__`` without ``__init__`` raises ``RuntimeError`` when used.
    """

    def __cinit__(self):
        self._initialized = False
        self._listening = set()

    def __init__(self, num_segments, segment_size, alignment=None, *, shared_memory=False):
        if self._initialized:
            raise RuntimeError("NetworkBufferPool is already initialised")
        cdef int32_t n = as_int32(num_segments, "num_segments", 1)
        cdef int32_t size = as_int32(segment_size, "segment_size", 1)
        if alignment is None:
            alignment = _default_alignment()
        if isinstance(alignment, bool) or not isinstance(alignment, int):
            raise TypeError(f"alignment must be an int, got {type(alignment).__name__}")
        if alignment < 64 or alignment > (1 << 30) or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two in [64, 2**30], got {alignment}")
        if not isinstance(shared_memory, bool):
            raise TypeError(f"shared_memory must be a bool, got {type(shared_memory).__name__}")
        cdef int rc = fb_netpool_init(&self._c, n, size, <size_t>alignment, shared_memory)
        if rc == FB_ENOMEM:
            raise MemoryError(f"cannot allocate {n} segments of {size} bytes")
        if rc != FB_OK:
            raise ValueError("invalid network buffer pool parameters")
        self._alignment = alignment
        self._shared = shared_memory
        self._initialized = True

    def __dealloc__(self):
        if self._initialized:
            fb_netpool_free(&self._c)
            self._initialized = False

    cdef int _check_live(self) except -1:
        if not self._initialized:
            raise RuntimeError("NetworkBufferPool is not initialised")
        return 0

    cdef int _dispatch_listeners(self) except -1:
        """Call, outside every lock, the listeners of pools now available.

        A listener's Exception goes to sys.unraisablehook and the others
        still run: it must not surface in whichever thread's recycle, resize
        or destroy made the pool available.  A KeyboardInterrupt or
        SystemExit is raised once the others ran."""
        cdef LocalBufferPool pool
        cdef list ready = []
        cdef object interrupt = None
        for pool in list(self._listening):
            if fb_localpool_is_available(&pool._c) or pool.is_destroyed:
                self._listening.discard(pool)
                ready.append((pool, pool._listeners))
                pool._listeners = []
        for pool, listeners in ready:
            for listener in listeners:
                try:
                    fb_call_listener(listener, pool)
                except BaseException as e:
                    if interrupt is None:
                        interrupt = e
                    else:
                        write_unraisable(listener)
        if interrupt is not None:
            raise interrupt
        return 0

    @property
    def num_segments(self):
        return self._c.num_segments

    @property
    def segment_size(self):
        return self._c.segment_size

    @property
    def segment_stride(self):
        """Distance in bytes between the starts of neighbouring segments."""
        return self._c.stride

    @property
    def alignment(self):
        return self._alignment

    @property
    def shared_memory(self):
        """True if the arena is a memory file other processes may map
        read-only (``shared_memory=True``)."""
        self._check_live()
        return self._shared

    @property
    def num_available_segments(self):
        """Segments on the global free list."""
        self._check_live()
        return fb_netpool_num_free(&self._c)

    @property
    def num_total_required_buffers(self):
        """Sum of the live pools' ``min_buffers`` plus unpooled reservations."""
        self._check_live()
        return fb_netpool_total_required(&self._c)

    @property
    def num_unpooled_segments(self):
        """Unpooled segments handed out and not yet recycled."""
        self._check_live()
        return fb_netpool_num_unpooled(&self._c)

    @property
    def num_outstanding_segments(self):
        """Segments not on the global free list (held by pools or users)."""
        self._check_live()
        return fb_netpool_num_outstanding(&self._c)

    @property
    def is_destroyed(self):
        return self._initialized and fb_netpool_is_destroyed(&self._c) != 0

    @property
    def is_arena_released(self):
        """True once the destroyed pool's memory has been unmapped."""
        return self._initialized and fb_netpool_arena_released(&self._c) != 0

    def create_buffer_pool(self, min_buffers, max_buffers, *, num_subpartitions=0,
                           max_buffers_per_channel=None, max_overdraft_buffers=0):
        """A new :class:`LocalBufferPool` guaranteed ``min_buffers`` segments and
        growing up to ``max_buffers`` (``None``: unbounded) by redistribution.

        ``num_subpartitions`` > 0 lets requests name a channel;
        ``max_buffers_per_channel`` then makes the pool *unavailable* (not
        refusing) while one channel holds that many buffers;
        ``max_overdraft_buffers`` extra segments may be taken from the global
        pool beyond the pool size.  Raises :class:`InsufficientBuffersError`
        if the required buffers of all pools would exceed the total."""
        self._check_live()
        cdef int32_t mn = as_int32(min_buffers, "min_buffers", 1)
        cdef int32_t mx = FB_UNBOUNDED if max_buffers is None else \
            as_int32(max_buffers, "max_buffers", 1)
        if mx < mn:
            raise ValueError(f"max_buffers ({max_buffers}) must be >= min_buffers ({mn})")
        cdef int32_t nsub = as_int32(num_subpartitions, "num_subpartitions", 0)
        cdef int32_t per_channel = FB_UNBOUNDED
        if max_buffers_per_channel is not None:
            if nsub == 0:
                raise ValueError("max_buffers_per_channel needs num_subpartitions > 0")
            per_channel = as_int32(max_buffers_per_channel, "max_buffers_per_channel", 1)
        cdef int32_t overdraft = as_int32(max_overdraft_buffers, "max_overdraft_buffers", 0)
        cdef LocalBufferPool pool = LocalBufferPool.__new__(LocalBufferPool, _POOL_TOKEN)
        pool._nbp = self
        cdef int rc = fb_localpool_create(&self._c, &pool._c, mn, mx, nsub, per_channel,
                                          overdraft)
        if rc == FB_EINSUFFICIENT:
            required = fb_netpool_total_required(&self._c)
            raise InsufficientBuffersError(
                f"insufficient network buffers: the pool requires {mn}, but only "
                f"{self._c.num_segments - required} of {self._c.num_segments} are not "
                f"required by other pools or unpooled requests")
        _raise_status(rc, "network buffer pool")
        pool._created = True
        return pool

    def request_unpooled_segments(self, num_segments, timeout=30.0):
        """Take ``num_segments`` segments outside any local pool (Flink's
        exclusive buffers).  They count as required buffers at once
        (:class:`InsufficientBuffersError` if that could never be met); the
        call then waits without the GIL until that many are free, raising
        :class:`BufferRequestTimeoutError` after ``timeout`` seconds
        (``None``: forever).  Return them with :meth:`recycle_unpooled_segments`."""
        self._check_live()
        cdef int32_t n = as_int32(num_segments, "num_segments", 1)
        cdef double t = as_timeout(timeout)
        if n > self._c.num_segments:
            raise InsufficientBuffersError(
                f"insufficient network buffers: requested {n} unpooled segments of a "
                f"pool of {self._c.num_segments}")
        cdef _unpooled_args args
        args.np = &self._c
        args.n = n
        args.out = <int32_t *>PyMem_Malloc(sizeof(int32_t) * n)
        if args.out == NULL:
            raise MemoryError()
        cdef int rc
        cdef list segments
        cdef MemorySegment seg
        cdef int32_t k
        try:
            rc = _wait_in_slices(_unpooled_step, &args, t)
            if rc == FB_EINSUFFICIENT:
                required = fb_netpool_total_required(&self._c)
                raise InsufficientBuffersError(
                    f"insufficient network buffers: requested {n} unpooled segments, but "
                    f"only {self._c.num_segments - required} of {self._c.num_segments} "
                    f"are not required")
            if rc == FB_ETIMEDOUT:
                raise BufferRequestTimeoutError(
                    f"timed out after {timeout}s waiting for {n} free segments")
            _raise_status(rc, "network buffer pool")
            segments = []
            for k in range(n):
                seg = MemorySegment.__new__(MemorySegment)
                seg._data = fb_segment_address(&self._c, args.out[k])
                seg._size = self._c.segment_size
                seg._owner = self
                seg._index = args.out[k]
                seg._kind = SEG_UNPOOLED
                segments.append(seg)
            return segments
        finally:
            PyMem_Free(args.out)

    def recycle_unpooled_segments(self, segments):
        """Return segments from :meth:`request_unpooled_segments`; they can no
        longer be accessed.  Validates all before returning any."""
        self._check_live()
        cdef list segs = list(segments)
        cdef MemorySegment seg
        for obj in segs:
            if not isinstance(obj, MemorySegment):
                raise TypeError(f"expected MemorySegment, got {type(obj).__name__}")
            seg = <MemorySegment>obj
            if seg._kind != SEG_UNPOOLED or seg._owner is not self:
                raise ValueError("segment is not an unpooled segment of this pool")
            if seg._data == NULL:
                raise SegmentFreedError("unpooled segment was already recycled")
            if seg._exports:
                raise ExportedBufferError(
                    f"segment has {seg._exports} exported buffer view(s); release them first")
        cdef Py_ssize_t n = len(segs), k
        if n == 0:
            return
        if n > self._c.num_segments:    # and the count passed to C is an int32_t
            raise ValueError("a segment is listed twice")
        cdef int32_t *idx = <int32_t *>PyMem_Malloc(sizeof(int32_t) * n)
        if idx == NULL:
            raise MemoryError()
        try:
            for k in range(n):
                idx[k] = (<MemorySegment>segs[k])._index
            if fb_netpool_recycle_unpooled(&self._c, idx, <int32_t>n) != FB_OK:
                raise ValueError("a segment is listed twice")
        finally:
            PyMem_Free(idx)
        for k in range(n):
            (<MemorySegment>segs[k])._data = NULL
        if self._listening:
            self._dispatch_listeners()

    def destroy(self):
        """Destroy all local pools and refuse new work.  Segments still out
        stay usable and are returned by their recycle; the memory is unmapped
        once the last one is back.  Returns the number still out."""
        self._check_live()
        cdef int32_t out = fb_netpool_destroy(&self._c)
        if self._listening:
            self._dispatch_listeners()
        return out

    cdef int _redistribute_now(self) except -1:
        self._check_live()
        fb_netpool_redistribute(&self._c)
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __repr__(self):
        if not self._initialized:
            return "<flinkbuf.NetworkBufferPool uninitialised>"
        return (f"<flinkbuf.NetworkBufferPool num_segments={self._c.num_segments} "
                f"segment_size={self._c.segment_size} "
                f"available={fb_netpool_num_free(&self._c)}"
                f"{' destroyed' if self.is_destroyed else ''}>")


@cython.final
@cython.no_gc_clear
cdef class LocalBufferPool:
    """A task's share of a :class:`NetworkBufferPool` (Flink semantics).

    ``num_buffers`` is the current size set by redistribution, within
    ``[min_buffers, max_buffers]``.  Segments are taken from the global pool
    lazily; recycled ones are kept for reuse unless the pool holds more than
    its size, in which case they go back (lazy shrink).  ``request_buffer()``
    never blocks; ``request_buffer_blocking()`` waits without the GIL: that
    wait is backpressure.  ``destroy()`` is lazy: buffers in flight go back
    to the global pool when recycled.
    """

    def __cinit__(self, *args, **kwargs):
        if len(args) != 1 or args[0] is not _POOL_TOKEN or kwargs:
            raise TypeError("LocalBufferPool cannot be created directly; use "
                            "NetworkBufferPool.create_buffer_pool()")
        self._created = False
        self._listeners = []

    def __init__(self):
        # __cinit__ refuses every call first; no parameters is what help() shows.
        raise TypeError("use NetworkBufferPool.create_buffer_pool()")

    def __dealloc__(self):
        if self._created:
            fb_localpool_destroy(&self._c)
            fb_localpool_free(&self._c)
            self._created = False

    cdef Buffer _wrap(self, int32_t index):
        return segment_buffer(self, &self._c, index)

    cdef int _recycled_in_c(self) except -1:
        """C code returned segments of this pool (through its ops): call
        the listeners a Python recycle would have called."""
        if self._nbp._listening:
            self._nbp._dispatch_listeners()
        return 0

    cdef int32_t _channel_arg(self, object channel) except? -2:
        if channel is None:
            return FB_NO_CHANNEL
        if isinstance(channel, bool) or not isinstance(channel, int):
            raise TypeError(f"channel must be an int or None, got {type(channel).__name__}")
        if channel < 0 or channel >= self._c.num_subpartitions:
            raise ValueError(f"channel {channel} is not in [0, {self._c.num_subpartitions})")
        return <int32_t>channel

    cdef Buffer _request(self, int32_t channel):
        cdef int32_t index
        cdef int rc = fb_localpool_request(&self._c, channel, &index)
        if rc == FB_OK:
            return self._wrap(index)
        if rc == FB_EMPTY:
            return None
        _raise_status(rc, "buffer pool")

    cdef Buffer _request_blocking(self, int32_t channel, double timeout):
        cdef _request_args args
        args.lp = &self._c
        args.channel = channel
        args.index = -1
        # Fast path with the GIL held: releasing it when a buffer is free would
        # hand the GIL to another thread for nothing.
        cdef int rc = fb_localpool_request(&self._c, channel, &args.index)
        if rc == FB_EMPTY:
            rc = _wait_in_slices(_request_step, &args, timeout)
        if rc == FB_OK:
            return self._wrap(args.index)
        _raise_status(rc, "buffer pool", timeout)

    def request_buffer(self, channel=None):
        """A :class:`Buffer`, or ``None`` if none is free right now.  Never blocks.
        ``channel`` (a subpartition index) counts toward its per-channel cap."""
        return self._request(self._channel_arg(channel))

    def request_buffer_blocking(self, timeout=None, channel=None):
        """A :class:`Buffer`, waiting without the GIL until one is recycled
        or the pool grows.  :class:`BufferRequestTimeoutError` after
        ``timeout`` seconds (``None``: forever); :class:`PoolDestroyedError`
        if the pool is destroyed, also while waiting."""
        return self._request_blocking(self._channel_arg(channel), as_timeout(timeout))

    def set_num_buffers(self, num_buffers):
        """Resize to ``num_buffers``, capped at ``max_buffers`` and at what
        leaves every other pool room for its ``min_buffers`` (so at most
        ``min_buffers`` plus the segments no pool or unpooled request
        requires); shrinking is lazy.  The next redistribution sets the size
        again.  ``ValueError`` below ``min_buffers``."""
        cdef int32_t n = as_int32(num_buffers, "num_buffers", 0)
        cdef int rc = fb_localpool_set_num_buffers(&self._c, n)
        if rc == FB_EINVAL:
            raise ValueError(f"buffer pool needs at least {self._c.min_buffers} buffers, "
                             f"tried to set {n}")
        _raise_status(rc, "buffer pool")
        if self._nbp._listening:
            self._nbp._dispatch_listeners()

    def destroy(self):
        """Return idle segments, wake blocked requests with
        :class:`PoolDestroyedError` and refuse new ones; buffers in flight
        return to the global pool when recycled.  Idempotent."""
        fb_localpool_destroy(&self._c)
        if self._nbp._listening:
            self._nbp._dispatch_listeners()

    def wait_available(self, timeout=None):
        """Wait (without the GIL) until a request would succeed and no channel
        is at its cap.  True when available, False on timeout;
        :class:`PoolDestroyedError` if the pool is destroyed."""
        cdef double t = as_timeout(timeout)
        if fb_localpool_is_available(&self._c):
            return True
        cdef int rc = _wait_in_slices(_available_step, &self._c, t)
        if rc == FB_ETIMEDOUT:
            return False
        _raise_status(rc, "buffer pool")
        return True

    def add_availability_listener(self, callback):
        """Call ``callback(pool)`` once, when the pool is next available (at once
        if it is now) or destroyed.  Listeners run in the thread whose call
        (a recycle, a resize, a destroy) made the pool available, never under
        a pool lock; a listener is a hint, another thread may take the buffer
        first.  An exception a listener raises is reported through
        ``sys.unraisablehook``, never raised from that call (which succeeds)
        nor from this one, and the other listeners still run; only
        ``KeyboardInterrupt`` and ``SystemExit`` propagate, after them."""
        if not callable(callback):
            raise TypeError("callback must be callable")
        if fb_localpool_is_available(&self._c) or self.is_destroyed:
            fb_call_listener(callback, self)
            return
        self._listeners.append(callback)
        self._nbp._listening.add(self)

    def channel_count(self, channel):
        """Buffers requested for ``channel`` and not yet recycled."""
        return fb_localpool_channel_count(&self._c, self._channel_arg(channel))

    cdef fb_localpool_stats_t _stats(self):
        cdef fb_localpool_stats_t st
        fb_localpool_stats(&self._c, &st)
        return st

    @property
    def network_buffer_pool(self):
        return self._nbp

    @property
    def min_buffers(self):
        return self._c.min_buffers

    @property
    def max_buffers(self):
        """The cap, or None for an unbounded pool."""
        return None if self._c.max_buffers == FB_UNBOUNDED else self._c.max_buffers

    @property
    def num_buffers(self):
        """Current pool size."""
        return self._stats().size

    @property
    def num_requested(self):
        """Segments taken from the global pool (idle here or handed out)."""
        return self._stats().num_requested

    @property
    def num_available(self):
        """Idle segments held by this pool."""
        return self._stats().num_avail

    @property
    def num_overdraft(self):
        """Overdraft segments in use."""
        return self._stats().num_overdraft

    @property
    def num_subpartitions(self):
        return self._c.num_subpartitions

    @property
    def max_buffers_per_channel(self):
        return None if self._c.max_per_channel == FB_UNBOUNDED else self._c.max_per_channel

    @property
    def max_overdraft_buffers(self):
        return self._c.max_overdraft

    @property
    def is_destroyed(self):
        return bool(self._stats().destroyed)

    @property
    def is_available(self):
        """True if a request would succeed now and no channel is at its cap."""
        return bool(fb_localpool_is_available(&self._c))

    def _debloat_given_back(self):
        """Segments this pool gave back to its network pool because the
        channels it serves, debloated, need fewer (its size as the
        redistribution would make it without its demand, minus its size)."""
        return fb_localpool_given_back(&self._c)

    def _set_demand(self, n):
        """Buffer debloating: size the pool as if its ``max_buffers`` were
        ``max(min_buffers, n)`` (None: ``max_buffers`` again); what it does
        not need goes back to the network pool and to other pools."""
        cdef int32_t d = FB_UNBOUNDED if n is None else as_int32(n, "demand", 0)
        _raise_status(fb_localpool_set_demand(&self._c, d), "buffer pool")
        if self._nbp._listening:
            self._nbp._dispatch_listeners()

    def _set_channel_limit(self, channel, n):
        """Buffer debloating: a request for ``channel`` finds nothing while
        it has ``n`` buffers out (None: no limit)."""
        cdef int32_t ch = self._channel_arg(channel)
        cdef int32_t limit = FB_UNBOUNDED if n is None else as_int32(n, "limit", 1)
        if ch < 0 or fb_localpool_set_channel_limit(&self._c, ch, limit) != FB_OK:
            raise ValueError(f"channel {channel!r} is not one of the pool's "
                             f"{self._c.num_subpartitions} channels")

    # ---- test hooks (flinkbuf._testing) --------------------------------------

    cdef double _request_recycle_ns(self, Py_ssize_t iterations) except -1.0:
        """Request+recycle pairs in C without the GIL, through the pool's
        ops (as C code of other layers calls them): ns per pair."""
        cdef int32_t index
        cdef Py_ssize_t i
        cdef int64_t t0, t1
        cdef int rc = FB_OK
        with nogil:
            t0 = fb_monotonic_ns()
            for i in range(iterations):
                rc = self._c.ops.request(&self._c, FB_NO_CHANNEL, &index)
                if rc != FB_OK:
                    break
                self._c.ops.recycle(&self._c, index)
            t1 = fb_monotonic_ns()
        if rc != FB_OK:
            raise RuntimeError("pool had no buffer for the benchmark loop")
        return (t1 - t0) / <double>(iterations if iterations > 0 else 1)

    def __repr__(self):
        cdef fb_localpool_stats_t st = self._stats()
        return (f"<flinkbuf.LocalBufferPool min={self._c.min_buffers} "
                f"max={self.max_buffers} num_buffers={st.size} "
                f"requested={st.num_requested} available={st.num_avail}"
                f"{' destroyed' if st.destroyed else ''}>")
