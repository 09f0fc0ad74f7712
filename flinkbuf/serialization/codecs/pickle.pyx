# The pickle codec: the payload is pickle.dumps(record, protocol=5).  An
# explicit opt-in: unpickling runs arbitrary code, so never use it with a
# peer that is not authenticated and trusted.  Included by _serialization.pyx.

cdef int _pickle_encode(RecordSerializer s, object record) except -1:
    cdef bytes data = pickle.dumps(record, protocol=5)
    return _bytes_encode(s, data)


cdef object _pickle_decode(const char *p, Py_ssize_t n, int64_t offset, object base):
    """Unpickle the payload [p, p + n) (``base``: an object holding it, or None)."""
    mv = PyMemoryView_FromMemory(<char *>p, n, PyBUF_READ) if base is None else base
    try:
        return pickle.loads(mv)
    except Exception as e:
        err = CorruptRecordError(
            f"corrupt record at stream offset {offset}: cannot unpickle the payload "
            f"of {n} bytes ({type(e).__name__}: {e})")
        err.stream_offset = offset
        raise err from e
    finally:
        if base is None:
            mv.release()
