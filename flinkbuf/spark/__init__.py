"""Layer 5: pipelined, backpressured exchange between PySpark tasks over
:mod:`flinkbuf.network` (being built)."""
