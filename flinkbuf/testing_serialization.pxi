# Test hooks of the serialization layer (included by _testing.pyx): its
# contract (_serialization.pxd) and nothing else.

# ---- layer 2 -------------------------------------------------------------------

def stage_general(value, codec="typed"):
    """The staged record (prefix and payload) as the general
    encoder writes it, bypassing the fast paths of serialize_record."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_general(value)
    return ser._record_bytes()


def stage(value, codec="typed"):
    """The staged record as serialize_record writes it."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_record(value)
    return ser._record_bytes()


def dict_shadow(keys):
    """What the shadow of CPython's dict table that decoding
    keeps for a large dict (codecs/dict_keys.pyx) makes of ``keys``, distinct
    keys inserted in order: ``(table size, slots visited)``."""
    return dict_shadow_stats(keys)


cdef int _drain(RecordDeserializer des, list out, bint keep) except -1:
    """Take every complete record out of ``des``: how many."""
    cdef Py_ssize_t count = 0
    cdef object r
    while True:
        r = des._next_record()
        if is_no_record(r):
            return count
        count += 1
        if keep:
            out.append(r)


def c_round_trip(RecordSerializer ser not None, RecordDeserializer des not None,
                  pool, list records, bint keep=True):
    """Move ``records`` through ``ser`` into
    buffers from ``pool`` and out of ``des`` with the C-level contract only,
    as a RecordWriter and an InputGate do.  Returns the records read (with
    ``keep``), else how many were read."""
    cdef list out = []
    cdef Py_ssize_t count = 0
    cdef Buffer buf = pool.request_buffer()
    cdef int flags
    cdef object r
    if buf is None:
        raise RuntimeError("the pool has no buffer")
    try:
        for r in records:
            ser._serialize_record(r)
            while True:
                flags = ser._copy_to_buffer(buf)
                if flags & FULL_BUFFER:
                    des._feed(buf)
                    buf = None
                    count += _drain(des, out, keep)
                    buf = pool.request_buffer()
                    if buf is None:
                        raise RuntimeError("the pool has no buffer")
                if flags & FULL_RECORD:
                    break
        des._feed(buf)
        buf = None
        count += _drain(des, out, keep)
    finally:
        if buf is not None:
            buf._release()
    return out if keep else count
