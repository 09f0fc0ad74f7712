# The bytes codec: the payload is the record's bytes (any bytes-like
# object); records come back as bytes.  Included by _serialization.pyx.

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
