# Flink's OutputFlusher: a thread per writer that hands partly filled
# buffers to the consumers every ``buffer_timeout`` seconds, so that a slow
# stream of records still flows.  Included by _io.pyx after record_writer.pyx.
#
# The flusher never takes a buffer from under the emitting thread: while the
# writer is busy with a record it only asks for a flush right after it
# (_flush_pending); an error of a timed flush is kept for the writer's next
# call.  The thread holds the writer by a weak reference and ends with it.


cdef object _as_buffer_timeout(object value):
    """``buffer_timeout``: None (no timer), or a real number of seconds,
    >= 0 and finite (at most threading.TIMEOUT_MAX), as a float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"buffer_timeout must be a number of seconds or None, "
                        f"got {type(value).__name__}")
    try:
        t = float(value)
    except OverflowError:
        t = float("inf")
    if not t >= 0:
        raise ValueError(f"buffer_timeout must be >= 0 seconds, got {value!r}")
    if t > threading.TIMEOUT_MAX:
        raise ValueError(f"buffer_timeout must be finite (at most {threading.TIMEOUT_MAX:.0f} s), "
                         f"got {value!r}: use None to hand buffers over only when they "
                         "are full (or on flush() and close())")
    return t


cdef int _start_flusher(RecordWriter w, double interval) except -1:
    """Start ``w``'s output flusher, every ``interval`` (> 0) seconds."""
    w._flusher_stop = threading.Event()
    w._flusher = threading.Thread(
        target=_output_flusher, args=(weakref.ref(w), w._flusher_stop, interval),
        name=f"flinkbuf-output-flusher-{w._name or id(w)}", daemon=True)
    w._flusher.start()
    return 0


cdef int _stop_flusher(RecordWriter w) except -1:
    """Stop ``w``'s output flusher, if it has one, and wait for it (unless
    this is the flusher's own thread)."""
    if w._flusher is not None:
        w._flusher_stop.set()
        if w._flusher is not threading.current_thread():
            w._flusher.join()
        w._flusher = None
    return 0


def _output_flusher(writer_ref, stop, interval):
    """Flink's OutputFlusher: flush a writer every ``interval`` seconds
    until ``stop`` is set or the writer is gone."""
    while not stop.wait(interval):
        writer = writer_ref()
        if writer is None:
            return
        _flusher_tick(<RecordWriter>writer)
        writer = None


cdef int _flusher_tick(RecordWriter w) except -1:
    """One timed flush of ``w``, or a request for one once its record is done."""
    if w._state != _W_OPEN:
        return 0
    if w._busy:
        w._flush_pending = True
        return 0
    try:
        w._flush_all(_FLUSH_TIMER)
    except BaseException as exc:        # kept for the writer's next call
        if w._flusher_error is None:
            w._flusher_error = exc
    return 0
