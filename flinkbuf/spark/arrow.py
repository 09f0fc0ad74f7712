"""The pipelined exchange for DataFrames: Arrow RecordBatches between the
tasks of ``df.mapInArrow(..., barrier=True)`` (:func:`arrow_exchange`).

Each task splits its input batches by a vectorized hash of the key column
(numpy, Flink's key groups, the same partition as
:func:`flinkbuf.io.assign_key_to_operator` gives the key), and sends each
piece as one record: an Arrow IPC message (the schema first, once per
channel, then record batch messages).  The consumer reads a batch from its
record without a further copy (the batch's buffers point into the record,
which, like every record, was copied once out of the network buffers).
"""

import numpy as np

from flinkbuf.io import default_max_parallelism
from flinkbuf.spark.exchange import _make_spec, _run_task, _serve_while, _start_rendezvous

__all__ = ["arrow_exchange", "key_partitions"]

_M32 = np.uint32(0xFFFFFFFF)
_SCHEMA, _BATCH = 0, 1


def _rotl(x, r):
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _murmur(codes):
    """Flink's ``MathUtils.murmurHash`` over an array of int32 hash codes
    (as uint32), vectorized; returns non-negative int64."""
    with np.errstate(over="ignore"):
        h = codes.astype(np.uint32, copy=True)
        h *= np.uint32(0xCC9E2D51)
        h = _rotl(h, 15)
        h *= np.uint32(0x1B873593)
        h = _rotl(h, 13)
        h = h * np.uint32(5) + np.uint32(0xE6546B64)
        h ^= np.uint32(4)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    signed = h.view(np.int32).astype(np.int64)
    out = np.abs(signed)
    out[signed == np.iinfo(np.int32).min] = 0
    return out


def _java_int_codes(values):
    """Java's ``hashCode()`` of integer keys as flinkbuf hashes them: a value
    in the int32 range as ``Integer`` (itself), a larger one as ``Long``
    (``(int) (v ^ (v >>> 32))``)."""
    v = np.asarray(values).astype(np.int64, copy=False)
    small = (v >= -2**31) & (v < 2**31)
    u = v.view(np.uint64)
    folded = (u ^ (u >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return np.where(small, v & 0xFFFFFFFF, folded.astype(np.int64)).astype(np.uint32)


def key_partitions(keys, num_partitions, max_parallelism=None):
    """The partition of each key of ``keys`` (an Arrow array or chunked
    array, or a numpy array) among ``num_partitions``, as the hash selector
    and :func:`flinkbuf.io.assign_key_to_operator` assign them (Flink's key
    groups): integer keys vectorized in numpy, other keys (strings, bytes,
    floats, ...) hashed once per distinct value.  Returns an int64 numpy
    array.  Null keys go to partition 0."""
    import pyarrow as pa

    if max_parallelism is None:
        max_parallelism = default_max_parallelism(num_partitions)
    if isinstance(keys, np.ndarray):
        keys = pa.array(keys)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type):
        values = keys.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        groups = _murmur(_java_int_codes(values)) % max_parallelism
    else:
        from flinkbuf.io import java_hash_code

        encoded = keys.dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        codes = np.array([java_hash_code(u) & 0xFFFFFFFF for u in uniques],
                         dtype=np.uint32)
        per_unique = _murmur(codes) % max_parallelism if len(uniques) else codes
        idx = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
        groups = per_unique[idx] if len(uniques) else np.zeros(len(keys), np.int64)
        if keys.null_count:
            groups[keys.is_null().to_numpy(zero_copy_only=False)] = 0
    parts = groups * num_partitions // max_parallelism
    if keys.null_count and (pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type)):
        parts[keys.is_null().to_numpy(zero_copy_only=False)] = 0
    return parts.astype(np.int64)


def _route(key, max_parallelism):
    """The producer: every input batch split by key partition, each piece
    sent to its consumer as an IPC message (the schema once per channel)."""

    def produce(writer, batches):
        n = writer.num_channels
        emit = writer.emit
        sent_schema = [False] * n
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if n == 1:
                dest = np.zeros(batch.num_rows, dtype=np.int64)
            else:
                dest = key_partitions(batch.column(batch.schema.get_field_index(key)), n,
                                      max_parallelism)
            order = np.argsort(dest, kind="stable")
            bounds = np.searchsorted(dest[order], np.arange(n + 1))
            for j in range(n):
                lo, hi = bounds[j], bounds[j + 1]
                if lo == hi:
                    continue
                if not sent_schema[j]:
                    emit((j, _SCHEMA, batch.schema.serialize().to_pybytes()))
                    sent_schema[j] = True
                piece = batch if hi - lo == batch.num_rows else batch.take(order[lo:hi])
                emit((j, _BATCH, memoryview(piece.serialize())))
    return produce


