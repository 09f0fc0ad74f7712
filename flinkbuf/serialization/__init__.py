"""Layer 2: records across buffers.

Each record is framed as in Flink, a 4-byte big-endian length and the
payload, and records span buffers freely (docs/FORMAT.md).  A
:class:`RecordSerializer` stages one record and copies it into as many
buffers as it takes; a :class:`RecordDeserializer` reassembles records from
buffers (or any bytes) fed in any chunks, validating lengths and contents
before it allocates.  Codecs (:data:`CODECS`): ``typed`` (compact, written
in Cython straight into segment memory), ``bytes``, ``pickle`` (explicit
opt-in: never unpickle what an unauthenticated peer sent) and ``arrow``
(pieces of column batches: a ``pyarrow.RecordBatch`` or a mapping of column
name -> numpy array, rebuilt over the record's memory).
"""

from typing import Literal

from flinkbuf.serialization._serialization import (
    CODECS,
    MAX_DEPTH,
    MAX_NDIM,
    MAX_PROBES_PER_KEY,
    MAX_SAME_HASH_KEYS,
    NO_RECORD,
    RecordDeserializer,
    RecordSerializer,
    SerializationResult,
    decode,
    encode,
)

# The name of a codec, as every ``codec`` argument takes it (one of CODECS).
CodecName = Literal["typed", "bytes", "pickle", "arrow"]

__all__ = [
    "CODECS",
    "CodecName",
    "MAX_DEPTH",
    "MAX_NDIM",
    "MAX_PROBES_PER_KEY",
    "MAX_SAME_HASH_KEYS",
    "NO_RECORD",
    "RecordDeserializer",
    "RecordSerializer",
    "SerializationResult",
    "decode",
    "encode",
]
