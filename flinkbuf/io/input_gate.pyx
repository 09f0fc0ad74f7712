# InputGate and its input channels.  Included by _io.pyx.

cdef object _NO_ITEM = object()     # _advance without waiting: no channel has an item


cdef object item_object(fb_item_t *item, LocalBufferPool pool):
    """What the gate reads from an item a channel handed over, which owns
    its memory from here on: a data item becomes a Buffer of ``pool`` (the
    pool its segment belongs to), an event its bytes (the item's memory is
    given back at once).  Disposes of the item if that fails."""
    cdef Buffer buf
    if item.kind == FB_ITEM_DATA:
        if item.pool == NULL or pool is None or item.pool != &pool._c:
            fb_item_dispose(item)
            raise RuntimeError("internal error: a data item not of its channel's pool")
        buf = pool._wrap(item.index)
        buf._writer = item.size
        return buf
    try:
        return PyBytes_FromStringAndSize(item.data, item.size)
    finally:
        fb_item_dispose(item)
        if pool is not None and item.pool != NULL:
            pool._recycled_in_c()


cdef class InputChannel:
    """One input of an :class:`InputGate`.  Local channels read a
    subpartition of this process; remote channels (layer 4) read one over
    a connection and tell the gate when data arrived.

    A channel hands its gate *items* (``fb_item_t``: a pooled segment or
    malloc'd bytes, see csrc/exchange.h), in order: finished data buffers
    and serialized events; ``_take`` turns the item just polled into the
    Buffer (the consumer recycles it) or the event's bytes.

    Abstract, and implemented in Cython: a subclass is a ``cdef class``
    that implements the C-level methods of ``input_gate.pxd`` (``_connect``,
    ``_poll``, ...).  Neither InputChannel itself nor a Python subclass can
    be instantiated; give an :class:`InputGate` a :class:`LocalInputChannel`
    or a ``(partition, subpartition)`` pair."""

    def __cinit__(self):
        self._index = -1
        cdef type t = type(self)
        if t is InputChannel:
            raise TypeError("InputChannel is abstract: give InputGate a "
                            "LocalInputChannel(partition, subpartition) or a "
                            "(partition, subpartition) pair")
        if _defined_in_python(t):
            raise TypeError(f"{t.__name__} subclasses InputChannel in Python, but input "
                            "channels are implemented in Cython (cdef classes, like "
                            "LocalInputChannel): a Python subclass cannot hand a gate "
                            "its buffers")

    cdef int _connect(self, InputGate gate, int32_t index) except -1:
        raise NotImplementedError

    cdef int _poll(self, fb_item_t *out) except -1:
        """Take the next item: FB_OK, FB_EMPTY, FB_EFAILED or FB_ERELEASED."""
        raise NotImplementedError

    cdef object _take(self, fb_item_t *item):
        """The object for an item just polled (see item_object): events
        only, unless a subclass knows the pool of its data items."""
        return item_object(item, None)

    cdef int _release(self, InputGate gate) except -1:
        return 0

    cdef int _disconnect(self, InputGate gate) except -1:
        """Leave ``gate`` without consuming anything (its constructor failed):
        the channel may join another gate."""
        self._index = -1
        return 0

    cdef int _discard(self) except -1:
        """Give the producer up without ever joining a gate (one that
        closed first): as ``_release`` does, its writes then fail."""
        return 0

    cdef object _failure(self):
        """The producer's exception, when the channel reports FB_EFAILED."""
        return None

    cdef object _channel_error(self):
        """When the channel itself failed (a remote channel whose connection
        dropped), the error the gate raises as it is; None when the
        producer failed (the gate raises ProducerFailedError from _failure)."""
        return None

    cdef int32_t _backlog(self) except -1:
        return 0

    cdef object _source_pool(self):
        """The pool of the producer's buffers the channel hands over, or None
        for a channel that receives into buffers of its own."""
        return None

    cdef object _own_buffer_counters(self):
        """For a channel that receives into buffers of its own rather than
        handing over its producer's: ``(own buffers in use, own buffers in
        all, bytes received, buffers received, the pool it borrows more
        buffers from, shared with its gate's other channels, or None)``;
        None for a channel that hands over its producer's buffers."""
        return None

    cdef int _announce_buffer_size(self, int32_t size, int32_t count) except -1:
        """Tell the producer to finish buffers at ``size`` bytes (buffer
        debloating), and that ``count`` buffers (0: no bound) hold the
        channel's in-flight data: the channel and its producer keep no
        more; a channel whose producer is not known yet keeps both."""
        return 0

    cdef int32_t _buffers_in_use(self) except -1:
        """The buffers between the producer and this consumer's reads:
        what the producer queued for the channel, what arrived and waits,
        and (for a channel with credit) what the producer may send into."""
        return 0

    cdef int32_t _segment_size(self) except -1:
        return 0

    cdef int _reader_dry(self) except -1:
        """The gate read every record of the buffers it took from this
        channel (the last one may have begun a record that the next buffer
        ends)."""
        return 0

    @property
    def index(self):
        """Position in the gate, or None before it joined one."""
        return None if self._index < 0 else self._index


