from libc.stdint cimport int32_t
from flinkbuf.csrc.pool cimport fb_localpool_stats_t, fb_localpool_t, fb_netpool_t


cdef class NetworkBufferPool:
    # The contract: the C pool (csrc/buffer/pool.h), for the C code of the
    # layers above (a shared pool's memfd, its segments' addresses).
    cdef fb_netpool_t _c
    # Internal.
    cdef bint _initialized
    cdef size_t _alignment
    cdef bint _shared
    cdef set _listening          # LocalBufferPools with pending listeners

    # PoolDestroyedError once destroyed.
    cdef int _check_live(self) except -1
    # Internal: run the availability listeners that are due.
    cdef int _dispatch_listeners(self) except -1

    # Test hook (flinkbuf._testing): one redistribution now.
    cdef int _redistribute_now(self) except -1


cdef class LocalBufferPool:
    # The contract: the C pool (csrc/buffer/pool.h), whose ops C code of
    # the layers above calls to request and recycle segments without the GIL.
    cdef fb_localpool_t _c
    # Internal.
    cdef NetworkBufferPool _nbp
    cdef bint _created
    cdef list _listeners

    # A Buffer over a segment of this pool that C code requested.
    cdef Buffer _wrap(self, int32_t index)
    # request_buffer() and request_buffer_blocking() for a channel
    # (FB_NO_CHANNEL: none) already checked.
    cdef Buffer _request(self, int32_t channel)
    cdef Buffer _request_blocking(self, int32_t channel, double timeout)
    cdef fb_localpool_stats_t _stats(self)
    # C code returned segments of this pool: run the listeners a Python
    # recycle would have.
    cdef int _recycled_in_c(self) except -1
    # Internal: a request's channel argument, checked.
    cdef int32_t _channel_arg(self, object channel) except? -2

    # Test hook (flinkbuf._testing): request+recycle pairs timed in C.
    cdef double _request_recycle_ns(self, Py_ssize_t iterations) except -1.0
