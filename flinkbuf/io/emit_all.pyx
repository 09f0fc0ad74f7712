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


cdef Py_ssize_t _emit_all(RecordWriter w, object records) except -1:
    """RecordWriter.emit_all: enter the writer once, then every record."""
    cdef type t = type(records)
    cdef object it = records if t is list or t is tuple else _records_iter(records)
    w._enter()
    try:
        w._check_open()
        return _emit_loop(w, it)
    finally:
        w._user = 0


cdef Py_ssize_t _emit_loop(RecordWriter w, object it) except -1:
    """Emit every record of ``it`` (a list or tuple by index, anything else
    through its iterator), each by _emit_entered, as emit does; the count.
    An exception gets a note naming the record's index."""
    cdef Py_ssize_t i = 0
    cdef int at = _AT_ITERABLE
    try:
        for record in it:
            at = _AT_RECORD
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
