"""Type stubs for flinkbuf.network._network, layer 4: connections and remote input channels."""

from collections.abc import Callable
from typing import Literal, TypedDict, final

from flinkbuf.buffer._buffer import LocalBufferPool, NetworkBufferPool
from flinkbuf.io._io import InputChannel, ResultPartition
from flinkbuf.network.environment import ConnectionCounters

class _ChannelStats(TypedDict):
    exclusive_available: int
    floating_available: int
    exclusive_total: int
    backlog: int
    queued: int
    buffers_in: int
    bytes_in: int

# Connection, FloatingBuffers and RemoteInputChannel are made by
# NetworkEnvironment: calling the class raises TypeError.

@final
class Connection:
    def __init__(self, token: object = None) -> None: ...
    @staticmethod
    def _open(
        fd: int,
        segment_size: int,
        lookup: Callable[[str], ResultPartition | None],
        local: str,
        peer: str,
        io_timeout: float,
        caller_sends: bool = True,
        direct_reads: bool = True,
        shared: tuple[int, int, int, int]
        | tuple[int, int, int, int, int, int, NetworkBufferPool | None, int, int]
        | None = None,
        keys: tuple[bytes, bytes] | None = None,
        start: bool = True,
    ) -> Connection: ...
    def _start(self) -> None: ...
    def close(self) -> None: ...
    @property
    def is_open(self) -> bool: ...
    @property
    def peer(self) -> str: ...
    @property
    def transport(self) -> Literal["unix", "tcp", "shm"]: ...
    @property
    def error(self) -> ConnectionError | None: ...
    def stats(self) -> ConnectionCounters: ...
    @property
    def num_channels(self) -> int: ...

@final
class FloatingBuffers:
    def __init__(self, token: object = None) -> None: ...
    @property
    def pool(self) -> LocalBufferPool: ...

def _shm_region(segment_size: int) -> list[int]: ...
def _memfd_of(pool: NetworkBufferPool) -> int: ...
def _new_ledger(pool: NetworkBufferPool) -> int: ...
def make_floating_buffers(pool: LocalBufferPool) -> FloatingBuffers: ...

@final
class RemoteInputChannel(InputChannel):
    def __init__(self, token: object = None) -> None: ...
    @staticmethod
    def _open(
        conn: Connection,
        partition_id: str,
        subpartition: int,
        exclusive: LocalBufferPool,
        floating: FloatingBuffers | None,
        buffer_timeout: float,
        request_timeout: float,
    ) -> RemoteInputChannel: ...
    def _close(self) -> None: ...
    @property
    def partition_id(self) -> str: ...
    @property
    def subpartition(self) -> int: ...
    @property
    def peer(self) -> str: ...
    @property
    def floating_buffers(self) -> FloatingBuffers | None: ...
    @property
    def receiver_id(self) -> int: ...
    def stats(self) -> _ChannelStats: ...
