"""Type stubs for flinkbuf.spark.exchange: pipelined exchange between the tasks of a barrier stage."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Literal, SupportsIndex, TypedDict

from pyspark import RDD

from flinkbuf.io._io import BufferDebloatConfig, InputGate, RecordWriter, ResultPartition, _JavaKey
from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.io.producer import ProducerThread
from flinkbuf.network import NetworkEnvironment
from flinkbuf.serialization import CodecName
from flinkbuf.spark.live import LiveView

__all__ = ["ExchangeTask", "RENDEZVOUS", "SELECTORS", "close_rendezvous", "current_task",
           "pipelined_exchange"]

class _TaskStatValues(TypedDict):
    # ExchangeTask.stats() without the task's index (what the live view
    # receives from each task).
    records_out: int
    bytes_out: int
    records_in: int
    bytes_in: int
    back_pressured_seconds: float
    idle_seconds: float
    out_pool_in_use: int
    out_pool_size: int
    # None until the task has read its first record.
    first_record_seconds: float | None

class _ExchangeTaskStats(_TaskStatValues):
    task: int

SELECTORS: Final[tuple[str, ...]]
RENDEZVOUS: Final[tuple[str, ...]]

class ExchangeTask:
    index: int
    num_tasks: int
    address: str
    environment: NetworkEnvironment
    partition: ResultPartition
    writer: RecordWriter
    gate: InputGate
    metrics: TaskMetrics
    producer: ProducerThread | None
    started: float
    first_record_seconds: float | None
    def __init__(
        self,
        index: int,
        num_tasks: int,
        address: str,
        environment: NetworkEnvironment,
        partition: ResultPartition,
        writer: RecordWriter,
        gate: InputGate,
    ) -> None: ...
    def stats(self) -> _ExchangeTaskStats: ...

def current_task() -> ExchangeTask | None: ...
def close_rendezvous() -> None: ...
def pipelined_exchange(
    rdd: RDD[Any],
    fn: Callable[[Iterator[Any]], Iterable[Any]] | None = None,
    *,
    num_partitions: int | None = None,
    key: int | Callable[[Any], _JavaKey] | None = None,
    selector: Literal["hash", "round_robin", "round-robin", "rebalance", "backlog_aware",
                      "backlog-aware", "broadcast"]
    | Callable[[Any, int], SupportsIndex] = "hash",
    codec: CodecName = "typed",
    segment_size: int = 32768,
    buffers_per_channel: int = 2,
    floating_buffers: int = 8,
    buffer_timeout: float | None = 0.1,
    max_record_size: int = 67108864,
    max_parallelism: int | None = None,
    host: str | None = None,
    timeout: float = 60.0,
    monitor: Callable[[ExchangeTask], Callable[[], object] | None] | None = None,
    rendezvous: Literal["driver", "barrier"] = "driver",
    encryption: bool | None = None,
    advertise: str | dict[str, str] | None = None,
    task_port: int = 0,
    rendezvous_port: int = 0,
    port_retries: int | None = None,
    connect_timeout: float = 10.0,
    live_view: LiveView | bool | int | str | None = None,
    buffer_debloat: bool | BufferDebloatConfig | None = None,
    buffer_debloat_target: float | None = None,
    buffer_debloat_period: float | None = None,
    buffer_debloat_samples: int | None = None,
    buffer_debloat_threshold: int | None = None,
    buffer_debloat_min_size: int | None = None,
) -> RDD[Any]: ...
