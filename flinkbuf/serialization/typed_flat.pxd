# The typed codec's tags (docs/FORMAT.md) and its flat fast path: scalars,
# and tuples or lists of scalars, encoded without running Python code,
# raising, allocating or touching a reference count: the common record
# shapes.  Produces exactly the bytes the general encoder (codecs/
# typed_encoder.pyx, _enc) would; anything else returns -1 and takes the
# general path.  Inline (compiled into each module that cimports this
# file): the serializer's fast paths and RecordWriter.emit_all's fused loop
# (flinkbuf/io/emit_all.pyx) run the same code.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH
from libc.stdint cimport int8_t, int16_t, int32_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from flinkbuf.capi cimport PyUnicode_IS_COMPACT_ASCII, fb_small_long
from flinkbuf.csrc.byteorder cimport fb_store_f64, fb_store_u16, fb_store_u32, fb_store_u64

cdef enum:
    T_NONE = 0x00
    T_FALSE = 0x01
    T_TRUE = 0x02
    T_INT8 = 0x03
    T_INT16 = 0x04
    T_INT32 = 0x05
    T_INT64 = 0x06
    T_BIGINT = 0x07
    T_FLOAT64 = 0x08
    T_STR8 = 0x09
    T_STR32 = 0x0A
    T_BYTES8 = 0x0B
    T_BYTES32 = 0x0C
    T_TUPLE8 = 0x0D
    T_TUPLE32 = 0x0E
    T_LIST8 = 0x0F
    T_LIST32 = 0x10
    T_DICT8 = 0x11
    T_DICT32 = 0x12
    T_NDARRAY = 0x13
    T_FIXINT = 0x80          # 0x80 | n for 0 <= n <= 127


cdef inline Py_ssize_t _store_int64(char *p, long long x) noexcept:
    """Tag and bytes of a 64-bit int at ``p`` (the smallest form, at most
    9 bytes); returns how many were written."""
    if 0 <= x <= 127:
        p[0] = <char>(T_FIXINT | <int>x)
        return 1
    if -128 <= x <= 127:
        p[0] = <char>T_INT8
        p[1] = <char><int8_t>x
        return 2
    if -32768 <= x <= 32767:
        p[0] = <char>T_INT16
        fb_store_u16(p + 1, <uint16_t><int16_t>x, 0)
        return 3
    if -2147483648 <= x <= 2147483647:
        p[0] = <char>T_INT32
        fb_store_u32(p + 1, <uint32_t><int32_t>x, 0)
        return 5
    p[0] = <char>T_INT64
    fb_store_u64(p + 1, <uint64_t>x, 0)
    return 9




cdef inline Py_ssize_t _enc_scalar_fast(char *p, const char *end, PyObject *o) noexcept:
    # ``o`` borrowed, its type a pointer: no reference counts on this path
    cdef PyTypeObject *t = Py_TYPE(<object>o)
    cdef int overflow = 0
    cdef long long x
    cdef Py_ssize_t n
    if t == <PyTypeObject *>int:
        if end - p < 9:
            return -1
        if not fb_small_long(o, &x):
            x = PyLong_AsLongLongAndOverflow(<object>o, &overflow)   # cannot fail for an exact int
            if overflow:
                return -1
        return _store_int64(p, x)
    if t == <PyTypeObject *>float:
        if end - p < 9:
            return -1
        p[0] = <char>T_FLOAT64
        fb_store_f64(p + 1, PyFloat_AS_DOUBLE(<object>o), 0)
        return 9
    if t == <PyTypeObject *>str:
        if not PyUnicode_IS_COMPACT_ASCII(<object>o):     # ASCII: the UTF-8 bytes are the data
            return -1
        n = PyUnicode_GET_LENGTH(<object>o)
        if n >= 256 or end - p < n + 2:
            return -1
        p[0] = <char>T_STR8
        p[1] = <char><uint8_t>n
        memcpy(p + 2, PyUnicode_DATA(<object>o), <size_t>n)
        return n + 2
    if t == <PyTypeObject *>bytes:
        n = PyBytes_GET_SIZE(<object>o)
        if n >= 256 or end - p < n + 2:           # below EXTERNAL_MIN: inline
            return -1
        p[0] = <char>T_BYTES8
        p[1] = <char><uint8_t>n
        memcpy(p + 2, PyBytes_AS_STRING(<object>o), <size_t>n)
        return n + 2
    if end - p < 1:
        return -1
    if <object>o is None:
        p[0] = <char>T_NONE
        return 1
    if t == <PyTypeObject *>bool:
        p[0] = <char>(T_TRUE if <object>o is True else T_FALSE)
        return 1
    return -1


cdef inline Py_ssize_t enc_flat(char *p, const char *end, object v) noexcept:
    """Encode ``v`` into ``[p, end)`` if it is a fast-path value; returns the
    bytes written, or -1 (nothing is committed: use the general path)."""
    cdef type t = type(v)
    cdef Py_ssize_t i, k, n
    cdef char *q
    if t is tuple or t is list:
        n = PyTuple_GET_SIZE(v) if t is tuple else PyList_GET_SIZE(v)
        if n >= 256 or end - p < 2:
            return -1
        p[0] = <char>(T_TUPLE8 if t is tuple else T_LIST8)
        p[1] = <char><uint8_t>n
        q = p + 2
        for i in range(n):
            k = _enc_scalar_fast(q, end, PyTuple_GET_ITEM(v, i) if t is tuple
                                 else PyList_GET_ITEM(v, i))
            if k < 0:
                return -1
            q += k
        return q - p
    return _enc_scalar_fast(p, end, <PyObject *>v)


cdef inline Py_ssize_t write_flat(char *p, Py_ssize_t space, object record) noexcept:
    """Write ``record`` as a record of the typed codec (its 4-byte big-endian
    payload length, then the payload) at ``p`` if it is a fast-path value
    and fits the ``space`` bytes there: the bytes written, or -1 (nothing
    is committed; the bytes at ``p`` may have changed)."""
    cdef Py_ssize_t n
    if space < 5:
        return -1
    n = enc_flat(p + 4, p + space, record)
    if n < 0:
        return -1
    fb_store_u32(p, <uint32_t>n, 1)
    return 4 + n
