cdef class _GateDebloat:
    cdef BufferDebloatConfig _config
    cdef BufferDebloater _debloater     # None until a channel's segment size is known
    cdef int64_t _period_ns
    cdef int64_t _due_ns                # the next sample
    cdef int64_t _since                 # the last sample: its time, the gate's bytes
    cdef int64_t _bytes                 # taken and its idle time then
    cdef int64_t _idle
    cdef int32_t _in_use                # buffers in use at the last sample
    cdef int64_t _warm_until            # the gate's buffers taken that make the first sample
    cdef int64_t _given_back            # segments its channels gave back to their pools
    cdef int32_t _count                 # buffers a channel's in-flight data takes (0: any)

    # Every period (from the consumer's thread, now = fb_monotonic_ns()):
    # sample the gate and announce a new buffer size to its channels.
    cdef int _tick(self, InputGate gate, int64_t now) except -1
    cdef int _mark(self, InputGate gate, int64_t now) except -1
    cdef int32_t _buffer_count(self, int32_t seg, int32_t channels) noexcept
    cdef int _follow_floating(self, InputGate gate) except -1
    cdef object _metrics(self, InputGate gate)


# The gate's debloating for `config`, or None when it is off.
cdef _GateDebloat gate_debloat(BufferDebloatConfig config)
