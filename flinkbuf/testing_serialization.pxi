# Test hooks of the serialization layer (included by _testing.pyx).

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
    keeps for a large dict (codec_typed.pyx) makes of ``keys``, distinct
    keys inserted in order: ``(table size, slots visited)``."""
    cdef fb_shadow s
    cdef Py_ssize_t same
    cdef Py_hash_t h
    cdef int r = 0
    fb_shadow_init(&s)
    try:
        for k in keys:
            h = PyObject_Hash(k)
            r = fb_shadow_before(&s, type(k) is str, 1 << 32)
            if r == 0:
                r = fb_shadow_after(&s, h, True, &same, 0)
            if r:
                raise MemoryError()
        return s.size, s.probes
    finally:
        fb_shadow_free(&s)


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
                    while True:
                        r = des._next_record()
                        if is_no_record(r):
                            break
                        count += 1
                        if keep:
                            out.append(r)
                    buf = pool.request_buffer()
                    if buf is None:
                        raise RuntimeError("the pool has no buffer")
                if flags & FULL_RECORD:
                    break
        des._feed(buf)
        buf = None
        while True:
            r = des._next_record()
            if is_no_record(r):
                break
            count += 1
            if keep:
                out.append(r)
    finally:
        if buf is not None:
            buf._release()
    return out if keep else count
