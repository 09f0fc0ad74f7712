from libc.stdint cimport int32_t
from flinkbuf.csrc.pool cimport fb_localpool_stats_t, fb_localpool_t, fb_netpool_t


cdef class NetworkBufferPool:
    cdef fb_netpool_t _c
    cdef bint _initialized
    cdef size_t _alignment
    cdef bint _shared
    cdef set _listening          # LocalBufferPools with pending listeners

    cdef int _check_live(self) except -1
    cdef int _dispatch_listeners(self) except -1
    cdef int _redistribute_now(self) except -1


cdef class LocalBufferPool:
    cdef fb_localpool_t _c
    cdef NetworkBufferPool _nbp
    cdef bint _created
    cdef list _listeners

    cdef Buffer _wrap(self, int32_t index)
    cdef Buffer _request(self, int32_t channel)
    cdef Buffer _request_blocking(self, int32_t channel, double timeout)
    cdef int32_t _channel_arg(self, object channel) except? -2
    cdef fb_localpool_stats_t _stats(self)
    cdef int _recycled_in_c(self) except -1
