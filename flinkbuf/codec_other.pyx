# The bytes and pickle codecs.  Included by _serialization.pyx.
#
# bytes:  the payload is the record's bytes (any bytes-like object); records
#         come back as bytes.
# pickle: the payload is pickle.dumps(record, protocol=5).  Explicit opt-in:
#         unpickling runs arbitrary code, so never use it with a peer that is
#         not authenticated and trusted.

cdef int _bytes_encode(RecordSerializer s, object record) except -1:
    cdef Py_buffer tmp
    cdef Py_buffer *view
    if type(record) is bytes:
        if PyBytes_GET_SIZE(record) >= EXTERNAL_MIN:
            _keep_object(s, record)
            _add_external(s, PyBytes_AS_STRING(record), PyBytes_GET_SIZE(record))
        else:
            _put_bytes(s, PyBytes_AS_STRING(record), PyBytes_GET_SIZE(record))
        return 0
    try:
        PyObject_GetBuffer(record, &tmp, PyBUF_SIMPLE)
    except BufferError:
        return _bytes_encode(s, memoryview(record).tobytes())
    except TypeError:
        raise TypeError(f"the bytes codec takes bytes-like records, got "
                        f"{type(record).__name__}") from None
    if tmp.len < EXTERNAL_MIN:
        try:
            _put_bytes(s, <const char *>tmp.buf, tmp.len)
        finally:
            PyBuffer_Release(&tmp)
        return 0
    PyBuffer_Release(&tmp)
    view = _keep_view(s, record)
    _add_external(s, <const char *>view.buf, view.len)
    return 0


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
