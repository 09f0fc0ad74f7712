# RecordWriter.emit_all: the records of an iterable in one call, the loop,
# the selector and the serializer in C.  Included by _io.pyx.

cdef enum:
    # Records between two chances for other threads to take the GIL (the
    # loop holds it, and a list's records run no Python code) and for signal
    # handlers: what the interpreter's switch interval does for a Python loop.
    _EMIT_YIELD_EVERY = 1024

# Where emit_all was when an exception came (the note it adds says so).
cdef enum:
    _AT_ITERABLE = 0        # asking the iterable for the next record
    _AT_RECORD = 1          # writing a record
    _AT_PAUSE = 2           # between records, letting other threads run


cdef object _records_iter(object records):
    """The iterator of ``records``; TypeError naming what it got."""
    try:
        return iter(records)
    except TypeError:
        raise TypeError(f"emit_all() takes an iterable of records, got "
                        f"{type(records).__name__}") from None


# The selectors whose channel the fast run computes itself (_FastSelector.kind).
cdef enum:
    _FAST_NONE = 0          # any other selector: every record by _emit_entered
    _FAST_ROUND_ROBIN = 1   # RoundRobinSelector
    _FAST_KEY_FIELD = 2     # HashSelector by a field (an index, or by_first_field)
    _FAST_KEY_RECORD = 3    # HashSelector(): the record is the key


cdef struct _FastSelector:
    # What the fast run needs of the writer's selector (kept alive by it).
    int kind
    Py_ssize_t index                    # _FAST_KEY_FIELD: the key's field
    const fb_key_assignment_t *assign   # _FAST_KEY_*: hash code -> channel
    int32_t *next                       # _FAST_ROUND_ROBIN: the selector's _next ...
    int32_t rr                          # ... as the fast path moves it on, then stored
    int32_t n                           # channels
    PyObject **current                  # the items of the writer's _current (n, for good)


cdef Py_ssize_t _emit_all(RecordWriter w, object records) except -1:
    """RecordWriter.emit_all: enter the writer once, then every record."""
    cdef type t = type(records)
    cdef object it = records if t is list or t is tuple else _records_iter(records)
    cdef _FastSelector fs
    w._enter()
    try:
        w._check_open()
        _fast_selector(w, &fs)
        if t is list or t is tuple:
            return _emit_sequence(w, it, t is list, &fs)
        return _emit_loop(w, it, &fs)
    finally:
        w._user = 0


cdef int _fast_selector(RecordWriter w, _FastSelector *fs) except -1:
    """Fill ``fs`` for ``w``'s selector: _FAST_NONE unless it is one whose
    channel the fast run computes as its _select would, with no Python code."""
    cdef ChannelSelector sel = w._selector
    cdef HashSelector hs
    fs.kind = _FAST_NONE
    fs.index = 0
    fs.assign = NULL
    fs.next = NULL
    fs.rr = 0
    fs.n = w._n
    fs.current = PySequence_Fast_ITEMS(w._current)
    if w._broadcast or w._flush_always or w._ser._codec != CODEC_TYPED:
        return 0        # every record by _emit_entered (a flush after each, ...)
    if type(sel) is RoundRobinSelector:
        fs.kind = _FAST_ROUND_ROBIN
        fs.next = &(<RoundRobinSelector>sel)._next
    elif type(sel) is HashSelector:
        hs = <HashSelector>sel
        if hs._assign.channel == NULL or hs._key is not None:
            return 0
        fs.assign = &hs._assign
        if hs._key_index == _KEY_FIRST_FIELD:
            fs.kind = _FAST_KEY_FIELD       # fs.index 0
        elif hs._key_index >= 0:
            fs.kind = _FAST_KEY_FIELD
            fs.index = hs._key_index
        else:
            fs.kind = _FAST_KEY_RECORD
    return 0


