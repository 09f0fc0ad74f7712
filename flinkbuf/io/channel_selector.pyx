# Channel selectors: which subpartition(s) a record goes to.  Included by _io.pyx.

cdef int32_t _ALL_BLOCKED = -2     # _select: every channel is blocked, wait
cdef Py_ssize_t _KEY_FIRST_FIELD = -2    # HashSelector._key_index of by_first_field


# ---- selectors -------------------------------------------------------------

cdef class ChannelSelector:
    """Chooses the channel (subpartition) of each record.  A writer sets its
    selector up with the number of channels; use one selector per writer.

    Abstract.  For your own selector in Python, pass a function
    ``fn(record, num_channels)`` or subclass :class:`CustomSelector` and
    override its ``select(record, num_channels)``: a writer calls neither
    :meth:`select_channel` nor :meth:`setup` of a subclass, so a Python
    subclass of ChannelSelector itself (or one that overrides those two)
    cannot be instantiated.  Selectors compiled with Cython may subclass
    ChannelSelector and implement the C-level ``_select`` (see
    ``channel_selector.pxd``)."""

    def __cinit__(self):
        self._n = 0
        self._broadcast = False
        cdef type t = type(self)
        if t is ChannelSelector:
            raise TypeError("ChannelSelector is abstract: use one of the selectors "
                            "(RoundRobinSelector, HashSelector, ...), or CustomSelector with "
                            "a function fn(record, num_channels) for your own")
        if _defined_in_python(t):
            _check_python_selector(t)

    cdef int _setup(self, int32_t num_channels) except -1:
        if num_channels < 1:
            raise ValueError(f"num_channels must be >= 1, got {num_channels}")
        self._n = num_channels
        return 0

    cdef int _bind(self, ResultPartition partition) except -1:
        return 0

    cdef int32_t _select(self, object record) except -1:
        raise NotImplementedError

    cdef int _init_once(self) except -1:
        if self._initialised:
            raise RuntimeError(f"{type(self).__name__} is already initialised")
        self._initialised = True
        return 0

    def setup(self, num_channels):
        """Prepare for ``num_channels`` channels (a writer does this).
        RuntimeError once a :class:`RecordWriter` set the selector up: a
        selector serves one writer, for good."""
        cdef int32_t n = as_int32(num_channels, "num_channels", 1)
        if self._bound:
            raise RuntimeError(f"the selector serves a RecordWriter of {self._n} channels and "
                               "cannot be set up again: use one selector per writer")
        self._setup(n)

    def select_channel(self, record):
        """The channel for ``record``."""
        if self._n == 0:
            raise RuntimeError("selector is not set up: call setup(num_channels)")
        if self._broadcast:
            raise RuntimeError("a broadcast selector sends every record to every channel")
        cdef int32_t ch = self._select(record)
        if ch == _ALL_BLOCKED:
            return None
        return ch

    @property
    def num_channels(self):
        return self._n

    @property
    def is_broadcast(self):
        return self._broadcast

    def __repr__(self):
        return f"<flinkbuf.{type(self).__name__} num_channels={self._n}>"


cdef int _check_python_selector(type t) except -1:
    """A selector class defined in Python must be a CustomSelector that
    chooses channels in ``select``: the writer calls nothing else."""
    if not issubclass(t, CustomSelector):
        raise TypeError(
            f"{t.__name__} subclasses ChannelSelector in Python, but a RecordWriter never "
            "asks it for a channel: subclass CustomSelector and override "
            "select(record, num_channels), or pass CustomSelector a function")
    for name in ("select_channel", "setup"):
        if getattr(t, name) is not getattr(ChannelSelector, name):
            raise TypeError(
                f"{t.__name__} overrides {name}(), which a RecordWriter never calls: "
                "override select(record, num_channels) instead")
    return 0


@cython.final
cdef class RoundRobinSelector(ChannelSelector):
    """Flink's rebalance: channels in turn, from a random start (or ``start``)."""

    def __init__(self, start=None):
        if start is not None:
            as_int32(start, "start", 0)
        self._init_once()
        self._start = start

    cdef int _setup(self, int32_t num_channels) except -1:
        ChannelSelector._setup(self, num_channels)
        if self._start is None:
            self._next = <int32_t>random.randrange(num_channels)
        else:
            self._next = <int32_t>(self._start % num_channels)
        return 0

    cdef int32_t _select(self, object record) except -1:
        cdef int32_t ch = self._next
        self._next = ch + 1 if ch + 1 < self._n else 0
        return ch


