# RecordDeserializer: reassembles length-prefixed records from buffers and
# bytes of any size.  Included by _serialization.pyx.
#
# A record that lies wholly inside one input chunk is decoded in place.  A
# record that spans chunks is copied piece by piece into memory of its own
# (for a typed record that is one large bytes value: straight into the
# resulting bytes object; record_assembly.pyx), so every chunk is released as
# soon as its bytes are consumed: decoded, or copied into the record being
# assembled.

cdef class NoRecordType:
    """The type of :data:`NO_RECORD`, its only instance."""

    def __cinit__(self, token=None):
        if token is not _NO_RECORD_TOKEN:
            raise TypeError("cannot create NoRecordType instances: use NO_RECORD")

    def __repr__(self):
        return "NO_RECORD"

    def __reduce__(self):
        return "NO_RECORD"


cdef object _NO_RECORD_TOKEN = object()
NO_RECORD = NoRecordType.__new__(NoRecordType, _NO_RECORD_TOKEN)
cdef object _NO_RECORD = NO_RECORD

# _typed_decode called as the C function it is: NULL with an exception set on error.
ctypedef PyObject *(*_raw_decode_fn)(const char *, Py_ssize_t, int64_t, int64_t,
                                     PyObject *) noexcept

cdef extern from "Python.h":
    PyObject *_raw_bytes "PyBytes_FromStringAndSize" (const char *v, Py_ssize_t n)

cdef extern from *:
    """
    /* Returns -1 so that Cython propagates the exception already set. */
    static int fb_reraise(void) { return -1; }

    /* Refill, in place, a bytes object of size n that nobody but the caller
     * references (reference count 1): 1 if done, else 0.  Nothing can
     * observe it (CPython extends a str in place on the same condition); it
     * saves the free and malloc of an object past pymalloc's 512 bytes,
     * which cost about as much as copying a KiB.  The cached hash is
     * forgotten.  Off where the object layout is not known to hold the hash
     * (Python >= 3.14) or reference counts can change under us (no GIL). */
    #if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
    static inline int fb_bytes_refill(PyObject *o, const char *p, Py_ssize_t n) {
        if (Py_REFCNT(o) != 1 || !PyBytes_CheckExact(o) || PyBytes_GET_SIZE(o) != n)
            return 0;
        memcpy(PyBytes_AS_STRING(o), p, (size_t)n);
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        ((PyBytesObject *)o)->ob_shash = -1;
    #pragma GCC diagnostic pop
        return 1;
    }
    #else
    static inline int fb_bytes_refill(PyObject *o, const char *p, Py_ssize_t n) {
        (void)o; (void)p; (void)n;
        return 0;
    }
    #endif
    """
    int fb_reraise() except -1
    bint fb_bytes_refill(PyObject *o, const char *p, Py_ssize_t n) noexcept

# Records returned as bytes of this many bytes are refilled in place once
# the consumer dropped them (see fb_bytes_refill): below, pymalloc is cheap;
# above, the copy dwarfs malloc and a spare would pin much memory.
cdef Py_ssize_t SPARE_MIN = 513
cdef Py_ssize_t SPARE_MAX = 1 << 16

cdef enum:
    SPAN_NONE = 0
    SPAN_PREFIX = 1
    SPAN_HEAD = 2
    SPAN_BODY = 3

cdef Py_ssize_t HEAD_PEEK = 5     # tag + u32 length: enough to spot one large bytes value
# A record spanning chunks is allocated whole when its prefix is read if it
# is at most this large (one allocation, no copy); a larger one grows as its
# bytes arrive, so that a length prefix alone never costs more than this.
cdef Py_ssize_t ASSEMBLY_EAGER = 16 << 20

cdef Py_ssize_t DEFAULT_MAX_RECORD_SIZE = 64 << 20


@cython.final
@cython.freelist(16)
cdef class _Chunk:
    def __dealloc__(self):
        # Dropped without _chunk_release (only when its owner is torn down).
        if self.has_view:
            self.has_view = False
            PyBuffer_Release(&self.view)


cdef int _chunk_release(_Chunk c) except -1:
    """Give the chunk's input back: recycle the Buffer or release the view."""
    cdef Buffer b = c.buf
    if b is not None:
        c.buf = None
        if b._data != NULL:          # else someone else recycled it already
            b._release()
    elif c.has_view:
        c.has_view = False
        PyBuffer_Release(&c.view)
    return 0


