# The typed codec: a compact tagged binary encoding of None, bool, int, float,
# str, bytes, tuple, list, dict and numpy arrays.  docs/FORMAT.md is the
# specification.  Included by _serialization.pyx.

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

cdef enum:
    NDARRAY_ALIGN = 16       # array data starts at a payload offset multiple of this
    DTYPE_STR_MAX = 32

# Array element kinds whose raw bytes are the values (no object pointers).
cdef bytes _ARRAY_KINDS_ASCII = b"biufcmMSUV"
cdef str _ARRAY_KINDS = _ARRAY_KINDS_ASCII.decode("ascii")


# -- encoding ---------------------------------------------------------------

cdef inline int _enc_len_header(RecordSerializer s, int tag8, Py_ssize_t n) except -1:
    """Tag + length/count: the 8-bit form below 256, else tag8+1 and a u32."""
    cdef char *p
    if n < 256:
        p = _put(s, 2)
        p[0] = <char>tag8
        p[1] = <char><uint8_t>n
    else:
        if n > MAX_PAYLOAD:
            raise ValueError(f"a value of {n} bytes or items is too large for a record")
        p = _put(s, 5)
        p[0] = <char>(tag8 + 1)
        fb_store_u32(p + 1, <uint32_t>n, 0)
    return 0


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


cdef int _enc_int(RecordSerializer s, object v) except -1:
    cdef int overflow = 0
    cdef long long x = PyLong_AsLongLongAndOverflow(v, &overflow)
    cdef char *p
    if overflow == 0:
        p = _put(s, 9)
        s._stage_len -= 9 - _store_int64(p, x)
        return 0
    # Beyond 64 bits: minimal two's complement, little-endian.  The base
    # class methods, so that int subclasses cannot change the bytes.
    cdef Py_ssize_t nbytes = (int.bit_length(v) + 8) // 8
    cdef bytes raw = int.to_bytes(v, nbytes, "little", signed=True)
    if nbytes > MAX_PAYLOAD:
        raise ValueError("int too large for a record")
    p = _put(s, 5)
    p[0] = <char>T_BIGINT
    fb_store_u32(p + 1, <uint32_t>nbytes, 0)
    _put_bytes(s, PyBytes_AS_STRING(raw), nbytes)
    return 0


cdef inline int _enc_float(RecordSerializer s, double d) except -1:
    cdef char *p = _put(s, 9)
    p[0] = <char>T_FLOAT64
    fb_store_f64(p + 1, d, 0)
    return 0


cdef int _enc_str(RecordSerializer s, object v) except -1:
    cdef Py_ssize_t n
    cdef const char *u = PyUnicode_AsUTF8AndSize(v, &n)
    _enc_len_header(s, T_STR8, n)
    if n >= EXTERNAL_MIN:
        _keep_object(s, v)          # the UTF-8 form is cached in the str
        _add_external(s, u, n)
    else:
        _put_bytes(s, u, n)
    return 0


cdef int _stage_raw(RecordSerializer s, object v, int tag8) except -1:
    """The raw bytes of a bytes-like ``v`` (bytes, bytearray, memoryview, any
    buffer), after the typed codec's length header when ``tag8`` >= 0 (the
    bytes codec's records have none).  Long values are referenced, not
    copied, until they are copied into buffers."""
    cdef Py_buffer tmp
    cdef Py_buffer *view
    cdef Py_ssize_t n
    if type(v) is bytes:
        n = PyBytes_GET_SIZE(v)
        if tag8 >= 0:
            _enc_len_header(s, tag8, n)
        if n >= EXTERNAL_MIN:
            _keep_object(s, v)
            _add_external(s, PyBytes_AS_STRING(v), n)
        else:
            _put_bytes(s, PyBytes_AS_STRING(v), n)
        return 0
    try:
        PyObject_GetBuffer(v, &tmp, PyBUF_SIMPLE)
    except BufferError:
        # not C-contiguous (a strided memoryview): a contiguous copy
        return _stage_raw(s, memoryview(v).tobytes(), tag8)
    if tmp.len < EXTERNAL_MIN:
        try:
            if tag8 >= 0:
                _enc_len_header(s, tag8, tmp.len)
            _put_bytes(s, <const char *>tmp.buf, tmp.len)
        finally:
            PyBuffer_Release(&tmp)
        return 0
    PyBuffer_Release(&tmp)
    view = _keep_view(s, v)          # pins a bytearray against resizing
    if tag8 >= 0:
        _enc_len_header(s, tag8, view.len)
    _add_external(s, <const char *>view.buf, view.len)
    return 0


