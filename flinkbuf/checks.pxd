# Argument checks every layer's extension shares (inline: each module that
# cimports them compiles its own copy; they hold no state).
from libc.stdint cimport int32_t


cdef inline int32_t as_int32(object value, str name, int32_t minimum) except? -1:
    """A Python int in [minimum, 2**31 - 1]: TypeError for anything else
    (bools too), ValueError outside the range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum or value > 2147483647:
        raise ValueError(f"{name} must be in [{minimum}, 2147483647], got {value}")
    return <int32_t>value
