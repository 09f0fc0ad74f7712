cdef class InputChannel:
    cdef int32_t _index         # position in its gate, -1 before connecting
    cdef int _connect(self, InputGate gate, int32_t index) except -1
    cdef int _poll(self, fb_item_t *out) except -1
    cdef object _take(self, fb_item_t *item)
    cdef int _release(self, InputGate gate) except -1
    cdef int _disconnect(self, InputGate gate) except -1
    cdef int _discard(self) except -1
    cdef object _failure(self)
    cdef object _channel_error(self)
    cdef int32_t _backlog(self) except -1
    cdef object _source_pool(self)
    cdef object _own_buffer_counters(self)
    # Buffer debloating (the consumer's thread): the buffer size the gate
    # wants (bytes, checked: min..segment size) told to the producer, and
    # the buffers and bytes in flight toward this consumer right now.
    cdef int _announce_buffer_size(self, int32_t size, int32_t count) except -1
    cdef int32_t _buffers_in_use(self) except -1
    # The gate's reader has read everything it took from this channel
    # (credit a debloated channel held back may go to the producer now).
    cdef int _reader_dry(self) except -1
    # The size of the segments its producer's buffers come in (0: not known).
    cdef int32_t _segment_size(self) except -1


cdef class LocalInputChannel(InputChannel):
    cdef ResultPartition _partition
    cdef ResultSubpartition _sp
    cdef int32_t _subpartition


cdef class UnknownInputChannel(InputChannel):
    cdef object _gate           # a weak reference to the gate it joined, or None
    cdef InputChannel _channel  # the channel it stands for, once known
    cdef object _error          # why that will never be known, or None
    cdef bint _released
    cdef int32_t _buffer_size   # the size announced, passed on to the channel it becomes
    cdef int32_t _buffer_count
    cdef readonly object partition_id
    cdef readonly object subpartition
    cdef object __weakref__
    cdef InputGate _joined(self)


cdef class InputGate:
    cdef fb_gate_t _c
    cdef bint _initialized
    cdef list _channels
    cdef list _deserializers
    cdef list _finished         # per channel: EndOfPartition seen
    cdef int32_t _n
    cdef int32_t _num_finished
    cdef int32_t _current       # channel whose deserializer may hold records, or -1
    cdef RecordDeserializer _cur_des   # that deserializer, or None
    cdef object _codec
    cdef object _max_record_size
    cdef object _name
    cdef object _error          # the error that ended the gate, raised again
    cdef bint _closed
    cdef object __weakref__
    # metrics (touched under the GIL only)
    cdef int64_t _records_in
    cdef int64_t _bytes_in
    cdef int64_t _buffers_in
    cdef int64_t _idle_ns
    cdef int64_t _idle_since
    # buffer debloating (None: off), sampled every _TICK_RECORDS records and
    # every buffer
    cdef _GateDebloat _debloat
    cdef BufferDebloatConfig _debloat_config
    cdef int32_t _countdown
    cdef int _debloat_tick(self) except -1

    cdef object _deferred       # an error read_many met after its first item, raised next
    cdef inline object _next(self, int32_t *channel)
    cdef inline object _current_record(self)
    cdef object _advance(self, int32_t *channel, bint block)
    cdef object _raise_deferred(self)
    cdef int _read_rest(self, list out, Py_ssize_t limit) except -1
    cdef int _wait_item(self, int32_t *channel, fb_item_t *item, bint block) except -1
    cdef int _check_open(self) except -1
