# Rows grouped by channel (csrc/io/channel_order.c): how a producer cuts a
# batch of rows into one piece per consumer.  Included by _io.pyx, after
# keygroup.pyx (whose buffer checks it shares).

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
    cdef int flags = PyBUF_FORMAT | PyBUF_STRIDES
    cdef size_t n, bad = 0
    cdef int64_t bad_channel = 0
    cdef Py_ssize_t num_channels
    cdef int rc
    _get_vector(channels, &cv, flags, "channels")
    try:
        if _key_kind(cv.format.decode("ascii"), cv.itemsize, "channels") != FB_KEYS_SIGNED:
            raise TypeError(f"channels must be an array of signed integers (int8 to int64), "
                            f"got format {cv.format.decode('ascii')!r}")
        n = <size_t>(cv.len // cv.itemsize)
        _get_vector(order, &ov, flags | PyBUF_WRITABLE, "order")
        try:
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
            _get_vector(counts, &nv, flags | PyBUF_WRITABLE, "counts")
            try:
                if (_key_kind(nv.format.decode("ascii"), nv.itemsize, "counts")
                        != FB_KEYS_SIGNED or nv.itemsize != 8):
                    raise TypeError(f"counts must be an array of int64, got format "
                                    f"{nv.format.decode('ascii')!r}")
                num_channels = nv.len // nv.itemsize
                if num_channels < 1 or num_channels > 2147483647:
                    raise ValueError(f"counts must hold one item per channel (1 to 2**31 - 1 "
                                     f"channels), got {num_channels} items")
                with nogil:
                    rc = fb_order_by_channel(cv.buf, <int>cv.itemsize, n,
                                             <int32_t>num_channels, ov.buf, <int>ov.itemsize,
                                             <int64_t *>nv.buf, &bad, &bad_channel)
            finally:
                PyBuffer_Release(&nv)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&cv)
    if rc == FB_ENOMEM:
        raise MemoryError(f"no memory for a table of {num_channels} channels")
    if rc != FB_OK:
        raise ValueError(f"channel {bad_channel} of row {bad} is not in [0, {num_channels})")
