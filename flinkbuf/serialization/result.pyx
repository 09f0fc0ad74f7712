# SerializationResult: what copy_to_buffer() achieved.  Included by _serialization.pyx.
#
# A plain class with __slots__, not a cdef class: CPython specializes
# attribute loads from slots (LOAD_ATTR_SLOT) but not from the getset
# descriptors Cython generates for cdef attributes, and a user's loop tests
# `res.is_full_buffer` once per record.

class SerializationResult:
    """Outcome of :meth:`RecordSerializer.copy_to_buffer`, as in Flink:

    * ``FULL_RECORD``: the record is completely copied, the buffer has room;
    * ``FULL_RECORD_MEMORY_SEGMENT_FULL``: the record is complete and the
      buffer is full;
    * ``PARTIAL_RECORD_MEMORY_SEGMENT_FULL``: the buffer is full and part
      of the record remains (copy it into the next buffer).

    The three instances are class attributes
    (``SerializationResult.FULL_RECORD`` ...), immutable, and compare by
    identity.
    """

    __slots__ = ("is_full_record", "is_full_buffer", "name")

    def __init__(self, *args, **kwargs):
        raise TypeError("use the three SerializationResult class attributes")

    def __init_subclass__(cls, **kwargs):
        raise TypeError("SerializationResult cannot be subclassed")

    def __setattr__(self, name, value):
        raise AttributeError("SerializationResult instances are immutable")

    def __delattr__(self, name):
        raise AttributeError("SerializationResult instances are immutable")

    def __repr__(self):
        return f"<SerializationResult.{self.name}>"

    def __reduce__(self):
        return (_result_by_name, (self.name,))


cdef object _make_result(str name, bint full_record, bint full_buffer):
    r = object.__new__(SerializationResult)
    object.__setattr__(r, "name", name)
    object.__setattr__(r, "is_full_record", full_record)
    object.__setattr__(r, "is_full_buffer", full_buffer)
    setattr(SerializationResult, name, r)      # Flink's enum names as class attributes
    return r


cdef object _R_FULL_RECORD = _make_result("FULL_RECORD", True, False)
cdef object _R_FULL_RECORD_FULL = _make_result("FULL_RECORD_MEMORY_SEGMENT_FULL", True, True)
cdef object _R_PARTIAL_FULL = _make_result("PARTIAL_RECORD_MEMORY_SEGMENT_FULL", False, True)


cdef inline object _result_for(int flags):
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
