# Layer 2: records across buffers.  Other modules (flinkbuf._io) cimport
# RecordSerializer / RecordDeserializer and call their C-level methods.
#
# Contract for cimporters:
#   ser._serialize_record(record)   stage one record (prefix + encoded value)
#   ser._write_record(buf, record)  a small record of a common shape written
#                                   straight into buf (nothing staged, no Python
#                                   code run): the flags of _copy_to_buffer, or 0
#                                   when it takes the staged path
#   ser._writes_direct()            records may be written straight into buffers
#                                   now (by _write_record, or typed_flat.pxd's
#                                   write_flat for the typed codec)
#   ser._copy_to_buffer(buf)        copy at buf's writer index; returns the bit
#                                   flags FULL_RECORD | FULL_BUFFER
#   ser._has_serialized_data()      part of the staged record is not copied yet
#   ser._reset()                    rewind: copy the same record again (broadcast)
#   ser._clear()                    drop the staged record
#   des._feed(data)                 a Buffer (ownership of one reference passes to
#                                   the deserializer, which recycles it exactly
#                                   once) or a bytes-like object
#   des._next_record()              the next complete record, or the sentinel
#                                   NO_RECORD: test it with is_no_record(x)
#   des._finish()                   end of input (raises if a record is partial)
#   des._close()                    drop all input now, recycling held buffers
#
# Test hooks (flinkbuf._testing):
#   ser._serialize_general(record)  stage without the fast paths of _serialize_record
#   ser._record_bytes()             the staged record (prefix and payload) as bytes
#   dict_shadow_stats(keys)         what decoding's shadow of a dict's table makes
#                                   of keys: (table size, slots visited)
#
# Every other field and C method below is the classes' own: Cython needs
# them declared here, and no other module uses them.

cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int64_t
from flinkbuf.buffer._buffer cimport Buffer

cdef enum:
    FULL_RECORD = 1        # the staged record is completely copied
    FULL_BUFFER = 2        # the destination buffer has no space left

cdef enum:
    CODEC_TYPED = 0
    CODEC_BYTES = 1
    CODEC_PICKLE = 2
    CODEC_ARROW = 3

cpdef enum:
    MAX_DEPTH = 100        # containers nested deeper are refused (encode and decode)
    MAX_NDIM = 32          # numpy arrays with more dimensions are refused
    # Decoding refuses a dict (docs/FORMAT.md 2.3) with more keys of one
    # hash value, or whose keys cost CPython's hash table more probes per
    # key on average: both would make decoding super-linear.
    MAX_SAME_HASH_KEYS = 8
    MAX_PROBES_PER_KEY = 64


cdef struct Piece:
    # One contiguous part of a staged record: either bytes in the staging
    # area (ptr == NULL, at offset `off`) or external memory kept alive by
    # the serializer (a large bytes/str/array value: copied only once).
    const char *ptr
    Py_ssize_t off
    Py_ssize_t len


@cython.final
cdef class NoRecordType:
    """Type of the NO_RECORD sentinel returned by _next_record()."""
    pass


cdef inline bint is_no_record(object x) noexcept:
    """True if ``x`` is the NO_RECORD sentinel (no complete record yet)."""
    return type(x) is NoRecordType


# Test hook: (table size, slots visited) of the dict shadow over ``keys``,
# distinct keys inserted in order (codecs/dict_keys.pyx).
cdef tuple dict_shadow_stats(object keys)


