# Java's hashCode() of Python keys and Flink's key-group assignment (what
# HashSelector routes by).  Included by _io.pyx.

cdef int32_t _java_int(object v) except? -1:
    """A Python int's hash as Java would compute it for the narrowest type
    that holds it: Integer (the value), Long, else BigInteger."""
    cdef int overflow = 0
    cdef long long x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow == 0:
        if -2147483648 <= x <= 2147483647:
            return <int32_t>x
        return fb_java_long_hash(<int64_t>x)
    # BigInteger.hashCode: 31-polynomial over the magnitude's 32-bit words
    # (most significant first), times the sign, in int arithmetic.
    cdef object mag = -v if v < 0 else v
    cdef list words = []
    while mag:
        words.append(mag & 0xffffffff)
        mag >>= 32
    cdef uint32_t h = 0
    cdef object w
    for w in reversed(words):
        h = 31u * h + <uint32_t>(<unsigned long long>w)
    if v < 0:
        h = 0u - h
    return <int32_t>h


cdef inline int32_t _small_int_channel(const fb_key_assignment_t *assign,
                                       PyObject *key) noexcept:
    """The channel of ``key`` when it is an exact int that fits a long long,
    hashed as _java_int hashes it (Integer, else Long), with no call or
    reference count (the hot path of the hash selectors); else -1."""
    cdef long long x
    if Py_TYPE(<object>key) != <PyTypeObject *>int or not fb_small_long(key, &x):
        return -1
    if -2147483648 <= x <= 2147483647:
        return fb_key_assignment_channel(assign, <int32_t>x)
    return fb_key_assignment_channel(assign, fb_java_long_hash(<int64_t>x))


cdef int _KEY_MAX_DEPTH = 100     # containers in a key, as the typed codec allows


cdef int _java_hash(object key, int32_t *out, int depth) except -1:
    """``key``'s hash code as Java computes it for the matching type.
    ``depth``: containers around ``key``; a key nested deeper than the
    typed codec allows (or a list that holds itself) raises ValueError
    instead of recursing off the C stack."""
    cdef type t = type(key)
    cdef Py_buffer view
    cdef uint32_t h
    cdef int32_t item
    cdef object element
    cdef Py_ssize_t i, n
    if t is int:
        out[0] = _java_int(key)
    elif t is str:
        out[0] = fb_java_string_hash(PyUnicode_DATA(key), PyUnicode_KIND(key),
                                     <size_t>PyUnicode_GET_LENGTH(key))
    elif key is None:
        out[0] = 0
    elif t is bool:
        out[0] = 1231 if key else 1237
    elif isinstance(key, float):
        out[0] = fb_java_double_hash(<double>key)
    elif isinstance(key, tuple):
        # Flink's TupleN.hashCode: f0's hash, then 31 * h + each next field's.
        if depth >= _KEY_MAX_DEPTH:
            _key_too_deep()
        n = len(<tuple>key)
        h = 0
        for i in range(n):
            element = (<tuple>key)[i]
            _java_hash(element, &item, depth + 1)
            h = (31u * h + <uint32_t>item) if i else <uint32_t>item
        out[0] = <int32_t>h
    elif isinstance(key, list):
        # java.util.List.hashCode
        if depth >= _KEY_MAX_DEPTH:
            _key_too_deep()
        h = 1
        for element in <list>key:
            _java_hash(element, &item, depth + 1)
            h = 31u * h + <uint32_t>item
        out[0] = <int32_t>h
    elif isinstance(key, int):     # int subclasses (bool handled above)
        out[0] = _java_int(int(key))
    elif isinstance(key, str):
        out[0] = fb_java_string_hash(PyUnicode_DATA(key), PyUnicode_KIND(key),
                                     <size_t>PyUnicode_GET_LENGTH(key))
    elif PyIndex_Check(key):       # numpy integers and the like
        out[0] = _java_int(operator.index(key))
    elif PyObject_CheckBuffer(key):
        # Arrays.hashCode(byte[]) over the raw bytes
        PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
        try:
            out[0] = fb_java_bytes_hash(<const unsigned char *>view.buf, <size_t>view.len)
        finally:
            PyBuffer_Release(&view)
    else:
        raise TypeError(
            f"cannot hash a key of type {t.__name__} deterministically; use a key "
            "function that returns None, bool, int, float, str, bytes, or a tuple or "
            "list of those")
    return 0