@cython.final
cdef class RescaleSelector(ChannelSelector):
    """Flink's rescale: channels in turn from channel 0.  With
    :func:`pointwise_connections` a producer feeds only a subset of the
    consumers, so rescaling stays local."""

    cdef int _setup(self, int32_t num_channels) except -1:
        ChannelSelector._setup(self, num_channels)
        self._next = 0
        return 0

    cdef int32_t _select(self, object record) except -1:
        cdef int32_t ch = self._next
        self._next = ch + 1 if ch + 1 < self._n else 0
        return ch


@cython.final
cdef class HashSelector(ChannelSelector):
    """Flink's key-group partitioning (``keyBy``): the key's Java hash code
    (:func:`java_hash_code`) is murmur-hashed into one of ``max_parallelism``
    key groups, and key groups map to channels in contiguous ranges
    (``murmurHash(hashCode) % max_parallelism``, then ``key_group *
    num_channels // max_parallelism``), bit-exact with Flink's
    ``KeyGroupRangeAssignment`` for the same parallelism and max
    parallelism whenever the hash codes agree: Python ints in the int32
    range hash as Java ``Integer`` keys, larger ones as ``Long`` (see
    :func:`java_hash_code` for ``Long`` keys with small negative values),
    ``str`` as ``String``.

    ``key``: None (the record is the key), an int (the field
    ``record[key]`` of a tuple, a list or another sequence; IndexError
    naming the key and the record's length when the record is shorter,
    TypeError when it cannot be indexed), or a callable ``key(record)``.
    :meth:`by_first_field` makes the selector of pair records.
    ``max_parallelism`` (keyword-only): the number of key groups, Flink's
    max parallelism of the consuming operator (default 128; at most
    32768)."""

    def __cinit__(self):
        self._key_index = -1            # as HashSelector(): the record is the key
        self._max_parallelism = 128

    def __init__(self, key=None, *, max_parallelism=128):
        cdef object fn = None
        cdef Py_ssize_t index = -1
        if key is None:
            pass
        elif isinstance(key, int) and not isinstance(key, bool):
            if key < 0:
                raise ValueError(f"key index must be >= 0, got {key}")
            if key > 2147483647:
                raise ValueError(f"key index must be < 2**31, got {key}")
            index = key
        elif callable(key):
            fn = key
        else:
            raise TypeError("key must be None, a field index or a callable")
        cdef int32_t mp = as_int32(max_parallelism, "max_parallelism", 1)
        if mp > 32768:
            raise ValueError(f"max_parallelism must be <= 32768 (Flink's limit), "
                             f"got {max_parallelism}")
        self._init_once()
        self._key = fn
        self._key_index = index
        self._max_parallelism = mp

    def __dealloc__(self):
        fb_key_assignment_free(&self._assign)

    cdef int _setup(self, int32_t num_channels) except -1:
        if num_channels > self._max_parallelism:
            raise ValueError(f"{num_channels} channels exceed max_parallelism "
                             f"{self._max_parallelism}")
        ChannelSelector._setup(self, num_channels)
        fb_key_assignment_free(&self._assign)
        if fb_key_assignment_init(&self._assign, num_channels, self._max_parallelism) != FB_OK:
            raise MemoryError("no memory for the key groups' channels")
        return 0

    @classmethod
    def by_first_field(cls, *, max_parallelism=128):
        """The selector of pair records (Spark's pair RDDs): a tuple or a
        list (subclasses too: named tuples, ``pyspark.sql.Row``) is keyed
        by its first field, any other record by itself.  An empty tuple or
        list raises IndexError."""
        cdef HashSelector selector = HashSelector(max_parallelism=max_parallelism)
        selector._key_index = _KEY_FIRST_FIELD
        return selector

    cdef int32_t _select(self, object record) except -1:
        cdef object key
        cdef int32_t h, ch
        cdef PyObject *field
        cdef Py_ssize_t index = self._key_index
        cdef PyTypeObject *t = Py_TYPE(record)
        if self._assign.channel == NULL:
            raise RuntimeError("selector is not set up: call setup(num_channels)")
        if index == _KEY_FIRST_FIELD:       # pairs: field 0 of a sequence, else the record
            index = 0 if t == <PyTypeObject *>tuple or isinstance(record, (tuple, list)) else -1
        if index >= 0:
            # Exact tuples and lists inline: the length is compared and the
            # item taken with no Python code in between (a small int key
            # hashed without a reference count or a call); the rest, and
            # every error, in _field.
            if t == <PyTypeObject *>tuple and index < PyTuple_GET_SIZE(record):
                field = PyTuple_GET_ITEM(record, index)
                ch = _small_int_channel(&self._assign, field)
                if ch >= 0:
                    return ch
                key = <object>field
            elif t == <PyTypeObject *>list and index < PyList_GET_SIZE(record):
                key = <object>PyList_GET_ITEM(record, index)
            else:
                key = _field(record, index)
        elif self._key is not None:
            key = self._key(record)
        else:
            key = record
        if type(key) is int:
            h = _java_int(key)
        else:
            _java_hash(key, &h, 0)
        return fb_key_assignment_channel(&self._assign, h)

    @property
    def max_parallelism(self):
        return self._max_parallelism


