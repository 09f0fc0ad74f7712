# UnknownInputChannel: a place in a gate for an input whose producer is not
# known yet (included into _io after input_gate.pyx's InputChannel).

@cython.final
@cython.no_gc_clear
cdef class UnknownInputChannel(InputChannel):
    """A place in an :class:`InputGate` for an input whose producer is not
    known yet (Flink's ``UnknownInputChannel``): it delivers nothing until
    :meth:`update` names the channel that reads the producer, which then
    takes its place (and index) in the gate, or until :meth:`fail`, whose
    error the gate raises as it reaches the channel.  Meanwhile the gate
    reads its other channels, and its iteration cannot end.

    ``partition_id`` and ``subpartition``: what the channel will read, for
    whoever updates it (:meth:`NetworkEnvironment.update_input_channel
    <flinkbuf.network.NetworkEnvironment.update_input_channel>`); any
    values, kept as they are.  :meth:`update` and :meth:`fail` may be
    called from any thread, once the channel is in a gate."""

    def __init__(self, partition_id=None, subpartition=None):
        self.partition_id = partition_id
        self.subpartition = subpartition

    cdef int _connect(self, InputGate gate, int32_t index) except -1:
        if self._index >= 0 or self._gate is not None:
            raise ValueError("the channel already belongs to an input gate")
        self._gate = weakref.ref(gate)
        self._index = index
        if self._error is not None:
            fb_gate_notify(&gate._c, index)
        return 0

    cdef InputGate _joined(self):
        return None if self._gate is None else <InputGate>self._gate()

    def update(self, channel):
        """Put ``channel`` (an :class:`InputChannel`, or a ``(partition,
        subpartition)`` pair) in this channel's place in its gate, with
        what it already holds.  ValueError when this channel is in no gate,
        was updated or failed before, or its gate was closed (then
        ``channel`` is released, as the gate's own are)."""
        cdef InputChannel ch = _as_channel(channel)
        cdef InputGate gate = self._joined()
        if self._index < 0 or gate is None:
            raise ValueError("the channel is in no input gate: it is updated once its gate "
                             "is made")
        if self._channel is not None:
            raise ValueError(f"input channel {self._index} was updated already")
        if self._error is not None:
            raise ValueError(f"input channel {self._index} failed already: {self._error!r}")
        if self._released:
            if ch._index < 0:
                ch._discard()
            raise ValueError(f"input channel {self._index}: its input gate is closed (the "
                             "channel given was released)")
        # Set before connecting: data that is already there wakes the gate,
        # which polls this channel (all of it under the GIL, so in one step).
        self._channel = ch
        try:
            ch._connect(gate, self._index)
        except BaseException:
            self._channel = None
            raise
        if self._buffer_size > 0:
            ch._announce_buffer_size(self._buffer_size, self._buffer_count)

    def fail(self, error):
        """Make the gate raise ``error`` (an exception) as it reaches this
        channel, unless the channel was updated (then the channel it stands
        for reports its own errors).  Returns whether it took ``error``."""
        if not isinstance(error, BaseException):
            raise TypeError(f"error must be an exception, got {type(error).__name__}")
        if self._channel is not None or self._error is not None:
            return False
        self._error = error
        cdef InputGate gate = self._joined()
        if gate is not None and self._index >= 0 and not self._released:
            fb_gate_notify(&gate._c, self._index)
        return True

    cdef int _poll(self, fb_item_t *out) except -1:
        if self._channel is not None:
            return self._channel._poll(out)
        return FB_EFAILED if self._error is not None else FB_EMPTY

    cdef object _take(self, fb_item_t *item):
        return self._channel._take(item)

    cdef int _release(self, InputGate gate) except -1:
        self._released = True
        if self._channel is not None:
            self._channel._release(gate)
        return 0

    cdef int _disconnect(self, InputGate gate) except -1:
        if self._channel is not None:
            self._channel._disconnect(gate)
            self._channel = None
        self._gate = None
        self._index = -1
        return 0

    cdef int _discard(self) except -1:
        if self._channel is not None:
            self._channel._discard()
        return 0

    cdef object _failure(self):
        return self._channel._failure() if self._channel is not None else None

    cdef object _channel_error(self):
        return self._channel._channel_error() if self._channel is not None else self._error

    cdef int32_t _backlog(self) except -1:
        return self._channel._backlog() if self._channel is not None else 0

    cdef object _source_pool(self):
        return self._channel._source_pool() if self._channel is not None else None

    cdef object _own_buffer_counters(self):
        return self._channel._own_buffer_counters() if self._channel is not None else None

    cdef int _announce_buffer_size(self, int32_t size, int32_t count) except -1:
        self._buffer_size = size
        self._buffer_count = count
        if self._channel is not None:
            self._channel._announce_buffer_size(size, count)
        return 0

    cdef int32_t _buffers_in_use(self) except -1:
        return self._channel._buffers_in_use() if self._channel is not None else 0

    cdef int _reader_dry(self) except -1:
        if self._channel is not None:
            self._channel._reader_dry()
        return 0

    cdef int32_t _segment_size(self) except -1:
        return self._channel._segment_size() if self._channel is not None else 0

    @property
    def channel(self):
        """The channel this one stands for, or None before :meth:`update`."""
        return self._channel

    @property
    def error(self):
        """What :meth:`fail` was given, or None."""
        return self._error

    def __repr__(self):
        state = ("failed" if self._error is not None else
                 "unknown" if self._channel is None else f"-> {self._channel!r}")
        return (f"<flinkbuf.UnknownInputChannel partition_id={self.partition_id!r} "
                f"subpartition={self.subpartition!r} {state}>")
