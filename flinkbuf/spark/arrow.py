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

from flinkbuf.io import default_max_parallelism, java_hash_code
from flinkbuf.spark.exchange import (
    _check_int,
    _check_slots,
    _make_spec,
    _run_task,
    _serve_while,
    _start_rendezvous,
)

__all__ = ["arrow_exchange", "key_partitions"]

_SCHEMA, _BATCH = 0, 1
# Spark's types of the key columns arrow_exchange hashes (as Java would).
_KEY_TYPES = frozenset(("boolean", "byte", "short", "integer", "long", "float", "double",
                        "string", "binary"))
_INT32_MIN = np.iinfo(np.int32).min


def _murmur(codes):
    """Flink's ``MathUtils.murmurHash`` over a uint32 array of int32 hash
    codes (consumed: hashed in place), vectorized; returns the hashes as
    non-negative values in a uint32 array."""
    h = codes
    with np.errstate(over="ignore"):
        h *= np.uint32(0xCC9E2D51)
        h[:] = (h << np.uint32(15)) | (h >> np.uint32(17))
        h *= np.uint32(0x1B873593)
        h[:] = (h << np.uint32(13)) | (h >> np.uint32(19))
        h *= np.uint32(5)
        h += np.uint32(0xE6546B64)
        h ^= np.uint32(4)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    signed = h.view(np.int32)
    minimum = signed == _INT32_MIN        # Flink: murmurHash(MIN_VALUE) is 0
    np.abs(signed, out=signed)
    signed[minimum] = 0
    return h


def _java_int_codes(values, lo=None, hi=None):
    """Java's ``hashCode()`` of int64 keys as flinkbuf hashes them, as a new
    uint32 array: a value in the int32 range as ``Integer`` (itself), a
    larger one as ``Long`` (``(int) (v ^ (v >>> 32))``).  ``lo``/``hi``: the
    values' minimum and maximum, if known."""
    if lo is None and len(values):
        lo, hi = int(values.min()), int(values.max())
    if not len(values) or (lo >= -2**31 and hi < 2**31):
        return values.astype(np.uint32)               # the low 32 bits: the int itself
    u = values.view(np.uint64)
    folded = (u ^ (u >> np.uint64(32))).astype(np.uint32)
    small = (values >= -2**31) & (values < 2**31)
    return np.where(small, values.astype(np.uint32), folded)


