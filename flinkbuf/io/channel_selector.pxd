cdef class ChannelSelector:
    cdef int32_t _n             # number of channels, 0 until set up
    cdef bint _broadcast
    cdef bint _initialised      # __init__ ran (subclasses that take arguments)
    cdef bint _bound            # set up by its RecordWriter: one writer, for good
    cdef int _init_once(self) except -1
    cdef int _setup(self, int32_t num_channels) except -1
    cdef int _bind(self, ResultPartition partition) except -1
    cdef int32_t _select(self, object record) except -1


cdef class RoundRobinSelector(ChannelSelector):
    cdef int32_t _next
    cdef object _start


cdef class RescaleSelector(ChannelSelector):
    cdef int32_t _next


cdef class HashSelector(ChannelSelector):
    cdef object _key            # callable or None
    cdef Py_ssize_t _key_index  # record[index] as the key, or -1
    cdef int32_t _max_parallelism
    cdef fb_key_assignment_t _assign    # hash code -> channel, once set up


cdef class BroadcastSelector(ChannelSelector):
    pass


cdef class ForwardSelector(ChannelSelector):
    pass


cdef class GlobalSelector(ChannelSelector):
    pass


cdef class CustomSelector(ChannelSelector):
    cdef object _fn


cdef class BacklogAwareRebalanceSelector(ChannelSelector):
    cdef int32_t _next
    cdef object _start
    cdef ResultPartition _partition
    cdef int32_t _max_backlog   # configured, or -1: from the pool size
    cdef int32_t _threshold     # in force
    cdef int32_t _cap           # the pool's per-channel cap, or -1
    cdef int32_t _countdown     # selections until the threshold is refreshed
    cdef int64_t _steered       # records sent elsewhere than round robin said
    cdef int32_t _compute_threshold(self) except -1
    cdef int _refresh(self) except -1
    cdef bint _is_blocked(self, int32_t channel) except -1
    cdef int32_t _wait_unblocked(self, double timeout) except -1
