from libc.stdint cimport int32_t


cdef class Buffer:
    cdef LocalBufferPool _pool
    cdef char *_data          # NULL once the last reference is recycled
    cdef int32_t _index
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _reader
    cdef Py_ssize_t _writer   # the size: bytes written so far
    # Counters as wide as the objects that can hold them: they cannot wrap.
    cdef Py_ssize_t _refcnt
    cdef Py_ssize_t _exports       # views of the buffer itself
    cdef Py_ssize_t _seg_exports   # views of MemorySegments over it
    cdef int _data_type

    cdef int _check(self) except -1
    cdef int _release(self) except -1
    cdef int _detach(self) except -1
