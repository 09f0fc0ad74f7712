# Buffer debloating (Flink's FLIP-183): what a user configures, and the
# arithmetic of one input gate over csrc/io/debloat.c (throughput, the
# smoothed buffer size, when to announce it).  Included by _io.pyx.

from flinkbuf.checks import check_real

# The constructor's keywords, in order.
_DEBLOAT_FIELDS = ("enabled", "target", "period", "samples", "threshold", "min_size")
_DEBLOAT_MAX_SECONDS = 3600.0
_INT64_MAX = 2 ** 63 - 1


cdef int64_t _seconds_ns(double seconds) noexcept:
    """Non-negative seconds as whole nanoseconds (rounded; INT64_MAX from
    2**63 ns on)."""
    cdef double ns = seconds * 1e9 + 0.5
    return INT64_MAX if ns >= 9223372036854775808.0 else <int64_t>ns


@cython.final
cdef class BufferDebloatConfig:
    """How input gates size the buffers their producers fill (buffer
    debloating), immutable.

    ``enabled``: whether gates debloat at all.  Each gate samples every
    ``period`` seconds (at least 0.001) how many bytes its consumer took in
    the time it did not wait for data, and sizes buffers so that the bytes
    in flight toward it take ``target`` seconds (at most 3600) to consume,
    smoothed over about ``samples`` samples (1..1000).  A new size is
    announced once it moved by ``threshold`` percent (0..100) of the last
    one, or reached a bound: ``min_size`` bytes (at least 1; where the
    segment size is known, a larger ``min_size`` counts as the segment
    size) or the segment size.

    TypeError or ValueError naming the option (``buffer_debloat_target``
    and so on) for a bad value; ints are not bools here."""

    def __cinit__(self, enabled=False, target=1.0, period=0.2, samples=20, threshold=25,
                  min_size=256):
        if not isinstance(enabled, bool):
            raise TypeError(f"buffer_debloat must be a bool, got {type(enabled).__name__}")
        self._enabled = enabled
        self._target = check_real(target, "buffer_debloat_target", gt=0,
                                  le=_DEBLOAT_MAX_SECONDS, unit="seconds")
        self._period = check_real(period, "buffer_debloat_period", ge=0.001,
                                  le=_DEBLOAT_MAX_SECONDS, unit="seconds")
        self._samples = check_int(samples, "buffer_debloat_samples", 1, FB_DEBLOAT_MAX_SAMPLES)
        self._threshold = check_int(threshold, "buffer_debloat_threshold", 0, 100)
        self._min_size = check_int(min_size, "buffer_debloat_min_size", 1)

    @property
    def enabled(self):
        """Whether input gates debloat their buffers."""
        return self._enabled

    @property
    def target(self):
        """Seconds the bytes in flight toward a consumer should take to consume."""
        return self._target

    @property
    def period(self):
        """Seconds between two samples of a gate."""
        return self._period

    @property
    def samples(self):
        """Samples the size is smoothed over: each moves it by 2 / (samples + 1)
        of the way to its aim."""
        return self._samples

    @property
    def threshold(self):
        """Percent of the last announced size a new one must differ by."""
        return self._threshold

    @property
    def min_size(self):
        """The smallest buffer size, in bytes."""
        return self._min_size

    cdef tuple _fields(self):
        return (self._enabled, self._target, self._period, self._samples, self._threshold,
                self._min_size)

    def replace(self, *, enabled=None, target=None, period=None, samples=None, threshold=None,
                min_size=None):
        """A copy with the fields given (not None) changed, checked as the
        constructor checks them."""
        values = (enabled, target, period, samples, threshold, min_size)
        fields = [mine if value is None else value
                  for mine, value in zip(self._fields(), values)]
        return BufferDebloatConfig(*fields)

    @classmethod
    def from_options(cls, buffer_debloat=None, buffer_debloat_target=None,
                     buffer_debloat_period=None, buffer_debloat_samples=None,
                     buffer_debloat_threshold=None, buffer_debloat_min_size=None, *,
                     default=None):
        """The configuration from the options as a user passes them:
        ``buffer_debloat`` a bool (on or off) or a BufferDebloatConfig, the
        others its fields, each None for the value of ``default`` (a
        BufferDebloatConfig; None: the defaults).  With a BufferDebloatConfig
        as ``buffer_debloat``, the options given override its fields."""
        cdef BufferDebloatConfig base = _DEFAULT_DEBLOAT
        if default is not None:
            if type(default) is not BufferDebloatConfig:
                raise TypeError(f"default must be a BufferDebloatConfig or None, got "
                                f"{type(default).__name__}")
            base = default
        if isinstance(buffer_debloat, bool):
            base = base.replace(enabled=buffer_debloat)
        elif type(buffer_debloat) is BufferDebloatConfig:
            base = buffer_debloat
        elif buffer_debloat is not None:
            raise TypeError(f"buffer_debloat must be a bool, a BufferDebloatConfig or None, "
                            f"got {type(buffer_debloat).__name__}")
        values = (buffer_debloat_target, buffer_debloat_period, buffer_debloat_samples,
                  buffer_debloat_threshold, buffer_debloat_min_size)
        if all(value is None for value in values):
            return base
        return base.replace(target=buffer_debloat_target, period=buffer_debloat_period,
                            samples=buffer_debloat_samples, threshold=buffer_debloat_threshold,
                            min_size=buffer_debloat_min_size)

    def __eq__(self, other):
        if type(other) is not BufferDebloatConfig:
            return NotImplemented
        return self._fields() == (<BufferDebloatConfig>other)._fields()

    def __ne__(self, other):
        if type(other) is not BufferDebloatConfig:
            return NotImplemented
        return self._fields() != (<BufferDebloatConfig>other)._fields()

    def __hash__(self):
        return hash((BufferDebloatConfig, self._fields()))

    def __reduce__(self):
        return (BufferDebloatConfig, self._fields())

    def __repr__(self):
        return ("BufferDebloatConfig(" + ", ".join(
            f"{name}={value!r}" for name, value in zip(_DEBLOAT_FIELDS, self._fields())) + ")")