@cython.final
@cython.no_gc_clear
cdef class LocalInputChannel(InputChannel):
    """Reads subpartition ``subpartition`` of a partition in this process:
    the producer's buffers are handed over by reference and go back to the
    producer's pool when consumed."""

    def __init__(self, ResultPartition partition not None, subpartition):
        if self._partition is not None:
            raise RuntimeError("LocalInputChannel is already initialised: a channel reads "
                               "one subpartition for good")
        if partition._n == 0:
            raise ValueError("partition is not initialised")
        cdef int32_t index = _as_subpartition(subpartition, partition._n)
        self._partition = partition
        self._sp = <ResultSubpartition>partition._subpartitions[index]
        self._subpartition = index

    cdef int _connect(self, InputGate gate, int32_t index) except -1:
        if self._sp is None:
            raise ValueError("channel is not initialised")
        if self._index >= 0:
            raise ValueError("the channel already belongs to an input gate")
        if fb_subpart_connect(&self._sp._c, &gate._c, index) != FB_OK:
            raise ValueError(f"subpartition {self._subpartition} of "
                             f"{self._partition._describe()} already has a consumer "
                             "or was released")
        self._index = index
        return 0

    cdef int _poll(self, fb_item_t *out) except -1:
        return fb_subpart_poll(&self._sp._c, out)

    cdef object _take(self, fb_item_t *item):
        return item_object(item, self._partition._pool)

    cdef int _release(self, InputGate gate) except -1:
        fb_subpart_disconnect(&self._sp._c, &gate._c)
        self._sp._terminate(FB_SP_RELEASED)
        return 0

    cdef int _disconnect(self, InputGate gate) except -1:
        fb_subpart_disconnect(&self._sp._c, &gate._c)
        self._index = -1
        return 0

    cdef int _discard(self) except -1:
        if self._sp is not None:
            self._sp._terminate(FB_SP_RELEASED)
        return 0

    cdef object _failure(self):
        return self._sp._cause

    cdef int32_t _backlog(self) except -1:
        return fb_subpart_backlog(&self._sp._c)

    cdef object _source_pool(self):
        return self._partition._pool

    cdef int _announce_buffer_size(self, int32_t size, int32_t count) except -1:
        fb_subpart_set_buffer_size(&self._sp._c, size)
        self._sp._count = count        # the writer applies both as it requests a buffer
        return 0

    cdef int32_t _buffers_in_use(self) except -1:
        # the queued ones and the producer's, which it fills meanwhile
        return fb_subpart_backlog(&self._sp._c) + 1

    cdef int32_t _segment_size(self) except -1:
        return self._partition._pool._c.net.segment_size

    @property
    def partition(self):
        return self._partition

    @property
    def subpartition(self):
        return self._subpartition

    def __repr__(self):
        return (f"<flinkbuf.LocalInputChannel {self._partition._describe()} "
                f"subpartition={self._subpartition}>")