cdef int _key_too_deep() except -1:
    raise ValueError(f"cannot hash keys nested deeper than {_KEY_MAX_DEPTH} levels "
                     "(or a list that contains itself)")


def java_hash_code(key):
    """``key``'s hash code as Java computes ``hashCode()`` for the matching
    type, the same in every process (unlike Python's ``hash()`` of
    ``str``/``bytes``, which is salted per process):

    * ``int`` (and numpy integers, by value): the narrowest Java type that
      holds the value.  In ``[-2**31, 2**31)`` as ``Integer.hashCode(v) == v``;
      elsewhere in the int64 range as ``Long.hashCode(v) ==
      (int) (v ^ (v >>> 32))``; beyond that as ``BigInteger.hashCode()``.
      A Flink job keyed by ``Long`` hashes small values as Long too: the two
      agree for ``0 <= v < 2**31`` but not for negative ones
      (``Long.hashCode(-1) == 0``).  To match ``Long`` keys exactly, key by
      Long's hash code, which an int32 then passes through unchanged::

          def long_hash(v):                       # Long.hashCode(v)
              u = v & 0xFFFFFFFFFFFFFFFF
              h = (u ^ (u >> 32)) & 0xFFFFFFFF
              return h - (1 << 32) if h >= 1 << 31 else h

          HashSelector(key=lambda record: long_hash(record[0]))

    * ``float`` as Double (``doubleToLongBits``, one NaN), ``bool`` as
      Boolean (1231 / 1237), ``str`` as String (over UTF-16 code units),
      bytes-like as ``Arrays.hashCode(byte[])``, ``None`` as 0;
    * ``tuple`` as Flink's ``TupleN`` (``h = f0``, then ``31 * h + fi``) and
      ``list`` as ``java.util.List`` (``h = 1``, then ``31 * h + e``), at
      most 100 containers deep (ValueError beyond, as the typed codec).

    Other types raise TypeError: pass a key function that returns one of
    these."""
    cdef int32_t h
    _java_hash(key, &h, 0)
    return h


def murmur_hash(code):
    """Flink's ``MathUtils.murmurHash`` of a 32-bit int: non-negative."""
    return fb_murmur_hash(_as_java_int32(code))


def key_group_for_hash(hash_code, max_parallelism=128):
    """Flink's ``computeKeyGroupForKeyHash``: murmur(hash) % max_parallelism."""
    return fb_key_group(_as_java_int32(hash_code),
                        as_int32(max_parallelism, "max_parallelism", 1))


def operator_index_for_key_group(key_group, parallelism, max_parallelism=128):
    """Flink's ``computeOperatorIndexForKeyGroup``: key_group * parallelism // max_parallelism."""
    cdef int32_t mp = as_int32(max_parallelism, "max_parallelism", 1)
    cdef int32_t p = as_int32(parallelism, "parallelism", 1)
    cdef int32_t kg = as_int32(key_group, "key_group", 0)
    if p > mp:
        raise ValueError(f"parallelism {p} exceeds max_parallelism {mp}")
    if kg >= mp:
        raise ValueError(f"key group {kg} is not in [0, {mp})")
    return fb_operator_index(kg, p, mp)


def assign_key_to_operator(key, parallelism, max_parallelism=128):
    """Flink's ``KeyGroupRangeAssignment.assignKeyToParallelOperator`` for a
    Python key hashed by :func:`java_hash_code`."""
    cdef int32_t mp = as_int32(max_parallelism, "max_parallelism", 1)
    cdef int32_t p = as_int32(parallelism, "parallelism", 1)
    if p > mp:
        raise ValueError(f"parallelism {p} exceeds max_parallelism {mp}")
    cdef int32_t h
    _java_hash(key, &h, 0)
    return fb_operator_index(fb_key_group(h, mp), p, mp)


cdef int32_t _as_java_int32(object v) except? -1:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an int, got {type(v).__name__}")
    if v < -2147483648 or v > 2147483647:
        raise ValueError(f"{v} is not a 32-bit int")
    return <int32_t>v