def _partition_table(num_partitions, max_parallelism):
    """The partition of each key group (Flink's operator index), in the
    narrowest integer type that holds it."""
    dtype = np.int8 if num_partitions <= 127 else (
        np.int16 if num_partitions <= 32767 else np.int32)
    groups = np.arange(max_parallelism, dtype=np.int64)
    return (groups * num_partitions // max_parallelism).astype(dtype)


def _int_partitions(values, table, max_parallelism):
    """The partition (``table``'s type) of each int64 key of ``values``.
    When the keys' range (maximum - minimum) is under half their number
    (say ``i % 1000`` in a batch of 65536), each value of the range is
    hashed once and the keys look their partition up (a gather instead of
    some twenty passes over the keys); otherwise every key is hashed."""
    if not len(values):
        return table[:0].copy()
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < len(values) // 2:
        span = np.arange(hi - lo + 1, dtype=np.int64)
        span += np.int64(lo)                      # the range itself: no overflow
        per_value = _hashed(_java_int_codes(span, lo, hi), table, max_parallelism)
        offsets = values - np.int64(lo)           # in [0, hi - lo]: no overflow
        return per_value[offsets]
    return _hashed(_java_int_codes(values, lo, hi), table, max_parallelism)


def _hashed(codes, table, max_parallelism):
    """The partition of each int32 hash code (a uint32 array, consumed)."""
    return table[_murmur(codes) % np.uint32(max_parallelism)]


def _numpy_partitions(values, table, max_parallelism):
    """The partition of each key of a 1-D numpy array: booleans as Java's
    ``Boolean``, integers vectorized (:func:`_int_partitions`), floats,
    str, bytes and uint64 values of 2**63 and more once per distinct value,
    the objects of an object array one by one (``None`` to partition 0, as
    a null), all with :func:`~flinkbuf.io.java_hash_code`."""
    kind = values.dtype.kind
    if kind == "b":
        return _hashed(np.where(values, np.uint32(1231), np.uint32(1237)), table,
                       max_parallelism)
    if kind == "i" or (kind == "u" and (values.dtype.itemsize < 8 or not len(values)
                                        or int(values.max()) < 2**63)):
        return _int_partitions(values.astype(np.int64, copy=False), table, max_parallelism)
    if kind in "mMcV":
        raise TypeError(f"cannot hash keys of dtype {values.dtype} as Java would: convert "
                        "them to int64, str or bytes first")
    if kind == "O":
        # One by one: Python's equality would merge keys that Java hashes
        # apart (1, 1.0 and True; 0.0 and -0.0).
        nulls = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        codes = np.fromiter((0 if v is None else java_hash_code(v) & 0xFFFFFFFF
                             for v in values), dtype=np.uint32, count=len(values))
        parts = _hashed(codes, table, max_parallelism)
        parts[nulls] = 0
        return parts
    if kind == "f":       # by bit pattern: Java tells -0.0 from 0.0, and np.unique does not
        uniques, inverse = np.unique(values.astype(np.float64).view(np.uint64),
                                     return_inverse=True)
        distinct = uniques.view(np.float64).tolist()
    else:                                         # str, bytes, big uint64: sorted in numpy
        uniques, inverse = np.unique(values, return_inverse=True)
        distinct = uniques.tolist()
    return _distinct_partitions(distinct, table, max_parallelism)[inverse]


def _distinct_partitions(distinct, table, max_parallelism):
    """The partition of each key of a list of distinct keys."""
    codes = np.array([java_hash_code(u) & 0xFFFFFFFF for u in distinct], dtype=np.uint32)
    return _hashed(codes, table, max_parallelism)


def _partitions(keys, max_parallelism, table):
    """:func:`key_partitions` for an Arrow array or chunked array ``keys``,
    in ``table``'s type (:func:`_partition_table`)."""
    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    null_mask = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else None
    if pa.types.is_integer(keys.type) or pa.types.is_boolean(keys.type):
        if null_mask is not None:
            keys = keys.fill_null(False if pa.types.is_boolean(keys.type) else 0)
        parts = _numpy_partitions(keys.to_numpy(zero_copy_only=False), table, max_parallelism)
    else:
        encoded = keys.dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        if not uniques:
            return np.zeros(len(keys), dtype=table.dtype)
        per_unique = _distinct_partitions(uniques, table, max_parallelism)
        parts = per_unique[encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    if null_mask is not None:
        parts[null_mask] = 0
    return parts


def _is_arrow(keys):
    return type(keys).__module__.split(".")[0] == "pyarrow"


def _as_key_array(keys):
    """``keys`` as a 1-D numpy array.  A sequence becomes an array of its
    objects as they are (numpy would turn ints beyond int64, or ints beside
    floats, into floats, and tuples into rows of a 2-D array)."""
    if isinstance(keys, np.ndarray):
        if keys.ndim != 1:
            raise ValueError(f"keys must be one-dimensional, got an array of shape {keys.shape}")
        return keys
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise TypeError(f"keys must be an Arrow array, a numpy array or a sequence of keys, "
                        f"got {type(keys).__name__}")
    items = list(keys)
    values = np.empty(len(items), dtype=object)
    values[:] = items
    return values


def key_partitions(keys, num_partitions, max_parallelism=None):
    """The partition of each key of ``keys`` among ``num_partitions``, as
    the hash selector and :func:`flinkbuf.io.assign_key_to_operator` assign
    them (Flink's key groups); returns an int64 numpy array.

    ``keys``: an Arrow array or chunked array, a one-dimensional numpy
    array, or a sequence of keys (pyarrow is needed for Arrow input only).
    Integer and boolean keys are hashed vectorized in numpy, other keys
    (strings, bytes, floats, tuples, ...) once per distinct value.  Null
    keys (``None``) go to partition 0.  ``max_parallelism``: the number of
    key groups, at least ``num_partitions`` (default: as the exchanges
    choose it)."""
    _check_int(num_partitions, "num_partitions", 1, 32768)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(num_partitions)
    else:
        _check_int(max_parallelism, "max_parallelism", num_partitions, 32768)
    table = _partition_table(num_partitions, max_parallelism)
    if _is_arrow(keys):
        parts = _partitions(keys, max_parallelism, table)
    else:
        parts = _numpy_partitions(_as_key_array(keys), table, max_parallelism)
    return parts.astype(np.int64)


def _route(key, max_parallelism):
    """The producer: every input batch split by key partition, each piece
    sent to its consumer as an IPC message (the schema once per channel)."""

    def produce(writer, batches):
        n = writer.num_channels
        emit = writer.emit
        table = _partition_table(n, max_parallelism)
        sent_schema = [False] * n
        column = None
        for batch in batches:
            rows = batch.num_rows
            if rows == 0:
                continue
            if n == 1:
                pieces = ((0, batch),)
            else:
                if column is None:
                    column = batch.schema.get_field_index(key)
                dest = _partitions(batch.column(column), max_parallelism, table)
                counts = np.bincount(dest, minlength=n)
                if counts.max() == rows:          # the whole batch goes to one consumer
                    pieces = ((int(dest[0]), batch),)
                else:
                    order = np.argsort(dest, kind="stable")   # a radix sort: small ints
                    bounds = np.cumsum(counts).tolist()
                    pieces = ((j, batch.take(order[bounds[j] - c:bounds[j]]))
                              for j, c in enumerate(counts.tolist()) if c)
            for j, piece in pieces:
                if not sent_schema[j]:
                    emit((j, _SCHEMA, batch.schema.serialize().to_pybytes()))
                    sent_schema[j] = True
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
    hold the largest piece), and read in place from the received record.  Slots, memory,
    timeouts, failures, ``host``, ``monitor`` and ``rendezvous``: as
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
    key_type = df.schema[key].dataType.typeName()
    if key_type not in _KEY_TYPES:
        raise TypeError(f"cannot hash key column {key!r} of type {key_type}: key columns are "
                        f"{', '.join(sorted(_KEY_TYPES))} (cast it, say to a string)")
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError("arrow_exchange needs pyarrow: pip install 'flinkbuf[spark]'") \
            from exc
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

    sc = df.sparkSession.sparkContext
    _check_slots(sc, n, spec.timeout)

    def task(batches):
        return _run_task(spec, batches)

    server = _start_rendezvous(sc, spec, n)
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