cdef inline int32_t _fast_channel(const _FastSelector *fs, PyObject *record) noexcept:
    """The channel ``fs``'s selector picks for ``record`` when that takes no
    Python code and cannot fail: an exact tuple or list keyed by an int
    field, an int record (a round robin's channel is not advanced here);
    else -1."""
    cdef PyTypeObject *t = Py_TYPE(<object>record)
    cdef PyObject *key = record
    if fs.kind == _FAST_ROUND_ROBIN:
        return fs.rr
    if fs.kind == _FAST_KEY_FIELD:
        # by_first_field keys exact tuples and lists by field 0 too
        if t == <PyTypeObject *>tuple and fs.index < PyTuple_GET_SIZE(<object>record):
            key = PyTuple_GET_ITEM(<object>record, fs.index)
        elif t == <PyTypeObject *>list and fs.index < PyList_GET_SIZE(<object>record):
            key = PyList_GET_ITEM(<object>record, fs.index)
        else:
            return -1
    elif fs.kind != _FAST_KEY_RECORD:
        return -1
    return _small_int_channel(fs.assign, key)


cdef inline bint _fast_ready(RecordWriter w) noexcept:
    """``w`` is in the state in which _emit_entered writes a record with no
    check failing and nothing to do after it (no flush due), and its
    serializer may write records straight into buffers."""
    return (w._state == _W_OPEN and not w._broken and w._flusher_error is None
            and w._partition._state == _P_LIVE and not w._flush_pending
            and w._ser._writes_direct())


cdef inline bint _write_fast(_FastSelector *fs, PyObject *record) noexcept:
    """Write ``record`` as _emit_entered would, when that is the common case
    (the selector picks its channel with no Python code, and write_flat
    encodes it into the channel's current buffer, leaving room): True; else
    False, and nothing changed (the buffer's bytes past its writer index
    aside).  The writer must be _fast_ready.  Borrowed references
    throughout: nothing here can drop one."""
    return _write_to(fs, _fast_channel(fs, record), record)


cdef inline bint _write_to(_FastSelector *fs, int32_t ch, PyObject *record) noexcept:
    """_write_fast with the channel _fast_channel gave (-1: not fast)."""
    if <uint32_t>ch >= <uint32_t>fs.n:
        return False
    cdef PyObject *cur = fs.current[ch]
    if cur == <PyObject *>None or (<Buffer>cur)._data == NULL:
        return False
    cdef Py_ssize_t at = (<Buffer>cur)._writer
    cdef Py_ssize_t space = (<Buffer>cur)._capacity - at
    cdef Py_ssize_t n = write_flat((<Buffer>cur)._data + at, space, <object>record)
    if n < 0 or n == space:         # a full buffer: _emit_entered hands it over
        return False
    (<Buffer>cur)._writer = at + n
    if fs.kind == _FAST_ROUND_ROBIN:
        fs.rr = ch + 1 if ch + 1 < fs.n else 0
    return True


cdef inline bint _write_one(_FastSelector *fs, PyObject *record) noexcept:
    """_write_fast of one record, the round robin's position taken from the
    selector and stored back."""
    if fs.kind == _FAST_ROUND_ROBIN:
        fs.rr = fs.next[0]
    if not _write_fast(fs, record):
        return False
    if fs.kind == _FAST_ROUND_ROBIN:
        fs.next[0] = fs.rr
    return True


cdef inline void _prefetch_ahead(PyObject **items, Py_ssize_t i, Py_ssize_t stop) noexcept:
    """Ask for the record 16 ahead of ``i`` and the two fields of the pair 8
    ahead (records are mostly cache misses), within ``stop``."""
    cdef PyObject *rec
    if i + 16 < stop:
        fb_prefetch(items[i + 16])
        rec = items[i + 8]
        if Py_TYPE(<object>rec) == <PyTypeObject *>tuple and PyTuple_GET_SIZE(<object>rec) >= 2:
            fb_prefetch(PyTuple_GET_ITEM(<object>rec, 0))
            fb_prefetch(PyTuple_GET_ITEM(<object>rec, 1))


