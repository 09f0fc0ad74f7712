from libc.stdint cimport int32_t
from flinkbuf.csrc.pool cimport fb_localpool_t


cdef class Buffer:
    # The contract: the layers above read and move the bytes through these
    # fields directly (a serializer copies at _data + _writer up to
    # _capacity, a deserializer reads [_reader, _writer)); _lp and _index
    # name the segment when C code (a queue, a connection) takes it over.
    cdef LocalBufferPool _pool    # None for a segment lent by another process
    cdef fb_localpool_t *_lp      # where the segment returns (_pool's, or a lender's)
    cdef char *_data          # NULL once the last reference is recycled
    cdef int32_t _index
    cdef Py_ssize_t _capacity
    cdef Py_ssize_t _reader
    cdef Py_ssize_t _writer   # the size: bytes written so far
    cdef int _data_type       # 0 data, 1 event (DataType)
    # Internal: the reference count and the views that hold the memory
    # (read through _check_detachable, never written outside this layer).
    # Counters as wide as the objects that can hold them: they cannot wrap.
    cdef Py_ssize_t _refcnt
    cdef Py_ssize_t _exports       # views of the buffer itself
    cdef Py_ssize_t _seg_exports   # views of MemorySegments over it
    cdef bint _readonly           # lent by another process: its memory is mapped read-only

    # RecycledBufferError once recycled.
    cdef int _check(self) except -1
    # Drop one reference; the last returns the segment (recycle()).
    cdef int _release(self) except -1
    # ValueError / ExportedBufferError unless this is the sole reference
    # and no view is exported: what handing the segment over requires.
    cdef int _check_detachable(self) except -1
    # Hand the segment (_lp, _index, _data, read before) over to C code;
    # afterwards this object is recycled.
    cdef int _detach(self) except -1

    # Test hooks (flinkbuf._testing): states no public call reaches.
    cdef int _set_ref_count(self, Py_ssize_t count) except -1
    cdef int _make_read_only(self) except -1


# A read-only Buffer of `size` bytes over a segment lent by another process
# (`lp` is where its recycle goes: a pool whose ops are not this module's).
cdef Buffer lent_buffer(fb_localpool_t *lp, int32_t index, Py_ssize_t size)
