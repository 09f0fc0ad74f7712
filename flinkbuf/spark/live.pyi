"""Type stubs for flinkbuf.spark.live: the live view of a session's exchanges."""

from types import TracebackType
from typing import Literal, TypedDict

from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

from flinkbuf.io.metrics import _TaskMetricValues
from flinkbuf.spark.exchange import _TaskStatValues

__all__ = ["LiveView", "live_view"]

# TaskMetrics.snapshot() of the task, without its "task" name.
_LiveMetrics = _TaskMetricValues

# ExchangeTask.stats() of the task, without its index.
_TaskStats = _TaskStatValues

class _LiveTask(TypedDict):
    task: int
    attempt: int
    attempt_number: int
    stage: int
    address: str
    state: Literal["RUNNING", "FINISHED", "FAILED", "CANCELED", "LOST"]
    error: str | None
    latest: bool
    bottleneck: bool
    since: float
    updated: float
    age: float
    elapsed: float
    reports: int
    report_cpu_seconds: float
    # None until the task's first report.
    metrics: _LiveMetrics | None
    stats: _TaskStats | None
    backlogs: list[int]

class _Bottleneck(TypedDict):
    task: int
    attempt: int
    why: str
    feeders: list[int]

class _LiveExchange(TypedDict):
    id: str
    name: str
    num_tasks: int
    created: float
    state: Literal["WAITING", "RUNNING", "FINISHED", "FAILED", "CANCELED"]
    bottleneck: list[_Bottleneck]
    tasks: list[_LiveTask]

class _History(TypedDict):
    fields: list[str]
    since: int
    # "exchange|task|attempt" -> [[seq, seconds, value of each field], ...]
    samples: dict[str, list[list[float]]]

class _Thresholds(TypedDict):
    OK: float
    LOW: float

class _LiveDocument(TypedDict):
    flinkbuf_live_view: int
    now: float
    interval: float
    thresholds: _Thresholds
    colours: dict[str, str]
    seq: int
    exchanges: list[_LiveExchange]
    history: _History
    url: str
    refused: int

class LiveView:
    interval: float
    loopback: bool
    address: tuple[str, int]
    url: str
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        interval: float = 0.5,
        report_host: str = "127.0.0.1",
        report_advertise: str | None = None,
    ) -> None: ...
    @property
    def report_address(self) -> tuple[str, int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def refused(self) -> int: ...
    def snapshot(self, since: int = 0) -> _LiveDocument: ...
    def prometheus(self) -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> LiveView: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

def live_view(
    spark: SparkSession | ConnectSparkSession | SparkContext,
    *,
    host: str | None = None,
    port: int | None = None,
    interval: float | None = None,
    report_host: str | None = None,
) -> LiveView: ...
