"""The pipelined exchange for DataFrames: Arrow RecordBatches between the
tasks of ``df.mapInArrow(..., barrier=True)`` (:func:`arrow_exchange`).

Each task splits its input batches by a vectorized hash of the key column
(:func:`flinkbuf.io.assign_keys_to_operators`, in C: Flink's key groups, the
same partition as :func:`flinkbuf.io.assign_key_to_operator` gives the key;
the rows grouped by consumer with :func:`flinkbuf.io.order_by_channel`),
and sends each piece as one record, after the schema (an Arrow IPC message,
once per channel): a batch whose columns are all of a fixed width (numbers,
dates, times, timestamps) and without nulls as its columns' values, gathered
straight out of the input batch (numpy arrays, which the record serializer
copies into the network buffers); any other batch as an Arrow IPC message.
The consumer reads a batch from its record without a further copy (the
batch's buffers point into the record, which, like every record, was copied
once out of the network buffers).
"""

import sys

import numpy as np

from flinkbuf.checks import check_int
from flinkbuf.errors import CorruptRecordError
from flinkbuf.io import (
    assign_keys_to_operators,
    default_max_parallelism,
    java_hash_code,
    order_by_channel,
    partition_buffers,
    task_segments,
)
from flinkbuf.spark import live
from flinkbuf.spark._dataframe import exchange_input
from flinkbuf.spark._prepare import prepare
from flinkbuf.spark._spec import check_buffers, check_options
from flinkbuf.spark._task import run_task

__all__ = ["arrow_exchange", "default_segment_size", "key_partitions"]

_SCHEMA, _BATCH, _VALUES = 0, 1, 2
# Columns whose values are one buffer of items of one of these widths (in
# bits) travel as those bytes, viewed as unsigned integers.
_VALUE_TYPES = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
                64: np.dtype(np.uint64)}
# The default network buffer size: the largest of these whose task buffers
# stay within the budget (a piece of a batch fills many buffers: larger ones
# mean fewer handoffs between the task's threads).
_SEGMENT_SIZE_MAX = 256 << 10
_SEGMENT_SIZE_MIN = 32 << 10
_TASK_BUFFERS_BUDGET = 8 << 20
# Spark's types of the key columns arrow_exchange hashes (as Java would).
_KEY_TYPES = frozenset(("boolean", "byte", "short", "integer", "long", "float", "double",
                        "string", "binary"))


def _partition_dtype(num_partitions):
    """The narrowest integer type that holds every partition."""
    return np.int8 if num_partitions <= 128 else np.int16


def _assign(keys, num_partitions, max_parallelism, dtype, **varlen):
    """The partition of each key of a numpy array of numbers, or of the
    bytes ``keys`` cut by ``varlen["offsets"]``, as a new array of
    ``dtype``."""
    n = len(keys) if not varlen else len(varlen["offsets"]) - 1
    out = np.empty(n, dtype=dtype)
    assign_keys_to_operators(keys, out, num_partitions, max_parallelism, **varlen)
    return out


def _numpy_partitions(values, num_partitions, max_parallelism, dtype):
    """The partition of each key of a 1-D numpy array: integers, booleans
    (Java's ``Boolean``) and floats (``Double``) in C; str and bytes once
    per distinct value and the objects of an object array one by one
    (``None`` to partition 0, as a null), with
    :func:`~flinkbuf.io.java_hash_code`."""
    kind = values.dtype.kind
    if kind in "biuf":
        if kind == "f" and values.dtype.itemsize not in (4, 8):
            values = values.astype(np.float64)
        values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
        return _assign(values, num_partitions, max_parallelism, dtype)
    if kind in "mMcV":
        raise TypeError(f"cannot hash keys of dtype {values.dtype} as Java would: convert "
                        "them to int64, str or bytes first")
    if kind == "O":
        # One by one: Python's equality would merge keys that Java hashes
        # apart (1, 1.0 and True; 0.0 and -0.0).
        codes = np.fromiter((0 if v is None else java_hash_code(v) for v in values),
                            dtype=np.int32, count=len(values))
        parts = _assign(codes, num_partitions, max_parallelism, dtype)
        parts[np.fromiter((v is None for v in values), dtype=bool, count=len(values))] = 0
        return parts
    uniques, inverse = np.unique(values, return_inverse=True)     # str, bytes: sorted in numpy
    return _distinct_partitions(uniques.tolist(), num_partitions, max_parallelism,
                                dtype)[inverse]


