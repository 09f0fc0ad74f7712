"""Layer 5: pipelined, backpressured exchange between PySpark tasks over
:mod:`flinkbuf.network`.

* :func:`pipelined_exchange` -- the tasks of one barrier stage exchange
  records through flinkbuf (``rdd.partitionBy(n).mapPartitions(fn)``, but
  pipelined and with bounded memory per task).
* :func:`arrow_exchange` -- the same for a DataFrame's rows by a key column,
  as Arrow RecordBatches (``mapInArrow(..., barrier=True)``), routed by a
  vectorized hash (:func:`key_partitions`).
* :func:`live_view` -- a live page of the session's exchanges on the
  driver (backpressure per task while the job runs, the bottleneck
  named), with JSON and Prometheus text (:class:`LiveView`).
* :func:`local_pipeline` -- a partition's stages in threads joined by local
  channels with a bounded pool, inside one task (it uses no Spark: it is
  :func:`flinkbuf.io.local_pipeline`, here too for Spark jobs).

PySpark is imported only when a function needs it (``pip install
'flinkbuf[spark]'``).  Executors must import flinkbuf: set
``PYSPARK_PYTHON`` to an interpreter that has it before the session starts.
"""

from flinkbuf.errors import InsufficientSlotsError
from flinkbuf.io import LocalPipeline, local_pipeline
from flinkbuf.spark.exchange import (
    RENDEZVOUS,
    SELECTORS,
    ExchangeTask,
    close_rendezvous,
    current_task,
    pipelined_exchange,
)
from flinkbuf.spark.arrow import arrow_exchange, key_partitions
from flinkbuf.spark.live import LiveView, live_view

__all__ = ["RENDEZVOUS", "SELECTORS", "ExchangeTask", "InsufficientSlotsError",
           "LiveView", "LocalPipeline", "arrow_exchange",
           "close_rendezvous", "current_task", "key_partitions", "live_view", "local_pipeline",
           "pipelined_exchange"]
