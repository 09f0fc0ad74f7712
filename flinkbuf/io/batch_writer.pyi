"""Type stubs for flinkbuf.io.batch_writer: a keyed exchange of column batches."""

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

from flinkbuf.io._io import (
    BroadcastSelector,
    ForwardSelector,
    RecordWriter,
    RescaleSelector,
    ResultPartition,
    RoundRobinSelector,
)

__all__ = ["BatchWriter"]

_WholeBatchSelector: TypeAlias = (
    RoundRobinSelector | RescaleSelector | BroadcastSelector | ForwardSelector
    | Literal["round_robin", "round-robin", "rebalance", "rescale", "broadcast", "forward"]
)
# A pyarrow.RecordBatch (pyarrow is optional) or a mapping of column name ->
# one-dimensional numpy array.
_Batch: TypeAlias = Any | Mapping[str, npt.NDArray[np.generic]]

class BatchWriter:
    def __init__(
        self,
        partition: ResultPartition,
        key: str | None = None,
        *,
        selector: _WholeBatchSelector | None = None,
        max_parallelism: int | None = None,
        name: str | None = None,
        buffer_timeout: float | None = 0.1,
    ) -> None: ...
    def emit(self, batch: _Batch) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def fail(self, exc: BaseException | None = None) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]: ...
    @property
    def record_writer(self) -> RecordWriter: ...
    @property
    def key(self) -> str | None: ...
    @property
    def max_parallelism(self) -> int: ...
    @property
    def num_channels(self) -> int: ...
    @property
    def name(self) -> str | None: ...
    @property
    def is_closed(self) -> bool: ...
    @property
    def num_rows_out(self) -> int: ...
    @property
    def num_pieces_out(self) -> int: ...
    @property
    def num_bytes_out(self) -> int: ...
    @property
    def back_pressured_time_ns(self) -> int: ...