cdef InputChannel _as_channel(object spec):
    if isinstance(spec, InputChannel):
        return <InputChannel>spec
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], ResultPartition):
        return LocalInputChannel(spec[0], spec[1])
    raise TypeError("channels must be InputChannels or (ResultPartition, subpartition) pairs, "
                    f"got {type(spec).__name__}")


@cython.final
@cython.no_gc_clear
cdef class InputGate:
    """The input of one consumer task: records from several input channels.

    Iterating yields the records of all channels, taking the channels with
    data in turn (one buffer at a time), each channel's records in the order
    they were emitted; a user :class:`Event` is yielded where it was sent.
    Iteration ends when every channel has delivered EndOfPartition.  While
    no channel has data the consumer sleeps on a condition variable without
    the GIL (that is idle time).

    If a producer fails, iteration raises :class:`ProducerFailedError`
    (its cause attached).  ``close()`` releases every channel early:
    queued buffers are recycled and the producers' writes fail with
    :class:`PartitionReleasedError`.  Use as a context manager.

    channels: :class:`InputChannel` s, or ``(partition, subpartition)``
    pairs (local channels).  codec / max_record_size: for the record
    deserializers, one per channel.  ``buffer_debloat`` (a bool or a
    :class:`BufferDebloatConfig`) and the ``buffer_debloat_*`` keywords
    (see :class:`BufferDebloatConfig`): the gate measures its throughput
    and tells its producers the buffer size that keeps its data in flight
    near the target time.
    """

    def __cinit__(self):
        self._initialized = False
        self._channels = []
        self._deserializers = []
        self._finished = []
        self._current = -1
        self._closed = True

    def __init__(self, channels, *, codec="typed", max_record_size=64 << 20, name=None,
                 buffer_debloat=None, buffer_debloat_target=None, buffer_debloat_period=None,
                 buffer_debloat_samples=None, buffer_debloat_threshold=None,
                 buffer_debloat_min_size=None):
        if self._initialized:
            raise RuntimeError("InputGate is already initialised")
        _check_name(name)
        cdef BufferDebloatConfig debloat = BufferDebloatConfig.from_options(
            buffer_debloat, buffer_debloat_target, buffer_debloat_period,
            buffer_debloat_samples, buffer_debloat_threshold, buffer_debloat_min_size)
        cdef list chans = [_as_channel(c) for c in channels]
        if not chans:
            raise ValueError("an input gate needs at least one channel")
        if len(chans) > 2147483647:
            raise ValueError("too many channels")
        cdef int32_t n = <int32_t>len(chans)
        cdef list deserializers = [RecordDeserializer(codec=codec, max_record_size=max_record_size)
                                   for _ in range(n)]
        for k in range(n):                 # each names its channel in its errors
            (<RecordDeserializer>deserializers[k]).where = f"input channel {k}"
        if fb_gate_init(&self._c, n) != FB_OK:     # n >= 1: only memory can fail
            raise MemoryError(f"cannot allocate an input gate of {n} channels")
        self._initialized = True
        self._n = n
        self._codec = codec
        self._max_record_size = max_record_size
        self._name = name
        self._deserializers = deserializers
        self._finished = [False] * n
        self._closed = False
        self._debloat = gate_debloat(debloat)
        self._debloat_config = debloat
        self._countdown = _TICK_RECORDS if self._debloat is not None else INT32_MAX
        cdef InputChannel ch
        cdef int32_t i
        try:
            for i in range(n):
                ch = <InputChannel>chans[i]
                ch._connect(self, i)
                self._channels.append(ch)
        except BaseException:
            # Nothing was read: hand the channels back untouched (releasing
            # them would end their subpartitions for any later consumer).
            for ch in self._channels:
                ch._disconnect(self)
            self._channels = []
            self._closed = True
            raise

    def __dealloc__(self):
        if not self._initialized:
            return
        try:
            self._release_channels()
        except BaseException:
            write_unraisable(self)
        fb_gate_free(&self._c)
        self._initialized = False

    def _release_channels(self):
        cdef InputChannel ch
        for ch in self._channels:       # local and remote channels give back in C
            ch._release(self)

    cdef int _check_open(self) except -1:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ValueError("input gate is closed")
        return 0

    # ---- reading ------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self):
        cdef int32_t ch
        return self._next(&ch)

    def next_with_channel(self):
        """``(channel_index, record_or_event)``; StopIteration at the end."""
        cdef int32_t ch = -1
        item = self._next(&ch)
        return ch, item

    @cython.always_allow_keywords(False)
    @cython.embedsignature(False)
    def read_many(self, n):
        """read_many($self, n, /)
--

Up to ``n`` records and events (an int >= 1), in the order iteration
yields them: waits as ``next()`` does until there is one, then takes
what the channels hold already without waiting again.  ``[]`` once every
channel ended (where iteration stops).  An error met after the first
item is raised by the next read (``read_many`` or ``next``), so the
items before it are returned first, as iteration yields them first."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            check_int(n, "n", 1, sys.maxsize)
        cdef Py_ssize_t limit = PY_SSIZE_T_MAX if n >= PY_SSIZE_T_MAX else n
        cdef int32_t ch
        cdef list out = []
        try:
            out.append(self._next(&ch))
        except StopIteration:
            return out
        if limit > 1:
            try:
                self._read_rest(out, limit)
            except Exception as exc:
                self._deferred = exc
                self._cur_des = None         # the next read goes to _advance
        return out

    cdef int _read_rest(self, list out, Py_ssize_t limit) except -1:
        """Append records and events until ``out`` holds ``limit`` or no
        channel has more now."""
        cdef object rec
        cdef int32_t ch
        while PyList_GET_SIZE(out) < limit:
            if self._cur_des is not None:
                rec = self._current_record()
                if not is_no_record(rec):
                    out.append(rec)
                    continue
            if self._num_finished == self._n:
                return 0
            rec = self._advance(&ch, False)
            if rec is _NO_ITEM:
                return 0
            if rec is not None:
                out.append(rec)             # a user event
        return 0

    cdef object _raise_deferred(self):
        """Raise the error read_many put off, and go on where it was (the
        current channel's deserializer is current again)."""
        err = self._deferred
        self._deferred = None
        if self._current >= 0 and not self._closed:
            self._cur_des = <RecordDeserializer>self._deserializers[self._current]
        raise err

    cdef inline object _next(self, int32_t *channel):
        cdef object rec
        while True:
            # The common case: the current channel's buffer holds another record.
            if self._cur_des is not None:
                rec = self._current_record()
                if not is_no_record(rec):
                    channel[0] = self._current
                    return rec
            rec = self._advance(channel, True)
            if rec is not None:
                return rec

    cdef inline object _current_record(self):
        """The next record of the current channel's buffers (counted), or
        NO_RECORD when they hold no more (the channel is current no longer)."""
        cdef int32_t ch = self._current
        # A reference of its own: decoding may run the garbage collector,
        # and so any code, close() included, which drops the gate's.
        cdef RecordDeserializer des = self._cur_des
        cdef object rec = des._next_record()
        if not is_no_record(rec):
            self._records_in += 1
            self._countdown -= 1
            if self._countdown <= 0:
                self._debloat_tick()
            return rec
        self._cur_des = None
        self._current = -1
        (<InputChannel>self._channels[ch])._reader_dry()
        return rec

    cdef object _advance(self, int32_t *channel, bint block):
        """Take the next item of any channel (waiting for one if ``block``,
        else _NO_ITEM when none is there): a data buffer goes to its
        channel's deserializer, which becomes the current one, and
        EndOfPartition ends its channel (None is returned for both); a user
        event is returned.  StopIteration once every channel ended.  An
        error read_many put off is raised first."""
        cdef int32_t ch
        cdef fb_item_t item
        cdef object obj, event, des_obj
        if self._deferred is not None:
            return self._raise_deferred()
        if self._num_finished == self._n:
            raise StopIteration
        if self._closed or self._error is not None:
            self._check_open()
        if not self._wait_item(&ch, &item, block):
            return _NO_ITEM
        obj = (<InputChannel>self._channels[ch])._take(&item)
        des_obj = self._deserializers[ch]
        if des_obj is None:             # closed by another thread meanwhile
            if item.kind == FB_ITEM_DATA:
                (<Buffer>obj)._release()
            raise ValueError("input gate is closed")
        if item.kind == FB_ITEM_DATA:
            self._buffers_in += 1
            self._bytes_in += item.size
            (<RecordDeserializer>des_obj)._feed(obj)
            obj = None
            # close() may have run meanwhile (a gc pass runs arbitrary code,
            # another thread may take the GIL): it dropped this deserializer,
            # which recycles the buffer when it goes.
            if self._closed:
                raise ValueError("input gate is closed")
            self._current = ch
            self._cur_des = <RecordDeserializer>des_obj
            if self._debloat is not None:
                self._debloat._tick(self, fb_monotonic_ns())
            return None
        try:
            event = _deserialize_event(obj)
        except CorruptRecordError as exc:
            # a malformed event: this channel's stream cannot be trusted
            # any more, so the gate fails for good
            self._error = exc
            raise
        if event is _END_OF_PARTITION:
            try:
                (<RecordDeserializer>des_obj)._finish()
            except BaseException as exc:
                # the stream ended inside a record: nothing more can come from
                # this channel, so the gate cannot end normally
                self._error = exc
                raise
            self._finished[ch] = True
            self._num_finished += 1
            (<InputChannel>self._channels[ch])._release(self)
            if self._closed:
                raise ValueError("input gate is closed")
            self._current = ch           # whatever finish() decoded last
            self._cur_des = <RecordDeserializer>des_obj
            return None
        channel[0] = ch
        return event

    cdef int _wait_item(self, int32_t *channel, fb_item_t *item, bint block) except -1:
        """Block (without the GIL) until a channel has an item, and take it:
        1; without ``block``, 0 at once when no channel has one."""
        cdef int32_t ch = -1
        cdef int rc
        cdef int64_t t0 = 0, deadline
        cdef InputChannel chan
        cdef object keep = self      # alive across the nogil waits
        try:
            while True:
                rc = fb_gate_wait(&self._c, 0, &ch)          # a try, no waiting
                if rc == FB_ETIMEDOUT and not block:
                    return 0
                if rc == FB_ETIMEDOUT:
                    if t0 == 0:
                        t0 = fb_monotonic_ns()
                        self._idle_since = t0
                    deadline = fb_deadline_after(FB_WAIT_SLICE)
                    with nogil:
                        rc = fb_gate_wait(&self._c, deadline, &ch)
                    if rc == FB_ETIMEDOUT:
                        PyErr_CheckSignals()
                        continue
                if rc == FB_ECLOSED or self._closed:
                    raise ValueError("input gate is closed")
                chan = <InputChannel>self._channels[ch]
                rc = chan._poll(item)
                if rc == FB_OK:
                    channel[0] = ch
                    return 1
                if rc == FB_EMPTY:
                    continue
                if rc == FB_EFAILED:
                    err = chan._channel_error()
                    if err is None:
                        cause = chan._failure()
                        err = ProducerFailedError(f"the producer of input channel {ch} "
                                                  f"failed: {cause!r}")
                        err.__cause__ = cause
                    self._error = err
                    raise err
                if rc == FB_ERELEASED:
                    if self._finished[ch]:
                        continue
                    err = PartitionReleasedError(
                        f"input channel {ch}: the partition was released by its producer")
                    self._error = err
                    raise err
                raise RuntimeError(f"internal error {rc} polling input channel {ch}")
        finally:
            if t0:
                self._idle_ns += fb_monotonic_ns() - t0
                self._idle_since = 0

    # ---- control ------------------------------------------------------------

    def close(self):
        """Release every channel: queued buffers are recycled, producers'
        further writes fail with :class:`PartitionReleasedError`, and a
        consumer blocked in another thread wakes with an error.  Idempotent."""
        if self._closed or not self._initialized:
            self._closed = True
            return
        self._closed = True
        self._cur_des = None
        self._current = -1
        self._deferred = None
        fb_gate_close(&self._c)
        try:
            self._release_channels()
        finally:
            # Buffers a deserializer still holds go back when it is dropped.
            self._deserializers = [None] * self._n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- introspection ------------------------------------------------------

    @property
    def num_channels(self):
        return self._n

    @property
    def channels(self):
        return list(self._channels)

    @property
    def name(self):
        return self._name

    @property
    def is_finished(self):
        """True once every channel delivered EndOfPartition."""
        return self._n > 0 and self._num_finished == self._n

    @property
    def is_closed(self):
        return self._closed

    @property
    def num_finished_channels(self):
        return self._num_finished

    @property
    def num_records_in(self):
        return self._records_in

    @property
    def num_bytes_in(self):
        return self._bytes_in

    @property
    def num_buffers_in(self):
        return self._buffers_in

    @property
    def idle_time_ns(self):
        """Total time spent waiting for input, including a wait in progress."""
        cdef int64_t since = self._idle_since
        return self._idle_ns + (fb_monotonic_ns() - since if since else 0)

    def backlogs(self):
        """Per channel: finished buffers queued and not yet read."""
        cdef InputChannel ch
        return [ch._backlog() for ch in self._channels]

    def source_pools(self):
        """The distinct buffer pools the channels' buffers come from."""
        cdef InputChannel ch
        pools = []
        for ch in self._channels:
            pool = ch._source_pool()
            if pool is not None and all(pool is not p for p in pools):
                pools.append(pool)
        return pools

    def _own_buffer_counters(self):
        """Per channel, what a channel that receives into buffers of its own
        counts of them (see InputChannel._own_buffer_counters), or None."""
        cdef InputChannel ch
        return [ch._own_buffer_counters() for ch in self._channels]

    cdef int _debloat_tick(self) except -1:
        if self._debloat is None:
            self._countdown = INT32_MAX
            return 0
        self._countdown = _TICK_RECORDS
        return self._debloat._tick(self, fb_monotonic_ns())

    @property
    def buffer_debloat(self):
        """The gate's :class:`BufferDebloatConfig` (``enabled`` False: off)."""
        return self._debloat_config if self._debloat_config is not None else _DEBLOAT_OFF

    def _debloat_metrics(self):
        """None when debloating is off, else a dict: ``buffer_size`` (the
        debloated size last announced, None before the first sample),
        ``time_to_consume`` (seconds to consume the buffers in use at the
        last sample's throughput, None before it), ``buffers_in_use`` (at
        the last sample), ``in_flight_bytes`` (per channel, now: its buffers
        in use times the buffer size; 0 for a finished channel) and
        ``given_back`` (segments the gate's channels gave back to their
        pools as their in-flight data shrank, in all)."""
        return self._debloat._metrics(self) if self._debloat is not None else None

    def _metric_counters(self):
        """(records, bytes, buffers, idle ns incl. a wait in progress)."""
        cdef int64_t since = self._idle_since
        return (self._records_in, self._bytes_in, self._buffers_in,
                self._idle_ns + (fb_monotonic_ns() - since if since else 0))

    def __repr__(self):
        return (f"<flinkbuf.InputGate name={self._name!r} channels={self._n} "
                f"finished={self._num_finished}{' closed' if self._closed else ''}>")