# ---- vectorized -------------------------------------------------------------------

# Buffer formats (the struct module's codes) of the keys the vectorized
# assignment reads, by kind.
_SIGNED_CODES = frozenset("bhilqn")
_UNSIGNED_CODES = frozenset("BHILQN")
_FLOAT_CODES = frozenset("fd")
_FOREIGN_ORDER = ">!" if sys.byteorder == "little" else "<"


cdef int _key_kind(str fmt, Py_ssize_t itemsize, str what) except -1:
    """The FB_KEYS_* kind of a buffer of ``fmt`` (native byte order)."""
    cdef str code = fmt[1:] if fmt[:1] in "@=<>!" else fmt
    if fmt[:1] and fmt[:1] in _FOREIGN_ORDER:
        raise ValueError(f"{what} must be in this machine's byte order, got format {fmt!r}")
    if code in _SIGNED_CODES and itemsize in (1, 2, 4, 8):
        return FB_KEYS_SIGNED
    if code in _UNSIGNED_CODES and itemsize in (1, 2, 4, 8):
        return FB_KEYS_UNSIGNED
    if code == "?" and itemsize == 1:
        return FB_KEYS_BOOL
    if code in _FLOAT_CODES and itemsize in (4, 8):
        return FB_KEYS_FLOAT
    return -2


cdef int _get_vector(object obj, Py_buffer *view, int flags, str what) except -1:
    """A one-dimensional, contiguous buffer of ``obj`` in ``view``."""
    if not PyObject_CheckBuffer(obj):
        raise TypeError(f"{what} must be a one-dimensional array (an object with the buffer "
                        f"protocol, such as a numpy array), got {type(obj).__name__}")
    try:
        PyObject_GetBuffer(obj, view, flags)
    except BufferError as exc:
        if flags & PyBUF_WRITABLE:
            raise ValueError(f"{what} must be a writable array: {exc}") from None
        raise ValueError(f"{what} cannot be read as an array: {exc}") from None
    if view.ndim != 1 or (view.len > view.itemsize and view.strides != NULL
                          and view.strides[0] != view.itemsize):
        shape = "a one-dimensional" if view.ndim == 1 else f"a {view.ndim}-dimensional"
        PyBuffer_Release(view)
        raise ValueError(f"{what} must be a contiguous one-dimensional array, got "
                         f"{shape} one" + (" with gaps between its items (a strided view: "
                                           "pass a copy)" if view.ndim == 1 else ""))
    return 0


