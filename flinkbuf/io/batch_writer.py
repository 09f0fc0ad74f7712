"""A keyed exchange of column batches (:class:`BatchWriter`): rows routed
by Flink's key groups, each consumer sent its piece of every batch as one
record of the ``arrow`` codec, which its input gate rebuilds in place."""

import threading
from collections.abc import Mapping

import numpy as np

from flinkbuf.checks import check_int
from flinkbuf.io._io import (
    BroadcastSelector,
    CustomSelector,
    ForwardSelector,
    RecordWriter,
    RescaleSelector,
    ResultPartition,
    RoundRobinSelector,
    _gather_by_channel,
    order_by_channel,
)
from flinkbuf.io.batch_keys import check_key_type, partition_dtype, partitions
from flinkbuf.serialization.codecs.columns import (
    ArrowValues,
    NumpyLayout,
    NumpyValues,
    check_columns,
    schema_values,
    value_views,
)

__all__ = ["BatchWriter"]

# The selectors that route whole batches, by name and by class.
_WHOLE_BATCH_NAMES = ("round_robin", "rebalance", "rescale", "broadcast", "forward")
_WHOLE_BATCH_TYPES = (RoundRobinSelector, RescaleSelector, BroadcastSelector, ForwardSelector)


# The unsigned integer type of each item size: a column is gathered as its
# items' bytes (numpy exports no buffer of datetimes).
_UINTS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
          8: np.dtype(np.uint64)}


def _raw(values):
    """``values`` (a 1-D numpy array of fixed-width items) as its items' bytes."""
    size = values.dtype.itemsize
    return values.view(_UINTS.get(size) or np.dtype(f"V{size}"))


def _runs(counts):
    """``(channel, start, count)`` of each channel with rows, the rows
    grouped by channel as ``counts`` (rows per channel) says."""
    start = 0
    for j, c in enumerate(counts.tolist()):
        if c:
            yield j, start, c
            start += c


class _Cut:
    """Cuts batches into one piece per consumer (each piece's rows in
    input order), reusing its arrays from batch to batch: a batch's pieces
    must be written out before the next batch is cut."""

    def __init__(self):
        self._order = np.empty(0, dtype=np.int32)
        self._counts = np.empty(0, dtype=np.int64)
        self._out = []           # each column's values grouped by channel
        self._raw = []           # ... the same memory, as _raw() gives it

    def _counts_of(self, n):
        """The counts array of ``n`` consumers."""
        if len(self._counts) != n:
            self._counts = np.empty(n, dtype=np.int64)
        return self._counts

    def _order_of(self, rows):
        """The order array of a batch of ``rows`` rows."""
        if len(self._order) < rows:
            self._order = np.empty(rows, dtype=np.int32 if rows < 1 << 31 else np.int64)
        return self._order[:rows]

    def split(self, dest, n):
        """``(consumer, rows)`` for each consumer with rows, in consumer
        order (``dest``: each row's consumer among ``n``; None: all to
        consumer 0); ``rows`` is None when the whole batch goes to one."""
        if dest is None:
            yield 0, None
            return
        rows = len(dest)
        order, counts = self._order_of(rows), self._counts_of(n)
        order_by_channel(dest, order, counts)
        if counts.max() == rows:
            yield int(dest[0]), None
            return
        for j, start, c in _runs(counts):
            yield j, order[start:start + c]

    def batch(self, batch, dest, n):
        """``(consumer, RecordBatch)`` for each consumer with rows."""
        from pyarrow.compute import take

        for j, rows in self.split(dest, n):
            # order holds each row once, in range: no bounds check
            yield j, batch if rows is None else take(batch, rows, boundscheck=False)

    def arrays(self, arrays, dest, n):
        """The same for 1-D numpy arrays of equal length: ``(consumer,
        arrays)``, every piece gathered in one call into arrays that the
        next batch reuses (arrays of Python objects taken piece by piece)."""
        if dest is None:
            yield 0, arrays
            return
        if any(v.dtype.hasobject for v in arrays):
            yield from self._take(arrays, dest, n)
            return
        rows = len(dest)
        counts = self._counts_of(n)
        out, raw = self._arrays(arrays, rows)
        _gather_by_channel(dest, [_raw(v) for v in arrays], [r[:rows] for r in raw],
                           None, counts)
        if counts.max() == rows:
            yield int(dest[0]), arrays
            return
        for j, start, c in _runs(counts):
            yield j, [o[start:start + c] for o in out]

    def _take(self, arrays, dest, n):
        for j, rows in self.split(dest, n):
            if rows is None:
                yield j, arrays
                continue
            # order holds each row once, in range: clip checks nothing
            yield j, [np.take(v, rows, mode="clip") for v in arrays]

    def _arrays(self, arrays, rows):
        if (len(self._out) != len(arrays) or len(self._out[0]) < rows
                or any(o.dtype != v.dtype for o, v in zip(self._out, arrays))):
            self._out = [np.empty(rows, dtype=v.dtype) for v in arrays]
            self._raw = [_raw(o) for o in self._out]
        return self._out, self._raw