def _batches(task):
    """The consumer: the gate's records as RecordBatches, read in place."""
    import time

    import pyarrow as pa

    gate = task.gate
    schemas = {}
    first = True
    while True:
        try:
            channel, (_, kind, payload) = gate.next_with_channel()
        except StopIteration:
            return
        if kind == _SCHEMA:
            schemas[channel] = pa.ipc.read_schema(pa.py_buffer(payload))
            continue
        if first:
            task.first_record_seconds = time.monotonic() - task.started
            first = False
        yield pa.ipc.read_record_batch(pa.py_buffer(payload), schemas[channel])


def arrow_exchange(df, fn, key, schema, *, segment_size=32768, buffers_per_channel=2,
                   floating_buffers=8, buffer_timeout=0.1, max_record_size=256 << 20,
                   max_parallelism=None, host=None, timeout=60.0, monitor=None,
                   rendezvous="driver"):
    """Exchange the rows of DataFrame ``df`` by ``key`` (a column name)
    between the tasks of one barrier stage and return the DataFrame of
    ``fn``'s output (``schema``, as for ``mapInArrow``): each task's
    ``fn`` gets an iterator of ``pyarrow.RecordBatch`` holding the rows whose
    key hashes to it, pipelined (batches arrive while they are produced), and
    yields RecordBatches.  ``df.repartition(n, key).mapInArrow(fn, schema)``
    computes the same, through Spark's shuffle.

    Built on ``df.mapInArrow(..., barrier=True)``: one task per partition of
    ``df``, each needing a slot at once.  Rows are routed by a vectorized
    hash of the key column (Flink's key groups, as the hash selector and
    :func:`key_partitions`), sent as Arrow IPC messages through flinkbuf
    (one message per piece of an input batch, so ``max_record_size`` must
    hold the largest piece), and read in place from the received record.  Memory, timeouts,
    failures, ``host``, ``monitor`` and ``rendezvous``: as
    :func:`pipelined_exchange`, except that the driver's rendezvous serves
    as long as the returned DataFrame itself is referenced (a DataFrame
    made from it does not keep it up), then until no task has registered
    for ``timeout`` seconds.
    """
    try:
        from pyspark.sql import DataFrame
    except ImportError as exc:            # pragma: no cover - depends on the install
        raise ImportError("arrow_exchange needs PySpark: pip install 'flinkbuf[spark]'") \
            from exc
    if not isinstance(df, DataFrame):
        raise TypeError(f"df must be a pyspark DataFrame, got {type(df).__name__}")
    if not callable(fn):
        raise TypeError(f"fn must be callable (iterator of RecordBatch -> iterator of "
                        f"RecordBatch), got {type(fn).__name__}")
    if not isinstance(key, str):
        raise TypeError(f"key must be a column name, got {type(key).__name__}")
    if key not in df.columns:
        raise ValueError(f"key {key!r} is not a column of the DataFrame ({', '.join(df.columns)})")
    n = df.rdd.getNumPartitions()
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(n)
    spec = _make_spec(n, fn, num_partitions=None, key=None,
                      selector=_by_destination, codec="typed", segment_size=segment_size,
                      buffers_per_channel=buffers_per_channel,
                      floating_buffers=floating_buffers, buffer_timeout=buffer_timeout,
                      max_record_size=max_record_size, max_parallelism=max_parallelism,
                      host=host, timeout=timeout, monitor=monitor, rendezvous=rendezvous,
                      produce=_route(key, max_parallelism), read=_batches)

    def task(batches):
        return _run_task(spec, batches)

    server = _start_rendezvous(df.sparkSession.sparkContext, spec, n)
    try:
        result = df.mapInArrow(task, schema, barrier=True)
    except BaseException:
        if server is not None:
            server.close()
        raise
    # A DataFrame made from the result holds only the JVM's plan: the
    # rendezvous serves while the returned DataFrame is referenced, then
    # until it has been idle for the timeout.
    _serve_while(server, result)
    return result


def _by_destination(record, num_channels):
    return record[0]
