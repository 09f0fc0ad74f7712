# The arrow codec: records are pieces of column batches (a pyarrow
# RecordBatch, or a mapping of column name -> numpy array), whose format
# codecs/columns.py writes and reads (docs/FORMAT.md 5).  Included by
# _serialization.pyx.

from flinkbuf.serialization.codecs.columns import decode_piece as _decode_piece
from flinkbuf.serialization.codecs.columns import encode_parts as _encode_parts


cdef int _arrow_encode(RecordSerializer s, object record) except -1:
    """Stage the payload's parts: the large ones (column values) by
    reference, copied straight into the buffers."""
    for part in _encode_parts(record):
        _stage_raw(s, part, -1)
    return 0


cdef object _arrow_decode(const char *p, Py_ssize_t n, int64_t record_start, object base):
    """The batch in the payload [p, p + n) of the record at stream offset
    ``record_start``.  ``base``: a bytearray that is the payload (a record
    assembled across buffers: the batch's arrays view it), or None (the
    payload lies in a network buffer: copied once into a bytearray)."""
    if base is None or type(base) is not bytearray or PyByteArray_GET_SIZE(base) != n:
        base = PyByteArray_FromStringAndSize(p, n)
    try:
        return _decode_piece(base)
    except CorruptRecordError as e:
        err = CorruptRecordError(f"corrupt record at stream offset {record_start}: {e}")
        err.stream_offset = record_start
        raise err from None
