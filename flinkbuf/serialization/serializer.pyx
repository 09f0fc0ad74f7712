# RecordSerializer: stages one length-prefixed record and copies it into
# buffers of any size.  Included by _serialization.pyx.

# The record codecs by name, each at its number (CODEC_TYPED, CODEC_BYTES,
# CODEC_PICKLE, CODEC_ARROW): the one table of codec names, which every
# layer imports.
CODECS = ("typed", "bytes", "pickle", "arrow")
cdef dict _CODECS = {name: number for number, name in enumerate(CODECS)}


cdef int _codec_arg(object codec) except -1:
    try:
        return _CODECS[codec]
    except (KeyError, TypeError):
        check_choice(codec, "codec", CODECS)
        raise


@cython.final
cdef class RecordSerializer:
    """Turns records into Flink's wire format, one at a time: a 4-byte
    big-endian payload length, then the payload (the record encoded by
    ``codec``: ``"typed"``, ``"bytes"`` or ``"pickle"``, see docs/FORMAT.md;
    pickle is opt-in and only for trusted, authenticated peers: unpickling
    runs code chosen by the writer).

    ``serialize_record(r)`` stages a record (encoding errors surface here);
    ``copy_to_buffer(buf)`` copies as much as fits at the buffer's writer
    index and says whether the record is done and whether the buffer is
    full; ``reset()`` rewinds to copy the same record again (broadcast).
    Large bytes, str and array values are not copied when staged: the
    serializer keeps a reference and copies them straight into the buffers,
    so do not mutate them until the record is copied.  Not thread-safe: one
    serializer per writing thread.
    """

    def __cinit__(self):
        self._codec = CODEC_TYPED
        self._stage = NULL
        _reserve_pieces(self, 8)     # the inline fast path needs one, always there

    def __init__(self, codec="typed"):
        self._codec = _codec_arg(codec)

    def __dealloc__(self):
        cdef Py_ssize_t i
        for i in range(self._nviews):
            PyBuffer_Release(&self._views[i])
        self._nviews = 0
        PyMem_Free(self._views)
        PyMem_Free(self._pieces)
        PyMem_Free(self._stage)

    # -- the C-level contract -------------------------------------------------

    cdef int _serialize_record(self, object record) except -1:
        """Stage ``record`` (replacing any staged one)."""
        cdef Py_ssize_t n
        if self._busy:
            raise RuntimeError("RecordSerializer used re-entrantly (from code run while "
                               "encoding) or from two threads at once")
        if self._owner is not None and not self._nviews and not self._owners:
            self._owner = None       # the previous record referenced one value: let it go
        if self._nviews or self._owner is not None or self._stage_cap > STAGE_KEEP_MAX:
            _stage_clear(self)
        if self._stage_cap < STAGE_INITIAL:
            _stage_grow(self, STAGE_INITIAL)
        # Fast paths (no Python code runs, nothing can fail): common record
        # shapes encoded straight into the staging area.
        cdef char *p = self._stage + 4
        if self._codec == CODEC_TYPED:
            n = enc_flat(p, self._stage + self._stage_cap, record)
            if n >= 0:
                return _stage_inline_record(self, 4 + n)
            if type(record) is bytes:
                n = PyBytes_GET_SIZE(record)
                if EXTERNAL_MIN <= n <= MAX_PAYLOAD - 5:
                    # one large bytes value: its 32-bit header, then the value by reference
                    p[0] = <char>T_BYTES32
                    fb_store_u32(p + 1, <uint32_t>n, 0)
                    return _stage_record(self, 9, record, PyBytes_AS_STRING(record), n)
        elif self._codec == CODEC_BYTES and type(record) is bytes:
            n = PyBytes_GET_SIZE(record)
            if n < EXTERNAL_MIN:
                if 4 + n > self._stage_cap:
                    _stage_grow(self, 4 + n)
                    p = self._stage + 4
                memcpy(p, PyBytes_AS_STRING(record), <size_t>n)
                return _stage_inline_record(self, 4 + n)
            if n <= MAX_PAYLOAD:
                return _stage_record(self, 4, record, PyBytes_AS_STRING(record), n)
        return self._serialize_general(record)

    cdef int _write_record(self, Buffer buf, object record) noexcept:
        """Write ``record`` (prefix and payload) straight into ``buf`` at its
        writer index when it is of a shape the fast paths encode and fits
        the room left, nothing staged and no Python code run: FULL_RECORD,
        with FULL_BUFFER if it filled the buffer; 0 when it did not (stage
        it with _serialize_record)."""
        cdef char *p = buf._data
        cdef Py_ssize_t n, space = buf._capacity - buf._writer
        if p == NULL or space < 5 or not self._writes_direct():
            return 0
        p += buf._writer
        if self._codec == CODEC_TYPED:
            n = write_flat(p, space, record)
            if n < 0:
                return 0
        elif self._codec == CODEC_BYTES and type(record) is bytes:
            n = PyBytes_GET_SIZE(record)
            if n > space - 4:
                return 0
            memcpy(p + 4, PyBytes_AS_STRING(record), <size_t>n)
            fb_store_u32(p, <uint32_t>n, 1)
            n += 4
        else:
            return 0
        buf._writer += n
        return FULL_RECORD | FULL_BUFFER if buf._writer == buf._capacity else FULL_RECORD

    cdef bint _writes_direct(self) noexcept:
        """Records may be written straight into buffers (_write_record, or
        write_flat for the typed codec) now: not encoding, and no earlier
        record holds values staged by reference, which only staging lets
        go."""
        return not (self._busy or self._owner is not None or self._nviews
                    or self._stage_cap > STAGE_KEEP_MAX)

    cdef int _serialize_general(self, object record) except -1:
        if self._stage_cap < STAGE_INITIAL:
            _stage_grow(self, STAGE_INITIAL)
        self._npieces = 0
        self._record_len = 0
        self._cur_piece = 0
        self._cur_off = 0
        self._stage_len = 4          # the length prefix, written below
        self._piece_start = 0
        self._ext_bytes = 0
        self._busy = True
        try:
            if self._codec == CODEC_TYPED:
                _enc(self, record, 0)
            elif self._codec == CODEC_BYTES:
                _bytes_encode(self, record)
            elif self._codec == CODEC_ARROW:
                _arrow_encode(self, record)
            else:
                _pickle_encode(self, record)
            _close_staged_piece(self)
            if _payload_pos(self) > MAX_PAYLOAD:
                raise ValueError(f"a record of {_payload_pos(self)} bytes exceeds the "
                                 f"{MAX_PAYLOAD}-byte limit of the length prefix")
        except BaseException:
            self._busy = False
            _stage_clear(self)
            raise
        self._busy = False
        fb_store_u32(self._stage, <uint32_t>_payload_pos(self), 1)
        self._record_len = self._stage_len + self._ext_bytes
        return 0

    cdef int _copy_to_buffer(self, Buffer buf) except -1:
        """Copy staged bytes at ``buf``'s writer index until the record is
        done or the buffer is full; returns FULL_RECORD | FULL_BUFFER bits."""
        cdef char *data = buf._data
        if data == NULL:
            buf._check()
        if self._busy:
            raise RuntimeError("RecordSerializer used re-entrantly while encoding")
        cdef Py_ssize_t space = buf._capacity - buf._writer
        cdef char *dst = data + buf._writer
        cdef Piece *pc = self._pieces + self._cur_piece
        cdef Piece *last = self._pieces + self._npieces
        cdef Py_ssize_t off = self._cur_off, left
        cdef const char *src
        while pc < last:
            src = (pc.ptr if pc.ptr != NULL else self._stage + pc.off) + off
            left = pc.len - off
            if left > space:
                memcpy(dst, src, <size_t>space)
                self._cur_piece = pc - self._pieces
                self._cur_off = off + space
                buf._writer = buf._capacity
                return FULL_BUFFER
            memcpy(dst, src, <size_t>left)
            dst += left
            space -= left
            off = 0
            pc += 1
        self._cur_piece = self._npieces
        self._cur_off = 0
        buf._writer = buf._capacity - space
        return FULL_RECORD | FULL_BUFFER if space == 0 else FULL_RECORD

    cdef bint _has_serialized_data(self) noexcept:
        return self._cur_piece < self._npieces

    cdef int _reset(self) except -1:
        """Rewind to the start of the staged record."""
        if self._busy:
            raise RuntimeError("RecordSerializer used re-entrantly while encoding")
        self._cur_piece = 0
        self._cur_off = 0
        return 0

    cdef int _clear(self) except -1:
        if self._busy:
            raise RuntimeError("RecordSerializer used re-entrantly while encoding")
        return _stage_clear(self)

    cdef bytes _payload_bytes(self):
        """The staged payload (without the prefix) as one bytes object."""
        return self._staged_bytes(4)

    cdef bytes _record_bytes(self):
        """The staged record (prefix and payload) as one bytes object."""
        return self._staged_bytes(0)

    cdef bytes _staged_bytes(self, Py_ssize_t skip):
        cdef Py_ssize_t n = self._record_len - skip if self._record_len else 0
        cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
        cdef char *dst = PyBytes_AS_STRING(out)
        cdef Py_ssize_t i, k
        cdef const char *src
        cdef Piece *pc
        for i in range(self._npieces):
            pc = &self._pieces[i]
            src = pc.ptr if pc.ptr != NULL else self._stage + pc.off
            k = pc.len
            if skip:
                # the prefix is at the start of the first (staged) piece
                src += skip
                k -= skip
                skip = 0
            memcpy(dst, src, <size_t>k)
            dst += k
        return out

    # -- Python API -----------------------------------------------------------

    # The per-record calls are METH_O (positional only); Cython's clinic
    # signature of a METH_O method omits the "/", so the docstrings spell it out.
    @cython.always_allow_keywords(False)
    @cython.embedsignature(False)
    def serialize_record(self, record):
        """serialize_record($self, record, /)
--

Stage one record, replacing any staged one.  ``TypeError`` for a
        value the codec cannot encode, ``ValueError`` for a too deep or
        self-referencing structure or a record over 2 GiB - 1 bytes."""
        self._serialize_record(record)

    @cython.always_allow_keywords(False)
    @cython.embedsignature(False)
    def copy_to_buffer(self, Buffer buf not None):
        """copy_to_buffer($self, buf, /)
--

Copy the staged record, or what is left of it, into ``buf`` at its
        writer index; returns a :class:`SerializationResult`."""
        return _result_for(self._copy_to_buffer(buf))

    @property
    def has_serialized_data(self):
        """True while part of the staged record is not yet copied."""
        return self._cur_piece < self._npieces

    def reset(self):
        """Rewind so that the staged record is copied again from its start
        (broadcast the same record into another channel's buffer)."""
        self._reset()

    def clear(self):
        """Forget the staged record and release the values it referenced."""
        self._clear()

    @property
    def record_size(self):
        """Bytes of the staged record including the 4-byte prefix (0 if none)."""
        return self._record_len

    @property
    def codec(self):
        """The codec name."""
        return CODECS[self._codec]

    def __repr__(self):
        return (f"<flinkbuf.RecordSerializer codec={self.codec!r} "
                f"record_size={self._record_len} pending={self.has_serialized_data}>")
