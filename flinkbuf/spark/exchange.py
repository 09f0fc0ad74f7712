"""Pipelined, backpressured exchange between the tasks of one PySpark barrier
stage (:func:`pipelined_exchange`).

Every task of ``rdd.barrier().mapPartitions(...)`` is both a producer and a
consumer.  It starts a :class:`~flinkbuf.network.NetworkEnvironment` on its
executor's address, registers a :class:`~flinkbuf.ResultPartition` with one
subpartition per task, and registers its address with the exchange's
rendezvous on the driver (which answers with every task's address once all
have registered; ``rendezvous="barrier"`` uses
``BarrierTaskContext.allGather`` instead).  Then a producer thread writes the task's
input partition through a :class:`~flinkbuf.RecordWriter` (its selector
picks the consumer of each record) while the task's own thread reads its
:class:`~flinkbuf.InputGate` (one channel from every task, its own one
local) and yields ``fn``'s output.  Records reach the consumer while they
are still being produced; each task's memory is bounded by its buffer
pools; a slow consumer stops granting credit, which blocks its producers'
buffer requests instead of growing a shuffle.  End of data travels in-band
(EndOfPartition on every channel); each task keeps its server up until
its peers have taken all their subpartitions.
"""

from flinkbuf.spark import _rendezvous, live
from flinkbuf.spark._prepare import prepare
from flinkbuf.spark._session import ClassicSession, is_connect
from flinkbuf.spark._spec import RENDEZVOUS, SELECTORS, check_options
from flinkbuf.spark._task import ExchangeTask, current_task, run_task

__all__ = ["ExchangeTask", "RENDEZVOUS", "SELECTORS", "close_rendezvous", "current_task",
           "pipelined_exchange"]


def close_rendezvous():
    """Close every exchange rendezvous this driver still serves (each
    closes by itself once nothing references its exchange's result any
    more, and at exit).  A job over an exchange whose rendezvous is closed
    fails in its tasks; create the exchange again to run it."""
    _rendezvous.close_all()


