"""Type stubs for flinkbuf.io.pipeline: a task's stages in threads joined by local channels."""

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypedDict

from typing_extensions import Self

from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.serialization import CodecName

__all__ = ["LocalPipeline", "local_pipeline"]

# One exchange between stage k and stage k + 1.
class _ExchangeStats(TypedDict):
    stage: int
    records: int
    bytes: int
    back_pressured_seconds: float
    records_in: int
    buffers_in_use: int
    buffers: int

class LocalPipeline:
    metrics: list[TaskMetrics]
    def __init__(
        self,
        source: Iterable[Any],
        stages: tuple[Callable[[Iterator[Any]], Iterable[Any]], ...],
        buffers: int,
        segment_size: int,
        codec: CodecName,
        buffer_timeout: float | None,
        timeout: float | None,
    ) -> None: ...
    def __iter__(self) -> Self: ...
    def __next__(self) -> Any: ...
    def stats(self) -> list[_ExchangeStats]: ...
    def close(self) -> None: ...
    def __del__(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> Literal[False]: ...

def local_pipeline(
    source: Iterable[Any],
    *stages: Callable[[Iterator[Any]], Iterable[Any]],
    buffers: int = 4,
    segment_size: int = 32768,
    codec: CodecName = "typed",
    buffer_timeout: float | None = 0.1,
    timeout: float | None = 60.0,
) -> LocalPipeline: ...
