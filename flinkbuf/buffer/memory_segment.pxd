from libc.stdint cimport int32_t

cdef enum SegmentKind:
    SEG_STANDALONE = 0   # owns memory from MemorySegment.allocate
    SEG_UNPOOLED = 1     # an exclusive segment of a NetworkBufferPool
    SEG_BUFFER = 2       # the segment under a Buffer; valid while the Buffer is


cdef class MemorySegment:
    cdef char *_data
    cdef Py_ssize_t _size
    cdef object _owner        # keeps the memory alive (pool or Buffer)
    cdef int32_t _index       # segment number in its arena, -1 standalone
    cdef SegmentKind _kind
    cdef Py_ssize_t _exports
    cdef bint _readonly       # the segment of a lent Buffer: reads only

    cdef int _check(self, Py_ssize_t offset, Py_ssize_t n) except -1
    cdef Py_ssize_t _at(self, object offset, Py_ssize_t n) except -1
    cdef Py_ssize_t _put_at(self, object offset, Py_ssize_t n) except -1
    cdef int _invalidate(self) except -1