cdef int _too_deep(RecordSerializer s, object v, int depth) except -1:
    cdef int i, j
    for i in range(depth):
        for j in range(i):
            if s._path[i] == s._path[j]:
                raise ValueError(
                    f"cannot encode a self-referencing structure (a "
                    f"{type(<object>s._path[i]).__name__} contains itself)")
    raise ValueError(f"cannot encode containers nested deeper than {MAX_DEPTH} levels")


cdef int _enc_tuple(RecordSerializer s, object v, int depth) except -1:
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(v)
    if depth >= MAX_DEPTH:
        _too_deep(s, v, depth)
    s._path[depth] = <void *>v
    _enc_len_header(s, T_TUPLE8, n)
    for i in range(n):
        _enc(s, <object>PyTuple_GET_ITEM(v, i), depth + 1)
    return 0


cdef int _enc_list(RecordSerializer s, object v, int depth) except -1:
    cdef Py_ssize_t i, n = PyList_GET_SIZE(v)
    cdef object item
    if depth >= MAX_DEPTH:
        _too_deep(s, v, depth)
    s._path[depth] = <void *>v
    _enc_len_header(s, T_LIST8, n)
    for i in range(n):
        if i >= PyList_GET_SIZE(v):
            break
        item = <object>PyList_GET_ITEM(v, i)    # a strong reference from here
        _enc(s, item, depth + 1)
    if PyList_GET_SIZE(v) != n:
        raise RuntimeError("list changed size during encoding")
    return 0


cdef int _enc_dict(RecordSerializer s, object v, int depth) except -1:
    cdef Py_ssize_t pos = 0, count = 0, n = PyDict_Size(v)
    cdef PyObject *k
    cdef PyObject *val
    cdef object key, value
    if depth >= MAX_DEPTH:
        _too_deep(s, v, depth)
    s._path[depth] = <void *>v
    _enc_len_header(s, T_DICT8, n)
    while PyDict_Next(v, &pos, &k, &val):
        key = <object>k
        value = <object>val
        _enc(s, key, depth + 1)
        _enc(s, value, depth + 1)
        count += 1
    if count != n or PyDict_Size(v) != n:
        raise RuntimeError("dict changed size during encoding")
    return 0