def assign_keys_to_operators(keys, out, parallelism, max_parallelism=128, *, offsets=None,
                             utf8=False):
    """:func:`assign_key_to_operator` of every key of ``keys`` at once,
    bit-exact with it, written into ``out``: the operator index (channel)
    among ``parallelism`` of each key's key group among
    ``max_parallelism``; with ``parallelism == max_parallelism``, the key
    group itself.  Runs in C without the GIL.

    ``keys``: a one-dimensional, contiguous array (numpy, or anything with
    the buffer protocol) of signed or unsigned integers of 8 to 64 bits
    (hashed as Python ints of their value), bools or floats (as Python
    floats: Java's ``Double``).  With ``offsets`` the keys are of variable
    length instead: ``keys`` holds their bytes, key ``i`` is
    ``keys[offsets[i]:offsets[i + 1]]`` (``offsets``: int32 or int64, one
    more than the keys, as an Arrow string or binary array's), hashed as
    ``str`` (decoded from UTF-8, with ``utf8=True``) or as ``bytes``.
    ``out``: a writable, contiguous array of signed integers (int8 to
    int64, wide enough for ``parallelism - 1``), one per key.  Integer or
    bool keys within a range of at most 65536 values, fewer than half their
    number (ids, small codes), are hashed once per value of the range and
    looked up, about three times faster.

    TypeError or ValueError, before anything is written, for keys of
    another type, arrays that are not one-dimensional and contiguous, an
    ``out`` of another length or type, or ``parallelism`` outside
    ``[1, max_parallelism]`` (``max_parallelism`` at most 32768); for a
    bad offset or ill-formed UTF-8, ValueError naming the key (``out`` is
    then partly written)."""
    cdef int32_t mp = check_int(max_parallelism, "max_parallelism", 1, 32768)
    cdef int32_t p = check_int(parallelism, "parallelism", 1, mp, why_high=" (max_parallelism)")
    if not isinstance(utf8, bool):
        raise TypeError(f"utf8 must be a bool, got {type(utf8).__name__}")
    if utf8 and offsets is None:
        raise TypeError("utf8 applies to keys of variable length: pass their offsets too")
    cdef Py_buffer kv, ov, outv
    cdef int kind, rc
    cdef size_t n, bad = 0
    cdef Py_ssize_t data_len = 0
    cdef int flags = PyBUF_FORMAT | PyBUF_STRIDES
    cdef int varlen = offsets is not None
    cdef int text = utf8
    _get_vector(out, &outv, flags | PyBUF_WRITABLE, "out")
    try:
        if _key_kind(outv.format.decode("ascii"), outv.itemsize, "out") != FB_KEYS_SIGNED:
            raise TypeError(f"out must be an array of signed integers (int8 to int64), got "
                            f"format {outv.format.decode('ascii')!r}")
        if outv.itemsize == 1 and p > 128:
            raise ValueError(f"out holds 8-bit integers, too narrow for channels up to "
                             f"{p - 1}: use int16 or wider")
        n = <size_t>(outv.len // outv.itemsize)
        if not varlen:
            _get_vector(keys, &kv, flags, "keys")
            try:
                kind = _key_kind(kv.format.decode("ascii"), kv.itemsize, "keys")
                if kind < 0:
                    raise TypeError(
                        f"keys must be integers (8 to 64 bits, signed or not), bools or "
                        f"floats (32 or 64 bits), got format {kv.format.decode('ascii')!r}: "
                        f"pass bytes or strings with their offsets")
                if <size_t>(kv.len // kv.itemsize) != n:
                    raise ValueError(f"out must hold one item per key: {kv.len // kv.itemsize} "
                                     f"keys, {n} items in out")
                with nogil:
                    rc = fb_assign_keys(kv.buf, kind, <int>kv.itemsize, n, p, mp, outv.buf,
                                        <int>outv.itemsize)
            finally:
                PyBuffer_Release(&kv)
        else:
            if not PyObject_CheckBuffer(keys):
                raise TypeError(f"keys must be the keys' bytes (bytes, or an array with the "
                                f"buffer protocol), got {type(keys).__name__}")
            try:
                PyObject_GetBuffer(keys, &kv, PyBUF_SIMPLE)
            except BufferError as exc:
                raise ValueError(f"keys must be contiguous bytes: {exc}") from None
            data_len = kv.len
            try:
                _get_vector(offsets, &ov, flags, "offsets")
                try:
                    if (_key_kind(ov.format.decode("ascii"), ov.itemsize, "offsets")
                            != FB_KEYS_SIGNED or ov.itemsize not in (4, 8)):
                        raise TypeError(f"offsets must be int32 or int64, got format "
                                        f"{ov.format.decode('ascii')!r}")
                    if <size_t>(ov.len // ov.itemsize) != n + 1:
                        raise ValueError(f"offsets must hold one more item than out: "
                                         f"{ov.len // ov.itemsize} offsets, {n} items in out")
                    with nogil:
                        rc = fb_assign_varlen_keys(<const unsigned char *>kv.buf,
                                                   <size_t>kv.len, ov.buf, <int>ov.itemsize,
                                                   n, text, p, mp, outv.buf,
                                                   <int>outv.itemsize, &bad)
                finally:
                    PyBuffer_Release(&ov)
            finally:
                PyBuffer_Release(&kv)
    finally:
        PyBuffer_Release(&outv)
    if rc == FB_ENOMEM:
        raise MemoryError("no memory for the table of key groups")
    if rc != FB_OK:
        if varlen:
            raise ValueError(f"key {bad}: its offsets lie outside the {data_len} bytes of keys "
                             f"or run backwards" + (", or its bytes are not UTF-8"
                                                    if text else ""))
        raise ValueError("internal error: the key assignment refused its arguments")
