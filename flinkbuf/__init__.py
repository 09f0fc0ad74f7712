"""flinkbuf: Apache Flink's network buffer management and backpressure for Python.

A :class:`NetworkBufferPool` owns all network memory of a process as one
aligned off-heap arena of fixed-size :class:`MemorySegment` s; task-level
:class:`LocalBufferPool` s share it by Flink's redistribution and hand out
reference-counted :class:`Buffer` s.  A blocking buffer request that waits
(without the GIL) for a recycled buffer is the backpressure mechanism.

Tasks exchange records through :class:`ResultPartition` s written by a
:class:`RecordWriter` and read by an :class:`InputGate` (see
:mod:`flinkbuf.io`); :class:`TaskMetrics` reports Flink's task metrics.
"""

from flinkbuf.buffer import (
    Buffer,
    DataType,
    LocalBufferPool,
    MemorySegment,
    NetworkBufferPool,
    redistribute,
)
from flinkbuf.serialization import (
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
    PartitionReleasedError,
    PoolDestroyedError,
    ProducerFailedError,
    ReadOnlyBufferError,
    RecycledBufferError,
    SegmentFreedError,
)
from flinkbuf.io import (
    BacklogAwareRebalanceSelector,
    BatchWriter,
    BroadcastSelector,
    BufferDebloatConfig,
    BufferDebloater,
    ChannelSelector,
    CustomSelector,
    Event,
    ForwardSelector,
    GlobalSelector,
    HashSelector,
    InputChannel,
    InputGate,
    LocalInputChannel,
    RecordWriter,
    RescaleSelector,
    ResultPartition,
    RoundRobinSelector,
    UnknownInputChannel,
    UserEvent,
    create_partition,
)
from flinkbuf.io.metrics import TaskMetrics

__version__ = "0.1.0"

__all__ = [
    "BacklogAwareRebalanceSelector",
    "BatchWriter",
    "BroadcastSelector",
    "Buffer",
    "BufferDebloatConfig",
    "BufferDebloater",
    "BufferRequestTimeoutError",
    "ChannelSelector",
    "CorruptRecordError",
    "CustomSelector",
    "DataType",
    "Event",
    "ExportedBufferError",
    "FlinkbufError",
    "ForwardSelector",
    "GlobalSelector",
    "HashSelector",
    "InputChannel",
    "InputGate",
    "InsufficientBuffersError",
    "LocalBufferPool",
    "LocalInputChannel",
    "MemorySegment",
    "NetworkBufferPool",
    "PartitionReleasedError",
    "PoolDestroyedError",
    "ProducerFailedError",
    "ReadOnlyBufferError",
    "RecordDeserializer",
    "RecordSerializer",
    "RecordWriter",
    "RecycledBufferError",
    "RescaleSelector",
    "ResultPartition",
    "RoundRobinSelector",
    "SegmentFreedError",
    "SerializationResult",
    "TaskMetrics",
    "UnknownInputChannel",
    "UserEvent",
    "create_partition",
    "redistribute",
]
