# Test hooks of the io layer (included by _testing.pyx): its contract
# (_io.pxd) and nothing else.

# ---- layer 3 -------------------------------------------------------------------

def serialize_event(event):
    """The bytes a user event travels as (to build event buffers by hand)."""
    return _serialize_event(event)


def attach_reader(ResultPartition partition not None):
    """Count a reader in another process on ``partition``, as a connection
    that serves one of its subpartitions does (until detach_reader)."""
    partition._check_initialised()
    partition._reader_attached()


def detach_reader(ResultPartition partition not None):
    """That reader is done (as the connection says when it ends the
    subpartition's channel)."""
    if partition._reader_count() <= 0:
        raise ValueError("no reader is attached")
    partition._reader_detached()


def num_readers(ResultPartition partition not None):
    """Readers in other processes that hold ``partition`` now."""
    return partition._reader_count()


def debloater_ema(BufferDebloater debloater not None):
    """The smoothed size a debloater's announced sizes follow (a float)."""
    return debloater._ema()


def debloater_rising(BufferDebloater debloater not None):
    """The samples in a row (0..2) that aimed at twice the smoothed size or
    more: at 2 the size doubles at once."""
    return debloater._rising()


def debloater_sample_ns(BufferDebloater debloater not None, int64_t bytes, int64_t active_ns,
                        int32_t buffers_in_use):
    """What the gate calls (the C fast path): the size to announce or 0.
    Takes what the Python method refuses (negative counts, exact ns)."""
    if debloater.config is None:
        raise RuntimeError("BufferDebloater is not initialised")
    return debloater._sample(bytes, active_ns, buffers_in_use)


def announce_buffer_size(InputChannel channel not None, int32_t size, int32_t count=0):
    """Have ``channel`` (of any kind: a gate's are ``gate.channels``)
    announce ``size`` to its producer, and that ``count`` buffers (0: no
    bound) hold its in-flight data, as its gate does for buffer debloating;
    the gate checks both first, this hook only that they are in range."""
    if size <= 0:
        raise ValueError(f"a buffer size is positive, got {size}")
    if count < 0:
        raise ValueError(f"a buffer count is at least 0, got {count}")
    channel._announce_buffer_size(size, count)


def buffers_in_use(InputChannel channel not None):
    """The buffers in flight toward ``channel``'s consumer now, as its gate
    counts them for buffer debloating."""
    return channel._buffers_in_use()
