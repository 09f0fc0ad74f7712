"""flinkbuf: Apache Flink's network buffer management and backpressure for Python.

A :class:`NetworkBufferPool` owns all network memory of a process as one
aligned off-heap arena of fixed-size :class:`MemorySegment` s; task-level
:class:`LocalBufferPool` s share it by Flink's redistribution and hand out
reference-counted :class:`Buffer` s.  A blocking buffer request that waits
(without the GIL) for a recycled buffer is the backpressure mechanism.
"""

from flinkbuf._core import (
    Buffer,
    DataType,
    LocalBufferPool,
    MemorySegment,
    NetworkBufferPool,
    redistribute,
)
from flinkbuf._serialization import (
    RecordDeserializer,
    RecordSerializer,
    SerializationResult,
)
from flinkbuf.errors import (
    BufferRequestTimeoutError,
    CorruptRecordError,
    ExportedBufferError,
    FlinkbufError,
    InsufficientBuffersError,
    PoolDestroyedError,
    RecycledBufferError,
    SegmentFreedError,
)

__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "BufferRequestTimeoutError",
    "CorruptRecordError",
    "DataType",
    "ExportedBufferError",
    "FlinkbufError",
    "InsufficientBuffersError",
    "LocalBufferPool",
    "MemorySegment",
    "NetworkBufferPool",
    "PoolDestroyedError",
    "RecordDeserializer",
    "RecordSerializer",
    "RecycledBufferError",
    "SegmentFreedError",
    "SerializationResult",
    "redistribute",
]