cdef object _field(object record, Py_ssize_t index):
    """``record[index]`` for a key index (>= 0), through the record's own
    item lookup (bounds-checked for lists and tuples); every failure names
    the key and the record."""
    cdef type t = type(record)
    try:
        return record[index]
    except (IndexError, KeyError) as exc:
        raise _key_out_of_range(record, index, exc) from exc
    except TypeError as exc:
        if getattr(t, "__getitem__", None) is None:
            raise TypeError(f"key index {index} selects a field of each record, but records "
                            f"of type {t.__name__} have no fields ({_short_repr(record)}): "
                            f"key tuples or lists, or pass key=None (the record itself) or "
                            f"a function") from exc
        raise


cdef object _key_out_of_range(object record, Py_ssize_t index, object cause):
    """The IndexError (the KeyError of a mapping) of a field the record
    does not have, with the record's length when it has one."""
    try:
        n = len(record)
    except Exception:               # noqa: BLE001 - the message goes without it
        n = None
    of = f"({type(record).__name__})" if n is None else \
        f"of length {n} ({type(record).__name__})"
    if index == 0 and n == 0:
        message = f"an empty record {of} has no first field to key it by"
    else:
        message = f"key index {index} is out of range for a record {of}: {_short_repr(record)}"
    return KeyError(message) if isinstance(cause, KeyError) else IndexError(message)


cdef object _short_repr(object value):
    """``repr(value)`` shortened (reprlib), for messages about records of
    any size; never raises."""
    try:
        return _reprlib.repr(value)
    except Exception:               # noqa: BLE001 - a broken __repr__
        return f"<{type(value).__name__}>"


@cython.final
cdef class BroadcastSelector(ChannelSelector):
    """Every record to every channel."""

    def __cinit__(self):
        self._broadcast = True

    cdef int32_t _select(self, object record) except -1:
        raise RuntimeError("a broadcast selector sends every record to every channel")


@cython.final
cdef class ForwardSelector(ChannelSelector):
    """Flink's forward: the one channel to the consumer of the same index
    (the partition must have exactly one subpartition)."""

    cdef int _setup(self, int32_t num_channels) except -1:
        if num_channels != 1:
            raise ValueError(f"forward needs exactly one channel, got {num_channels}")
        return ChannelSelector._setup(self, num_channels)

    cdef int32_t _select(self, object record) except -1:
        return 0


@cython.final
cdef class GlobalSelector(ChannelSelector):
    """Flink's global: every record to channel 0."""

    cdef int32_t _select(self, object record) except -1:
        return 0


