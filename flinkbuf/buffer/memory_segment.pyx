# MemorySegment: a bounds-checked window onto off-heap memory.
# Included by _buffer.pyx.  No other layer cimports it (the layers above
# reach memory through Buffer), so it is declared here, not in a .pxd.

cdef enum SegmentKind:
    SEG_STANDALONE = 0   # owns memory from MemorySegment.allocate
    SEG_UNPOOLED = 1     # an exclusive segment of a NetworkBufferPool
    SEG_BUFFER = 2       # the segment under a Buffer; valid while the Buffer is


@cython.final
@cython.no_gc_clear
cdef class MemorySegment:
    """A fixed-size block of off-heap memory: an address and a length.

    Segments come from :meth:`allocate` (standalone, freed by :meth:`free`),
    from :meth:`NetworkBufferPool.request_unpooled_segments`, or as
    :attr:`Buffer.segment`.  Every access is bounds-checked (``IndexError``);
    access after free, return or recycle raises :class:`SegmentFreedError`
    or :class:`RecycledBufferError`.  Offsets and lengths are any ``int``
    or object with ``__index__`` (else ``TypeError``); one out of bounds,
    however large, is an ``IndexError``.  The segment supports the buffer
    protocol: ``memoryview(seg)`` is writable and ``numpy.frombuffer(seg,
    ...)`` is zero-copy; while such views exist it cannot be freed.  The
    segment of a read-only buffer (:attr:`Buffer.is_read_only`) is
    read-only: writes raise :class:`ReadOnlyBufferError`.
    """
    cdef char *_data
    cdef Py_ssize_t _size
    cdef object _owner        # keeps the memory alive (pool or Buffer)
    cdef int32_t _index       # segment number in its arena, -1 standalone
    cdef SegmentKind _kind
    cdef Py_ssize_t _exports
    cdef bint _readonly       # the segment of a lent Buffer: reads only

    def __cinit__(self):
        self._data = NULL
        self._size = 0
        self._owner = None
        self._index = -1
        self._kind = SEG_STANDALONE
        self._exports = 0

    def __init__(self):
        raise TypeError("MemorySegment cannot be created directly; use "
                        "MemorySegment.allocate() or a pool")

    def __dealloc__(self):
        if self._data == NULL:
            return
        if self._kind == SEG_STANDALONE:
            FB_DBG_ADD(FB_DBG_SEGMENTS, -1)
            fb_aligned_free(self._data)
        elif self._kind == SEG_UNPOOLED:
            # Dropped without recycle_unpooled_segments: give it back, which
            # may make local pools available.
            self._data = NULL
            nbp = <NetworkBufferPool>self._owner
            fb_netpool_recycle_unpooled(&nbp._c, &self._index, 1)
            if nbp._listening:
                try:
                    nbp._dispatch_listeners()
                except BaseException:
                    write_unraisable(self)
        self._data = NULL

    @staticmethod
    def allocate(size, alignment=64):
        """A standalone zeroed segment of ``size`` bytes aligned to ``alignment``
        (a power of two in [64, 2**30]).  Release it with :meth:`free`.
        ``MemoryError`` if it cannot be allocated, however large ``size`` is."""
        cdef Py_ssize_t n = fb_as_position(size)
        cdef Py_ssize_t align = fb_as_position(alignment)
        if n <= 0:
            raise ValueError(f"size must be positive, got {size}")
        if align < 64 or align > (1 << 30) or not fb_is_pow2(<size_t>align):
            raise ValueError(f"alignment must be a power of two in [64, 2**30], got {alignment}")
        # A clamped size is past the address space: nothing to ask malloc for.
        cdef void *p = NULL if n == PY_SSIZE_T_MAX else fb_aligned_alloc(<size_t>n, <size_t>align)
        if p == NULL:
            raise MemoryError(f"cannot allocate a segment of {size} bytes")
        cdef MemorySegment seg = MemorySegment.__new__(MemorySegment)
        seg._data = <char *>p
        seg._size = n
        FB_DBG_ADD(FB_DBG_SEGMENTS, 1)
        return seg

    cdef int _check(self, Py_ssize_t offset, Py_ssize_t n) except -1:
        if self._data == NULL:
            raise SegmentFreedError("memory segment was freed or returned to its pool")
        if self._kind == SEG_BUFFER and (<Buffer>self._owner)._data == NULL:
            raise RecycledBufferError("the buffer of this segment was recycled")
        if offset < 0 or n < 0 or offset > self._size - n:
            raise IndexError(f"access of {_shown(n)} bytes at offset {_shown(offset)} is "
                             f"out of bounds of a {self._size}-byte segment")
        return 0

    cdef Py_ssize_t _at(self, object offset, Py_ssize_t n) except -1:
        """``offset`` (any int) checked for an access of ``n`` bytes."""
        cdef Py_ssize_t off = fb_as_position(offset)
        self._check(off, n)
        return off

    cdef Py_ssize_t _put_at(self, object offset, Py_ssize_t n) except -1:
        """As ``_at``, for a write."""
        cdef Py_ssize_t off = self._at(offset, n)
        if self._readonly:
            raise ReadOnlyBufferError(_READ_ONLY)
        return off

    cdef int _invalidate(self) except -1:
        if self._exports:
            raise ExportedBufferError(
                f"segment has {self._exports} exported buffer view(s); release them first")
        self._data = NULL
        return 0

    @property
    def address(self):
        """The address of the first byte (an ``int``)."""
        self._check(0, 0)
        return <size_t>self._data

    @property
    def size(self):
        """The size in bytes."""
        return self._size

    @property
    def is_freed(self):
        """True once the segment may no longer be accessed."""
        if self._data == NULL:
            return True
        return self._kind == SEG_BUFFER and (<Buffer>self._owner)._data == NULL

    def free(self):
        """Free a standalone segment.  ``ExportedBufferError`` while views
        exist, ``SegmentFreedError`` if already freed; pooled segments are
        returned through their pool instead (``TypeError``)."""
        if self._kind == SEG_UNPOOLED:
            raise TypeError("return unpooled segments with "
                            "NetworkBufferPool.recycle_unpooled_segments()")
        if self._kind == SEG_BUFFER:
            raise TypeError("a buffer's segment is returned by Buffer.recycle()")
        if self._data == NULL:
            raise SegmentFreedError("memory segment was already freed")
        cdef char *p = self._data
        self._invalidate()
        FB_DBG_ADD(FB_DBG_SEGMENTS, -1)
        fb_aligned_free(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._kind == SEG_STANDALONE and self._data != NULL:
            self.free()

    def __len__(self):
        return self._size

    def __repr__(self):
        state = "freed" if self.is_freed else f"address=0x{<size_t>self._data:x}"
        return f"<flinkbuf.MemorySegment size={self._size} {state}>"

    def __getbuffer__(self, Py_buffer *view, int flags):
        self._check(0, 0)
        if self._readonly and flags & PyBUF_WRITABLE:
            raise ReadOnlyBufferError(_READ_ONLY)
        PyBuffer_FillInfo(view, self, self._data, self._size, self._readonly, flags)
        self._exports += 1
        if self._kind == SEG_BUFFER:
            (<Buffer>self._owner)._seg_exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self._exports -= 1
        if self._kind == SEG_BUFFER:
            (<Buffer>self._owner)._seg_exports -= 1

    # -- typed access ------------------------------------------------------

    def get_int8(self, offset):
        cdef Py_ssize_t off = self._at(offset, 1)
        return <int8_t>self._data[off]

    def get_uint8(self, offset):
        cdef Py_ssize_t off = self._at(offset, 1)
        return <uint8_t>self._data[off]

    def put_int8(self, offset, int8_t value):
        cdef Py_ssize_t off = self._put_at(offset, 1)
        self._data[off] = <char>value

    def put_uint8(self, offset, uint8_t value):
        cdef Py_ssize_t off = self._put_at(offset, 1)
        self._data[off] = <char>value

    def get_int16(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 2)
        return <int16_t>fb_load_u16(self._data + off, big_endian)

    def get_uint16(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 2)
        return fb_load_u16(self._data + off, big_endian)

    def put_int16(self, offset, int16_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 2)
        fb_store_u16(self._data + off, <uint16_t>value, big_endian)

    def put_uint16(self, offset, uint16_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 2)
        fb_store_u16(self._data + off, value, big_endian)

    def get_int32(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 4)
        return <int32_t>fb_load_u32(self._data + off, big_endian)

    def get_uint32(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 4)
        return fb_load_u32(self._data + off, big_endian)

    def put_int32(self, offset, int32_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 4)
        fb_store_u32(self._data + off, <uint32_t>value, big_endian)

    def put_uint32(self, offset, uint32_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 4)
        fb_store_u32(self._data + off, value, big_endian)

    def get_int64(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 8)
        return <int64_t>fb_load_u64(self._data + off, big_endian)

    def get_uint64(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 8)
        return fb_load_u64(self._data + off, big_endian)

    def put_int64(self, offset, int64_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 8)
        fb_store_u64(self._data + off, <uint64_t>value, big_endian)

    def put_uint64(self, offset, uint64_t value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 8)
        fb_store_u64(self._data + off, value, big_endian)

    def get_float32(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 4)
        return fb_load_f32(self._data + off, big_endian)

    def put_float32(self, offset, float value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 4)
        fb_store_f32(self._data + off, value, big_endian)

    def get_float64(self, offset, bint big_endian=False):
        cdef Py_ssize_t off = self._at(offset, 8)
        return fb_load_f64(self._data + off, big_endian)

    def put_float64(self, offset, double value, bint big_endian=False):
        cdef Py_ssize_t off = self._put_at(offset, 8)
        fb_store_f64(self._data + off, value, big_endian)

    # -- bulk access -------------------------------------------------------

    def get_bytes(self, offset, length):
        """``length`` bytes from ``offset`` as ``bytes``."""
        cdef Py_ssize_t n = fb_as_position(length)
        cdef Py_ssize_t off = self._at(offset, n)
        return PyBytes_FromStringAndSize(self._data + off, n)

    def put_bytes(self, offset, data):
        """Copy a bytes-like object to ``offset``."""
        cdef Py_ssize_t off = fb_as_position(offset)
        cdef Py_buffer pb
        PyObject_GetBuffer(data, &pb, PyBUF_SIMPLE)
        try:
            self._check(off, pb.len)
            if self._readonly:
                raise ReadOnlyBufferError(_READ_ONLY)
            memmove(self._data + off, pb.buf, pb.len)
        finally:
            PyBuffer_Release(&pb)

    def copy_to(self, offset, MemorySegment target not None, target_offset, length):
        """Copy ``length`` bytes at ``offset`` into ``target`` at ``target_offset``
        (the two ranges may overlap)."""
        cdef Py_ssize_t n = fb_as_position(length)
        cdef Py_ssize_t off = self._at(offset, n)
        cdef Py_ssize_t target_off = target._put_at(target_offset, n)
        memmove(target._data + target_off, self._data + off, n)

    def compare(self, MemorySegment other not None, offset, other_offset, length):
        """Compare bytes lexicographically (unsigned): -1, 0 or 1."""
        cdef Py_ssize_t n = fb_as_position(length)
        cdef Py_ssize_t off = self._at(offset, n)
        cdef Py_ssize_t other_off = other._at(other_offset, n)
        cdef int c = memcmp(self._data + off, other._data + other_off, n)
        return (c > 0) - (c < 0)
