# The typed codec: a compact tagged binary encoding of None, bool, int, float,
# str, bytes, tuple, list, dict and numpy arrays.  docs/FORMAT.md is the
# specification.  Included by _serialization.pyx; the encoder and the decoder
# are files of their own, included here after the tags they share.

from flinkbuf.serialization.typed_flat cimport *
from flinkbuf.serialization.typed_flat cimport _store_int64

cdef enum:
    NDARRAY_ALIGN = 16       # array data starts at a payload offset multiple of this
    DTYPE_STR_MAX = 32

# Array element kinds whose raw bytes are the values (no object pointers).
cdef bytes _ARRAY_KINDS_ASCII = b"biufcmMSUV"
cdef str _ARRAY_KINDS = _ARRAY_KINDS_ASCII.decode("ascii")


include "typed_encoder.pyx"
include "typed_decoder.pyx"
