"""The exceptions flinkbuf raises.

Every error is a :class:`FlinkbufError` and also derives from the closest
builtin, so ``except MemoryError`` or ``except TimeoutError`` keep working.
Plain argument errors (a negative size, an index out of bounds) are the
builtin ``ValueError`` / ``TypeError`` / ``IndexError``.
"""

from __future__ import annotations

__all__ = [
    "FlinkbufError",
    "InsufficientBuffersError",
    "BufferRequestTimeoutError",
    "PoolDestroyedError",
    "RecycledBufferError",
    "SegmentFreedError",
    "ExportedBufferError",
    "ReadOnlyBufferError",
    "CorruptRecordError",
    "PartitionReleasedError",
    "ProducerFailedError",
    "RemoteConnectionError",
    "AuthenticationError",
    "PartitionNotFoundError",
    "RemoteError",
    "InsufficientSlotsError",
    "NoFreePortError",
    "EnvironmentClosedError",
]


class FlinkbufError(Exception):
    """Root of all flinkbuf errors."""


class InsufficientBuffersError(FlinkbufError, MemoryError):
    """The required buffers would exceed the segments of the network pool."""


class BufferRequestTimeoutError(FlinkbufError, TimeoutError):
    """A blocking request did not get its buffer or segments in time."""


class PoolDestroyedError(FlinkbufError, RuntimeError):
    """The pool was destroyed (before or while the call waited)."""


class RecycledBufferError(FlinkbufError, ValueError):
    """A buffer (or a segment view of it) was used after its last recycle."""


class SegmentFreedError(FlinkbufError, ValueError):
    """A memory segment was used after it was freed or returned."""


class ExportedBufferError(FlinkbufError, BufferError):
    """Memory cannot be recycled or freed while buffer views of it exist."""


class ReadOnlyBufferError(FlinkbufError, BufferError):
    """A write to a buffer lent by a producer in another process (received
    over shared memory), whose memory this process maps read-only."""


class CorruptRecordError(FlinkbufError, ValueError):
    """A serialized record stream is malformed."""


class PartitionReleasedError(FlinkbufError, ConnectionError):
    """The consumer of a subpartition released it (closed its input gate):
    the producer can no longer write there, and a blocked request ends."""


class ProducerFailedError(FlinkbufError, RuntimeError):
    """The producer of a partition failed; ``__cause__`` is its error."""


class RemoteConnectionError(FlinkbufError, ConnectionError):
    """A connection to another process failed: it dropped, the peer stalled
    in the middle of a frame, or one side broke the protocol.  The channels
    it carried fail with this error."""


class AuthenticationError(RemoteConnectionError):
    """The peer did not prove that it knows the shared secret (or we could
    not prove it to the peer): nothing was exchanged."""


class PartitionNotFoundError(FlinkbufError, LookupError):
    """A remote partition was not registered by its producer within the
    request timeout."""


class RemoteError(FlinkbufError):
    """An exception raised in another process, as far as it travelled: its
    class name (``type_name``) and message.  The cause of a
    :class:`ProducerFailedError` of a remote channel."""

    type_name: str
    message: str

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if type_name else message)
        self.type_name = type_name
        self.message = message

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str]]:
        return (type(self), (self.type_name, self.message))


class InsufficientSlotsError(FlinkbufError, RuntimeError):
    """A barrier stage needs a task slot for each of its tasks at once, and
    the Spark master offers fewer."""


class NoFreePortError(FlinkbufError, OSError):
    """Every port of the range a server may bind was taken (``errno`` is
    ``EADDRINUSE``); the message names the range and the option that sets
    it."""


class EnvironmentClosedError(FlinkbufError, RuntimeError):
    """The network environment was closed: it makes no more gates or
    connections and serves no more partitions."""

    def __init__(self, message: str = "the network environment is closed") -> None:
        super().__init__(message)