cdef class CustomSelector(ChannelSelector):
    """``fn(record, num_channels) -> channel`` (Flink's custom partitioner).

    The extension point for selectors written in Python: pass ``fn``, or
    subclass and override :meth:`select` (then ``fn`` may be omitted).  The
    channel may be any integer (``int``, numpy integers, anything with
    ``__index__``) but not a bool; IndexError outside
    ``[0, num_channels)``."""

    def __init__(self, fn=None):
        if fn is None:
            if type(self).select is CustomSelector.select:
                raise TypeError("CustomSelector needs a function fn(record, num_channels), "
                                "or a subclass that overrides select(record, num_channels)")
        elif not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self._init_once()
        self._fn = fn

    def select(self, record, num_channels):
        """The channel for ``record`` among ``num_channels``: ``fn``'s answer
        unless a subclass overrides this."""
        if self._fn is None:
            raise NotImplementedError(
                f"{type(self).__name__}: pass fn or override select(record, num_channels)")
        return self._fn(record, num_channels)

    cdef int32_t _select(self, object record) except -1:
        cdef object ch
        cdef int overflow = 0
        cdef long long c
        if self._fn is not None and type(self) is CustomSelector:
            ch = self._fn(record, self._n)
        else:
            ch = self.select(record, self._n)
        if type(ch) is not int:
            ch = _channel_index(ch)
        c = PyLong_AsLongLongAndOverflow(ch, &overflow)
        if overflow or c < 0 or c >= self._n:
            raise IndexError(f"custom selector returned channel {ch}, not in [0, {self._n})")
        return <int32_t>c


cdef object _channel_index(object ch):
    """A channel that is not exactly an int: any integer type (numpy
    integers, IntEnum: ``operator.index``), but not bool, whose True/False
    is more likely a predicate's answer than a channel."""
    if isinstance(ch, bool) or not PyIndex_Check(ch):
        raise TypeError(f"custom selector returned {type(ch).__name__}, not an integer "
                        "channel index")
    return operator.index(ch)


