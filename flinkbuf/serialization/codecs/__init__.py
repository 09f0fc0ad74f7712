"""The record codecs of layer 2 (typed, bytes, pickle), compiled into
:mod:`flinkbuf.serialization._serialization`; declarations for cimporters."""