class _Router:
    """The RecordWriter's selector: the channel the batch writer chose for
    the piece it emits."""

    __slots__ = ("channel",)

    def __init__(self):
        self.channel = 0

    def __call__(self, record, num_channels):
        return self.channel


def _is_record_batch(batch):
    return type(batch).__name__ == "RecordBatch" and \
        type(batch).__module__.split(".")[0] == "pyarrow"


def _whole_batch_selector(selector):
    """``selector`` (a name or one of the whole-batch selectors), checked."""
    if isinstance(selector, str):
        if selector.replace("-", "_") in _WHOLE_BATCH_NAMES:
            return selector
        raise ValueError(f"selector {selector!r} does not route whole batches: one of "
                         f"{', '.join(_WHOLE_BATCH_NAMES)} (rows by key: key=COLUMN)")
    if isinstance(selector, _WHOLE_BATCH_TYPES):
        return selector
    raise TypeError(f"selector must route whole batches (RoundRobinSelector, RescaleSelector, "
                    f"BroadcastSelector, ForwardSelector or one of their names; rows by key: "
                    f"key=COLUMN), got {type(selector).__name__}")


class BatchWriter:
    """Writes column batches into the subpartitions of a
    :class:`ResultPartition`, one piece of each batch per consumer.

    ``emit(batch)`` takes a ``pyarrow.RecordBatch`` or a mapping of column
    name -> equal-length one-dimensional numpy array (every batch of a
    writer of one kind).  With ``key`` (a column name) every row goes to
    the channel that :class:`HashSelector` gives its key (Flink's key
    groups, ``max_parallelism`` of them, by default
    :func:`default_max_parallelism` of the number of channels): integer,
    float, boolean, string and bytes keys, a null key (``None``) where the
    hash selector sends ``None``.  Each consumer gets one piece per batch
    that has rows for it, its rows in input order; an empty piece is not
    sent.  Without a key, ``selector`` routes whole batches: round robin
    (``"round_robin"``, ``"rebalance"``), ``"rescale"``, ``"broadcast"``,
    ``"forward"`` or such a selector object.

    A piece travels as one record of the ``arrow`` codec, written through a
    :class:`RecordWriter` (:attr:`record_writer`): it spans as many buffers
    as it takes, and a writer waiting for a buffer is backpressured exactly
    as a record writer.  A consumer reads pieces with an input gate of
    ``codec="arrow"``, which yields each as a batch of the kind written,
    whose arrays share the received record's memory; the gate's
    ``max_record_size`` bounds a piece (its rows' values, plus a header of
    the schema, about 100 bytes a column): a larger one fails the consumer
    with :class:`~flinkbuf.errors.CorruptRecordError`, so slice batches
    that could exceed it.  A numpy column travels as its raw values (an
    object column as a list of typed-codec values); an Arrow batch whose
    columns are all of a fixed width (numbers, dates, times, timestamps)
    and without nulls as its columns' values, any other as an Arrow IPC
    message (dictionary-encoded columns are refused).

    One thread at a time emits (RuntimeError otherwise); ``fail()`` may
    come from any thread.  ``close()`` ends every subpartition,
    ``fail(exc)`` makes consumers raise; as a context manager it closes on
    success and fails on an exception.  The first batch with rows is handed
    to its consumers at once; later ones fill buffers, and a partly filled
    buffer waits at most ``buffer_timeout`` (as for :class:`RecordWriter`,
    with ``name``).
    """

    def __init__(self, partition, key=None, *, selector=None, max_parallelism=None, name=None,
                 buffer_timeout=0.1):
        if key is not None and not isinstance(key, str):
            raise TypeError(f"key must be a column name (str) or None, got {type(key).__name__}")
        if key is not None and selector is not None:
            raise ValueError("give key (rows routed by key) or selector (whole batches), "
                             "not both")
        if key is None and selector is None:
            raise ValueError("a BatchWriter needs key=COLUMN (rows routed by key) or "
                             "selector= (whole batches: round robin, rescale, broadcast, "
                             "forward)")
        if not isinstance(partition, ResultPartition):
            raise TypeError(f"partition must be a ResultPartition, got "
                            f"{type(partition).__name__}")
        n = partition.num_subpartitions
        if max_parallelism is None:
            from flinkbuf.io import default_max_parallelism

            max_parallelism = default_max_parallelism(max(n, 1))
        else:
            check_int(max_parallelism, "max_parallelism", max(n, 1), 32768)
        self._router = _Router()
        self._writer = RecordWriter(
            partition,
            _whole_batch_selector(selector) if key is None else CustomSelector(self._router),
            codec="arrow", buffer_timeout=buffer_timeout, name=name)
        self._key = key
        self._max_parallelism = max_parallelism
        self._n = n
        self._dtype = partition_dtype(n)
        self._kind = None
        self._cut = _Cut()
        self._layout = None
        self._lock = threading.Lock()
        self._rows_out = 0

    # ---- writing ------------------------------------------------------------

    def emit(self, batch):
        """Write ``batch``'s rows: with a key, each consumer its piece, else
        the whole batch to the channel(s) the selector picks.  An empty batch
        writes nothing.  Blocks while no buffer is free."""
        arrow = _is_record_batch(batch)
        if not arrow and not isinstance(batch, Mapping):
            raise TypeError(f"a batch is a pyarrow.RecordBatch or a mapping of column name -> "
                            f"numpy array, got {type(batch).__name__}")
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(f"BatchWriter {self.name!r} is in use by another thread: a "
                               f"writer serves one thread at a time")
        try:
            kind = "pyarrow.RecordBatch" if arrow else "mapping of numpy arrays"
            if self._kind is not None and kind != self._kind:
                raise TypeError(f"this writer writes batches of one kind: a {kind} after "
                                f"a {self._kind}")
            rows = self._emit_arrow(batch) if arrow else self._emit_numpy(batch)
            self._kind = kind
            if rows and not self._rows_out:
                # The first rows go out at once, not after buffer_timeout:
                # consumers start as soon as the first batch is cut.
                self._writer.flush()
            self._rows_out += rows
        finally:
            self._lock.release()

    def _emit_arrow(self, batch):
        rows = batch.num_rows
        if rows == 0:
            return 0
        emit, router = self._writer.emit, self._router
        if self._key is None:
            emit(batch)
            return rows
        index = batch.schema.get_field_index(self._key)
        if index < 0:
            raise ValueError(f"key {self._key!r} names no single column of the batches to "
                             f"exchange ({', '.join(batch.schema.names)})")
        keys = batch.column(index)
        check_key_type(self._key, keys)
        dest = None if self._n == 1 else partitions(keys, self._n, self._max_parallelism,
                                                    self._dtype)
        ipc, types = schema_values(batch.schema)
        views = None if types is None else value_views(batch, types)
        if views is None:
            for j, piece in self._cut.batch(batch, dest, self._n):
                router.channel = j
                emit(piece)
            return rows
        for j, arrays in self._cut.arrays(views, dest, self._n):
            router.channel = j
            # each piece is copied into the buffers here, before the next
            # is gathered into the same arrays
            emit(ArrowValues(ipc, len(arrays[0]), arrays))
        return rows

    def _emit_numpy(self, batch):
        names, arrays, rows = check_columns(batch)
        if rows == 0:
            return 0
        if self._key is None:
            self._writer.emit(dict(zip(names, arrays)))
            return rows
        if self._key not in batch:
            raise ValueError(f"key {self._key!r} names no single column of the batches to "
                             f"exchange ({', '.join(names)})")
        keys = batch[self._key]
        check_key_type(self._key, keys)
        try:
            dest = None if self._n == 1 else partitions(keys, self._n, self._max_parallelism,
                                                        self._dtype)
        except TypeError as exc:
            raise TypeError(f"key column {self._key!r}: {exc}") from exc
        emit, router = self._writer.emit, self._router
        layout = self._layout_of(names, arrays)
        for j, piece in self._cut.arrays(arrays, dest, self._n):
            router.channel = j
            emit(dict(zip(names, piece)) if layout is None else
                 NumpyValues(layout, len(piece[0]), piece))
        return rows

    def _layout_of(self, names, arrays):
        """The :class:`NumpyLayout` of these columns (the last batch's
        while names and dtypes stay), or None with a column of objects."""
        layout = self._layout
        if (layout is None or len(layout.names) != len(names)
                or any(a != b for a, b in zip(layout.names, names))
                or any(a.dtype != d for a, d in zip(arrays, layout.dtypes))):
            if any(a.dtype.hasobject for a in arrays):
                return None
            layout = self._layout = NumpyLayout(names, [a.dtype for a in arrays])
        return layout

    def flush(self):
        """Hand every partly filled buffer to its subpartition now."""
        self._writer.flush()

    def close(self):
        """Flush and end every subpartition (EndOfPartition)."""
        self._writer.close()

    def fail(self, exc=None):
        """Drop what is buffered and fail the partition: consumers raise
        :class:`ProducerFailedError` from ``exc``.  From any thread."""
        self._writer.fail(exc)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return self._writer.__exit__(exc_type, exc, tb)      # close, or fail with exc

    # ---- introspection ------------------------------------------------------

    @property
    def record_writer(self):
        """The :class:`RecordWriter` that writes the pieces (its metrics
        count pieces as records)."""
        return self._writer

    @property
    def key(self):
        return self._key

    @property
    def max_parallelism(self):
        return self._max_parallelism

    @property
    def num_channels(self):
        return self._n

    @property
    def name(self):
        return self._writer.name

    @property
    def is_closed(self):
        return self._writer.is_closed

    @property
    def num_rows_out(self):
        """Rows of the batches written (each counted once, also when
        broadcast)."""
        return self._rows_out

    @property
    def num_pieces_out(self):
        """Pieces written (records of the record writer)."""
        return self._writer.num_records_out

    @property
    def num_bytes_out(self):
        return self._writer.num_bytes_out

    @property
    def back_pressured_time_ns(self):
        """Total time blocked on output (see :class:`RecordWriter`)."""
        return self._writer.back_pressured_time_ns

    def __repr__(self):
        route = f"key={self._key!r}" if self._key is not None else \
            f"selector={type(self._writer.selector).__name__}"
        state = "closed" if self.is_closed else "open"
        return f"<flinkbuf.BatchWriter name={self.name!r} channels={self._n} {route} {state}>"