@cython.final
cdef class BacklogAwareRebalanceSelector(ChannelSelector):
    """Round robin (Flink's rebalance) that steers records away from
    blocked subpartitions, so that one slow consumer cannot hog a shared
    output pool: the backlog-aware round robin, by name ``"backlog_aware"``
    (the name ``"rebalance"`` is plain round robin, as in Flink).

    A subpartition counts as blocked while its backlog (finished buffers its
    consumer has not taken yet) is at least ``max_backlog``.  By default that
    is derived from the pool: with a per-channel cap ``C`` it is ``C - 3``
    (the blocked subpartition then holds at most ``C - 1`` buffers, counting
    the one being filled and the one its consumer reads, so the cap never
    makes the pool unavailable), else half of an even share of the pool,
    ``num_buffers // (2 * num_subpartitions)``; at least 1.

    A record goes to the round-robin channel unless that one is blocked,
    then to the next channel in turn that is not.  When all are blocked the
    writer waits (that is backpressure) until a consumer takes a buffer.
    Only usable with a :class:`RecordWriter` (it reads the partition).
    ``start`` (keyword-only): the first round-robin channel (default
    random)."""

    def __cinit__(self):
        self._max_backlog = -1          # as BacklogAwareRebalanceSelector()
        self._cap = -1

    def __init__(self, max_backlog=None, *, start=None):
        cdef int32_t mb = -1 if max_backlog is None else \
            as_int32(max_backlog, "max_backlog", 1)
        if start is not None:
            as_int32(start, "start", 0)
        self._init_once()
        self._max_backlog = mb
        self._start = start

    cdef int _bind(self, ResultPartition partition) except -1:
        if self._partition is not None and self._partition is not partition:
            raise ValueError("selector is already bound to another partition")
        self._partition = partition
        self._cap = partition._cap
        return 0

    cdef int _setup(self, int32_t num_channels) except -1:
        ChannelSelector._setup(self, num_channels)
        if self._start is None:
            self._next = <int32_t>random.randrange(num_channels)
        else:
            self._next = <int32_t>(self._start % num_channels)
        self._countdown = 0
        self._threshold = 0
        return 0

    cdef int32_t _compute_threshold(self) except -1:
        """The threshold the configuration and the pool give now (bound and
        set up)."""
        cdef int32_t t
        if self._max_backlog > 0:
            t = self._max_backlog
        elif self._cap > 0:
            t = self._cap - 3
        else:
            t = self._partition._pool._stats().size // (2 * self._n)
        return t if t > 0 else 1

    cdef int _refresh(self) except -1:
        self._threshold = self._compute_threshold()
        self._countdown = 1024
        return 0

    cdef bint _is_blocked(self, int32_t channel) except -1:
        """The channel's backlog reached the threshold, or its consumer left
        (a released channel takes nothing)."""
        cdef ResultSubpartition sp = <ResultSubpartition>self._partition._subpartitions[channel]
        return (fb_subpart_state(&sp._c) != FB_SP_LIVE
                or fb_subpart_backlog(&sp._c) >= self._threshold)

    cdef int32_t _select(self, object record) except -1:
        if self._partition is None:
            raise RuntimeError("BacklogAwareRebalanceSelector works only inside a RecordWriter")
        if self._countdown <= 0:
            self._refresh()
        self._countdown -= 1
        cdef int32_t ch = self._next, k, other
        self._next = ch + 1 if ch + 1 < self._n else 0
        if not self._is_blocked(ch):
            return ch
        for k in range(1, self._n):
            other = ch + k
            if other >= self._n:
                other -= self._n
            if not self._is_blocked(other):
                self._steered += 1
                return other
        return _ALL_BLOCKED

    cdef int32_t _wait_unblocked(self, double timeout) except -1:
        """After _ALL_BLOCKED: wait without the GIL until a consumer takes
        something (or ``timeout``), then pick again; _ALL_BLOCKED if still
        none is free."""
        cdef _ConsumeSignal signal = self._partition._signal
        cdef uint64_t seen = fb_signal_seq(&signal._c)
        cdef int32_t k, ch
        for k in range(self._n):
            ch = self._next + k
            if ch >= self._n:
                ch -= self._n
            if not self._is_blocked(ch):
                self._next = ch + 1 if ch + 1 < self._n else 0
                self._steered += 1
                return ch
        cdef ResultSubpartition sp
        for sp in self._partition._subpartitions:
            if fb_subpart_state(&sp._c) == FB_SP_LIVE:
                break
        else:
            raise PartitionReleasedError(
                f"every consumer of {self._partition._describe()} released its subpartition")
        cdef int64_t deadline = fb_deadline_after(timeout)
        with nogil:
            fb_signal_wait(&signal._c, seen, deadline)
        return _ALL_BLOCKED

    @property
    def max_backlog(self):
        """The backlog at which a subpartition counts as blocked: the
        threshold in force (a derived one is refreshed from the pool every
        1024 records), or before the first record the one it would start
        with; unbound, the configured value (None: derived from the pool).
        Reading it changes nothing."""
        if self._partition is None or self._n == 0:
            return None if self._max_backlog < 0 else self._max_backlog
        if self._threshold > 0:
            return self._threshold
        return self._compute_threshold()

    @property
    def num_steered(self):
        """Records sent to another channel than round robin chose."""
        return self._steered


# ---- by name ------------------------------------------------------------------

cdef ChannelSelector _as_selector(object selector):
    if selector is None:
        return RoundRobinSelector()
    if isinstance(selector, ChannelSelector):
        return <ChannelSelector>selector
    if isinstance(selector, str):
        factory = _SELECTORS.get(selector.replace("-", "_"))
        if factory is None:
            raise ValueError(f"unknown selector {selector!r}; one of {sorted(_SELECTORS)}")
        return factory()
    if callable(selector):
        return CustomSelector(selector)
    raise TypeError(f"selector must be a ChannelSelector, a name or a callable, "
                    f"got {type(selector).__name__}")


# The selectors by name, the one table of them ("-" may stand for "_"):
# "rebalance" is Flink's rebalance, round robin; the backlog-aware round
# robin is "backlog_aware".
_SELECTORS = {
    "round_robin": RoundRobinSelector,
    "rebalance": RoundRobinSelector,
    "rescale": RescaleSelector,
    "hash": HashSelector,
    "broadcast": BroadcastSelector,
    "forward": ForwardSelector,
    "global": GlobalSelector,
    "backlog_aware": BacklogAwareRebalanceSelector,
}