@cython.final
cdef class _RecordIterator:
    """What RecordDeserializer.records() returns."""
    cdef RecordDeserializer _des

    def __cinit__(self, des=None):
        # Never without a deserializer: __next__ does not check (per record).
        if type(des) is not RecordDeserializer:
            raise TypeError("records iterators are made by RecordDeserializer.records()")
        self._des = <RecordDeserializer>des

    def __iter__(self):
        return self

    def __next__(self):
        r = self._des._next_record()
        if type(r) is NoRecordType:
            raise StopIteration
        return r


@cython.final
@cython.no_gc_clear
cdef class RecordDeserializer:
    """Reassembles records from the byte stream a :class:`RecordSerializer`
    wrote, fed in chunks of any size: ``feed()`` a :class:`Buffer` (the
    deserializer takes over one reference and recycles it exactly once, as
    soon as its bytes are consumed, also when decoding fails) or any
    bytes-like object; ``records()`` yields every complete record so far; a
    partial record waits for more input; ``finish()`` ends the stream.

    Lengths above ``max_record_size`` are refused before anything is
    allocated, and a record decodes in time linear in its length: typed
    dicts whose keys are chosen to collide in CPython's hash table are
    refused (docs/FORMAT.md 2.3).  Malformed input raises
    :class:`CorruptRecordError` (a ``ValueError``) naming the stream offset
    and the reason; the deserializer then releases its input and refuses
    further use.  Not thread-safe: one deserializer per reading thread.
    """

    def __cinit__(self):
        # A deserializer made without __init__ is a default one.
        self._codec = CODEC_TYPED
        self._max_record_size = DEFAULT_MAX_RECORD_SIZE
        self._pending = []
        self._ready = []
        self._dst = NULL

    def __init__(self, codec="typed", max_record_size=64 << 20):
        self._codec = _codec_arg(codec)
        if isinstance(max_record_size, bool) or not isinstance(max_record_size, int):
            raise TypeError("max_record_size must be an int")
        if max_record_size < 0 or max_record_size > MAX_PAYLOAD:
            raise ValueError(f"max_record_size must be in [0, {MAX_PAYLOAD}], "
                             f"got {max_record_size}")
        self._max_record_size = max_record_size

    def __dealloc__(self):
        # Give back whatever is still held; errors cannot propagate from here.
        try:
            self._close()
        except BaseException:
            write_unraisable(self)

    # -- input chunks ---------------------------------------------------------

    cdef int _activate(self, _Chunk c) except -1:
        self._cur = c
        if c.buf is not None:
            self._cur_ptr = c.buf._data
            if self._cur_ptr == NULL:
                self._cur_pos = self._cur_end = 0
                raise RuntimeError("a Buffer fed to the RecordDeserializer was recycled "
                                   "by someone else while the deserializer still owned it")
        else:
            self._cur_ptr = <const char *>c.view.buf
        self._cur_pos = c.start
        self._cur_end = c.end
        return 0

    cdef bint _advance(self) except -1:
        """Release the current chunk (all consumed) and make the next one
        current; False if there is none."""
        cdef _Chunk c = self._cur
        if c is not None:
            self._cur = None
            self._cur_ptr = NULL
            self._cur_pos = 0
            self._cur_end = 0
            _chunk_release(c)
        if self._pending_head < len(self._pending):
            c = <_Chunk>self._pending[self._pending_head]
            self._pending[self._pending_head] = None
            self._pending_head += 1
            if self._pending_head == len(self._pending):
                del self._pending[:]
                self._pending_head = 0
            self._activate(c)
            return True
        return False

    cdef int _advance_keeping(self, object record) except -1:
        """_advance after ``record`` was decoded: an error giving the consumed
        chunk back (a Buffer with views still exported) must not lose the
        record, so it is raised by the next call instead."""
        try:
            self._advance()
        except BaseException as e:
            self._deferred = e
        return 0

    cdef int _release_input(self) except -1:
        """Release every held chunk (first error re-raised after all are released)."""
        cdef _Chunk c
        cdef object first_error = None
        chunks = []
        if self._cur is not None:
            chunks.append(self._cur)
        chunks.extend(self._pending[self._pending_head:])
        self._cur = None
        self._cur_ptr = NULL
        self._cur_pos = 0
        self._cur_end = 0
        del self._pending[:]
        self._pending_head = 0
        for c in chunks:
            try:
                _chunk_release(c)
            except BaseException as e:
                if first_error is None:
                    first_error = e
        self._span = SPAN_NONE
        self._target = None
        self._dst = NULL
        if first_error is not None:
            raise first_error
        return 0

    cdef int _fail(self, object exc) except -1:
        """The stream is broken: remember why, release all input, raise ``exc``
        (a CorruptRecordError says where, when the deserializer knows)."""
        if self.where is not None and isinstance(exc, CorruptRecordError) and exc.args:
            exc.args = (f"{self.where}: {exc.args[0]}",) + exc.args[1:]
        self._failure = str(exc)
        del self._ready[:]
        self._ready_head = 0
        try:
            self._release_input()
        finally:
            raise exc

    cdef int _refuse_input(self, object data) except -1:
        if type(data) is Buffer:
            (<Buffer>data)._release()
        if self._failure is not None:
            raise CorruptRecordError(f"the record stream is broken: {self._failure}")
        raise ValueError("feed() after finish() or close()")

    # -- the C-level contract -------------------------------------------------

    cdef int _feed(self, object data) except -1:
        """Append input.  A Buffer's reference passes to the deserializer even
        when this raises (it is recycled then)."""
        cdef _Chunk c
        cdef Buffer buf
        if type(data) is Buffer:
            buf = <Buffer>data
            buf._check()
            if self._finished or self._failure is not None:
                return self._refuse_input(data)
            if buf._writer == buf._reader:
                buf._release()
                return 0
            c = _Chunk.__new__(_Chunk)
            c.buf = buf
            c.start = buf._reader
            c.end = buf._writer
        else:
            if self._finished or self._failure is not None:
                return self._refuse_input(data)
            c = _Chunk.__new__(_Chunk)
            try:
                PyObject_GetBuffer(data, &c.view, PyBUF_SIMPLE)
            except TypeError:
                raise TypeError(f"feed() takes a Buffer or a bytes-like object, "
                                f"got {type(data).__name__}") from None
            c.has_view = True
            c.start = 0
            c.end = c.view.len
            if c.end == 0:
                return _chunk_release(c)
        if self._cur is None:
            self._activate(c)
        else:
            self._pending.append(c)
        return 0

    cdef object _next_record(self):
        """The next complete record, or NO_RECORD (test: is_no_record)."""
        cdef Py_ssize_t avail, n
        cdef const char *p
        cdef int64_t start
        cdef PyObject *r
        # Fast path: a typed or bytes record wholly inside the current chunk,
        # and nothing ready, broken, deferred or being decoded.  It decodes
        # without a try block (whose set-up costs as much as a small
        # record): an error is caught by _fail_raised.
        if (self._span == SPAN_NONE and self._codec <= CODEC_BYTES and not self._busy
                and self._failure is None and self._deferred is None
                and PyList_GET_SIZE(self._ready) == 0):
            avail = self._cur_end - self._cur_pos
            if avail >= 4:
                p = self._cur_ptr + self._cur_pos
                n = <Py_ssize_t>fb_load_u32(p, 1)
                if (0 < n <= self._max_record_size and n <= avail - 4
                        and (self._cur.buf is None or self._cur.buf._data != NULL)):
                    start = self._stream_pos
                    self._cur_pos += 4 + n
                    self._stream_pos += 4 + n
                    if self._codec == CODEC_BYTES:
                        r = self._bytes_value(p + 4, n)
                    elif n >= 5 and <uint8_t>p[4] == T_BYTES32 \
                            and <Py_ssize_t>fb_load_u32(p + 5, 0) == n - 5:
                        # one large bytes value (as in a bytes-records stream)
                        r = self._bytes_value(p + 9, n - 5)
                    else:
                        self._busy = True
                        r = (<_raw_decode_fn>_typed_decode)(p + 4, n, start + 4, start,
                                                            <PyObject *>None)
                        self._busy = False
                    if r == NULL:
                        return self._fail_raised()
                    v = <object>r
                    Py_DECREF(v)                 # the reference _typed_decode returned
                    if self._cur_pos == self._cur_end:
                        self._advance_keeping(v)
                    return v
        return self._next_record_general()

    cdef PyObject *_bytes_value(self, const char *p, Py_ssize_t n) noexcept:
        """A new reference to a bytes record holding ``[p, p + n)``: one of
        the last two such records refilled, if the consumer dropped it, or
        a new object; NULL with an exception set if that fails.  Two, as a
        ``for rec in records()`` loop still holds the previous record while
        it asks for the next one."""
        cdef PyObject *o
        cdef object older
        if self._spare_older is not None and fb_bytes_refill(<PyObject *>self._spare_older,
                                                             p, n):
            older = self._spare_older
            self._spare_older = self._spare
            self._spare = older
        elif self._spare is not None and fb_bytes_refill(<PyObject *>self._spare, p, n):
            pass
        else:
            o = _raw_bytes(p, n)
            if o != NULL and SPARE_MIN <= n <= SPARE_MAX:
                self._spare_older = self._spare
                self._spare = <object>o
            return o
        o = <PyObject *>self._spare
        Py_INCREF(self._spare)
        return o

    cdef object _fail_raised(self):
        """_fail with the exception that is set (raised, not yet caught)."""
        try:
            fb_reraise()
        except BaseException as e:
            return self._fail(e)

    cdef object _next_record_general(self):
        cdef Py_ssize_t avail, n
        cdef const char *p
        cdef int64_t start
        if self._ready_head < len(self._ready):
            v = self._ready[self._ready_head]
            self._ready[self._ready_head] = None
            self._ready_head += 1
            if self._ready_head == len(self._ready):
                del self._ready[:]
                self._ready_head = 0
            return v
        if self._failure is not None:
            raise CorruptRecordError(f"the record stream is broken: {self._failure}")
        if self._busy:
            self._check_idle()
        if self._deferred is not None:
            err = self._deferred
            self._deferred = None
            raise err
        if self._cur is not None and self._cur.buf is not None and self._cur.buf._data == NULL:
            raise RuntimeError("a Buffer fed to the RecordDeserializer was recycled "
                               "by someone else while the deserializer still owned it")
        while True:
            if self._span == SPAN_NONE:
                avail = self._cur_end - self._cur_pos
                if avail >= 4:
                    p = self._cur_ptr + self._cur_pos
                    n = <Py_ssize_t>fb_load_u32(p, 1)
                    if n > self._max_record_size:
                        return self._bad_length(n)
                    if avail - 4 >= n:
                        # the whole record is here: decode it in place
                        start = self._stream_pos
                        self._cur_pos += 4 + n
                        self._stream_pos += 4 + n
                        v = self._decode_or_fail(p + 4, n, start, None)
                        if self._cur_pos == self._cur_end:
                            self._advance_keeping(v)
                        return v
                elif avail == 0:
                    if not self._advance():
                        return _NO_RECORD
                    continue
                # the record continues in later chunks: assemble it
                self._rec_start = self._stream_pos
                self._span = SPAN_PREFIX
                self._dst = <char *>self._hdr
                self._have = 0
                self._need = self._cap = 4
            # copy into the record being assembled
            avail = self._cur_end - self._cur_pos
            n = self._need - self._have
            if avail < n:
                n = avail
            if self._have + n > self._cap:
                try:
                    _grow_target(self, self._have + n)
                except BaseException as e:
                    return self._fail(e)
            if n > 0:
                memcpy(self._dst + self._have, self._cur_ptr + self._cur_pos, <size_t>n)
                self._have += n
                self._cur_pos += n
                self._stream_pos += n
            if self._have < self._need:
                if not self._advance():
                    return _NO_RECORD
                continue
            v = _span_step(self)
            if not is_no_record(v):
                if self._cur_pos == self._cur_end:
                    self._advance_keeping(v)
                return v

    cdef object _decode_or_fail(self, const char *p, Py_ssize_t n, int64_t record_start,
                                object base):
        """_decode, marking the deserializer busy (decoding may run Python
        code); any error breaks the stream (the record is already consumed)."""
        self._busy = True
        try:
            if self._codec == CODEC_TYPED and n > 0:
                v = _typed_decode(p, n, record_start + 4, record_start, base)
            else:
                v = self._decode(p, n, record_start, base)
        except BaseException as e:
            self._busy = False
            return self._fail(e)
        self._busy = False
        return v

    cdef int _check_idle(self) except -1:
        if self._busy:
            raise RuntimeError("RecordDeserializer used re-entrantly (from code run while "
                               "decoding) or from two threads at once")
        return 0

    cdef object _decode(self, const char *p, Py_ssize_t n, int64_t record_start, object base):
        """Decode the payload of the record whose prefix is at ``record_start``."""
        if self._codec == CODEC_TYPED:
            if n == 0:
                err = CorruptRecordError(
                    f"corrupt record at stream offset {record_start}: empty payload "
                    f"(a typed record holds at least a type tag)")
                err.stream_offset = record_start
                raise err
            return _typed_decode(p, n, record_start + 4, record_start, base)
        if self._codec == CODEC_BYTES:
            return PyBytes_FromStringAndSize(p, n)
        if self._codec == CODEC_ARROW:
            return _arrow_decode(p, n, record_start, base)
        return _pickle_decode(p, n, record_start + 4, base)

    cdef object _bad_length(self, Py_ssize_t n):
        cdef int64_t at = self._stream_pos if self._span == SPAN_NONE else self._rec_start
        err = CorruptRecordError(
            f"corrupt record at stream offset {at}: length prefix {n} exceeds "
            f"max_record_size {self._max_record_size}")
        err.stream_offset = at
        return self._fail(err)

    cdef int _finish(self) except -1:
        """End of input: decode what is left (records() still returns it) and
        raise CorruptRecordError if the stream ends inside a record."""
        cdef list got = []
        self._check_idle()
        if self._finished:
            return 0
        while True:
            v = self._next_record()
            if is_no_record(v):
                break
            got.append(v)
        self._finished = True
        if self._span != SPAN_NONE:
            have = self._have
            if self._span == SPAN_PREFIX:
                what = f"{have} of the 4 length-prefix bytes"
            else:
                if self._span == SPAN_BODY and self._target_is_value and self._codec == CODEC_TYPED:
                    have += HEAD_PEEK
                what = f"{have} of its {self._rec_len} payload bytes"
            err = CorruptRecordError(
                f"corrupt record at stream offset {self._rec_start}: the stream ended "
                f"inside a record ({what})")
            err.stream_offset = self._rec_start
            return self._fail(err)
        self._ready.extend(got)
        return 0

    cdef int _close(self) except -1:
        """Drop all input, recycling held buffers; further feeds are refused."""
        self._check_idle()
        self._finished = True
        del self._ready[:]
        self._ready_head = 0
        self._spare = self._spare_older = None
        self._spare_array = self._spare_array_older = None
        return self._release_input()

    # -- Python API -----------------------------------------------------------

    @cython.always_allow_keywords(False)       # METH_O (see RecordSerializer)
    @cython.embedsignature(False)
    def feed(self, data):
        """feed($self, data, /)
--

Append a :class:`Buffer` (its bytes ``[reader_index, size)``; the
        deserializer owns one reference from now on and recycles it when
        consumed) or a bytes-like object (kept, unmodified, until consumed)."""
        self._feed(data)

    def records(self):
        """An iterator over every complete record fed so far; stops at a
        partial record, which waits for more input."""
        return _RecordIterator.__new__(_RecordIterator, self)

    def next_record(self):
        """The next complete record, or :data:`NO_RECORD`."""
        return self._next_record()

    def finish(self):
        """End of stream: ``CorruptRecordError`` if a partial record remains.
        Complete records not read yet stay available from ``records()``."""
        self._finish()

    def close(self):
        """Drop all input now (recycling held buffers); idempotent."""
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._close()

    @property
    def codec(self):
        return CODECS[self._codec]

    @property
    def max_record_size(self):
        return self._max_record_size

    @property
    def stream_offset(self):
        """Bytes of the stream consumed so far (decoded or being assembled)."""
        return self._stream_pos

    @property
    def buffered_bytes(self):
        """Input bytes held that are not consumed yet."""
        cdef Py_ssize_t total = self._cur_end - self._cur_pos
        cdef _Chunk c
        for c in self._pending[self._pending_head:]:
            total += c.end - c.start
        return total

    @property
    def has_partial_record(self):
        """True while a record is being assembled across chunks."""
        return self._span != SPAN_NONE

    def __repr__(self):
        return (f"<flinkbuf.RecordDeserializer codec={self.codec!r} "
                f"stream_offset={self._stream_pos} buffered={self.buffered_bytes}>")
