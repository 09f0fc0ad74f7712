# Argument checks every layer's extension shares (inline: each module that
# cimports them compiles its own copy; they hold no state).  The messages
# come from flinkbuf/checks.py, the one argument checker of the package.
from libc.stdint cimport int32_t


cdef inline int32_t as_int32(object value, str name, int32_t minimum) except? -1:
    """A Python int in [minimum, 2**31 - 1]: TypeError for anything else
    (bools too), ValueError outside the range (flinkbuf.checks.check_int)."""
    if not isinstance(value, bool) and isinstance(value, int) \
            and minimum <= value <= 2147483647:
        return <int32_t>value
    from flinkbuf.checks import check_int
    return <int32_t>check_int(value, name, minimum)


cdef inline double as_timeout(object timeout) except? -2.0:
    """Seconds to wait: a non-negative number (TypeError for anything
    else, ValueError below 0 or NaN), or None for forever (-1.0)."""
    if timeout is None:
        return -1.0
    if isinstance(timeout, (str, bytes, bytearray)) or not hasattr(type(timeout), "__float__"):
        raise TypeError(f"timeout must be None or a number, got {type(timeout).__name__}")
    cdef double t
    try:
        t = float(timeout)
    except OverflowError:
        # An int past the double range: longer than any deadline, or negative.
        t = float("inf") if timeout > 0 else -1.0
    if t != t or t < 0:
        raise ValueError(f"timeout must be None or a non-negative number, got {timeout!r}")
    return t
