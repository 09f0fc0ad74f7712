cdef class RecordWriter:
    cdef ResultPartition _partition
    cdef LocalBufferPool _pool
    cdef ChannelSelector _selector
    cdef RecordSerializer _ser
    cdef list _current          # per channel: the Buffer being filled, or None; made once
                                # by __init__, never resized (emit_all keeps its items pointer)
    cdef list _subparts         # the partition's ResultSubpartitions
    cdef int32_t _n
    cdef bint _broadcast
    cdef bint _round_robin      # the selector is exactly a RoundRobinSelector
    cdef int _busy              # _IDLE, _EMITTING, _BROADCASTING (the flusher waits)
    cdef bint _flush_pending    # the flusher came while busy
    cdef bint _flush_always     # buffer timeout 0
    cdef bint _broken           # a record was left half written (in a live channel)
    cdef int _state             # _W_NEW, _W_OPEN, _W_CLOSED, _W_FAILED
    cdef unsigned long _user    # thread in a call (emit, flush, close...), 0 if none
    cdef object _timeout
    cdef object _flusher
    cdef object _flusher_stop
    cdef object _flusher_error
    cdef object _name
    cdef object __weakref__
    # metrics (touched under the GIL only)
    cdef int64_t _records_out
    cdef int64_t _bytes_out
    cdef int64_t _buffers_out
    cdef int64_t _bp_ns         # time blocked requesting buffers, finished waits
    cdef int64_t _bp_since      # start of the current wait, or 0
    cdef int64_t _soft_bp_ns    # of _bp_ns: soft back-pressured time (back_pressure.pyx)
    cdef int64_t _soft_since    # start of the current soft stretch of a wait, or 0
    cdef int64_t _soft_base     # in broadcast_event: _bp_ns at its start (its waits are
                                # soft), else -1

    cdef inline int _enter(self) except -1
    cdef int _concurrent_use(self) except -1
    cdef inline int _emit(self, object record) except -1
    cdef int _emit_entered(self, object record) except -1
    cdef Py_ssize_t _emit_all(self, object records) except -1   # emit_all.pyx
    cdef int32_t _bad_channel(self, int32_t channel) except -1
    cdef int _broadcast_emit(self, object record) except -1
    cdef int _channel_released(self, int32_t channel) except -1
    cdef int _skip_released(self, int32_t channel) except -1
    cdef int _drop_record(self, int32_t channel) except -1
    cdef int _drop_current(self, int32_t channel) except -1
    cdef int32_t _await_channel(self) except -1
    cdef int _copy_rest(self, int32_t channel, Buffer buf, int flags) except -1
    cdef Buffer _request_buffer(self, int32_t channel)
    cdef int _check_partition(self) except -1
    cdef bint _target_released(self, int32_t channel) except -1
    cdef int _hand_over(self, int32_t channel, Buffer buf) except -1
    cdef int _flush_all(self, int mode) except -1
    cdef int _release_current(self) except -1
    cdef int _check_open(self) except -1
    cdef int _close(self) except -1
