from libc.stdint cimport int32_t
from flinkbuf.csrc.pool cimport fb_localpool_t


cdef class Buffer:
    cdef LocalBufferPool _pool    # None for a segment lent by another process
    cdef fb_localpool_t *_lp      # where the segment returns (_pool's, or a lender's)
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
    cdef bint _readonly           # lent by another process: its memory is mapped read-only

    cdef int _check(self) except -1
    cdef int _release(self) except -1
    cdef int _detach(self) except -1


# A read-only Buffer of `size` bytes over a segment lent by another process
# (`lp` is where its recycle goes: a pool whose ops are not this module's).
cdef Buffer lent_buffer(fb_localpool_t *lp, int32_t index, Py_ssize_t size)
