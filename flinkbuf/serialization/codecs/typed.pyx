# The typed codec: a compact tagged binary encoding of None, bool, int, float,
# str, bytes, tuple, list, dict and numpy arrays.  docs/FORMAT.md is the
# specification.  Included by _serialization.pyx; the encoder and the decoder
# are files of their own, included here after the tags they share.

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


include "typed_encoder.pyx"
include "typed_decoder.pyx"