cdef int _enc_ndarray(RecordSerializer s, object v) except -1:
    cdef cnp.ndarray arr = <cnp.ndarray>v
    cdef Py_ssize_t i, pad
    dtype = arr.dtype
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or \
            dtype.subdtype is not None or dtype.itemsize == 0:
        raise TypeError(
            f"cannot encode a numpy array of dtype {dtype!r} with the typed codec "
            f"(object, structured and unsized dtypes are not supported; "
            f"use codec='pickle')")
    cdef int ndim = cnp.PyArray_NDIM(arr)
    cdef uint64_t nonzero = 1
    if ndim > MAX_NDIM:
        raise ValueError(f"cannot encode a numpy array of more than {MAX_NDIM} dimensions")
    for i in range(ndim):
        if cnp.PyArray_DIMS(arr)[i]:
            nonzero *= <uint64_t>cnp.PyArray_DIMS(arr)[i]
            if nonzero > <uint64_t>MAX_PAYLOAD:
                raise ValueError(f"cannot encode a numpy array of shape {v.shape}: the "
                                 f"product of its non-zero dimensions exceeds {MAX_PAYLOAD}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        arr = numpy.ascontiguousarray(arr)      # 0-d arrays are always contiguous
    cdef bytes dstr = dtype.str.encode("ascii")
    cdef Py_ssize_t dlen = PyBytes_GET_SIZE(dstr)
    cdef Py_ssize_t nbytes = cnp.PyArray_NBYTES(arr)
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(arr)
    cdef char *p = _put(s, 2 + dlen + 1 + 8 * ndim + 1)
    p[0] = <char>T_NDARRAY
    p[1] = <char><uint8_t>dlen
    memcpy(p + 2, PyBytes_AS_STRING(dstr), <size_t>dlen)
    p += 2 + dlen
    p[0] = <char><uint8_t>ndim
    p += 1
    for i in range(ndim):
        fb_store_u64(p, <uint64_t>dims[i], 0)
        p += 8
    # p is the pad-count byte; the data follows the padding, aligned.
    pad = (-(_payload_pos(s))) & (NDARRAY_ALIGN - 1)
    p[0] = <char><uint8_t>pad
    if pad:
        memset(_put(s, pad), 0, <size_t>pad)
    if nbytes >= EXTERNAL_MIN:
        _keep_object(s, arr)
        _add_external(s, <const char *>cnp.PyArray_DATA(arr), nbytes)
    else:
        _put_bytes(s, <const char *>cnp.PyArray_DATA(arr), nbytes)
    return 0


cdef int _enc_other(RecordSerializer s, object v, int depth) except -1:
    """Subclasses of the supported types (encoded as the base type), numpy
    scalars (as the equivalent Python scalar), else TypeError."""
    if isinstance(v, int):
        return _enc_int(s, v)
    if isinstance(v, float):
        return _enc_float(s, PyFloat_AsDouble(v))
    if isinstance(v, str):
        return _enc_str(s, v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _stage_raw(s, v, T_BYTES8)
    if isinstance(v, tuple):
        return _enc_tuple(s, v, depth)
    if isinstance(v, list):
        return _enc_list(s, v, depth)
    if isinstance(v, dict):
        return _enc_dict(s, v, depth)
    if isinstance(v, _ndarray_type):
        if isinstance(v, numpy.ma.MaskedArray):
            raise TypeError("cannot encode a numpy masked array with the typed codec "
                            "(the mask would be lost); use codec='pickle'")
        return _enc_ndarray(s, v)
    if isinstance(v, _generic_type):
        item = v.item()
        if type(item) is bool or type(item) is int or type(item) is float:
            return _enc(s, item, depth)
    raise TypeError(
        f"cannot encode an object of type {type(v).__module__}.{type(v).__qualname__} "
        f"with the typed codec (it supports None, bool, int, float, str, bytes, "
        f"bytearray, memoryview, tuple, list, dict and numpy arrays); "
        f"use RecordSerializer(codec='pickle') for arbitrary objects")


# -- the flat fast path -----------------------------------------------------
#
# Scalars, and tuples or lists of scalars, that encode inline without
# running Python code, raising or growing the staging area: the common
# record shapes, written straight into the staging area.  Produces exactly
# the bytes the general encoder (_enc) would; anything else returns -1 and
# takes the general path.


cdef inline Py_ssize_t _enc_scalar_fast(char *p, const char *end, object v) noexcept:
    cdef type t = type(v)
    cdef int overflow = 0
    cdef long long x
    cdef Py_ssize_t n
    if t is int:
        if end - p < 9:
            return -1
        x = PyLong_AsLongLongAndOverflow(v, &overflow)   # cannot fail for an exact int
        if overflow:
            return -1
        return _store_int64(p, x)
    if t is float:
        if end - p < 9:
            return -1
        p[0] = <char>T_FLOAT64
        fb_store_f64(p + 1, PyFloat_AS_DOUBLE(v), 0)
        return 9
    if t is str:
        if not PyUnicode_IS_COMPACT_ASCII(v):     # ASCII: the UTF-8 bytes are the data
            return -1
        n = PyUnicode_GET_LENGTH(v)
        if n >= 256 or end - p < n + 2:
            return -1
        p[0] = <char>T_STR8
        p[1] = <char><uint8_t>n
        memcpy(p + 2, PyUnicode_DATA(v), <size_t>n)
        return n + 2
    if t is bytes:
        n = PyBytes_GET_SIZE(v)
        if n >= 256 or end - p < n + 2:           # below EXTERNAL_MIN: inline
            return -1
        p[0] = <char>T_BYTES8
        p[1] = <char><uint8_t>n
        memcpy(p + 2, PyBytes_AS_STRING(v), <size_t>n)
        return n + 2
    if end - p < 1:
        return -1
    if v is None:
        p[0] = <char>T_NONE
        return 1
    if t is bool:
        p[0] = <char>(T_TRUE if v is True else T_FALSE)
        return 1
    return -1


cdef Py_ssize_t _enc_flat(char *p, const char *end, object v) noexcept:
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
            k = _enc_scalar_fast(q, end, <object>(PyTuple_GET_ITEM(v, i) if t is tuple
                                                  else PyList_GET_ITEM(v, i)))
            if k < 0:
                return -1
            q += k
        return q - p
    return _enc_scalar_fast(p, end, v)


cdef int _enc(RecordSerializer s, object v, int depth) except -1:
    cdef type t = type(v)
    cdef char *p
    if t is int:
        return _enc_int(s, v)
    if t is tuple:
        return _enc_tuple(s, v, depth)
    if t is float:
        return _enc_float(s, PyFloat_AS_DOUBLE(v))
    if t is str:
        return _enc_str(s, v)
    if t is bytes:
        return _stage_raw(s, v, T_BYTES8)
    if v is None:
        p = _put(s, 1)
        p[0] = <char>T_NONE
        return 0
    if t is bool:
        p = _put(s, 1)
        p[0] = <char>(T_TRUE if v is True else T_FALSE)
        return 0
    if t is list:
        return _enc_list(s, v, depth)
    if t is dict:
        return _enc_dict(s, v, depth)
    if t is _ndarray_type:
        return _enc_ndarray(s, v)
    if t is bytearray or t is memoryview:
        return _stage_raw(s, v, T_BYTES8)
    return _enc_other(s, v, depth)


# -- decoding ---------------------------------------------------------------

cdef struct _Dec:
    const char *start        # first byte of the payload
    const char *p            # next byte to read
    const char *end          # one past the payload
    int64_t offset           # stream offset of `start`
    int64_t record_start     # stream offset of the record's prefix, -1 if none
    PyObject *base           # bytearray holding the payload (zero-copy arrays) or NULL


cdef int _corrupt(_Dec *d, const char *at, str reason) except -1:
    cdef int64_t off = d.offset + (at - d.start)
    if d.record_start >= 0:
        msg = (f"corrupt record at stream offset {off}: {reason} (record at stream "
               f"offset {d.record_start}, payload of {d.end - d.start} bytes)")
    else:
        msg = f"corrupt value at offset {off}: {reason}"
    err = CorruptRecordError(msg)
    err.stream_offset = off
    raise err


cdef int _truncated(_Dec *d, Py_ssize_t n, str what) except -1:
    return _corrupt(d, d.p, f"truncated {what}: needs {n} bytes, {d.end - d.p} left")


cdef inline int _need(_Dec *d, Py_ssize_t n, str what) except -1:
    if d.end - d.p < n:
        return _truncated(d, n, what)      # out of line: keeps _need small enough to inline
    return 0


cdef inline Py_ssize_t _dec_len(_Dec *d, int tag, int tag8, str what) except -1:
    """Length/count after a tag of the 8-bit (tag8) or 32-bit (tag8 + 1) form."""
    cdef Py_ssize_t n
    if tag == tag8:
        _need(d, 1, what)
        n = <uint8_t>d.p[0]
        d.p += 1
    else:
        _need(d, 4, what)
        n = <Py_ssize_t>fb_load_u32(d.p, 0)
        d.p += 4
    return n


cdef object _dec_bigint(_Dec *d):
    cdef Py_ssize_t n
    _need(d, 4, "big int")
    n = <Py_ssize_t>fb_load_u32(d.p, 0)
    if n == 0:
        _corrupt(d, d.p, "big int of zero bytes")
    d.p += 4
    _need(d, n, "big int")
    cdef bytes raw = PyBytes_FromStringAndSize(d.p, n)
    d.p += n
    return int.from_bytes(raw, "little", signed=True)


cdef object _dec_str(_Dec *d, int tag):
    cdef const char *at = d.p - 1
    cdef Py_ssize_t n = _dec_len(d, tag, T_STR8, "str")
    _need(d, n, "str")
    try:
        v = PyUnicode_DecodeUTF8(d.p, n, NULL)
    except UnicodeDecodeError as e:
        _corrupt(d, at, f"invalid UTF-8 in a str value ({e.reason} at byte {e.start})")
    d.p += n
    return v


cdef object _dec_bytes(_Dec *d, int tag):
    cdef Py_ssize_t n = _dec_len(d, tag, T_BYTES8, "bytes")
    _need(d, n, "bytes")
    v = PyBytes_FromStringAndSize(d.p, n)
    d.p += n
    return v


cdef object _dec_sequence(_Dec *d, int tag, int tag8, int depth):
    """A tuple (tag8 T_TUPLE8) or list (T_LIST8) of values."""
    cdef const char *at = d.p - 1
    cdef bint is_tuple = tag8 == T_TUPLE8
    cdef Py_ssize_t i, n = _dec_len(d, tag, tag8, "tuple" if is_tuple else "list")
    if n > d.end - d.p:
        _corrupt(d, at, f"{'tuple' if is_tuple else 'list'} of {n} items in "
                        f"{d.end - d.p} bytes")
    if depth >= MAX_DEPTH:
        _corrupt(d, at, f"containers nested deeper than {MAX_DEPTH} levels")
    cdef tuple t
    cdef list l
    cdef object item
    # Two loops, each with its own container type: this runs per record.
    if is_tuple:
        t = PyTuple_New(n)
        for i in range(n):
            item = _dec(d, depth + 1)
            Py_INCREF(item)
            PyTuple_SET_ITEM(t, i, item)
        return t
    l = PyList_New(n)
    for i in range(n):
        item = _dec(d, depth + 1)
        Py_INCREF(item)
        PyList_SET_ITEM(l, i, item)
    return l


include "dict_keys.pyx"


cdef object _dec_dict(_Dec *d, int tag, int depth):
    cdef const char *at = d.p - 1
    cdef const char *kat
    cdef Py_ssize_t i, n = _dec_len(d, tag, T_DICT8, "dict")
    if n > (d.end - d.p) // 2:
        _corrupt(d, at, f"dict of {n} items in {d.end - d.p} bytes")
    if depth >= MAX_DEPTH:
        _corrupt(d, at, f"containers nested deeper than {MAX_DEPTH} levels")
    cdef dict m = {}
    if n > MAX_SAME_HASH_KEYS:
        return _dec_dict_shadowed(d, m, n, depth)
    for i in range(n):
        kat = d.p
        key = _dec(d, depth + 1)
        value = _dec(d, depth + 1)
        try:
            PyDict_SetItem(m, key, value)
        except TypeError:
            _corrupt(d, kat, f"unhashable dict key of type {type(key).__name__}")
    return m


cdef object _dec_dict_shadowed(_Dec *d, dict m, Py_ssize_t n, int depth):
    """The ``n`` pairs of a large dict into ``m``, within the limits on
    CPython's hash-table work."""
    cdef const char *kat
    cdef Py_ssize_t i
    cdef fb_shadow s
    cdef bint shadowing = not _SALTED_STR
    cdef type t
    cdef Py_hash_t h
    fb_shadow_init(&s)
    try:
        for i in range(n):
            kat = d.p
            key = _dec(d, depth + 1)
            if not shadowing:
                t = type(key)
                if t is str or t is bytes:
                    PyDict_SetItem(m, key, _dec(d, depth + 1))
                    continue
                _shadow_start(d, kat, &s, m)
                shadowing = True
            h = fb_hash(key)
            if h == -1:
                _unhashable_key(d, kat, key)
            fb_shadow_prefetch(&s, h)          # the lookup's slots, while the value decodes
            _shadow_insert(d, kat, &s, m, key, _dec(d, depth + 1), h, i + 1)
    finally:
        fb_shadow_free(&s)
    return m


cdef dict _dtype_cache = {}


cdef object _dtype_from(_Dec *d, const char *at, bytes dstr):
    """The dtype a descriptor names; only the canonical ``dtype.str`` of a
    plain (non-object, non-structured, sized) dtype is accepted."""
    dtype = _dtype_cache.get(dstr)
    if dtype is not None:
        return dtype
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(dstr)
    cdef const char *c = PyBytes_AS_STRING(dstr)
    cdef char ch
    cdef bint ok = n >= 3 and c[0] in b"<>|" and c[1] in _ARRAY_KINDS_ASCII
    for i in range(2, n):
        ch = c[i]
        if not ((c'0' <= ch <= c'9') or (c'a' <= ch <= c'z') or (c'A' <= ch <= c'Z')
                or ch == c'[' or ch == c']'):
            ok = False
    if ok:
        text = dstr.decode("ascii")
        try:
            dtype = numpy.dtype(text)
        except Exception:
            dtype = None
        if dtype is not None and (dtype.str != text or dtype.kind not in _ARRAY_KINDS
                                  or dtype.fields is not None
                                  or dtype.subdtype is not None or dtype.itemsize == 0):
            dtype = None
    if dtype is None:
        _corrupt(d, at, f"unsupported numpy dtype descriptor {dstr!r}")
    if len(_dtype_cache) < 256:
        _dtype_cache[dstr] = dtype
    return dtype


cdef object _dec_ndarray(_Dec *d):
    cdef const char *at = d.p - 1
    cdef Py_ssize_t dlen, ndim, i, pad, nbytes, itemsize
    cdef uint64_t dim, count = 1
    cdef bint empty = False
    _need(d, 1, "numpy dtype")
    dlen = <uint8_t>d.p[0]
    d.p += 1
    if dlen == 0 or dlen > DTYPE_STR_MAX:
        _corrupt(d, at, f"numpy dtype descriptor of {dlen} bytes")
    _need(d, dlen, "numpy dtype")
    dtype = _dtype_from(d, at, PyBytes_FromStringAndSize(d.p, dlen))
    d.p += dlen
    _need(d, 1, "numpy shape")
    ndim = <uint8_t>d.p[0]
    d.p += 1
    if ndim > MAX_NDIM:
        _corrupt(d, at, f"numpy array of {ndim} dimensions (at most {MAX_NDIM})")
    _need(d, 8 * ndim, "numpy shape")
    cdef list shape = []
    for i in range(ndim):
        dim = fb_load_u64(d.p + 8 * i, 0)
        if dim > <uint64_t>MAX_PAYLOAD:
            _corrupt(d, at, f"numpy dimension of {dim}")
        shape.append(<Py_ssize_t>dim)
        if dim == 0:
            empty = True
    # The product of the non-zero dimensions is bounded even for an empty
    # array (numpy refuses shapes whose product overflows).
    for i in range(ndim):
        dim = fb_load_u64(d.p + 8 * i, 0)
        if dim:
            count *= dim                               # each factor <= 2**31
            if count > <uint64_t>MAX_PAYLOAD:
                _corrupt(d, at, "numpy array larger than a record")
    if empty:
        count = 0
    d.p += 8 * ndim
    _need(d, 1, "numpy padding")
    pad = <uint8_t>d.p[0]
    d.p += 1
    if pad >= NDARRAY_ALIGN:
        _corrupt(d, at, f"numpy data padding of {pad} bytes")
    _need(d, pad, "numpy padding")
    d.p += pad
    itemsize = dtype.itemsize
    if count > <uint64_t>((d.end - d.p) // itemsize):
        _corrupt(d, at, f"numpy array of {count} x {itemsize}-byte items in "
                        f"{d.end - d.p} bytes")
    nbytes = <Py_ssize_t>count * itemsize
    cdef cnp.ndarray arr
    try:
        if d.base != NULL and count > 0:
            # zero-copy: a view of the assembled record
            arr = numpy.frombuffer(<object>d.base, dtype=dtype, count=<Py_ssize_t>count,
                                   offset=d.p - PyByteArray_AS_STRING(<object>d.base))
            if ndim != 1:
                arr = arr.reshape(shape)
        else:
            arr = numpy.empty(shape, dtype=dtype)
    except (ValueError, TypeError) as e:
        _corrupt(d, at, f"numpy refused the array ({e})")
    if d.base == NULL or count == 0:
        memcpy(cnp.PyArray_DATA(arr), d.p, <size_t>nbytes)
    d.p += nbytes
    return arr


cdef object _dec(_Dec *d, int depth):
    cdef int tag
    cdef const char *p = d.p
    if p >= d.end:
        _corrupt(d, p, "truncated value: no type tag")
    tag = <uint8_t>p[0]
    d.p = p + 1
    if tag >= T_FIXINT:
        return tag - T_FIXINT
    # one if/elif chain on the tag: Cython compiles it to a switch
    if tag == T_TUPLE8 or tag == T_TUPLE32:
        return _dec_sequence(d, tag, T_TUPLE8, depth)
    elif tag == T_INT8:
        _need(d, 1, "int8")
        d.p += 1
        return <int8_t>p[1]
    elif tag == T_INT16:
        _need(d, 2, "int16")
        d.p += 2
        return <int16_t>fb_load_u16(p + 1, 0)
    elif tag == T_INT32:
        _need(d, 4, "int32")
        d.p += 4
        return <int32_t>fb_load_u32(p + 1, 0)
    elif tag == T_INT64:
        _need(d, 8, "int64")
        d.p += 8
        return PyLong_FromLongLong(<int64_t>fb_load_u64(p + 1, 0))
    elif tag == T_FLOAT64:
        _need(d, 8, "float64")
        d.p += 8
        return PyFloat_FromDouble(fb_load_f64(p + 1, 0))
    elif tag == T_STR8 or tag == T_STR32:
        return _dec_str(d, tag)
    elif tag == T_BYTES8 or tag == T_BYTES32:
        return _dec_bytes(d, tag)
    elif tag == T_NONE:
        return None
    elif tag == T_TRUE:
        return True
    elif tag == T_FALSE:
        return False
    elif tag == T_LIST8 or tag == T_LIST32:
        return _dec_sequence(d, tag, T_LIST8, depth)
    elif tag == T_DICT8 or tag == T_DICT32:
        return _dec_dict(d, tag, depth)
    elif tag == T_NDARRAY:
        return _dec_ndarray(d)
    elif tag == T_BIGINT:
        return _dec_bigint(d)
    _corrupt(d, p, f"unknown type tag 0x{tag:02x}")


cdef object _typed_decode(const char *p, Py_ssize_t n, int64_t offset,
                          int64_t record_start, object base):
    """Decode the payload ``[p, p + n)``, which must hold exactly one value.
    ``offset`` is its stream offset; ``base`` a bytearray holding it (arrays
    then view it without a copy) or None."""
    cdef _Dec d
    d.start = p
    d.p = p
    d.end = p + n
    d.offset = offset
    d.record_start = record_start
    d.base = NULL if base is None else <PyObject *>base
    v = _dec(&d, 0)
    if d.p != d.end:
        _corrupt(&d, d.p, f"{d.end - d.p} trailing bytes after the value")
    return v
