# Assembling a record that spans input chunks (RecordDeserializer's
# SPAN_PREFIX, SPAN_HEAD and SPAN_BODY stages): where its bytes go, and what
# each completed stage leads to.  Included by _serialization.pyx after
# deserializer.pyx, whose _next_record_general copies the bytes in.
#
# The prefix is staged in the deserializer's _hdr; a typed record's first
# HEAD_PEEK payload bytes too, to see whether it is one large bytes value
# (then its body is assembled straight into the resulting bytes object).
# Memory beyond ASSEMBLY_EAGER bytes is taken as the bytes arrive, so a
# length prefix alone never costs more than that.

cdef extern from *:
    """
    /* Whether bytearray o, which nobody but the caller references (reference
     * count 1: no view of it either), can hold n bytes as it is: its whole
     * allocation in use from its start, and n at least half of it (so that
     * PyByteArray_Resize only sets the size).  Never where reference counts
     * can change under us (no GIL). */
    #if !defined(Py_GIL_DISABLED)
    static inline int fb_bytearray_reusable(PyObject *o, Py_ssize_t n) {
        PyByteArrayObject *b = (PyByteArrayObject *)o;
        return Py_REFCNT(o) == 1 && PyByteArray_CheckExact(o) && b->ob_exports == 0
            && b->ob_start == b->ob_bytes && n < b->ob_alloc && n >= b->ob_alloc / 2;
    }
    #else
    static inline int fb_bytearray_reusable(PyObject *o, Py_ssize_t n) {
        (void)o; (void)n;
        return 0;
    }
    #endif
    """
    bint fb_bytearray_reusable(PyObject *o, Py_ssize_t n) noexcept

# Records assembled in a bytearray of this many bytes are assembled again in
# one of the last two such records' once the consumer dropped them (the
# arrays of a batch view its record): below, malloc serves them from the
# heap; above, a spare would pin much memory, and the copy dwarfs the cost of
# fresh pages.  A new one is allocated with SPARE_ARRAY_SLACK more (never
# touched until used), so that a slightly larger record fits it too.
cdef Py_ssize_t SPARE_ARRAY_MIN = 1 << 16
cdef Py_ssize_t SPARE_ARRAY_MAX = 4 << 20
cdef Py_ssize_t SPARE_ARRAY_SLACK = 8         # 1/8 more


cdef object _assembly_array(RecordDeserializer d, Py_ssize_t cap):
    """A bytearray of ``cap`` bytes to assemble a record in: a spare (one
    of the last two returned that nobody else references any more: no batch
    views it) if one holds ``cap`` bytes, else a new one (remembered as a
    spare if of a size worth it).  Its content is garbage: every byte is
    written by the assembly before the record is decoded."""
    cdef object ba
    if cap < SPARE_ARRAY_MIN or cap > SPARE_ARRAY_MAX:
        return PyByteArray_FromStringAndSize(NULL, cap)
    if d._spare_array is not None and fb_bytearray_reusable(<PyObject *>d._spare_array, cap):
        ba = d._spare_array
    elif (d._spare_array_older is not None
          and fb_bytearray_reusable(<PyObject *>d._spare_array_older, cap)):
        ba = d._spare_array_older
        d._spare_array_older = d._spare_array
        d._spare_array = ba
    else:
        ba = PyByteArray_FromStringAndSize(NULL, cap + cap // SPARE_ARRAY_SLACK)
        d._spare_array_older = d._spare_array
        d._spare_array = ba
    PyByteArray_Resize(ba, cap)          # within its allocation: sets the size
    return ba


cdef int _new_target(RecordDeserializer d, Py_ssize_t size, bint as_bytes) except -1:
    """Memory for a record (or its one bytes value) of ``size`` bytes.
    Up to ASSEMBLY_EAGER bytes, or what the input already holds, are
    allocated now, the rest as the bytes arrive: a length prefix alone
    never costs more memory than a fixed amount (max_record_size bounds
    the total)."""
    cdef Py_ssize_t cap = size
    cdef Py_ssize_t avail
    cdef _Chunk c
    if cap > ASSEMBLY_EAGER:
        avail = d._cur_end - d._cur_pos
        for c in d._pending[d._pending_head:]:
            avail += c.end - c.start
        cap = ASSEMBLY_EAGER if avail < ASSEMBLY_EAGER else avail
        if cap > size:
            cap = size
    if as_bytes:
        d._target = PyBytes_FromStringAndSize(NULL, cap)
        d._dst = PyBytes_AS_STRING(d._target)
    else:
        d._target = _assembly_array(d, cap)
        d._dst = PyByteArray_AS_STRING(d._target)
    d._target_is_value = as_bytes
    d._cap = cap
    return 0

cdef int _grow_target(RecordDeserializer d, Py_ssize_t min_size) except -1:
    """Grow the record being assembled to at least ``min_size`` bytes
    (at most the record's size), geometrically."""
    cdef Py_ssize_t cap = d._cap * 2
    cdef PyObject *o
    if cap < min_size:
        cap = min_size
    if cap > d._need:
        cap = d._need
    if d._target_is_value:
        # _PyBytes_Resize needs the only reference: take it over
        o = <PyObject *>d._target
        Py_INCREF(d._target)
        d._target = None
        if _PyBytes_Resize(&o, cap) < 0:
            return -1                      # o was freed; MemoryError is set
        d._target = <object>o
        Py_DECREF(d._target)
        d._dst = PyBytes_AS_STRING(d._target)
    else:
        PyByteArray_Resize(d._target, cap)
        d._dst = PyByteArray_AS_STRING(d._target)
    d._cap = cap
    return 0

cdef object _span_step(RecordDeserializer d):
    """A stage of the assembled record is complete: move to the next one.
    Returns the record once it is done, else NO_RECORD."""
    cdef Py_ssize_t n, h, raw
    cdef const char *hdr = <const char *>d._hdr
    if d._span == SPAN_PREFIX:
        n = <Py_ssize_t>fb_load_u32(hdr, 1)
        if n > d._max_record_size:
            return d._bad_length(n)
        d._rec_len = n
        if d._codec == CODEC_TYPED and n > 0:
            # peek at the value header before choosing where the body goes
            d._span = SPAN_HEAD
            d._dst = <char *>d._hdr + 4
            d._have = 0
            d._need = d._cap = n if n < HEAD_PEEK else HEAD_PEEK
            return _NO_RECORD
        _new_target(d, n, d._codec == CODEC_BYTES)
        d._span = SPAN_BODY
        d._have = 0
        d._need = n
        if n > 0:
            return _NO_RECORD
    elif d._span == SPAN_HEAD:
        n = d._rec_len
        h = d._have
        if h < n:
            raw = <Py_ssize_t>fb_load_u32(hdr + 5, 0)
            if h == HEAD_PEEK and <uint8_t>hdr[4] == T_BYTES32 and raw == n - HEAD_PEEK:
                # one bytes value: assemble it straight into the result
                _new_target(d, raw, True)
                d._have = 0
                d._need = raw
            else:
                _new_target(d, n, False)
                memcpy(d._dst, hdr + 4, <size_t>h)
                d._need = n
            d._span = SPAN_BODY
            return _NO_RECORD
        # the whole payload fit in the peek area
        d._span = SPAN_NONE
        d._dst = NULL
        return d._decode_or_fail(hdr + 4, n, d._rec_start, None)
    # SPAN_BODY complete
    d._span = SPAN_NONE
    d._dst = NULL
    target = d._target
    d._target = None
    if d._target_is_value:
        return target
    return d._decode_or_fail(PyByteArray_AS_STRING(target), d._rec_len,
                                d._rec_start, target)
