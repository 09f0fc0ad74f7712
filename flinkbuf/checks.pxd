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
