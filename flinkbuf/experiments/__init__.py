"""The seeds' experiments, as library functions behind ``flinkbuf experiment``.

* :func:`run_backpressure` -- the 2015 Flink blog post: a producer and a
  consumer task exchanging records locally through 2 buffers of 4096 bytes;
  the consumer is slowed and released twice, the producer follows.
* :func:`run_slow_subpartition` -- seed 003: one blocked consumer of a
  round-robin producer starves the other through a shared output pool,
  unless the per-channel cap and the backlog-aware rebalance step in.
"""

from flinkbuf.experiments.backpressure import DEFAULT_SCHEDULE, run_backpressure
from flinkbuf.experiments.slow_subpartition import MODES, run_slow_subpartition

__all__ = ["DEFAULT_SCHEDULE", "MODES", "run_backpressure", "run_slow_subpartition"]
