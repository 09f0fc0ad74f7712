"""The partitions a network environment serves (Flink's
``ResultPartitionManager``): registered by id, found by the connections
that serve them to other processes and by this process's own gates."""

from __future__ import annotations

import threading

from flinkbuf.errors import EnvironmentClosedError, PartitionNotFoundError
from flinkbuf.io import ResultPartition

__all__ = ["PartitionRegistry", "MAX_PARTITION_ID"]

MAX_PARTITION_ID = 1024            # bytes of UTF-8, as the wire format caps it


class PartitionRegistry:
    """Partitions by id.  Thread-safe; a closed registry finds nothing and
    registers nothing, and its waiters raise."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._partitions: dict[str, ResultPartition] = {}
        self._closed = False

    def register(self, partition_id: str, partition: ResultPartition) -> None:
        """Serve ``partition`` as ``partition_id`` (a str of at most 1024
        bytes of UTF-8); ValueError if that id is taken."""
        if not isinstance(partition_id, str):
            raise TypeError(f"partition_id must be a str, got {type(partition_id).__name__}")
        if len(partition_id.encode("utf-8")) > MAX_PARTITION_ID:
            raise ValueError(f"partition_id is longer than {MAX_PARTITION_ID} bytes of UTF-8")
        if not isinstance(partition, ResultPartition):
            raise TypeError(f"expected a ResultPartition, got {type(partition).__name__}")
        with self._changed:
            if self._closed:
                raise EnvironmentClosedError
            if partition_id in self._partitions:
                raise ValueError(f"a partition {partition_id!r} is registered already")
            self._partitions[partition_id] = partition
            self._changed.notify_all()

    def lookup(self, partition_id: str) -> ResultPartition | None:
        """The partition registered as ``partition_id``, or None (a
        connection's partition request then waits and asks again)."""
        with self._lock:
            return None if self._closed else self._partitions.get(partition_id)

    def wait_for(self, partition_id: str, timeout: float) -> ResultPartition:
        """The partition registered as ``partition_id``, once it is (waiting
        up to ``timeout`` seconds, as a remote request would):
        PartitionNotFoundError if it is not by then."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._closed or partition_id in self._partitions, timeout):
                raise PartitionNotFoundError(
                    f"no partition {partition_id!r} was registered in this process within "
                    f"{timeout:g} s")
            if self._closed:
                raise EnvironmentClosedError
            return self._partitions[partition_id]

    def close(self) -> None:
        """Forget every partition; waiters raise EnvironmentClosedError."""
        with self._changed:
            self._closed = True
            self._partitions.clear()
            self._changed.notify_all()