cdef BufferDebloatConfig _DEFAULT_DEBLOAT = BufferDebloatConfig()


@cython.final
cdef class BufferDebloater:
    """The buffer size one input gate announces, from samples of its
    consumer's throughput (see BufferDebloatConfig): starts at
    ``segment_size`` (Flink's start), stays within [min(config.min_size,
    segment_size), segment_size].  ``start_small``: starts at the minimum
    instead, and the first sample with active time sets the size at once
    (no smoothing, no doubling bound) and announces it whatever it is;
    what an :class:`InputGate` does, so that a slow consumer never starts
    behind whole segments.  Each sample moves the size part of the way to
    its aim (Flink's smoothing), aiming at most twice the size; from the
    second sample in a row that aims at twice or more, the size doubles at
    once (a consumer that sped up is back to whole segments in a few
    samples).  One thread samples it."""

    def __init__(self, BufferDebloatConfig config not None, segment_size, *,
                 bint start_small=False):
        if self._config is not None:
            raise RuntimeError("BufferDebloater is already initialised: make a new one")
        cdef int32_t size = as_int32(segment_size, "segment_size", 1)
        cdef fb_debloat_config_t cfg
        cdef char err[128]
        cfg.target_ns = max(1, _seconds_ns(config._target))
        cfg.period_ns = max(<int64_t>FB_DEBLOAT_MIN_PERIOD_NS, _seconds_ns(config._period))
        cfg.samples = config._samples
        cfg.threshold_pct = config._threshold
        cfg.min_size = min(config._min_size, size)
        cfg.max_size = size
        if fb_debloat_config_check(&cfg, err, sizeof(err)) != FB_OK:
            raise ValueError(f"bad buffer debloating configuration: "
                             f"{err.decode('ascii', 'replace')}")
        fb_debloater_init(&self._c, &cfg)
        if start_small:
            fb_debloater_start_small(&self._c)
        self._config = config

    cdef int32_t _sample(self, int64_t bytes, int64_t active_ns,
                         int32_t buffers_in_use) noexcept nogil:
        """fb_debloater_sample: the size to announce, or 0 (keep the last)."""
        return fb_debloater_sample(&self._c, bytes, active_ns, buffers_in_use)

    cdef double _ema(self) noexcept:
        return self._c.ema

    cdef int32_t _rising(self) noexcept:
        return self._c.rising

    def sample(self, bytes, active_seconds, buffers_in_use):
        """One sample: ``bytes`` the consumer took over ``active_seconds``
        of time it did not wait for data (none: the throughput stays the
        last one), and the buffers in flight toward it now (0 counts as 1).
        The new buffer size to announce, or None to keep the last one
        (``buffer_size``)."""
        if self._config is None:
            raise RuntimeError("BufferDebloater is not initialised")
        cdef int64_t n = check_int(bytes, "bytes", 0, _INT64_MAX)
        cdef double active = check_real(active_seconds, "active_seconds", ge=0,
                                        unit="seconds")
        cdef int32_t buffers = as_int32(buffers_in_use, "buffers_in_use", 0)
        cdef int32_t size = self._sample(n, _seconds_ns(active), buffers)
        return None if size == 0 else size

    @property
    def buffer_size(self):
        """The last announced buffer size in bytes (Flink's debloatedBufferSize)."""
        return self._c.size

    @property
    def throughput(self):
        """Bytes per second of the last sample with time that was not waiting."""
        return self._c.throughput

    @property
    def estimated_time_to_consume(self):
        """Seconds the buffers in use at the last sample take to consume at
        its size and the throughput (Flink's estimatedTimeToConsumeBuffersMs,
        in seconds)."""
        return self._c.time_to_consume_ns / 1e9

    @property
    def config(self):
        """The BufferDebloatConfig (None before __init__)."""
        return self._config

    @property
    def segment_size(self):
        """The largest buffer size, in bytes."""
        return self._c.cfg.max_size
