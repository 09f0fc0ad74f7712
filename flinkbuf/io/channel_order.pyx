# Rows grouped by channel (csrc/io/channel_order.c): how a producer cuts a
# batch of rows into one piece per consumer, and its columns gathered so
# (BatchWriter).  Included by _io.pyx, after keygroup.pyx (whose buffer
# checks it shares).

def order_by_channel(channels, order, counts):
    """Group rows by channel: a stable counting sort of ``channels`` (each
    row's channel, as :func:`assign_keys_to_operators` writes them).
    Writes into ``counts`` how many rows each channel has (its length is
    the number of channels) and into ``order`` the row indices sorted by
    channel, ascending, the rows of one channel in their input order, so
    that channel ``c``'s rows are ``order[start:start + counts[c]]`` with
    ``start = sum(counts[:c])``.  Runs in C without the GIL, in two passes
    over ``channels``.

    ``channels``: a one-dimensional, contiguous array of signed integers
    (int8 to int64); ``order``: a writable one of int32 or int64 of the
    same length (int32 holds at most 2**31 - 1 rows); ``counts``: a
    writable one of int64, at least one item.

    TypeError or ValueError, before anything is written, for arrays of
    another type, shape or length, and for a channel outside
    ``[0, len(counts))`` (the error names its row)."""
    cdef Py_buffer cv, ov, nv
    cdef size_t bad = 0
    cdef int64_t bad_channel = 0
    cdef Py_ssize_t num_channels = _get_order_args(channels, order, counts, &cv, &ov, &nv)
    cdef size_t n = <size_t>(cv.len // cv.itemsize)
    cdef int rc
    try:
        with nogil:
            rc = fb_order_by_channel(cv.buf, <int>cv.itemsize, n, <int32_t>num_channels,
                                     ov.buf, <int>ov.itemsize, <int64_t *>nv.buf, &bad,
                                     &bad_channel)
    finally:
        PyBuffer_Release(&nv)
        PyBuffer_Release(&ov)
        PyBuffer_Release(&cv)
    _raise_for_order(rc, bad, bad_channel, num_channels)


cdef int _check_order(Py_buffer *ov, size_t n) except -1:
    """An order of int32 or int64, one per row of ``n``."""
    if (_key_kind(ov.format.decode("ascii"), ov.itemsize, "order") != FB_KEYS_SIGNED
            or ov.itemsize not in (4, 8)):
        raise TypeError(f"order must be an array of int32 or int64, got format "
                        f"{ov.format.decode('ascii')!r}")
    if <size_t>(ov.len // ov.itemsize) != n:
        raise ValueError(f"order must hold one item per channel: {n} channels, "
                         f"{ov.len // ov.itemsize} items in order")
    if ov.itemsize == 4 and n > 2147483647:
        raise ValueError(f"order holds 32-bit integers, too narrow for {n} rows: "
                         f"use int64")
    return 0


cdef int _raise_for_order(int rc, size_t bad, int64_t bad_channel,
                          Py_ssize_t num_channels) except -1:
    if rc == FB_ENOMEM:
        raise MemoryError(f"no memory for a table of {num_channels} channels")
    if rc != FB_OK:
        raise ValueError(f"channel {bad_channel} of row {bad} is not in [0, {num_channels})")
    return 0


cdef Py_ssize_t _get_order_args(object channels, object order, object counts, Py_buffer *cv,
                                Py_buffer *ov, Py_buffer *nv, bint order_optional=False) except -1:
    """The buffers of :func:`order_by_channel`'s arguments, checked, in
    ``cv``, ``ov`` and ``nv`` (none held if it raises); returns the number
    of channels.  With ``order_optional``, an ``order`` of None leaves
    ``ov`` empty (its ``buf`` and ``obj`` NULL)."""
    cdef int flags = PyBUF_FORMAT | PyBUF_STRIDES
    cdef size_t n
    cdef Py_ssize_t num_channels
    _get_vector(channels, cv, flags, "channels")
    try:
        if _key_kind(cv.format.decode("ascii"), cv.itemsize, "channels") != FB_KEYS_SIGNED:
            raise TypeError(f"channels must be an array of signed integers (int8 to int64), "
                            f"got format {cv.format.decode('ascii')!r}")
        n = <size_t>(cv.len // cv.itemsize)
        if order is None and order_optional:
            memset(ov, 0, sizeof(Py_buffer))     # nothing held: releasing it is a no-op
        else:
            _get_vector(order, ov, flags | PyBUF_WRITABLE, "order")
        try:
            if order is not None or not order_optional:
                _check_order(ov, n)
            _get_vector(counts, nv, flags | PyBUF_WRITABLE, "counts")
            try:
                if (_key_kind(nv.format.decode("ascii"), nv.itemsize, "counts")
                        != FB_KEYS_SIGNED or nv.itemsize != 8):
                    raise TypeError(f"counts must be an array of int64, got format "
                                    f"{nv.format.decode('ascii')!r}")
                num_channels = nv.len // nv.itemsize
                if num_channels < 1 or num_channels > 2147483647:
                    raise ValueError(f"counts must hold one item per channel (1 to 2**31 - 1 "
                                     f"channels), got {num_channels} items")
                return num_channels
            except BaseException:
                PyBuffer_Release(nv)
                raise
        except BaseException:
            PyBuffer_Release(ov)
            raise
    except BaseException:
        PyBuffer_Release(cv)
        raise


def _gather_by_channel(channels, columns, outs, order, counts):
    """:func:`order_by_channel`, then each column of the list ``columns``
    gathered in that order into the array of ``outs`` at its place, in C
    without the GIL: channel ``c``'s values are ``out[start:start +
    counts[c]]`` of each out, in input order (BatchWriter's pieces).
    ``order`` None: only the columns are wanted (scattered in one pass
    each when the rows are many enough), and no order is written.

    A column: a one-dimensional array of ``len(channels)`` items of any
    fixed width (strided too; not of Python objects); its out: a writable,
    contiguous one of the same length and item size that overlaps no
    input.  TypeError or ValueError, before anything is written, for
    anything else, and as :func:`order_by_channel` raises."""
    cdef Py_buffer cv, ov, nv
    cdef Py_buffer *views
    cdef fb_column *cols
    cdef Py_ssize_t m, k, held = 0
    cdef size_t n, bad = 0
    cdef int64_t bad_channel = 0
    cdef Py_ssize_t num_channels = 0
    cdef int rc = FB_OK
    if type(columns) is not list or type(outs) is not list or len(columns) != len(outs):
        raise TypeError("columns and outs must be lists of arrays of one length")
    m = len(columns)
    views = <Py_buffer *>malloc(<size_t>(2 * m + 1) * sizeof(Py_buffer))
    cols = <fb_column *>malloc(<size_t>(m + 1) * sizeof(fb_column))
    try:
        if views == NULL or cols == NULL:
            raise MemoryError(f"no memory for the views of {m} columns")
        num_channels = _get_order_args(channels, order, counts, &cv, &ov, &nv, True)
        n = <size_t>(cv.len // cv.itemsize)
        try:
            for k in range(m):
                _get_column(columns[k], &views[held], n, 0, "column", k)
                held += 1
                _get_column(outs[k], &views[held], n, views[held - 1].itemsize, "out", k)
                held += 1
                cols[k].values = views[2 * k].buf
                cols[k].stride = views[2 * k].strides[0]
                cols[k].itemsize = <size_t>views[2 * k].itemsize
                cols[k].out = views[2 * k + 1].buf
            with nogil:
                rc = fb_gather_by_channel(cv.buf, <int>cv.itemsize, n, <int32_t>num_channels,
                                          ov.buf, <int>ov.itemsize if ov.buf != NULL else 8,
                                          <int64_t *>nv.buf, cols,
                                          <size_t>m, &bad, &bad_channel)
        finally:
            PyBuffer_Release(&nv)
            PyBuffer_Release(&ov)
            PyBuffer_Release(&cv)
    finally:
        for k in range(held):
            PyBuffer_Release(&views[k])
        free(views)
        free(cols)
    _raise_for_order(rc, bad, bad_channel, num_channels)


cdef int _get_column(object obj, Py_buffer *view, size_t n, Py_ssize_t itemsize, str what,
                     Py_ssize_t k) except -1:
    """A column (``itemsize`` 0) or an out (writable, contiguous, of
    ``itemsize``) of :func:`_gather_by_channel` in ``view``, of ``n`` items."""
    cdef int flags = PyBUF_FORMAT | PyBUF_STRIDES | (PyBUF_WRITABLE if itemsize else 0)
    cdef bytes fmt
    if not PyObject_CheckBuffer(obj):
        raise TypeError(f"{what} {k} must be an array, got {type(obj).__name__}")
    try:
        PyObject_GetBuffer(obj, view, flags)
    except (BufferError, ValueError) as exc:   # numpy: no buffer of datetimes
        raise ValueError(f"{what} {k} cannot be read as an array: {exc}") from None
    try:
        if view.ndim != 1 or <size_t>view.shape[0] != n or view.itemsize < 1:
            raise ValueError(f"{what} {k} must be a one-dimensional array of {n} items")
        fmt = view.format if view.format != NULL else b"B"
        if b"O" in fmt:
            raise TypeError(f"{what} {k} holds Python objects, which are not gathered")
        if itemsize and (view.itemsize != itemsize
                         or (n > 1 and view.strides[0] != view.itemsize)):
            raise ValueError(f"{what} {k} must be contiguous, of items of {itemsize} bytes")
    except BaseException:
        PyBuffer_Release(view)
        raise
    return 0
