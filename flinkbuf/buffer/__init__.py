"""Layer 1, the buffer core: off-heap memory segments, the process's
:class:`NetworkBufferPool` (one arena), the tasks' :class:`LocalBufferPool` s
that share it by Flink's redistribution, and reference-counted
:class:`Buffer` s.  A blocking buffer request that waits (without the GIL)
for a recycled buffer is the backpressure mechanism."""

from flinkbuf.buffer._buffer import (
    Buffer,
    DataType,
    LocalBufferPool,
    MemorySegment,
    NetworkBufferPool,
    debug_counters,
    redistribute,
)

__all__ = [
    "Buffer",
    "DataType",
    "LocalBufferPool",
    "MemorySegment",
    "NetworkBufferPool",
    "debug_counters",
    "redistribute",
]
