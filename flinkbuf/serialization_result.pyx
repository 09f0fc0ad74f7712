# SerializationResult: what copy_to_buffer() achieved.  Included by _serialization.pyx.

@cython.final
cdef class SerializationResult:
    """Outcome of :meth:`RecordSerializer.copy_to_buffer`, as in Flink:

    * ``FULL_RECORD``: the record is completely copied, the buffer has room;
    * ``FULL_RECORD_MEMORY_SEGMENT_FULL``: the record is complete and the
      buffer is full;
    * ``PARTIAL_RECORD_MEMORY_SEGMENT_FULL``: the buffer is full and part
      of the record remains (copy it into the next buffer).

    The three instances are class attributes
    (``SerializationResult.FULL_RECORD`` ...) and compare by identity.
    """

    def __init__(self):
        raise TypeError("use the three SerializationResult class attributes")

    def __repr__(self):
        return f"<SerializationResult.{self.name}>"

    def __reduce__(self):
        return (_result_by_name, (self.name,))


cdef SerializationResult _make_result(str name, bint full_record, bint full_buffer):
    cdef SerializationResult r = SerializationResult.__new__(SerializationResult)
    r.name = name
    r.is_full_record = full_record
    r.is_full_buffer = full_buffer
    return r


cdef SerializationResult _R_FULL_RECORD = _make_result("FULL_RECORD", True, False)
cdef SerializationResult _R_FULL_RECORD_FULL = _make_result(
    "FULL_RECORD_MEMORY_SEGMENT_FULL", True, True)
cdef SerializationResult _R_PARTIAL_FULL = _make_result(
    "PARTIAL_RECORD_MEMORY_SEGMENT_FULL", False, True)


cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject *tp_dict
    void PyType_Modified(PyTypeObject *t)


cdef _set_class_attributes():
    # Flink's enum names as class attributes (SerializationResult.FULL_RECORD).
    cdef PyTypeObject *tp = <PyTypeObject *>SerializationResult
    cdef dict d = <dict>tp.tp_dict
    for r in (_R_FULL_RECORD, _R_FULL_RECORD_FULL, _R_PARTIAL_FULL):
        d[r.name] = r
    PyType_Modified(tp)


_set_class_attributes()


cdef inline SerializationResult _result_for(int flags):
    if flags == FULL_RECORD:
        return _R_FULL_RECORD
    if flags == FULL_RECORD | FULL_BUFFER:
        return _R_FULL_RECORD_FULL
    return _R_PARTIAL_FULL


def _result_by_name(name):
    for r in (_R_FULL_RECORD, _R_FULL_RECORD_FULL, _R_PARTIAL_FULL):
        if r.name == name:
            return r
    raise ValueError(f"no SerializationResult named {name!r}")
