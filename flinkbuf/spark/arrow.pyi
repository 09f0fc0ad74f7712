"""Type stubs for flinkbuf.spark.arrow: the pipelined exchange of Arrow RecordBatches."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from flinkbuf.io import BufferDebloatConfig
from flinkbuf.spark.exchange import ExchangeTask
from flinkbuf.spark.live import LiveView

__all__ = ["arrow_exchange", "default_segment_size", "key_partitions"]

def key_partitions(
    keys: pa.Array | pa.ChunkedArray | npt.NDArray[np.generic] | Sequence[object],
    num_partitions: int,
    max_parallelism: int | None = None,
) -> npt.NDArray[np.int64]: ...
def default_segment_size(
    num_tasks: int, buffers_per_channel: int = 2, floating_buffers: int = 8
) -> int: ...
def arrow_exchange(
    df: DataFrame,
    fn: Callable[[Iterator[pa.RecordBatch]], Iterable[pa.RecordBatch]],
    key: str,
    schema: StructType | str,
    *,
    num_partitions: int | None = None,
    segment_size: int | None = None,
    buffers_per_channel: int = 2,
    floating_buffers: int = 8,
    buffer_timeout: float | None = 0.1,
    max_record_size: int = 268435456,
    max_parallelism: int | None = None,
    host: str | None = None,
    timeout: float = 60.0,
    monitor: Callable[[ExchangeTask], Callable[[], object] | None] | None = None,
    rendezvous: Literal["driver", "barrier"] | None = None,
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
    map_input: Callable[[Iterator[pa.RecordBatch]], Iterable[pa.RecordBatch]] | None = None,
) -> DataFrame: ...