cdef Py_ssize_t _fast_run(RecordWriter w, const _FastSelector *fs, object seq,
                          Py_ssize_t i, Py_ssize_t stop) noexcept:
    """Write the records of the list or tuple ``seq`` from index ``i`` by
    _write_fast while it takes them, up to ``stop`` (<= the length); the
    index of the first not written.  No Python code runs: the writer's
    state and the list stay as they are, other threads wait for the GIL."""
    cdef Py_ssize_t start = i
    # A copy of *fs in local variables (the bytes stored into buffers could
    # alias *fs for the compiler, which would reload it every record).
    cdef _FastSelector f = fs[0]
    cdef PyObject **items = PySequence_Fast_ITEMS(seq)
    cdef int32_t ch, ahead
    if f.kind == _FAST_NONE or not _fast_ready(w):
        return i
    if f.kind == _FAST_ROUND_ROBIN:
        f.rr = f.next[0]
        while i < stop:
            _prefetch_ahead(items, i, stop)
            if not _write_fast(&f, items[i]):
                break
            i += 1
        f.next[0] = f.rr
    elif i < stop:
        # A key's channel one record ahead: where a record goes is known
        # before the previous one is written (else the processor waits on,
        # or guesses wrong about, which buffer the last one went to).
        ch = _fast_channel(&f, items[i])
        while True:
            _prefetch_ahead(items, i, stop)
            ahead = _fast_channel(&f, items[i + 1]) if i + 1 < stop else -1
            if not _write_to(&f, ch, items[i]):
                break
            i += 1
            if i == stop:
                break
            ch = ahead
    w._records_out += i - start
    return i


cdef Py_ssize_t _emit_sequence(RecordWriter w, object seq, bint is_list,
                               const _FastSelector *fs) except -1:
    """Emit the records of a list or tuple by index (a list may change size
    meanwhile: code run for a record may change it), the common ones in
    fast runs, the others by _emit_entered; the count.  Every
    _EMIT_YIELD_EVERY records other threads get a chance to run.  An
    exception gets a note naming the record's index."""
    cdef Py_ssize_t i = 0, n, stop, pause = _EMIT_YIELD_EVERY
    cdef int at = _AT_RECORD
    cdef object record
    try:
        while True:
            n = PyList_GET_SIZE(seq) if is_list else PyTuple_GET_SIZE(seq)
            stop = n if n < pause else pause
            if i >= stop:
                break
            i = _fast_run(w, fs, seq, i, stop)
            if i < stop:
                at = _AT_RECORD
                record = <object>(PyList_GET_ITEM(seq, i) if is_list
                                  else PyTuple_GET_ITEM(seq, i))
                w._emit_entered(record)
                record = None
                i += 1
            if i == pause:
                at = _AT_PAUSE
                _let_others_run()
                pause += _EMIT_YIELD_EVERY
    except BaseException as exc:
        _note_index(exc, i, at)
        raise
    return i


cdef Py_ssize_t _emit_loop(RecordWriter w, object it, _FastSelector *fs) except -1:
    """Emit every record of the iterator ``it``, each by _write_fast or else
    by _emit_entered, as emit does; the count.  An exception gets a note
    naming the record's index."""
    cdef Py_ssize_t i = 0
    cdef int at = _AT_ITERABLE
    cdef bint fast = fs.kind != _FAST_NONE
    try:
        for record in it:
            at = _AT_RECORD
            # the iterator ran Python code: the writer's state is checked again
            if fast and _fast_ready(w) and _write_one(fs, <PyObject *>record):
                w._records_out += 1
            else:
                w._emit_entered(record)
            i += 1
            if not i % _EMIT_YIELD_EVERY:
                at = _AT_PAUSE
                _let_others_run()
            at = _AT_ITERABLE
    except BaseException as exc:
        _note_index(exc, i, at)
        raise
    return i


cdef int _let_others_run() except -1:
    """Release the GIL for a moment (a thread waiting for it since the
    switch interval takes it now) and run signal handlers."""
    with nogil:
        pass
    PyErr_CheckSignals()
    return 0


cdef int _note_index(BaseException exc, Py_ssize_t index, int at) except -1:
    """Add a note to ``exc`` naming where emit_all stopped (PEP 678: shown
    by tracebacks from Python 3.11 on, kept in ``__notes__`` before)."""
    if at == _AT_RECORD:
        note = (f"RecordWriter.emit_all: the record at index {index} of the iterable was not "
                f"written; the {index} before it were")
    elif at == _AT_ITERABLE:
        note = (f"RecordWriter.emit_all: the iterable raised for the record at index {index}; "
                f"the {index} before it were written")
    else:
        note = f"RecordWriter.emit_all was interrupted after writing {index} records"
    try:
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(note)
        else:                       # Python 3.10
            notes = getattr(exc, "__notes__", None)
            if notes is None:
                exc.__notes__ = [note]
            else:
                notes.append(note)
    except Exception:               # noqa: BLE001 - an exception that takes no notes
        pass
    return 0
