"""Type stubs for flinkbuf.spark.driver: what an exchange's driver reads of its Spark session."""

from collections.abc import Callable

from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

__all__ = ["check_slots", "driver_addresses", "issued_task_ids", "session_encryption",
           "session_port_retries", "slots_message"]

def driver_addresses(sc: SparkContext) -> tuple[str, str]: ...
def session_port_retries(
    sc: SparkContext | SparkSession | ConnectSparkSession, port_retries: int | None
) -> int: ...
def session_encryption(
    sc: SparkContext | SparkSession | ConnectSparkSession, encryption: bool | None
) -> bool | None: ...
def check_slots(sc: SparkContext, num_tasks: int, timeout: float) -> None: ...
def slots_message(
    num_tasks: int,
    master: str,
    slots: int,
    cpus: str | int,
    *,
    fixed: bool,
    waited: float | None = None,
    num_partitions: bool = False,
) -> str: ...
def issued_task_ids(sc: SparkContext) -> Callable[[], int | None] | None: ...
