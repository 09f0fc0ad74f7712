# An input gate's buffer debloating (Flink's FLIP-183): every period the
# gate's throughput (the bytes it took over the time it did not wait for
# data) and the buffers in flight toward it give the buffer size that keeps
# its in-flight data near the target time (BufferDebloater); a new size is
# announced to every channel still open, which tells its producer.

cdef enum:
    _TICK_RECORDS = 64      # records between two looks at the clock
    _WARM_BUFFERS = 32      # buffers taken that make the first sample


cdef BufferDebloatConfig _DEBLOAT_OFF = BufferDebloatConfig()


cdef _GateDebloat gate_debloat(BufferDebloatConfig config):
    if not config._enabled:
        return None
    cdef _GateDebloat d = _GateDebloat.__new__(_GateDebloat)
    d._config = config
    d._period_ns = <int64_t>(config._period * 1e9)
    return d


cdef inline int64_t _consumed(InputGate gate):
    """The bytes the gate's reader has read so far: those of the buffers it
    took, but for what is left of the one it reads (a period shorter than
    a buffer's reading would see its bytes all at once, then none)."""
    cdef RecordDeserializer des = gate._cur_des
    if des is None:
        return gate._bytes_in
    return gate._bytes_in - (des._cur_end - des._cur_pos)


@cython.final
cdef class _GateDebloat:
    """What an input gate keeps to debloat its buffers (internal)."""

    def __init__(self):
        raise TypeError("_GateDebloat is made by InputGate")

    cdef int _tick(self, InputGate gate, int64_t now) except -1:
        cdef int32_t seg = 0, size, in_use = 0, k
        # Started small (BufferDebloater's start_small), the first sample
        # comes after a tenth of the period or _WARM_BUFFERS buffers: a fast
        # consumer's producers leave small buffers at once.
        if now < self._due_ns and not (self._debloater is not None and self._debloater._c.warm
                                       and gate._buffers_in >= self._warm_until):
            return 0
        # Started small, or the size rising at its doubling bound: sooner.
        self._due_ns = now + (self._period_ns if self._debloater is not None
                              and not self._debloater._c.warm
                              and not self._debloater._c.rising else self._period_ns // 10)
        if self._debloater is None:
            for k in range(gate._n):
                seg = max(seg, (<InputChannel>gate._channels[k])._segment_size())
            if seg > 0:
                self._debloater = BufferDebloater(self._config, seg, start_small=True)
                self._warm_until = gate._buffers_in + _WARM_BUFFERS
                self._mark(gate, now)
            return 0
        for k in range(gate._n):
            if not gate._finished[k]:
                in_use += (<InputChannel>gate._channels[k])._buffers_in_use()
        size = self._debloater._sample(_consumed(gate) - self._bytes,
                                       (now - self._since) - (gate._idle_ns - self._idle),
                                       in_use)
        self._in_use = in_use
        self._mark(gate, now)
        count = self._buffer_count(self._debloater._c.cfg.max_size,
                                   gate._n - gate._num_finished)
        if size > 0 or count != self._count:
            self._count = count
            size = self._debloater._c.size
            for k in range(gate._n):
                if not gate._finished[k]:
                    (<InputChannel>gate._channels[k])._announce_buffer_size(size, count)
            self._follow_floating(gate)
        return 0

    cdef int32_t _buffer_count(self, int32_t seg, int32_t channels) noexcept:
        """The buffers a channel's share of the desired in-flight data
        takes, as few as whole segments allow and one more (the one its
        consumer reads while the next fills), at least 2; 0 (no bound) while
        the size is the segment's (the gate could use more)."""
        cdef double desired
        if self._debloater._c.size >= seg or channels <= 0:
            return 0
        desired = (<double>self._debloater._c.throughput * self._debloater._c.cfg.target_ns
                   / 1e9 / channels)
        return <int32_t>max(2.0, min(1e6, ceil(desired / seg) + 1))

    cdef int _follow_floating(self, InputGate gate) except -1:
        """The gate's floating buffers (remote channels') are sized to what
        its channels' counts leave beyond their exclusive buffers; what they
        do not need goes back to the network pool."""
        cdef int32_t k
        cdef int64_t need = 0
        cdef object pool = None, counters
        for k in range(gate._n):
            if gate._finished[k]:
                continue
            counters = (<InputChannel>gate._channels[k])._own_buffer_counters()
            if counters is None or counters[4] is None:
                continue
            pool = counters[4]
            need += max(0, self._count - 1 - counters[1])
        if pool is not None:
            pool._set_demand(need if self._count > 0 else None)
            self._given_back = pool._debloat_given_back()
        return 0

    cdef int _mark(self, InputGate gate, int64_t now) except -1:
        self._since = now
        self._bytes = _consumed(gate)
        self._idle = gate._idle_ns
        return 0

    cdef object _metrics(self, InputGate gate):
        cdef int32_t k, size = self._debloater._c.size if self._debloater is not None else 0
        cdef list in_flight = []
        for k in range(gate._n):
            in_flight.append(0 if gate._finished[k] or size == 0 else
                             (<InputChannel>gate._channels[k])._buffers_in_use() * size)
        return {"buffer_size": size or None,
                "time_to_consume": (self._debloater._c.time_to_consume_ns / 1e9
                                    if self._debloater is not None else None),
                "buffers_in_use": self._in_use,
                "in_flight_bytes": in_flight,
                "given_back": self._given_back}
