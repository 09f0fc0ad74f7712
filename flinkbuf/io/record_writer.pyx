# RecordWriter: records into its partition's subpartitions, one buffer per
# channel at a time.  Included by _io.pyx; its output flusher is
# output_flusher.pyx, its back-pressured time's split back_pressure.pyx.

cdef enum:
    _W_OPEN = 0
    _W_CLOSED = 1
    _W_FAILED = 2
    _W_NEW = 3              # made without __init__

# RecordWriter._busy: what the emitting thread is doing.
cdef enum:
    _IDLE = 0
    _EMITTING = 1           # copying a record into one channel
    _BROADCASTING = 2       # copying a record into every channel

# RecordWriter._flush_all modes.  A channel whose consumer released it is
# never written again: its partly filled buffer is dropped.
cdef enum:
    _FLUSH_RAISE = 0        # flush(), or after every record: errors raise, and a
                            # dropped buffer is a PartitionReleasedError (after
                            # the other channels are handed over)
    _FLUSH_QUIET = 1        # errors raise; dropped buffers are not reported
    _FLUSH_TIMER = 2        # the output flusher: errors are kept for the
                            # writer's next call; dropped buffers not reported


cdef inline Buffer _trimmed(Buffer buf, ResultSubpartition sp):
    """``buf`` holding at most the buffer size the subpartition's consumer
    announced (buffer debloating): a record that does not fit goes on in
    the next buffer."""
    cdef int32_t size = fb_subpart_buffer_size(&sp._c)
    if size < 0:                    # the size it starts at
        size = -size
    if 0 < size < buf._capacity:
        buf._capacity = size
    return buf


