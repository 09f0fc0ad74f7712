# The bytes codec: the payload is the record's bytes (any bytes-like
# object); records come back as bytes.  Included by _serialization.pyx.

cdef int _bytes_encode(RecordSerializer s, object record) except -1:
    if type(record) is not bytes and not PyObject_CheckBuffer(record):
        raise TypeError(f"the bytes codec takes bytes-like records, got "
                        f"{type(record).__name__}")
    return _stage_raw(s, record, -1)
