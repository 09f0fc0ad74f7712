# Buffer: a reference-counted view of one pooled segment.  Included by _buffer.pyx.

class DataType(enum.IntEnum):
    """What a buffer carries: serialized records or an in-band event."""
    DATA_BUFFER = 0
    EVENT_BUFFER = 1


@cython.final
@cython.no_gc_clear
@cython.freelist(64)
cdef class Buffer:
    """One pooled memory segment with reader and writer indices.

    ``size`` (the writer index) counts the bytes written; ``reader_index``
    marks how far they were read; ``memoryview(buf)`` is the unread bytes
    ``[reader_index, size)``.  The buffer is reference counted: ``retain()``
    adds a reference, ``recycle()`` drops one, and the segment goes back to
    its pool exactly once, when the count reaches zero.  After that every
    use raises :class:`RecycledBufferError`; recycling while views are
    exported raises :class:`ExportedBufferError`.  A buffer dropped without
    recycling is recycled when it is garbage collected.  ``size`` and
    ``reader_index`` take any ``int`` (``ValueError`` out of range, however
    large).  A Buffer not made by a pool (``Buffer.__new__(Buffer)``)
    behaves as a recycled one.

    A buffer received over shared memory may be *lent*: its segment is the
    producer's, in another process, mapped read-only here, and its last
    recycle hands it back to that producer.  Such a buffer is read-only
    (:attr:`is_read_only`): ``write``, writable views and its segment's
    ``put_*`` raise :class:`ReadOnlyBufferError`; ``bytes(buf)`` copies it.
    """

    def __init__(self):
        raise TypeError("Buffers come from LocalBufferPool.request_buffer()")

    def __dealloc__(self):
        if self._data != NULL:
            FB_DBG_ADD(FB_DBG_BUFFERS, -1)
            self._data = NULL
            self._refcnt = 0
            fb_localpool_recycle(self._lp, self._index)
            if self._pool is not None and self._pool._nbp._listening:
                try:
                    self._pool._nbp._dispatch_listeners()
                except BaseException:
                    write_unraisable(self)

    cdef int _check(self) except -1:
        if self._data == NULL:
            raise RecycledBufferError("buffer was recycled")
        return 0

    cdef int _release(self) except -1:
        """Drop one reference; the last one returns the segment."""
        if self._data == NULL:
            raise RecycledBufferError("buffer was already recycled")
        if self._refcnt == 1:
            if self._exports or self._seg_exports:
                raise ExportedBufferError(
                    f"buffer has {self._exports + self._seg_exports} exported view(s); "
                    "release them before the last recycle")
            self._data = NULL
            self._refcnt = 0
            FB_DBG_ADD(FB_DBG_BUFFERS, -1)
            if fb_localpool_recycle(self._lp, self._index) != FB_OK:
                raise RuntimeError("internal error: segment was not out of its pool")
            if self._pool is not None and self._pool._nbp._listening:
                self._pool._nbp._dispatch_listeners()
        else:
            self._refcnt -= 1
        return 0

    cdef int _check_detachable(self) except -1:
        """Only the sole reference, with no view exported, may be handed
        over: whoever holds another could still write to the segment."""
        if self._data == NULL:
            raise RecycledBufferError("buffer was recycled")
        if self._refcnt != 1:
            raise ValueError(f"a buffer with {self._refcnt} references cannot be handed over: "
                             "whoever holds the others could still write to it")
        if self._exports or self._seg_exports:
            raise ExportedBufferError(
                f"buffer has {self._exports + self._seg_exports} exported view(s); "
                "release them before handing it over")
        return 0

    cdef int _detach(self) except -1:
        """Hand the segment over to C code (a queue), which returns it to
        the pool itself: afterwards this object is recycled, and the segment
        (``_lp``, ``_index``, ``_data``, read before) is the caller's.
        Only the sole reference, with no view exported, may be detached."""
        self._check_detachable()
        self._data = NULL
        self._refcnt = 0
        FB_DBG_ADD(FB_DBG_BUFFERS, -1)
        return 0

    def recycle(self):
        """Drop one reference; the last returns the segment to its pool."""
        self._release()

    def retain(self):
        """Add a reference (to be dropped by another ``recycle()``); returns self.
        ``OverflowError`` rather than a count past ``sys.maxsize``."""
        self._check()
        if self._refcnt == PY_SSIZE_T_MAX:
            raise OverflowError(f"buffer reference count cannot exceed {PY_SSIZE_T_MAX}")
        self._refcnt += 1
        return self

    def __enter__(self):
        self._check()
        return self

    def __exit__(self, *exc):
        self._release()

    @property
    def ref_count(self):
        """References still held; 0 once recycled."""
        return self._refcnt

    @property
    def is_recycled(self):
        return self._data == NULL

    @property
    def pool(self):
        """The :class:`LocalBufferPool` the segment returns to; ``None`` for a
        segment lent by a producer in another process."""
        if self._pool is None and self._lp == NULL:
            raise RecycledBufferError("buffer was not handed out by a pool")
        return self._pool

    @property
    def is_read_only(self):
        """True for a buffer lent by a producer in another process (received
        over shared memory): its bytes can be read, not changed."""
        return self._readonly

    @property
    def segment(self):
        """The whole underlying :class:`MemorySegment` (writable unless the
        buffer is read-only); valid until the buffer is recycled."""
        self._check()
        cdef MemorySegment seg = MemorySegment.__new__(MemorySegment)
        seg._data = self._data
        seg._size = self._capacity
        seg._owner = self
        seg._index = self._index
        seg._kind = SEG_BUFFER
        seg._readonly = self._readonly
        return seg

    @property
    def capacity(self):
        """Bytes the buffer can hold (the pool's segment size)."""
        return self._capacity

    @property
    def size(self):
        """The writer index: bytes written so far."""
        self._check()
        return self._writer

    @size.setter
    def size(self, value):
        cdef Py_ssize_t v = fb_as_position(value)
        self._check()
        if v < self._reader or v > self._capacity:
            raise ValueError(f"size must be in [{self._reader}, {self._capacity}], got {value}")
        self._writer = v

    @property
    def reader_index(self):
        """Bytes already read; ``0 <= reader_index <= size``."""
        self._check()
        return self._reader

    @reader_index.setter
    def reader_index(self, value):
        cdef Py_ssize_t v = fb_as_position(value)
        self._check()
        if v < 0 or v > self._writer:
            raise ValueError(f"reader_index must be in [0, {self._writer}], got {value}")
        self._reader = v

    @property
    def readable_bytes(self):
        self._check()
        return self._writer - self._reader

    @property
    def writable_bytes(self):
        self._check()
        return self._capacity - self._writer

    @property
    def data_type(self):
        """:class:`DataType` of the contents (data by default)."""
        self._check()
        return DataType(self._data_type)

    @data_type.setter
    def data_type(self, value):
        self._check()
        self._data_type = int(DataType(value))

    @property
    def is_buffer(self):
        """True for data, False for an event."""
        self._check()
        return self._data_type == 0

    def write(self, data):
        """Append a bytes-like object at the writer index (``ValueError`` if it
        does not fit); returns the number of bytes written."""
        self._check()
        if self._readonly:
            raise ReadOnlyBufferError(_READ_ONLY)
        cdef Py_buffer pb
        PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
        try:
            if pb.len > self._capacity - self._writer:
                raise ValueError(f"{pb.len} bytes do not fit in the "
                                 f"{self._capacity - self._writer} writable bytes")
            memmove(self._data + self._writer, pb.buf, pb.len)
            self._writer += pb.len
            return pb.len
        finally:
            PyBuffer_Release(&pb)

    def read(self, n=-1):
        """Up to ``n`` unread bytes (all if negative), advancing the reader index."""
        cdef Py_ssize_t k = fb_as_position(n)
        self._check()
        cdef Py_ssize_t avail = self._writer - self._reader
        if k < 0 or k > avail:
            k = avail
        out = PyBytes_FromStringAndSize(self._data + self._reader, k)
        self._reader += k
        return out

    def __getbuffer__(self, Py_buffer *view, int flags):
        self._check()
        if self._readonly and flags & PyBUF_WRITABLE:
            raise ReadOnlyBufferError(_READ_ONLY)
        PyBuffer_FillInfo(view, self, self._data + self._reader,
                          self._writer - self._reader, self._readonly, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self._exports -= 1

    # ---- test hooks (flinkbuf._testing) --------------------------------------

    cdef int _set_ref_count(self, Py_ssize_t count) except -1:
        """Set a live buffer's reference count (>= 1), to reach the limits
        without 2**63 calls to retain()."""
        self._check()
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self._refcnt = count
        return 0

    cdef int _make_read_only(self) except -1:
        """Make a live buffer read-only, as a buffer lent by another process
        is (its memory stays writable: tests check that nothing writes it)."""
        self._check()
        self._readonly = True
        return 0

    def __repr__(self):
        if self._data == NULL:
            return "<flinkbuf.Buffer recycled>"
        return (f"<flinkbuf.Buffer size={self._writer} reader_index={self._reader} "
                f"capacity={self._capacity} ref_count={self._refcnt}>")


cdef Buffer segment_buffer(LocalBufferPool pool, fb_localpool_t *lp, int32_t index):
    """A Buffer over segment ``index`` of ``lp`` (where its recycle goes),
    whose Python pool is ``pool`` (None: a lender's)."""
    cdef Buffer buf = Buffer.__new__(Buffer)
    buf._pool = pool
    buf._lp = lp
    buf._index = index
    buf._data = fb_segment_address(lp.net, index)
    buf._capacity = lp.net.segment_size
    buf._refcnt = 1
    FB_DBG_ADD(FB_DBG_BUFFERS, 1)
    return buf


cdef Buffer lent_buffer(fb_localpool_t *lp, int32_t index, Py_ssize_t size):
    cdef Buffer buf = segment_buffer(None, lp, index)
    buf._writer = size
    buf._readonly = True
    return buf