@cython.final
@cython.no_gc_clear
cdef class RecordWriter:
    """Serializes records into the buffers of a :class:`ResultPartition`.

    ``emit(record)`` is one call: pick the channel with ``selector``,
    serialize the record into that channel's current buffer, and when the
    buffer is full hand it to the subpartition and request the next one.
    That request blocks (without the GIL) while the pool has no buffer:
    this wait is backpressure, and is measured as back-pressured time.

    Back-pressured time is hard (Flink's split) while the writer waits for
    a buffer the pool does not have (serving its connection meanwhile, if
    the network layer lends it one, included), soft while the output is
    unavailable though the pool has buffers: a channel at its cap or at the
    buffers its debloated size allows, every channel blocked for the backlog-aware round robin, no room for an event.

    ``buffer_timeout`` (seconds) is Flink's: a partly filled buffer is
    handed over at the latest that long after it was started, by an output
    flusher thread; ``0`` hands over after every record, ``None`` only
    when full (or on :meth:`flush` / :meth:`close`).  A real number >= 0
    and finite (TypeError for bools and strings, ValueError for negative
    numbers, NaN and infinity: "never" is ``None``).

    One thread at a time uses a writer (``emit``, ``broadcast_emit``,
    ``flush``, ``broadcast_event``, ``close``): a call that overlaps another
    (from a second thread, or re-entered from a selector or codec) raises
    RuntimeError and changes nothing, so the stream of the thread in the
    first call goes on.  ``fail()`` may come from any thread at any time:
    it is how a producer blocked in ``emit`` is aborted.  The output flusher
    and metric readers run concurrently.  ``close()`` flushes and ends every
    subpartition with EndOfPartition; ``fail(exc)`` drops everything and
    makes consumers raise.  As a context manager it closes on success and
    fails on an exception.

    A consumer that leaves early (closes its input gate) releases its
    subpartition, which is never written again (Flink does the same); the
    other consumers are not affected.  A record for that channel alone is
    dropped and its ``emit`` raises :class:`PartitionReleasedError` once the
    writer notices, at the channel's next buffer (its buffer is full or
    flushed, a new one is needed, or a request for one was waiting);
    records already in the channel's buffer then are lost with it.  The
    writer stays usable for the other channels and ``close()`` ends them
    normally.  The backlog-aware round robin steers around released channels.  Broadcasts
    (``broadcast_emit``, a broadcast selector, ``broadcast_event``) skip
    released channels, and raise only once every channel is released.  The
    output flusher drops the partly filled buffer of a released channel
    without an error.

    selector: a :class:`ChannelSelector`, a name (``"round_robin"`` or
    ``"rebalance"``, both Flink's rebalance, :class:`RoundRobinSelector`;
    ``"rescale"``, ``"hash"``, ``"broadcast"``, ``"forward"``, ``"global"``,
    ``"backlog_aware"``, :class:`BacklogAwareRebalanceSelector`; ``"-"`` may
    stand for ``"_"``) or a callable ``fn(record, num_channels)``.
    codec: the record codec (one of :data:`flinkbuf.serialization.CODECS`:
    ``"typed"``, ``"bytes"``, ``"pickle"``).
    """

    def __cinit__(self):
        self._state = _W_NEW
        self._soft_base = -1
        self._current = []
        self._subparts = []

    def __init__(self, ResultPartition partition not None, selector=None, *, codec="typed",
                 buffer_timeout=0.1, name=None):
        if self._state != _W_NEW:
            raise RuntimeError("RecordWriter is already initialised")
        _check_name(name)
        buffer_timeout = _as_buffer_timeout(buffer_timeout)
        if partition._n == 0:
            raise ValueError("partition is not initialised")
        if partition._has_writer:
            raise ValueError("the partition already has a writer")
        partition._check_live()
        cdef RecordSerializer ser = RecordSerializer(codec)
        cdef ChannelSelector sel = _as_selector(selector)
        if sel._bound:
            raise ValueError(f"the {type(sel).__name__} already serves a RecordWriter: "
                             "use one selector per writer")
        sel._setup(partition._n)
        sel._bind(partition)
        sel._bound = True
        self._ser = ser
        self._partition = partition
        self._pool = partition._pool
        self._selector = sel
        self._n = partition._n
        self._broadcast = sel._broadcast
        self._round_robin = type(sel) is RoundRobinSelector
        self._current = [None] * self._n
        self._subparts = list(partition._subpartitions)
        self._timeout = buffer_timeout
        self._flush_always = buffer_timeout == 0
        self._name = name if name is not None else partition._name
        partition._has_writer = True
        partition._writer = weakref.ref(self)
        self._state = _W_OPEN
        if buffer_timeout is not None and buffer_timeout > 0:
            _start_flusher(self, buffer_timeout)

    def __del__(self):
        # Dropped while open (say, its thread died without close() or a with
        # block): fail the partition, so that consumers raise instead of
        # waiting for an EndOfPartition that can no longer come.
        if self._state != _W_OPEN:
            return
        try:
            if self._flusher_stop is not None:
                self._flusher_stop.set()
            self._state = _W_FAILED
            self._release_current()
            if self._partition._state == _P_LIVE:
                self._partition.fail(RuntimeError(
                    f"the RecordWriter {self._name!r} was dropped without close() or fail()"))
        except BaseException:
            write_unraisable(self)

    # ---- the record path ----------------------------------------------------

    # The per-record entry point: METH_O.  Cython's clinic signature of a
    # METH_O method omits the "/", so the docstring spells it out.
    @cython.always_allow_keywords(False)
    @cython.embedsignature(False)
    def emit(self, record):
        """emit($self, record, /)
--

Write ``record`` to the channel the selector picks (every channel for
a broadcast selector); blocks while no buffer is free.  Either the
record is written or emit raises."""
        self._emit(record)

    @cython.always_allow_keywords(False)
    @cython.embedsignature(False)
    def emit_all(self, records):
        """emit_all($self, records, /)
--

Emit the records of the iterable ``records`` in order, as a loop of
:meth:`emit` does, in one call (the loop runs in C); returns how many
were written.  The first exception, the iterable's or emit's (the writer
then as emit leaves it), ends it with a note naming the record's index:
the records before it are written, no later one is taken."""
        return self._emit_all(records)

    cdef Py_ssize_t _emit_all(self, object records) except -1:
        return _emit_all(self, records)

    def broadcast_emit(self, record):
        """Write ``record`` to every channel."""
        self._enter()
        try:
            self._check_open()
            self._broadcast_emit(record)
        finally:
            self._user = 0

    cdef inline int _enter(self) except -1:
        """Start a call: refused while another one is in progress."""
        if self._user:
            return self._concurrent_use()
        self._user = PyThread_get_thread_ident()
        return 0

    cdef int _concurrent_use(self) except -1:
        if self._user == PyThread_get_thread_ident():
            raise RuntimeError(
                "RecordWriter was re-entered: code run during a call (a selector, a codec, a "
                "pool listener) called the writer again; nothing was written by this call")
        raise RuntimeError(
            f"RecordWriter {self._name!r} is in use by another thread: a writer serves one "
            "thread at a time (fail() may come from any thread); nothing was written by "
            "this call")

    cdef int _check_open(self) except -1:
        cdef object err
        if self._state == _W_NEW:
            raise RuntimeError("RecordWriter is not initialised (its __init__ was not called)")
        if self._state == _W_CLOSED:
            raise ValueError("record writer is closed")
        if self._state == _W_FAILED:
            raise ProducerFailedError("record writer has failed") from self._partition._cause
        self._check_partition()
        if self._broken:
            raise RuntimeError("a record was left half written by an earlier error; "
                               "the writer can only fail()")
        if self._flusher_error is not None:
            raise RuntimeError("the output flusher could not hand over a buffer (the records "
                               "in it are lost); the writer can only fail()") \
                from self._flusher_error
        return 0

    cdef inline int _emit(self, object record) except -1:
        if self._user:
            return self._concurrent_use()
        self._user = PyThread_get_thread_ident()
        try:
            return self._emit_entered(record)
        finally:
            self._user = 0

    cdef int _emit_entered(self, object record) except -1:
        cdef int32_t ch
        cdef object cur
        cdef int flags
        if (self._state != _W_OPEN or self._broken or self._flusher_error is not None
                or self._partition._state != _P_LIVE):
            self._check_open()
        if self._broadcast:
            return self._broadcast_emit(record)
        self._busy = _EMITTING
        try:
            if self._round_robin:       # final class: a direct (inlinable) call
                ch = (<RoundRobinSelector>self._selector)._select(record)
            else:
                ch = self._selector._select(record)
            # Whatever the selector (a Cython subclass may return anything),
            # only a channel of this writer reaches its lists.
            if <uint32_t>ch >= <uint32_t>self._n:
                if ch == _ALL_BLOCKED and type(self._selector) is BacklogAwareRebalanceSelector:
                    ch = self._await_channel()
                else:
                    self._bad_channel(ch)
            # The common case inline: a small record written straight into
            # the channel's buffer (no code runs); else staged and copied.
            cur = <object>PyList_GET_ITEM(self._current, ch)     # ch < self._n, checked
            flags = 0
            if cur is not None and self._state == _W_OPEN:
                flags = self._ser._write_record(<Buffer>cur, record)
            if flags == 0:
                self._ser._serialize_record(record)
                if self._state != _W_OPEN:
                    # fail() came (from the selector, the codec or another thread)
                    self._ser._clear()
                    self._check_open()
                cur = self._current[ch]
                if cur is not None:
                    flags = self._ser._copy_to_buffer(<Buffer>cur)
            if flags != FULL_RECORD:
                self._broken = True
                self._copy_rest(ch, <Buffer>cur if flags else None, flags)
                self._broken = False
            self._records_out += 1
        finally:
            self._busy = _IDLE
        if self._flush_always or self._flush_pending:
            self._flush_pending = False
            self._flush_all(_FLUSH_RAISE if self._flush_always else _FLUSH_QUIET)
        return 0

    cdef int32_t _bad_channel(self, int32_t channel) except -1:
        raise IndexError(f"the {type(self._selector).__name__} chose channel {channel}, not in "
                         f"[0, {self._n}): nothing was written")

    cdef int _broadcast_emit(self, object record) except -1:
        cdef int32_t ch
        cdef object cur
        self._busy = _BROADCASTING
        try:
            self._ser._serialize_record(record)
            if self._state != _W_OPEN:
                self._ser._clear()
                self._check_open()
            self._broken = True
            for ch in range(self._n):
                if ch:
                    self._ser._reset()
                cur = self._current[ch]
                if cur is None:
                    self._copy_rest(ch, None, 0)
                else:
                    self._copy_rest(ch, <Buffer>cur, self._ser._copy_to_buffer(<Buffer>cur))
            self._broken = False
            self._records_out += 1
        finally:
            self._busy = _IDLE
        if self._flush_always or self._flush_pending:
            self._flush_pending = False
            self._flush_all(_FLUSH_QUIET)
        return 0

    cdef int _channel_released(self, int32_t channel) except -1:
        """The consumer of ``channel`` released it while the staged record
        was being copied there: a broadcast skips it, a record for that
        channel alone is dropped."""
        if self._busy == _BROADCASTING:
            return self._skip_released(channel)
        return self._drop_record(channel)

    cdef int _skip_released(self, int32_t channel) except -1:
        """A broadcast met a channel whose consumer released it: skip it,
        unless every channel is released (then nobody gets the record)."""
        self._drop_current(channel)
        cdef ResultSubpartition sp
        for sp in self._subparts:
            if fb_subpart_state(&sp._c) != FB_SP_RELEASED:
                return 0
        self._ser._clear()
        self._broken = False
        raise PartitionReleasedError(f"every consumer of {self._partition._describe()} released "
                                     "its subpartition: the record was not delivered")

    cdef int _drop_record(self, int32_t channel) except -1:
        """The consumer of ``channel`` released it while a record for that
        channel alone was being written: the record and whatever the writer
        holds for the channel are dropped, nothing is left half written, and
        the writer goes on serving the other channels."""
        self._drop_current(channel)
        self._ser._clear()
        self._broken = False
        raise PartitionReleasedError(
            f"subpartition {channel} of {self._partition._describe()} was released by its "
            "consumer: the record was not delivered")

    cdef int _drop_current(self, int32_t channel) except -1:
        cdef object cur = self._current[channel]
        if cur is not None:
            self._current[channel] = None
            if not (<Buffer>cur).is_recycled:
                (<Buffer>cur)._release()
        return 0

    cdef int32_t _await_channel(self) except -1:
        """Every channel is blocked (backlog-aware round robin): wait until a
        consumer takes a buffer.  Counted as soft back-pressured time (no
        buffer is requested, nothing of the record is written yet)."""
        cdef BacklogAwareRebalanceSelector sel = <BacklogAwareRebalanceSelector>self._selector
        cdef int32_t ch = _ALL_BLOCKED
        cdef int64_t t0 = fb_monotonic_ns()
        self._bp_since = t0
        self._soft_since = t0
        self._busy = _IDLE
        try:
            while ch < 0:
                self._check_partition()
                ch = sel._wait_unblocked(FB_WAIT_SLICE)
                PyErr_CheckSignals()
        finally:
            self._busy = _EMITTING
            _end_wait(self, t0)
        return ch


    cdef int _copy_rest(self, int32_t channel, Buffer buf, int flags) except -1:
        """Go on copying the staged record after the channel's current
        buffer ``buf`` took what fit (``flags`` from that copy), or from the
        start when there is none (``buf`` None).  A released channel: see
        _channel_released."""
        if buf is not None:
            if not flags & FULL_BUFFER:
                return 0
            self._current[channel] = None
            if self._hand_over(channel, buf):
                return self._channel_released(channel)
            if flags & FULL_RECORD:
                return 0
        # From here on every buffer is fresh: it becomes current only if the
        # record ends in it with room to spare.
        while True:
            buf = self._request_buffer(channel)
            if buf is None:
                return self._channel_released(channel)
            flags = self._ser._copy_to_buffer(buf)
            if not flags & FULL_BUFFER:
                self._current[channel] = buf
                return 0
            if self._hand_over(channel, buf):
                return self._channel_released(channel)
            if flags & FULL_RECORD:
                return 0

    cdef Buffer _request_buffer(self, int32_t channel):
        """The next buffer for ``channel``; blocks while none is free (with a
        per-channel cap: while the pool is unavailable, as in Flink); None
        if the channel's consumer released it (before or meanwhile)."""
        cdef int32_t pool_ch = channel if self._partition._pool_channels else -1
        cdef bint capped = self._partition._cap > 0
        cdef ResultSubpartition sp = <ResultSubpartition>self._subparts[channel]
        cdef Buffer buf
        self._partition._follow_debloat(sp)
        # A released (or failed) channel takes the loop below, which says so.
        if fb_subpart_state(&sp._c) == FB_SP_LIVE and (not capped or self._pool.is_available):
            buf = self._pool._request(pool_ch)
            if buf is not None:
                return _trimmed(buf, sp)
        cdef int mode = self._busy
        cdef bint released
        cdef int64_t t0 = fb_monotonic_ns()
        self._bp_since = t0
        self._busy = _IDLE          # the flusher may hand over other channels meanwhile
        try:
            while True:
                if self._target_released(channel):
                    break
                _soft_while(self, _soft_wait(self, sp, pool_ch))
                if capped and not self._pool.wait_available(FB_WAIT_SLICE):
                    continue
                try:        # (a debloated channel's limit may keep it waiting)
                    buf = self._pool._request_blocking(pool_ch, FB_WAIT_SLICE)
                except BufferRequestTimeoutError:
                    self._partition._follow_debloat(sp)
                    continue
                try:
                    released = self._target_released(channel)
                except BaseException:
                    buf._release()
                    raise
                if not released:
                    return _trimmed(buf, sp)
                buf._release()
                break
        finally:
            self._busy = mode
            _end_wait(self, t0)
        return None                 # the consumer of `channel` left

    cdef int _check_partition(self) except -1:
        if self._state == _W_FAILED:
            raise ProducerFailedError("record writer has failed") from self._partition._cause
        if self._state == _W_CLOSED:
            raise ValueError("record writer is closed")
        cdef int state = self._partition._state
        if state == _P_FAILED:
            raise ProducerFailedError(f"{self._partition._describe()} has failed") \
                from self._partition._cause
        if state == _P_RELEASED:
            raise PartitionReleasedError(f"{self._partition._describe()} was released")
        return 0

    cdef bint _target_released(self, int32_t channel) except -1:
        """True if ``channel``'s consumer released it; raises if the writer or
        the partition can no longer be written."""
        self._check_partition()
        cdef ResultSubpartition sp = <ResultSubpartition>self._subparts[channel]
        cdef int32_t state = fb_subpart_state(&sp._c)
        if state == FB_SP_FAILED:
            self._partition._raise_for_rc(FB_EFAILED, channel)
        return state == FB_SP_RELEASED

    cdef int _hand_over(self, int32_t channel, Buffer buf) except -1:
        """Hand a buffer to its subpartition (empty ones are recycled): 0, or 1
        if the channel's consumer released it (the buffer is recycled)."""
        cdef int32_t size = <int32_t>buf._writer
        if size == 0:
            buf._release()
            return 0
        cdef ResultSubpartition sp = <ResultSubpartition>self._subparts[channel]
        cdef int rc = sp._add_buffer(buf, FB_ITEM_DATA, False)    # buf is gone either way
        if rc != FB_OK:
            if rc == FB_ERELEASED:
                return 1
            self._partition._raise_for_rc(rc, channel)
        self._bytes_out += size
        self._buffers_out += 1
        return 0

    cdef int _flush_all(self, int mode) except -1:
        """Hand over every partly filled buffer; a released channel's is
        dropped.  ``mode``: _FLUSH_RAISE, _FLUSH_QUIET or _FLUSH_TIMER."""
        cdef int32_t ch, dropped = -1
        cdef object cur
        cdef Buffer buf
        for ch in range(self._n):
            cur = self._current[ch]
            if cur is None:
                continue
            buf = <Buffer>cur
            if buf._writer == 0:
                continue
            self._current[ch] = None
            try:
                if self._hand_over(ch, buf):
                    dropped = ch
            except BaseException as exc:
                if mode != _FLUSH_TIMER:
                    raise
                if self._flusher_error is None:
                    self._flusher_error = exc
        if dropped >= 0 and mode == _FLUSH_RAISE:
            raise PartitionReleasedError(
                f"subpartition {dropped} of {self._partition._describe()} was released by its "
                "consumer: what was written for it was not delivered")
        return 0

    cdef int _release_current(self) except -1:
        cdef int32_t ch
        cdef object cur
        for ch in range(len(self._current)):
            cur = self._current[ch]
            if cur is not None:
                self._current[ch] = None
                if not (<Buffer>cur).is_recycled:
                    (<Buffer>cur)._release()
        return 0

    # ---- control ------------------------------------------------------------

    def flush(self):
        """Hand every partly filled buffer to its consumer now.  A channel
        whose consumer left gets nothing; what was written for it is dropped
        and reported with :class:`PartitionReleasedError` once the others
        are handed over (not for a broadcast selector, see the class)."""
        self._enter()
        try:
            self._check_open()
            self._flush_all(_FLUSH_QUIET if self._broadcast else _FLUSH_RAISE)
        finally:
            self._user = 0

    def broadcast_event(self, event):
        """Flush, then send a :class:`UserEvent` in-band to every channel:
        each consumer sees it after all records emitted before it.  The
        event is encoded first: a wrong one, or one larger than a buffer of
        the partition's pool, is refused before anything is flushed.

        Events are bounded like records: while a consumer has
        ``MAX_QUEUED_EVENTS`` events it has not taken yet, this call waits
        (without the GIL; counted as soft back-pressured time)."""
        self._enter()
        try:
            self._check_open()
            data = self._partition._encode_event(event)
            self._flush_all(_FLUSH_QUIET)
            self._partition._check_live()
            self._soft_base = self._bp_ns       # the partition's waits for room: soft
            try:
                self._partition._add_event_all(data, False, self)
            finally:
                self._soft_bp_ns += self._bp_ns - self._soft_base
                self._soft_base = -1
        finally:
            self._user = 0

    def close(self):
        """Flush and end every subpartition with EndOfPartition (subpartitions
        whose consumer left are skipped: nothing is reported for them).
        Idempotent; after a failure it only frees the writer's buffers."""
        if self._state == _W_CLOSED:
            return
        if self._state == _W_NEW:
            self._check_open()
        self._enter()
        try:
            self._close()
        finally:
            self._user = 0

    cdef int _close(self) except -1:
        _stop_flusher(self)
        if self._state == _W_FAILED:
            self._release_current()
            return 0
        cdef int32_t ch
        cdef object cur
        try:
            if self._broken:
                raise RuntimeError("a record was left half written by an earlier error")
            if self._flusher_error is not None:
                raise self._flusher_error
            for ch in range(self._n):
                cur = self._current[ch]
                if cur is None:
                    continue
                self._current[ch] = None
                self._hand_over(ch, <Buffer>cur)     # 1 (released): nothing to deliver
            self._partition._finish()
        except BaseException as exc:
            self._state = _W_FAILED
            self._release_current()
            self._partition.fail(exc)
            raise
        self._state = _W_CLOSED
        return 0

    def fail(self, exc=None):
        """Drop this writer's buffers and fail the partition: consumers raise
        :class:`ProducerFailedError` from ``exc`` (an exception instance, or
        None: see :meth:`ResultPartition.fail`)."""
        _check_failure_cause(exc)
        if self._state == _W_FAILED:
            return
        if self._state == _W_NEW:
            self._check_open()
        _stop_flusher(self)
        self._state = _W_FAILED
        self._release_current()
        self._partition.fail(exc)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
        else:
            self.fail(exc)
        return False

    # ---- introspection ------------------------------------------------------

    @property
    def partition(self):
        return self._partition

    @property
    def selector(self):
        return self._selector

    @property
    def num_channels(self):
        return self._n

    @property
    def buffer_timeout(self):
        return self._timeout

    @property
    def name(self):
        return self._name

    @property
    def is_closed(self):
        return self._state != _W_OPEN

    @property
    def num_records_out(self):
        return self._records_out

    @property
    def num_bytes_out(self):
        """Bytes of finished buffers handed to subpartitions."""
        return self._bytes_out

    @property
    def num_buffers_out(self):
        return self._buffers_out

    @property
    def back_pressured_time_ns(self):
        """Total time spent blocked on output (requesting a buffer, or
        waiting for a free channel), including a wait in progress."""
        cdef int64_t since = self._bp_since
        return self._bp_ns + (fb_monotonic_ns() - since if since else 0)

    def _metric_counters(self):
        """(records, bytes, buffers, back-pressured ns incl. a wait in progress)."""
        cdef int64_t since = self._bp_since
        return (self._records_out, self._bytes_out, self._buffers_out,
                self._bp_ns + (fb_monotonic_ns() - since if since else 0))

    def _back_pressure_counters(self):
        """(back-pressured ns, of which soft ns), a wait in progress
        included (read at one instant: soft never exceeds the total)."""
        return _back_pressure_counters(self)

    def __repr__(self):
        state = ("open", "closed", "failed", "not initialised")[self._state]
        return (f"<flinkbuf.RecordWriter name={self._name!r} channels={self._n} "
                f"selector={type(self._selector).__name__} {state}>")
