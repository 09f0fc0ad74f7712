# The buffer core as one extension module; other modules cimport from here.
cdef class LocalBufferPool
include "memory_segment.pxd"
include "buffer.pxd"
include "buffer_pool.pxd"
