"""The pipelined exchange for DataFrames: Arrow RecordBatches between the
tasks of ``df.mapInArrow(..., barrier=True)`` (:func:`arrow_exchange`).

Each task writes its input batches through a :class:`flinkbuf.io.BatchWriter`
keyed by the key column (a vectorized hash in C: Flink's key groups, the
partition :func:`key_partitions` and :func:`flinkbuf.io.assign_key_to_operator`
give the key), which sends each consumer its piece of every batch as one
record of the ``arrow`` codec; the task's input gate (``codec="arrow"``)
rebuilds each piece as a RecordBatch over the received record's memory.
"""

from flinkbuf.checks import check_int
from flinkbuf.io import default_max_parallelism, partition_buffers, task_segments
from flinkbuf.io.batch_keys import is_key_type, key_partitions, key_type_error
from flinkbuf.spark import live
from flinkbuf.spark._dataframe import exchange_input
from flinkbuf.spark._prepare import prepare
from flinkbuf.spark._spec import check_buffers, check_options
from flinkbuf.spark._task import run_task

__all__ = ["arrow_exchange", "default_segment_size", "key_partitions"]

# The default network buffer size: the largest of these whose task buffers
# stay within the budget (a piece of a batch fills many buffers: larger ones
# mean fewer handoffs between the task's threads).
_SEGMENT_SIZE_MAX = 256 << 10
_SEGMENT_SIZE_MIN = 32 << 10
_TASK_BUFFERS_BUDGET = 8 << 20
# Spark's types of the key columns arrow_exchange hashes (as Java would).
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


def _route(map_input=None):
    """The producer: every input batch (or every batch ``map_input`` makes
    of them) through the task's :class:`~flinkbuf.io.BatchWriter`, which
    sends each consumer its piece."""

    def produce(writer, batches):
        if map_input is not None:
            batches = map_input(batches)
        emit = writer.emit
        for batch in batches:
            emit(batch)
    return produce


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
    :func:`key_partitions`; null keys where the hash selector sends
    ``None``) by a :class:`~flinkbuf.io.BatchWriter`, one record per piece
    of an input batch (so ``max_record_size`` must hold the largest piece),
    and read in place from the received record.
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
    options = check_options(n, fn, num_partitions=None, key=key, selector="hash",
                            codec="arrow", segment_size=segment_size,
                            buffers_per_channel=buffers_per_channel,
                            floating_buffers=floating_buffers, buffer_timeout=buffer_timeout,
                            max_record_size=max_record_size, max_parallelism=max_parallelism,
                            host=host, timeout=timeout, monitor=monitor, rendezvous=rendezvous,
                            encryption=encryption,
                            produce=_route(map_input), advertise=advertise, task_port=task_port,
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
    from pyspark.sql.pandas.types import to_arrow_type

    data_type = df.schema[key].dataType
    try:
        arrow_type = to_arrow_type(data_type)
    except Exception:                # noqa: BLE001 - a type Arrow cannot carry
        arrow_type = None
    if arrow_type is None or not is_key_type(arrow_type):
        raise key_type_error(key, data_type.simpleString())