def pipelined_exchange(rdd, fn=None, *, num_partitions=None, key=None, selector="hash",
                       codec="typed", segment_size=32768, buffers_per_channel=2,
                       floating_buffers=8, buffer_timeout=0.1, max_record_size=64 << 20,
                       max_parallelism=None, host=None, timeout=60.0, monitor=None,
                       rendezvous="driver", encryption=None, advertise=None, task_port=0,
                       rendezvous_port=0, port_retries=None, connect_timeout=10.0,
                       live_view=None, buffer_debloat=None, buffer_debloat_target=None,
                       buffer_debloat_period=None, buffer_debloat_samples=None,
                       buffer_debloat_threshold=None, buffer_debloat_min_size=None):
    """Exchange the records of ``rdd`` between the tasks of one barrier
    stage and return the RDD of ``fn``'s output: partition ``j`` of the
    result is ``fn(iterator of the records routed to j)``, as
    ``rdd.partitionBy(n, ...).mapPartitions(fn)`` gives, but pipelined:
    records reach their consumer while they are being produced, through
    flinkbuf's buffers over authenticated connections with credit-based
    flow control, and a slow consumer slows its producers down.

    The stage runs one task per partition of ``rdd`` (``num_partitions``, if
    given, must be that number: Spark allows no coalesce or union inside a
    barrier stage, so repartition first), and needs a slot for every task
    at once: this call checks that the master has them (waiting up to
    ``timeout`` for executors to register on a cluster master) and raises
    :class:`~flinkbuf.errors.InsufficientSlotsError` saying what to set
    otherwise, instead of letting Spark retry its own check for minutes.
    Each task writes its input partition and reads partition ``index``;
    records of one producer to one consumer keep their order.

    selector: ``"hash"`` (by ``key``, Flink's key groups, as
    :class:`~flinkbuf.HashSelector`: every record of a key reaches one
    partition, :func:`flinkbuf.io.assign_key_to_operator` says which),
    ``"round_robin"`` or ``"rebalance"`` (both Flink's rebalance: round
    robin), ``"backlog_aware"`` (round robin that steers around a consumer
    whose backlog is full, :class:`~flinkbuf.BacklogAwareRebalanceSelector`)
    or ``"broadcast"`` (every record to every partition), ``"-"`` for
    ``"_"`` too; or a callable ``fn(record, num_partitions) -> int``.
    key: for ``"hash"``, an int (the field at that index of each record, a
    tuple or a list; a record without it fails the task with an
    IndexError naming the key and the record's length) or a callable
    ``record -> key``; None (the default) keys a tuple or list record by
    its first field, as for a pair RDD, and any other record (a str, an
    int) by the whole record.  Keys are hashed as Java's ``hashCode()``
    (str, int, float, bytes, tuples of them), never with Python's salted
    ``hash()``.
    codec: ``"typed"`` (records are None, bool, int, float, str, bytes,
    tuples, lists, dicts, numpy arrays), ``"bytes"`` or ``"pickle"``.

    Memory: each task has ``num_tasks * buffers_per_channel + 1`` output
    buffers and ``buffers_per_channel`` exclusive buffers per remote input
    channel plus ``floating_buffers`` of ``segment_size`` bytes.
    ``buffer_timeout``: seconds a partly filled buffer may wait before it
    is sent (Flink's buffer timeout; None: only full buffers).

    Every wait is bounded, each by a bound of its own, all derived from two
    options: connecting to a peer or to the rendezvous (the handshake and
    the rendezvous's acknowledgement included) lasts at most
    ``connect_timeout`` seconds; each of the others at most ``timeout``
    seconds: a peer's partition request waiting for the partition
    (request), a stalled frame and, at a task's end, its producer and its
    peers taking nothing more of its output (I/O), the wait on the driver
    for a cluster's slots (slots), and a task's wait for every task's
    address (rendezvous).  A peer that dies fails its connection at once,
    and a task that raises (in its input or in ``fn``) fails its
    partition, so its peers raise :class:`~flinkbuf.ProducerFailedError`
    carrying its error.
    An error about a connection names the task at the other end and which
    way it failed (connecting to it, or reading from it).  Each task leaves
    no thread, socket or buffer behind.  Spark aborts the job when the
    exchange is its last stage, and retries the whole stage when it feeds
    a shuffle; a retried attempt needs all of its slots at once, and
    Spark would wait for them forever after a host is lost: the driver
    cancels an attempt of the exchange's stage (and its job, with a
    message saying so) that has had fewer slots than tasks for
    ``timeout`` seconds, and one whose slots come back in time runs (with
    the driver's rendezvous only).

    rendezvous: how the tasks learn each other's addresses.  ``"driver"``
    (the default): this call starts a small server on the driver (a
    thread on ``spark.driver.host``, at ``rendezvous_port``) that each task
    registers with, authenticated with the exchange's secret; it answers
    each task as soon as all the tasks of its stage attempt have
    registered (a retried stage registers afresh; a task of an older
    attempt is refused).  It serves as long as the returned RDD, or an RDD
    made from it without a shuffle, is referenced on the driver; after that
    it serves on until no task has registered for ``timeout`` seconds
    (enough for a job that is running, or about to run, over an RDD made
    from the result across a shuffle: keep the result referenced to run
    such a job later), and closes, its thread and port with it.  The
    interpreter's exit and :func:`close_rendezvous` close it at once.
    ``"barrier"``: Spark's ``BarrierTaskContext.allGather``, which needs
    no server on the driver but waits up to Spark's
    ``spark.barrier.sync.timeout`` and is answered on a one-second poll
    (it delays the start of the data by up to a second).

    host: the address each task's server binds to; by default an address
    of the task's own host: ``SPARK_LOCAL_IP`` where the executor's host
    sets it (as Spark's own services there bind it), else the executor's
    address as the driver saw it if it is one of the host's (behind a NAT
    or with several interfaces it is not), else the address the host
    reaches the driver from.  ``"0.0.0.0"`` binds every interface.
    advertise: the host the tasks' peers dial, if not the bound one (a
    task bound to every interface advertises its own host's address, never
    ``0.0.0.0``): a str for every task, or a dict from a host's own address
    to the address its tasks advertise (a host behind a NAT that forwards
    the task ports).  Each peer is also identified by its task attempt,
    checked in the handshake both ways, so that two tasks that share an
    address (the same port on two hosts behind one advertised address)
    are never taken for one another.
    task_port: the port each task's server binds (0: any free port); a task
    that finds it taken takes the next free one, up to ``port_retries``
    more, so ``task_port`` to ``task_port + port_retries`` is the range to
    open in a firewall between the executors (as for Spark's
    ``spark.blockManager.port``).  rendezvous_port: the same for the
    driver's rendezvous (0: any free port; the executors must be able to
    connect to it, as to ``spark.driver.port``).  port_retries: None (the
    default) takes the session's ``spark.port.maxRetries`` (16 by
    default).  The exchange's secret is made here, on the driver, for this
    exchange only, and travels to the tasks inside the stage's closure.
    encryption: whether the connections between tasks are sealed
    (authenticated encryption, as :class:`~flinkbuf.network.NetworkEnvironment`
    says).  None (the default): sealed when the Spark session encrypts its
    own traffic (``spark.network.crypto.enabled`` or ``spark.ssl.enabled``),
    else sealed between tasks on different hosts only; True: every
    connection; False: none.
    monitor: a picklable callable run in each task with its
    :class:`ExchangeTask` once the task is connected to every peer and
    before records flow; it may return a callable that is run when the
    task ends.  (Without one, records flow as soon as a task starts: its
    ``fn`` reads the task's own output at once and each peer's once that
    peer has started.)
    live_view: whether the tasks report their metrics to a live view on
    the driver while they run (a page naming the bottleneck, JSON and
    Prometheus text; :mod:`flinkbuf.spark.live`).  None (the default):
    to the session's view if :func:`~flinkbuf.spark.live_view` started
    one, else not at all (nothing runs for it); False: not at all;
    True: to the session's view, started on loopback and a free port if
    there is none; a port or ``"HOST:PORT"``: the same, started there; a
    :class:`~flinkbuf.spark.LiveView`: to that one.  Its URL is the view's
    ``url`` (``flinkbuf.spark.live_view(spark).url``) and is logged when
    it starts.  (A separate option from ``monitor``, which runs code of
    yours in each task: this one runs none, and costs a report per task
    every half second.)

    buffer_debloat (a bool or a :class:`~flinkbuf.io.BufferDebloatConfig`)
    and the ``buffer_debloat_*`` keywords: buffer debloating in every
    task's input gate (:class:`~flinkbuf.network.NetworkEnvironment` says
    what it does; None everywhere: the tasks' default, which the
    environment variable ``FLINKBUF_NET_BUFFER_DEBLOAT`` sets).

    Executors import flinkbuf: set ``PYSPARK_PYTHON`` to an interpreter
    that has it before the Spark session starts.

    A Spark Connect session has no RDDs: there, :func:`arrow_exchange`
    exchanges a DataFrame's rows (this raises TypeError saying so).
    """
    if is_connect(rdd):
        raise TypeError(f"pipelined_exchange exchanges the records of an RDD, and a Spark "
                        f"Connect session has no RDDs (got a {type(rdd).__name__} of Spark "
                        f"Connect): use flinkbuf.spark.arrow_exchange(df, fn, key, schema), "
                        f"which exchanges a DataFrame's rows by a key column on either kind "
                        f"of session")
    try:
        from pyspark import RDD
    except ImportError as exc:              # pragma: no cover - depends on the install
        raise ImportError("pipelined_exchange needs PySpark: pip install 'flinkbuf[spark]'") \
            from exc
    if not isinstance(rdd, RDD):
        hint = " (for a DataFrame's rows: arrow_exchange)" \
            if type(rdd).__name__ == "DataFrame" else ""
        raise TypeError(f"rdd must be a pyspark RDD, got {type(rdd).__name__}{hint}")
    n = rdd.getNumPartitions()
    options = check_options(n, fn, num_partitions=num_partitions, key=key, selector=selector,
                            codec=codec, segment_size=segment_size,
                            buffers_per_channel=buffers_per_channel,
                            floating_buffers=floating_buffers, buffer_timeout=buffer_timeout,
                            max_record_size=max_record_size, max_parallelism=max_parallelism,
                            host=host, timeout=timeout, monitor=monitor, rendezvous=rendezvous,
                            encryption=encryption, advertise=advertise, task_port=task_port,
                            rendezvous_port=rendezvous_port, port_retries=port_retries,
                            connect_timeout=connect_timeout, buffer_debloat=buffer_debloat,
                            buffer_debloat_target=buffer_debloat_target,
                            buffer_debloat_period=buffer_debloat_period,
                            buffer_debloat_samples=buffer_debloat_samples,
                            buffer_debloat_threshold=buffer_debloat_threshold,
                            buffer_debloat_min_size=buffer_debloat_min_size)
    prepared = prepare(ClassicSession(rdd.context), n, options, live_view,
                       live.exchange_name("pipelined_exchange", rdd, fn))
    spec = prepared.spec

    def task(iterator):
        return run_task(spec, iterator)

    # Every RDD made from the result holds ``task`` (PySpark composes the
    # functions of a pipeline): the rendezvous serves as long as one lives.
    return prepared.launch(lambda: rdd.barrier().mapPartitions(task), owner=task)
