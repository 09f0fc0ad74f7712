# The typed codec's decoder: one value from a payload in memory, every length
# and count checked before it is used (docs/FORMAT.md).  Included by typed.pyx.

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


cdef inline bint _never_tracked(PyObject *o) noexcept:
    """``o`` is not tracked by the garbage collector and never will be: a
    decoded scalar (int, float, str, bytes, None, bool) or an untracked
    tuple (CPython's test for untracking a tuple, on the types decoding
    makes: a list or a dict, and anything else, counts as tracked)."""
    cdef PyTypeObject *t = Py_TYPE(<object>o)
    if (t == <PyTypeObject *>int or t == <PyTypeObject *>str or t == <PyTypeObject *>float
            or t == <PyTypeObject *>bytes or o == <PyObject *>None
            or t == <PyTypeObject *>bool):
        return True
    return t == <PyTypeObject *>tuple and not PyObject_GC_IsTracked(<object>o)


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
    cdef bint untrack = True
    # Two loops, each with its own container type: this runs per record.
    if is_tuple:
        t = PyTuple_New(n)
        for i in range(n):
            item = _dec(d, depth + 1)
            Py_INCREF(item)
            PyTuple_SET_ITEM(t, i, item)
            if untrack and not _never_tracked(<PyObject *>item):
                untrack = False
        if untrack:
            # What CPython's collector does to such a tuple at its first
            # collection, at once: thousands of decoded records alive at a
            # time (read_many) would else be traversed by every collection.
            PyObject_GC_UnTrack(<PyObject *>t)
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
