cdef class _ConsumeSignal:
    cdef fb_signal_t _c
    cdef bint _initialized


cdef class RecordWriter


cdef class ResultSubpartition:
    cdef fb_subpart_t _c
    cdef bint _initialized
    cdef int32_t _index
    cdef object _cause          # why the producer failed, once it did
    cdef _ConsumeSignal _signal
    cdef object __weakref__

    cdef LocalBufferPool _pool  # where queued segments return: alive while they are queued
    # Buffer debloating: the buffers its local consumer's in-flight data
    # should take (0: none said), and the size and limit the writer applied
    # to the pool last.
    cdef int32_t _count
    cdef int32_t _seen_size
    cdef int32_t _seen_count
    cdef int32_t _limit
    cdef int _add_buffer(self, Buffer buf, int32_t kind, bint last) except -1
    cdef int _add_bytes(self, bytes payload, bint last) except -1
    cdef int32_t _terminate(self, int32_t state) except -1


cdef class ResultPartition:
    cdef LocalBufferPool _pool
    cdef list _subpartitions
    cdef int32_t _n
    cdef int32_t _pool_channels  # the pool counts buffers per subpartition
    cdef int32_t _cap            # the pool's per-channel cap, or -1
    cdef object _name
    cdef object _cause
    cdef int _state              # _P_LIVE, _P_FINISHED, _P_FAILED, _P_RELEASED
    cdef bint _has_writer
    cdef object _writer          # weak reference to the RecordWriter, or None
    cdef _ConsumeSignal _signal  # posted when a consumer takes an item, a subpartition
                                 # ends, or a reader elsewhere is done
    cdef int32_t _readers        # readers elsewhere: connections serving a subpartition

    cdef int _raise_for_rc(self, int rc, int32_t index) except -1
    cdef int32_t _segment_size   # an event must fit one buffer
    # Buffer debloating, from the writer before it requests a buffer for
    # `sp`: its pool's channel limit follows the size (and, for a local
    # consumer, the count) announced, and the pool's demand the limits.
    cdef int _follow_debloat(self, ResultSubpartition sp) except -1
    cdef int32_t _demand
    cdef bytes _encode_event(self, object event)
    cdef int _add_event_all(self, bytes payload, bint last, RecordWriter writer) except -1
    cdef int _await_event_room(self, ResultSubpartition sp, RecordWriter writer) except -1
    cdef int _finish(self) except -1
    cdef int _check_initialised(self) except -1
    cdef bint _is_consumed(self) except -1
    # The contract of a reader in another process (a connection serving one
    # of the subpartitions): attached while it holds the partition, detached
    # when it is done; the partition is not consumed while one is attached.
    cdef int _reader_attached(self) except -1
    cdef int _reader_detached(self) except -1
    cdef int32_t _reader_count(self) noexcept
