# The typed codec's encoder: values written straight into the serializer's
# staging area (docs/FORMAT.md).  Included by typed.pyx.

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
