"""Layer 4: records across processes, over TCP, with Flink's credit-based
flow control.

A :class:`NetworkEnvironment` per process serves the partitions it
registers and reads remote ones through the :class:`RemoteInputChannel` s of
its input gates; one authenticated connection per pair of processes carries
all their channels (docs/PROTOCOL.md is the wire format).  The producer side
does not change: a :class:`~flinkbuf.ResultPartition` and its
:class:`~flinkbuf.RecordWriter` do not know whether a consumer is local or
remote, and a slow remote consumer backpressures the producer exactly as a
local one does.
"""

from flinkbuf.errors import (
    AuthenticationError,
    EnvironmentClosedError,
    PartitionNotFoundError,
    RemoteConnectionError,
    RemoteError,
)
from flinkbuf.network._network import Connection, RemoteInputChannel
from flinkbuf.network.addresses import format_address
from flinkbuf.network.environment import NetworkEnvironment

__all__ = [
    "AuthenticationError",
    "Connection",
    "EnvironmentClosedError",
    "NetworkEnvironment",
    "PartitionNotFoundError",
    "RemoteConnectionError",
    "RemoteError",
    "RemoteInputChannel",
    "format_address",
]
