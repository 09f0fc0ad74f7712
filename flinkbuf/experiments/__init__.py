"""The experiments, as library functions behind ``flinkbuf experiment``.

* :func:`run_backpressure` -- Flink's 2015 backpressure experiment (the blog
  post "How Apache Flink handles backpressure"): a producer and a consumer
  task exchanging records locally through 2 buffers of 4096 bytes; the
  consumer is slowed and released twice, the producer follows.
* :func:`run_slow_subpartition` -- one slow subpartition: a blocked
  consumer of a round-robin producer starves the other through a shared
  output pool, unless the backlog-aware round robin (alone, or with the
  per-channel cap) steers records around it.
* :func:`run_debloat` -- buffer debloating off and on under the
  backpressure schedule: the records' sojourn, the throughput, the data in
  flight, the debloated buffer size and the memory handed back.

Each checks every argument before anything runs and raises
:class:`ExperimentArgumentError` (a ``ValueError``) for one out of range.
They write a CSV table and a JSON document, and a PNG figure when
matplotlib is installed (``pip install 'flinkbuf[plot]'``).
"""

from flinkbuf.experiments.arguments import ExperimentArgumentError
from flinkbuf.experiments.backpressure import DEFAULT_SCHEDULE, run_backpressure
from flinkbuf.experiments.debloat import run_debloat
from flinkbuf.experiments.slow_subpartition import DEFAULT_MODES, MODES, run_slow_subpartition

__all__ = ["DEFAULT_MODES", "DEFAULT_SCHEDULE", "MODES", "ExperimentArgumentError",
           "run_backpressure", "run_debloat", "run_slow_subpartition"]
