# The serializer's staging area: a growable C byte area for everything
# encoded inline, plus a list of pieces that also points at large external
# values (kept alive, copied once, straight into the destination buffers).
# Included by _serialization.pyx; the fields live on RecordSerializer.

cdef Py_ssize_t STAGE_INITIAL = 256
cdef Py_ssize_t STAGE_KEEP_MAX = 1 << 20   # larger staging areas are freed after use


cdef int _stage_grow(RecordSerializer s, Py_ssize_t need) except -1:
    """Make room for ``need`` staged bytes in total."""
    cdef Py_ssize_t cap = s._stage_cap * 2
    if cap < need:
        cap = need
    if cap < STAGE_INITIAL:
        cap = STAGE_INITIAL
    cdef char *p = <char *>PyMem_Realloc(s._stage, <size_t>cap)
    if p == NULL:
        raise MemoryError(f"cannot grow the record staging area to {cap} bytes")
    s._stage = p
    s._stage_cap = cap
    return 0


cdef inline char *_put(RecordSerializer s, Py_ssize_t n) except NULL:
    """Reserve ``n`` bytes at the end of the staging area; returns where to write."""
    cdef Py_ssize_t need = s._stage_len + n
    if need > s._stage_cap:
        _stage_grow(s, need)
    cdef char *p = s._stage + s._stage_len
    s._stage_len = need
    return p


cdef inline int _put_bytes(RecordSerializer s, const char *src, Py_ssize_t n) except -1:
    cdef char *p = _put(s, n)
    memcpy(p, src, <size_t>n)
    return 0


cdef int _reserve_pieces(RecordSerializer s, Py_ssize_t cap) except -1:
    cdef Piece *p
    if cap > s._pieces_cap:
        p = <Piece *>PyMem_Realloc(s._pieces, sizeof(Piece) * <size_t>cap)
        if p == NULL:
            raise MemoryError()
        s._pieces = p
        s._pieces_cap = cap
    return 0


cdef int _add_piece(RecordSerializer s, const char *ptr, Py_ssize_t off,
                    Py_ssize_t n) except -1:
    cdef Piece *p
    if s._npieces == s._pieces_cap:
        _reserve_pieces(s, s._pieces_cap * 2)
    p = &s._pieces[s._npieces]
    p.ptr = ptr
    p.off = off
    p.len = n
    s._npieces += 1
    return 0


cdef int _close_staged_piece(RecordSerializer s) except -1:
    """End the open staged piece (bytes staged since the last external one)."""
    if s._stage_len > s._piece_start:
        _add_piece(s, NULL, s._piece_start, s._stage_len - s._piece_start)
        s._piece_start = s._stage_len
    return 0


cdef int _add_external(RecordSerializer s, const char *ptr, Py_ssize_t n) except -1:
    """Stage ``n`` bytes at ``ptr`` by reference; the caller keeps them alive
    (``_keep_object`` or ``_keep_view``) until the record is cleared."""
    _close_staged_piece(s)
    _add_piece(s, ptr, 0, n)
    s._ext_bytes += n
    return 0


cdef inline int _stage_record(RecordSerializer s, Py_ssize_t head, object owner,
                              const char *ptr, Py_ssize_t n) noexcept:
    """The staged record is the first ``head`` staging bytes (prefix
    included), then, if ``n`` > 0, ``n`` bytes at ``ptr`` kept alive by
    ``owner`` (the staging area holds no other external value)."""
    s._owner = owner
    s._stage_len = head
    s._piece_start = head
    s._ext_bytes = n
    s._pieces[0].ptr = NULL
    s._pieces[0].off = 0
    s._pieces[0].len = head
    s._npieces = 1
    if n:
        s._pieces[1].ptr = ptr
        s._pieces[1].off = 0
        s._pieces[1].len = n
        s._npieces = 2
    s._cur_piece = 0
    s._cur_off = 0
    fb_store_u32(s._stage, <uint32_t>(head - 4 + n), 1)
    s._record_len = head + n
    return 0


cdef inline int _stage_inline_record(RecordSerializer s, Py_ssize_t total) noexcept:
    """The staged record is the first ``total`` staging bytes (prefix
    included): one piece, ready to copy."""
    return _stage_record(s, total, None, NULL, 0)


cdef inline int _keep_object(RecordSerializer s, object o) except -1:
    if s._owner is None:
        s._owner = o                 # the common case: one large value
    elif s._owners is None:
        s._owners = [o]
    else:
        s._owners.append(o)
    return 0


cdef Py_buffer *_keep_view(RecordSerializer s, object o) except NULL:
    """Export a buffer of ``o`` (pinning it) that lives until the record is
    cleared.  Raises BufferError for objects that are not C-contiguous."""
    cdef Py_ssize_t cap
    cdef Py_buffer *v
    if s._nviews == s._views_cap:
        cap = s._views_cap * 2 if s._views_cap else 4
        v = <Py_buffer *>PyMem_Realloc(s._views, sizeof(Py_buffer) * <size_t>cap)
        if v == NULL:
            raise MemoryError()
        s._views = v
        s._views_cap = cap
    v = &s._views[s._nviews]
    PyObject_GetBuffer(o, v, PyBUF_SIMPLE)
    s._nviews += 1
    return v


cdef inline Py_ssize_t _payload_pos(RecordSerializer s) noexcept:
    """Offset in the record payload of the next byte to be staged."""
    return s._stage_len + s._ext_bytes - 4


cdef int _stage_clear(RecordSerializer s) except -1:
    """Forget the staged record and release what kept its pieces alive."""
    cdef Py_ssize_t i, n = s._nviews
    s._npieces = 0
    s._cur_piece = 0
    s._cur_off = 0
    s._record_len = 0
    s._stage_len = 0
    s._piece_start = 0
    s._ext_bytes = 0
    if n:
        s._nviews = 0
        for i in range(n):
            PyBuffer_Release(&s._views[i])
    if s._owner is not None:
        s._owner = None
        if s._owners:
            PyList_SetSlice(s._owners, 0, PY_SSIZE_T_MAX, NULL)
    if s._stage_cap > STAGE_KEEP_MAX:
        PyMem_Free(s._stage)
        s._stage = NULL
        s._stage_cap = 0
    return 0
