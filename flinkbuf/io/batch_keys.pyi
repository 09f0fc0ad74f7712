"""Type stubs for flinkbuf.io.batch_keys: the channel of every row of a batch by its key."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["check_key_type", "is_arrow", "key_partitions", "partition_dtype", "partitions"]

def partition_dtype(num_partitions: int) -> type[np.int8] | type[np.int16]: ...
def is_arrow(obj: object) -> bool: ...
def partitions(
    keys: Any, num_partitions: int, max_parallelism: int, dtype: Any = ...
) -> npt.NDArray[np.integer[Any]]: ...
def check_key_type(name: str, column: Any) -> None: ...
def key_partitions(
    keys: Any | npt.NDArray[np.generic] | Sequence[object],
    num_partitions: int,
    max_parallelism: int | None = None,
) -> npt.NDArray[np.int64]: ...
