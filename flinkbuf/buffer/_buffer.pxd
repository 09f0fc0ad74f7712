# The buffer core as one extension module; other modules cimport from here.
cdef class LocalBufferPool
include "buffer.pxd"
include "buffer_pool.pxd"
