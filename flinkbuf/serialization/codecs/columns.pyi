"""Type stubs for flinkbuf.serialization.codecs.columns: the arrow codec's records."""

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["ALIGN", "ArrowValues", "KIND_ARROW_IPC", "KIND_ARROW_VALUES", "KIND_NUMPY",
           "NumpyLayout", "NumpyValues", "check_columns", "decode_piece", "encode_parts",
           "schema_values", "value_type", "value_views"]

MAGIC: Final[bytes]
KIND_NUMPY: Final[int]
KIND_ARROW_VALUES: Final[int]
KIND_ARROW_IPC: Final[int]
ALIGN: Final[int]

class ArrowValues:
    schema: bytes
    rows: int
    arrays: list[npt.NDArray[Any]]
    def __init__(self, schema: bytes, rows: int, arrays: list[npt.NDArray[Any]]) -> None: ...

def schema_values(schema: Any) -> tuple[bytes, list[np.dtype[Any]] | None]: ...
def check_columns(
    columns: Mapping[str, npt.NDArray[np.generic]],
) -> tuple[list[str], list[npt.NDArray[np.generic]], int]: ...
def value_type(t: Any) -> np.dtype[Any] | None: ...
def value_views(batch: Any, types: list[np.dtype[Any]]) -> list[npt.NDArray[Any]] | None: ...

class NumpyLayout:
    names: tuple[str, ...]
    dtypes: tuple[np.dtype[Any], ...]
    def __init__(self, names: list[str], dtypes: list[np.dtype[Any]]) -> None: ...
    def header(self, rows: int) -> bytes: ...

class NumpyValues:
    layout: NumpyLayout
    rows: int
    arrays: list[npt.NDArray[Any]]
    def __init__(
        self, layout: NumpyLayout, rows: int, arrays: list[npt.NDArray[Any]]
    ) -> None: ...

def encode_parts(record: Any) -> list[Any]: ...
def decode_piece(payload: bytearray) -> Any: ...