def _distinct_partitions(distinct, num_partitions, max_parallelism, dtype):
    """The partition of each key of a list of distinct keys."""
    codes = np.fromiter((java_hash_code(u) for u in distinct), dtype=np.int32,
                        count=len(distinct))
    return _assign(codes, num_partitions, max_parallelism, dtype)


def _partitions(keys, num_partitions, max_parallelism, dtype):
    """:func:`key_partitions` for an Arrow array or chunked array ``keys``,
    as an array of ``dtype``: numbers, strings and bytes in C, other types
    once per distinct value."""
    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    t = keys.type
    null_mask = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else None
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t):
        if null_mask is not None and not pa.types.is_floating(t):
            keys = keys.fill_null(False if pa.types.is_boolean(t) else 0)
        parts = _numpy_partitions(keys.to_numpy(zero_copy_only=False), num_partitions,
                                  max_parallelism, dtype)
    elif (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
          or pa.types.is_large_binary(t)):
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        if null_mask is not None:
            keys = keys.fill_null("" if text else b"")
        _, offsets, data = keys.buffers()
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
        offsets = offsets[keys.offset:keys.offset + len(keys) + 1]
        parts = _assign(b"" if data is None else data, num_partitions, max_parallelism,
                        dtype, offsets=offsets, utf8=text)
    else:
        encoded = keys.dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        if not uniques:
            return np.zeros(len(keys), dtype=dtype)
        per_unique = _distinct_partitions(uniques, num_partitions, max_parallelism, dtype)
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
    Integer, boolean and float keys, and Arrow strings and binaries, are
    hashed vectorized in C (:func:`flinkbuf.io.assign_keys_to_operators`),
    other keys (numpy strings, tuples, ...) once per distinct value.  Null
    keys (``None``) go to partition 0.  ``max_parallelism``: the number of
    key groups, at least ``num_partitions`` (default: as the exchanges
    choose it)."""
    check_int(num_partitions, "num_partitions", 1, 32768)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(num_partitions)
    else:
        check_int(max_parallelism, "max_parallelism", num_partitions, 32768)
    if _is_arrow(keys):
        return _partitions(keys, num_partitions, max_parallelism, np.int64)
    return _numpy_partitions(_as_key_array(keys), num_partitions, max_parallelism, np.int64)


class _Cut:
    """Cuts batches into one piece per consumer (each piece's rows in
    input order), reusing its arrays from batch to batch: a piece must be
    written out before the next is cut."""

    def __init__(self):
        self._order = np.empty(0, dtype=np.int32)
        self._out = []

    def _split(self, dest, n):
        """``(consumer, rows)`` for each consumer with rows, in consumer
        order (``dest``: each row's consumer among ``n``; None: all to
        consumer 0); ``rows`` is None when the whole batch goes to one."""
        if dest is None:
            yield 0, None
            return
        rows = len(dest)
        if len(self._order) < rows:
            self._order = np.empty(rows, dtype=np.int32 if rows < 1 << 31 else np.int64)
        order = self._order[:rows]
        counts = np.empty(n, dtype=np.int64)
        order_by_channel(dest, order, counts)
        if counts.max() == rows:
            yield int(dest[0]), None
            return
        start = 0
        for j, c in enumerate(counts.tolist()):
            if c:
                yield j, order[start:start + c]
                start += c

    def batch(self, batch, dest, n):
        """``(consumer, RecordBatch)`` for each consumer with rows."""
        from pyarrow.compute import take

        for j, rows in self._split(dest, n):
            # order holds each row once, in range: no bounds check
            yield j, batch if rows is None else take(batch, rows, boundscheck=False)

    def values(self, views, dest, n):
        """The same for the value views of a batch's columns: ``(consumer,
        arrays)``, each piece gathered into arrays that the next reuses."""
        for j, rows in self._split(dest, n):
            if rows is None:
                yield j, tuple(views)
                continue
            out = self._arrays(views)
            # order holds each row once, in range: clip checks nothing
            yield j, tuple(np.take(v, rows, out=o[:len(rows)], mode="clip")
                           for v, o in zip(views, out))

    def _arrays(self, views):
        rows = len(views[0])
        if (len(self._out) != len(views) or len(self._out[0]) < rows
                or any(o.dtype != v.dtype for o, v in zip(self._out, views))):
            self._out = [np.empty(rows, dtype=v.dtype) for v in views]
        return self._out


def _pieces(batch, dest, n):
    """``batch`` cut by ``dest`` (each row's consumer among ``n``):
    ``(consumer, piece)`` for each consumer with rows, in consumer order,
    each piece's rows in input order."""
    return _Cut().batch(batch, dest, n)


def _value_type(t):
    """The numpy type that a column of Arrow type ``t`` travels as when
    it has no nulls: its values' bytes, as unsigned integers of its width
    (integers, floats, dates, times, timestamps, durations, fixed-size
    binary of 1, 2, 4 or 8 bytes), or None (sent as an IPC message)."""
    import pyarrow as pa

    if (sys.byteorder != "little" or isinstance(t, pa.ExtensionType)
            or pa.types.is_dictionary(t) or pa.types.is_boolean(t) or pa.types.is_nested(t)):
        return None
    try:
        bits = t.bit_width
    except ValueError:                   # not of a fixed width
        return None
    return _VALUE_TYPES.get(bits)


def _value_types(schema):
    """Each field's :func:`_value_type`, or None if one has none."""
    types = [_value_type(field.type) for field in schema]
    return types if types and all(t is not None for t in types) else None


def _value_views(batch, types):
    """Each column of ``batch`` as a numpy view of its values, or None if
    a column has nulls (or buffers not laid out as its type says)."""
    views = []
    for column, t in zip(batch.columns, types):
        if column.null_count:
            return None
        buffers = column.buffers()
        if len(buffers) != 2 or buffers[1] is None:
            return None
        views.append(np.frombuffer(buffers[1], dtype=t, count=len(column),
                                   offset=column.offset * t.itemsize))
    return views


def _from_values(arrays, schema, types):
    """The RecordBatch of ``schema`` whose columns' values are ``arrays``
    (a record of values, viewed in place); ``types``: each field's
    :func:`_value_type`."""
    import pyarrow as pa

    if not (isinstance(arrays, tuple) and len(arrays) == len(schema) and arrays
            and isinstance(arrays[0], np.ndarray)):
        raise CorruptRecordError("a malformed piece of an Arrow batch: not one array per "
                                 "column of its schema")
    rows = len(arrays[0])
    columns = []
    for field, t, values in zip(schema, types, arrays):
        if not (isinstance(values, np.ndarray) and values.ndim == 1 and len(values) == rows
                and t is not None and values.dtype == t):
            raise CorruptRecordError(f"a malformed piece of an Arrow batch: column "
                                     f"{field.name!r} ({field.type}) does not hold {rows} "
                                     f"values of its type")
        columns.append(pa.Array.from_buffers(field.type, rows, [None, pa.py_buffer(values)]))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def default_segment_size(num_tasks, buffers_per_channel=2, floating_buffers=8):
    """arrow_exchange's network buffer size for ``num_tasks`` tasks:
    256 KiB, halved (to 32 KiB at the least) while the buffers of a task
    (:func:`~flinkbuf.io.task_segments`) would take more than 8 MiB."""
    check_int(num_tasks, "num_tasks", 1)
    check_buffers(buffers_per_channel, floating_buffers)
    segments = task_segments([partition_buffers(num_tasks, buffers_per_channel)],
                             [num_tasks - 1], exclusive_buffers_per_channel=buffers_per_channel,
                             floating_buffers_per_gate=floating_buffers)
    size = _SEGMENT_SIZE_MAX
    while size > _SEGMENT_SIZE_MIN and size * segments > _TASK_BUFFERS_BUDGET:
        size //= 2
    return size


def _route(key, max_parallelism, map_input=None):
    """The producer: every input batch (or every batch ``map_input`` makes
    of them) split by key partition, each piece sent to its consumer as one
    record (the schema once per channel, as an IPC message): the values of
    its columns when all are of a fixed width and without nulls (gathered
    straight out of the batch), else an IPC message."""

    def produce(writer, batches):
        if map_input is not None:
            batches = map_input(batches)
        n = writer.num_channels
        emit = writer.emit
        dtype = _partition_dtype(n)
        sent_schema = [False] * n
        column = None
        types = False                    # not known yet
        cut = _Cut()
        for batch in batches:
            rows = batch.num_rows
            if rows == 0:
                continue
            if types is False:
                types = _value_types(batch.schema)
            dest = None
            if n > 1:
                if column is None:
                    column = _key_column(batch.schema, key)
                dest = _partitions(batch.column(column), n, max_parallelism, dtype)
            views = None if types is None else _value_views(batch, types)
            if views is not None:
                pieces, kind = cut.values(views, dest, n), _VALUES
            else:
                pieces, kind = cut.batch(batch, dest, n), _BATCH
            for j, piece in pieces:
                if not sent_schema[j]:
                    emit((j, _SCHEMA, batch.schema.serialize().to_pybytes()))
                    sent_schema[j] = True
                # each piece of values is copied into the buffers here,
                # before the next is gathered into the same arrays
                emit((j, kind, piece if kind == _VALUES else memoryview(piece.serialize())))
    return produce


def _key_column(schema, key):
    """The index of column ``key`` in ``schema`` (of a batch that
    ``map_input`` made), else ValueError."""
    column = schema.get_field_index(key)
    if column < 0:
        raise ValueError(f"key {key!r} names no single column of the batches to exchange "
                         f"({', '.join(schema.names)})")
    return column


def _batches(task):
    """The consumer: the gate's records as RecordBatches, read in place."""
    import time

    import pyarrow as pa

    gate = task.gate
    schemas = {}
    first = True
    while True:
        try:
            channel, record = gate.next_with_channel()
        except StopIteration:
            return
        if not (isinstance(record, tuple) and len(record) == 3
                and record[1] in (_SCHEMA, _BATCH, _VALUES)):
            raise CorruptRecordError(f"a malformed record of arrow_exchange from channel "
                                     f"{channel}")
        _, kind, payload = record
        if kind == _SCHEMA:
            schema = _read_ipc(pa.ipc.read_schema, channel, payload)
            schemas[channel] = schema, [_value_type(field.type) for field in schema]
            continue
        if channel not in schemas:
            raise CorruptRecordError(f"a piece of an Arrow batch from channel {channel} "
                                     f"before its schema")
        schema, types = schemas[channel]
        if first:
            task.first_record_seconds = time.monotonic() - task.started
            first = False
        if kind == _VALUES:
            yield _from_values(payload, schema, types)
        else:
            yield _read_ipc(pa.ipc.read_record_batch, channel, payload, schema)


def _read_ipc(read, channel, payload, *args):
    """``read`` (pyarrow.ipc's) over the bytes of a record from
    ``channel``; a malformed message is a CorruptRecordError."""
    import pyarrow as pa

    try:
        return read(pa.py_buffer(payload), *args)
    except (pa.ArrowException, EOFError, OSError, TypeError, ValueError) as exc:
        raise CorruptRecordError(f"a malformed Arrow IPC message from channel {channel}: "
                                 f"{exc}") from None


def arrow_exchange(df, fn, key, schema, *, num_partitions=None, segment_size=None,
                   buffers_per_channel=2, floating_buffers=8, buffer_timeout=0.1,
                   max_record_size=256 << 20, max_parallelism=None, host=None, timeout=60.0,
                   monitor=None, rendezvous=None, encryption=None, advertise=None, task_port=0,
                   rendezvous_port=0, port_retries=None, connect_timeout=10.0,
                   live_view=None, buffer_debloat=None, buffer_debloat_target=None,
                   buffer_debloat_period=None, buffer_debloat_samples=None,
                   buffer_debloat_threshold=None, buffer_debloat_min_size=None,
                   map_input=None):
    """Exchange the rows of DataFrame ``df`` by ``key`` (a column name)
    between the tasks of one barrier stage and return the DataFrame of
    ``fn``'s output (``schema``, as for ``mapInArrow``): each task's
    ``fn`` gets an iterator of ``pyarrow.RecordBatch`` holding the rows whose
    key hashes to it, pipelined (batches arrive while they are produced), and
    yields RecordBatches.  ``df.repartition(n, key).mapInArrow(fn, schema)``
    computes the same, through Spark's shuffle.

    Built on ``df.mapInArrow(..., barrier=True)``: one task per partition of
    ``df``, each needing a slot at once; ``num_partitions=N`` repartitions
    ``df`` to N partitions first (round robin, through Spark's shuffle).  Rows are routed by a vectorized
    hash of the key column (Flink's key groups, as the hash selector and
    :func:`key_partitions`), sent as Arrow IPC messages through flinkbuf
    (one message per piece of an input batch, so ``max_record_size`` must
    hold the largest piece), and read in place from the received record.
    ``segment_size``: the network buffers' size, by default
    :func:`default_segment_size` (256 KiB for a few tasks, less for many).  Slots, memory,
    timeouts, failures, addresses and ports (``host``, ``advertise``,
    ``task_port``, ``rendezvous_port``, ``port_retries``), ``monitor``,
    ``rendezvous``, ``encryption``, ``live_view`` and buffer debloating
    (``buffer_debloat`` and the ``buffer_debloat_*`` keywords): as
    :func:`pipelined_exchange`, except that the driver's rendezvous serves
    as long as the returned DataFrame itself is referenced (a DataFrame
    made from it does not keep it up), then until no task has registered
    for ``timeout`` seconds.

    ``map_input``: a function of a task's input batches (an iterator of
    RecordBatch) that yields the batches the task exchanges in their
    place, run in the task's producer thread: a map chained before the
    exchange, in the same Python worker as the exchange and ``fn`` (where
    ``df.mapInArrow(f)`` first would run ``f`` in a Python worker of its
    own, its batches passing through the JVM on their way to the
    exchange).  Its batches must have the ``key`` column, which ``df``
    then need not have; a batch without it fails the task with ValueError.

    On a Spark Connect session (``SparkSession.builder.remote(...)``, told
    from the DataFrame itself) it works the same, without a SparkContext:
    the number of tasks comes from the DataFrame's plan (a range with
    ``numPartitions``, ``repartition(n)``, and what keeps their
    partitions; otherwise give ``num_partitions``); the slots are checked
    from the master URL and the session's settings where they tell
    (``local[N]``, ``local-cluster``, static executors x cores /
    ``spark.task.cpus``); ``encryption`` follows the session's settings
    read through ``spark.conf``; every job that runs the exchange runs
    under a tag of its own (the exchange's id), which this client
    interrupts, and the action raises
    :class:`~flinkbuf.errors.InsufficientSlotsError`, when the job shows
    no running task and the exchange's tasks have not started within
    ``timeout`` (Spark would repeat its own slot check for ten minutes).
    ``rendezvous=None`` (the default) is the driver's rendezvous on a
    classic session; on a Connect session, this client's when the
    Connect server runs on this machine (its tasks reach this client; one
    round trip, where ``allGather`` is answered on a one-second poll),
    else ``"barrier"`` (``allGather``: tasks on a cluster cannot be
    assumed to reach a client outside it; ``"driver"`` serves it here
    anyway, on the address this machine reaches the server from, for a
    client inside the cluster).
    """
    try:
        from pyspark.sql import DataFrame     # either kind's DataFrame is one
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
    if map_input is not None and not callable(map_input):
        raise TypeError(f"map_input must be callable (iterator of RecordBatch -> iterator "
                        f"of RecordBatch) or None, got {type(map_input).__name__}")
    if map_input is None:
        _check_key_column(df, key)
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError("arrow_exchange needs pyarrow: pip install 'flinkbuf[spark]'") \
            from exc
    session, df, n = exchange_input(df, num_partitions)
    rendezvous = session.rendezvous(rendezvous)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(n)
    if segment_size is None:
        segment_size = default_segment_size(n, buffers_per_channel, floating_buffers)
    options = check_options(n, fn, num_partitions=None, key=None, selector=_by_destination,
                            codec="typed", segment_size=segment_size,
                            buffers_per_channel=buffers_per_channel,
                            floating_buffers=floating_buffers, buffer_timeout=buffer_timeout,
                            max_record_size=max_record_size, max_parallelism=max_parallelism,
                            host=host, timeout=timeout, monitor=monitor, rendezvous=rendezvous,
                            encryption=encryption,
                            produce=_route(key, max_parallelism, map_input),
                            read=_batches, advertise=advertise, task_port=task_port,
                            rendezvous_port=rendezvous_port, port_retries=port_retries,
                            connect_timeout=connect_timeout, buffer_debloat=buffer_debloat,
                            buffer_debloat_target=buffer_debloat_target,
                            buffer_debloat_period=buffer_debloat_period,
                            buffer_debloat_samples=buffer_debloat_samples,
                            buffer_debloat_threshold=buffer_debloat_threshold,
                            buffer_debloat_min_size=buffer_debloat_min_size)
    prepared = prepare(session, n, options, live_view,
                       live.exchange_name("arrow_exchange", key, fn))
    spec = prepared.spec

    def task(batches):
        return run_task(spec, batches)

    # A DataFrame made from the result holds only the JVM's plan: the
    # rendezvous serves while the returned DataFrame is referenced, then
    # until it has been idle for the timeout.
    return prepared.launch(lambda: df.mapInArrow(task, schema, barrier=True))


def _check_key_column(df, key):
    """``key`` is a column of DataFrame ``df`` of a type the exchange
    hashes as Java would."""
    if key not in df.columns:
        raise ValueError(f"key {key!r} is not a column of the DataFrame ({', '.join(df.columns)})")
    key_type = df.schema[key].dataType.typeName()
    if key_type not in _KEY_TYPES:
        raise TypeError(f"cannot hash key column {key!r} of type {key_type}: key columns are "
                        f"{', '.join(sorted(_KEY_TYPES))} (cast it, say to a string)")


def _by_destination(record, num_channels):
    return record[0]