@cython.final
cdef class RecordSerializer:
    cdef int _codec
    # staging area: the length prefix and everything encoded inline
    cdef char *_stage
    cdef Py_ssize_t _stage_len
    cdef Py_ssize_t _stage_cap
    cdef Py_ssize_t _piece_start      # stage offset where the open piece began
    cdef Py_ssize_t _ext_bytes        # bytes staged as external pieces
    # the staged record as pieces, and the copy cursor over them
    cdef Piece *_pieces
    cdef Py_ssize_t _npieces
    cdef Py_ssize_t _pieces_cap
    cdef Py_ssize_t _cur_piece
    cdef Py_ssize_t _cur_off
    cdef Py_ssize_t _record_len       # prefix + payload of the staged record, 0 if none
    # what keeps external pieces alive
    cdef Py_buffer *_views
    cdef Py_ssize_t _nviews
    cdef Py_ssize_t _views_cap
    cdef object _owner                # keeps the first external value alive
    cdef list _owners                 # ... and the others
    cdef bint _busy                   # encoding (user code may run: pickle)
    # containers on the encoding path (self-reference diagnosis)
    cdef void *_path[MAX_DEPTH + 1]

    cdef int _serialize_record(self, object record) except -1
    cdef int _write_record(self, Buffer buf, object record) noexcept
    cdef bint _writes_direct(self) noexcept
    cdef int _serialize_general(self, object record) except -1
    cdef int _copy_to_buffer(self, Buffer buf) except -1
    cdef bint _has_serialized_data(self) noexcept
    cdef int _reset(self) except -1
    cdef int _clear(self) except -1
    cdef bytes _payload_bytes(self)
    cdef bytes _record_bytes(self)
    cdef bytes _staged_bytes(self, Py_ssize_t skip)


@cython.final
cdef class _Chunk:
    # One fed input: a Buffer (one reference owned) or a pinned bytes-like.
    cdef Buffer buf
    cdef Py_buffer view
    cdef bint has_view
    cdef Py_ssize_t start
    cdef Py_ssize_t end


@cython.final
@cython.no_gc_clear
cdef class RecordDeserializer:
    cdef int _codec
    cdef Py_ssize_t _max_record_size
    # the chunk being read, and the ones fed after it
    cdef _Chunk _cur
    cdef const char *_cur_ptr
    cdef Py_ssize_t _cur_pos
    cdef Py_ssize_t _cur_end
    cdef list _pending
    cdef Py_ssize_t _pending_head
    cdef int64_t _stream_pos          # stream offset of the next unread byte
    # a record spanning chunks: 0 none, 1 prefix, 2 value header, 3 body
    cdef int _span
    cdef unsigned char _hdr[12]       # 4-byte prefix, then up to 5 payload bytes
    cdef Py_ssize_t _have
    cdef Py_ssize_t _need
    cdef Py_ssize_t _cap              # bytes allocated at _dst (grows up to _need)
    cdef char *_dst
    cdef Py_ssize_t _rec_len
    cdef int64_t _rec_start
    cdef object _target               # bytes or bytearray being filled
    cdef bint _target_is_value        # the filled bytes are the record itself
    # records decoded by finish() but not yet returned
    cdef list _ready
    cdef Py_ssize_t _ready_head
    cdef bint _finished
    cdef bint _busy                   # decoding (user code may run: pickle, numpy)
    cdef object _failure              # the message once the stream is broken
    cdef object _deferred             # an error to raise at the next _next_record
    cdef object _spare                # the last bytes record returned (see _bytes_value)
    cdef object _spare_older          # ... and the one before
    cdef object _spare_array          # the last bytearray assembled (see _assembly_array)
    cdef object _spare_array_older    # ... and the one before
    # what the deserializer reads (say "input channel 3"): named in its
    # errors; None: nothing
    cdef public object where

    cdef int _feed(self, object data) except -1
    cdef object _next_record(self)
    cdef object _next_record_general(self)
    cdef object _fail_raised(self)
    cdef PyObject *_bytes_value(self, const char *p, Py_ssize_t n) noexcept
    cdef int _finish(self) except -1
    cdef int _close(self) except -1
    # internals
    cdef int _activate(self, _Chunk c) except -1
    cdef bint _advance(self) except -1
    cdef int _advance_keeping(self, object record) except -1
    cdef int _release_input(self) except -1
    cdef int _fail(self, object exc) except -1
    cdef int _refuse_input(self, object data) except -1
    cdef object _decode(self, const char *p, Py_ssize_t n, int64_t record_start, object base)
    cdef object _bad_length(self, Py_ssize_t n)
    cdef object _decode_or_fail(self, const char *p, Py_ssize_t n, int64_t record_start,
                                object base)
    cdef int _check_idle(self) except -1
