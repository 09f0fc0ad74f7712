"""The executor's side of an exchange: the body of each barrier task
(:func:`run_task`: an environment, a partition, a producer thread and a
gate, as :mod:`flinkbuf.spark.exchange` describes), what it shows of itself
(:class:`ExchangeTask`, :func:`current_task`), and how it ends on every
path (:class:`_TaskRun`).  It runs with the :class:`~flinkbuf.spark._spec.ExchangeSpec`
the driver made; where it listens is :mod:`~flinkbuf.spark._task_environment`,
how it finds and connects its peers :mod:`~flinkbuf.spark._task_peers`.
"""

import threading
import time

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io import (
    BatchWriter,
    CustomSelector,
    HashSelector,
    RecordWriter,
    create_partition,
    monotonic_ns,
    partition_buffers,
)
from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.io.producer import ProducerThread
from flinkbuf.network.addresses import format_address
from flinkbuf.spark import _reports
from flinkbuf.spark._task_environment import peer_id, start_environment, task_addresses
from flinkbuf.spark._task_peers import (
    CONSEQUENCE_DELAY,
    Connector,
    Peers,
    connect_channels,
    expect_peers,
    gather,
    is_consequence,
    register,
    root_error,
)

_JOIN_SLICE = 0.05
_ERROR_GRACE = 2.0     # seconds a failing task waits for its error to reach its peers
# Seconds a failed task waits for its connector thread (blocked in
# allGather, it ends with the stage).
_CONNECTOR_GRACE = 1.0


class ExchangeTask:
    """What one task of an exchange sees of itself, handed to the
    ``monitor`` of :func:`pipelined_exchange` once the task is connected and
    before any record flows.

    ``index`` (the task's partition id, also the output partition it
    consumes), ``num_tasks``, ``address`` (``"host:port"`` its peers read
    from), ``writer`` (its :class:`~flinkbuf.RecordWriter`), ``gate`` (its
    :class:`~flinkbuf.InputGate`), ``partition`` and ``environment``, and
    ``metrics``: a :class:`~flinkbuf.TaskMetrics` over the writer and the
    gate (Flink's task metrics; ``snapshot()`` may be called from any
    thread; the producer side is the thread that writes the task's input,
    idle before it starts and once it is done, the consumer side the
    task's own thread), and ``producer``, that thread (a
    :class:`~flinkbuf.io.producer.ProducerThread`, None until it starts).
    :meth:`stats` sums it up in one dict.
    """

    # Documented, typed and exported by flinkbuf.spark.exchange.
    __module__ = "flinkbuf.spark.exchange"

    def __init__(self, index, num_tasks, address, environment, partition, writer, gate):
        self.index = index
        self.num_tasks = num_tasks
        self.address = address
        self.environment = environment
        self.partition = partition
        self.writer = writer
        self.gate = gate
        self.producer = None
        self._created_ns = monotonic_ns()
        self.metrics = TaskMetrics(f"exchange-{index}", writers=[writer], gates=[gate],
                                   window=1.0, producer_idle=self._producer_idle_ns)
        self.started = time.monotonic()
        self.first_record_seconds = None

    def _producer_idle_ns(self):
        """Nanoseconds the producer had nothing to write: before it started
        and since it is done."""
        now = monotonic_ns()
        producer = self.producer
        started = None if producer is None else producer.started_ns
        if started is None:
            return now - self._created_ns
        ended = producer.ended_ns
        return (started - self._created_ns) + (now - ended if ended is not None else 0)

    def stats(self):
        """Totals so far: records and bytes out and in, back-pressured and
        idle seconds, the output pool's buffers in use and its size, the
        seconds from the start of data exchange to the first record read."""
        pool = self.partition.pool
        return {
            "task": self.index,
            "records_out": self.writer.num_records_out,
            "bytes_out": self.writer.num_bytes_out,
            "records_in": self.gate.num_records_in,
            "bytes_in": self.gate.num_bytes_in,
            "back_pressured_seconds": self.writer.back_pressured_time_ns / 1e9,
            "idle_seconds": self.gate.idle_time_ns / 1e9,
            "out_pool_in_use": pool.num_requested - pool.num_available,
            "out_pool_size": pool.num_buffers,
            "first_record_seconds": self.first_record_seconds,
        }


_CURRENT = threading.local()


def current_task():
    """The :class:`ExchangeTask` of the exchange whose ``fn`` is running in
    this thread (read its ``metrics`` or :meth:`~ExchangeTask.stats` from
    ``fn``), or None outside one."""
    return getattr(_CURRENT, "task", None)


current_task.__module__ = "flinkbuf.spark.exchange"


def make_selector(selector, key, max_parallelism):
    """The channel selector a task's writer uses (made inside the task:
    selectors are extension types that do not travel in closures): a
    function's CustomSelector, the hash selector by ``key``, or the
    RecordWriter's selector of that name."""
    if callable(selector):
        fn = selector
        return CustomSelector(lambda record, n: fn(record, n))
    if selector == "hash":
        if key is None:
            return HashSelector.by_first_field(max_parallelism=max_parallelism)
        return HashSelector(key, max_parallelism=max_parallelism)
    return selector


def gate_records(task):
    """The gate's records (no events: the exchange sends none of its own)."""
    gate = task.gate
    first = True
    for record in gate:
        if first:
            task.first_record_seconds = time.monotonic() - task.started
            first = False
        yield record


def run_task(spec, iterator):
    """The body of each barrier task: a generator of ``fn``'s output.

    Without a ``monitor`` (which runs once the task is connected), records
    flow before the peers are known: the producer starts and the gate reads
    the task's own output at once, while a thread learns the peers'
    addresses and connects the gate's other channels (a task that Spark
    starts early does not wait for the last one to start)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    if ctx is None:
        raise RuntimeError("pipelined_exchange's tasks must run in a barrier stage")
    run = _TaskRun(spec, ctx)
    fn = spec.options.fn
    try:
        task = run.connect()
        run.start_producer(task, iterator)
        records = (spec.options.read or gate_records)(task)
        _CURRENT.task = task
        try:
            for out in (fn(records) if fn is not None else records):
                yield out
            for _ in records:          # fn stopped early: the rest is still read
                pass
        except BaseException as exc:
            error, cause = run.reported(exc)
            if error is exc:
                raise
            raise error from cause
        run.finish()
    except BaseException as exc:
        run.failed = exc
        run.hold_back(exc)
        raise
    finally:
        _CURRENT.task = None
        run.close()


class _TaskRun:
    """One run of an exchange's task in its Python worker: its environment
    (started when made), and what it opens after, each closed on every
    path (:meth:`close`)."""

    def __init__(self, spec, ctx):
        self.spec, self.ctx = spec, ctx
        self.index = ctx.partitionId()
        self.n = len(ctx.getTaskInfos())
        self.tid = ctx.taskAttemptId()
        bind, advertised = task_addresses(ctx, self.index, spec)
        self.out_buffers = partition_buffers(self.n, spec.options.buffers_per_channel)
        self.env = start_environment(spec, self.n, bind, advertised, peer_id(self.tid),
                                     self.out_buffers)
        self.partition = self.writer = self.batch_writer = self.gate = self.producer = None
        self.connector = self.peers = self.reports = self.done = None
        self.failed = None

    def connect(self):
        """The task's partition (registered), writer and gate, its reports
        to a live view started and its monitor run: its ExchangeTask.
        Without a monitor, the gate's channels to peers are connected by a
        :class:`Connector` thread while records flow; with one, before."""
        spec, options, env, index, n = self.spec, self.spec.options, self.env, self.index, self.n
        self.partition = create_partition(env.network_buffer_pool, n,
                                          min_buffers=self.out_buffers,
                                          name=f"{spec.exchange_id}-{index}",
                                          buffer_debloat=env.config.buffer_debloat)
        env.register_partition(spec.exchange_id, self.partition)
        published = format_address(env.advertised_address)
        if options.codec == "arrow":           # column batches, routed by a key column
            self.batch_writer = BatchWriter(
                self.partition, options.key, max_parallelism=options.max_parallelism,
                buffer_timeout=options.buffer_timeout, name=f"exchange-{index}")
            self.writer = self.batch_writer.record_writer
        else:
            self.writer = RecordWriter(
                self.partition,
                make_selector(options.selector, options.key, options.max_parallelism),
                codec=options.codec, buffer_timeout=options.buffer_timeout,
                name=f"exchange-{index}")
        gate_options = {"codec": options.codec, "max_record_size": options.max_record_size,
                        "name": f"exchange-{index}"}
        # The peers' channels start unknown: connected one by one, so that
        # an error connecting names the peer dialed.
        self.gate = env.create_input_gate(
            [(published if i == index else None, spec.exchange_id, index) for i in range(n)],
            **gate_options)
        if options.monitor is None:
            # Registered before any record flows (only the answer is awaited
            # in the thread): a task that fails on its input is known to
            # its stage attempt, whose retry's tasks then start a new one.
            registration = None if spec.rendezvous is None else register(spec, self.ctx,
                                                                         self.tid, published)
            self.connector = Connector(spec, self.ctx, env, self.gate, self.tid, published,
                                       registration)
            self.connector.start()
        else:
            addresses, tids = gather(spec, self.ctx, index, n, self.tid, published)
            self.peers = Peers(index, addresses)
            expect_peers(env, index, addresses, tids)
            connect_channels(env, self.gate, self.peers, spec.timeouts.connect)
        task = ExchangeTask(index, n, published, env, self.partition, self.writer, self.gate)
        if spec.live is not None:
            self.reports = spec.live.start(task, self.ctx)
        if options.monitor is not None:
            self.done = options.monitor(task)
        return task

    def start_producer(self, task, iterator):
        """The thread that writes the task's input (``iterator``)."""
        produce, batches = self.spec.options.produce, self.batch_writer
        if batches is not None:                 # it writes through the batch writer
            def produce(writer, source, produce=produce):
                produce(batches, source)
        self.producer = ProducerThread(self.writer, iterator, produce=produce,
                                       name=f"flinkbuf-exchange-producer-{self.index}")
        task.producer = self.producer
        task.started = time.monotonic()
        self.producer.start()

    def known_peers(self):
        """The peers' addresses once known (:class:`Peers`), else None."""
        return self.connector.peers if self.connector is not None else self.peers

    def reported(self, exc):
        """``(error, cause)``: what the task raises for ``exc``, raised
        while it read its records: its own error before one that only
        says a peer went away (:func:`root_error`), one about a connection
        with the peer named (caused by the error as it came)."""
        error = root_error(exc, self.producer.error)
        peers = self.known_peers()
        if (isinstance(error, RemoteConnectionError) and peers is not None
                and (self.connector is None or error is not self.connector.error)):
            named = peers.named(error)
            if named is not None:
                return named, error
        return error, None

    def finish(self):
        """Every record read: wait for the producer and for the peers to
        take the rest of the task's output."""
        io = self.spec.timeouts.io
        _join(self.producer, io)
        if self.producer.error is not None:
            raise root_error(None, self.producer.error)
        self.gate.close()
        _wait_until_served(self.partition, io)

    def hold_back(self, exc):
        """The task fails with ``exc``: if it only says that a peer went
        away, whenever it came (connecting, reading, writing), wait a
        moment, so that Spark hears of the peer's own failure, the cause,
        before this one."""
        if self.known_peers() is not None and is_consequence(exc):
            time.sleep(min(self.spec.timeouts.io, CONSEQUENCE_DELAY))

    def close(self):
        """Leave nothing behind (the task ended, or failed with
        ``failed``): the reports stopped, the connector ended, and what
        :meth:`_release` closes; then the monitor's end is run."""
        failed = self.failed
        _reports.stop(self.reports, failed)
        if self.connector is not None and failed is not None:
            self.connector.cancel()
        self._release(failed)
        if self.connector is not None:
            self.connector.join(_CONNECTOR_GRACE if failed is not None
                                else self.spec.timeouts.rendezvous)
        if self.done is not None:
            self.done()

    def _release(self, failed):
        """On a failure the partition fails (peers raise the error) and the
        producer is aborted; the gate and the environment close (its
        threads and sockets end)."""
        partition, writer, timeout = self.partition, self.writer, self.spec.timeouts.io
        if failed is not None:
            cause = failed if isinstance(failed, Exception) else None
            try:
                if writer is not None:
                    writer.fail(cause)
                elif partition is not None:
                    partition.fail(cause)
            except Exception:         # noqa: BLE001
                pass
        if self.gate is not None:
            self.gate.close()
        if self.producer is not None and self.producer.is_alive():
            try:
                _join(self.producer, timeout)
            except TimeoutError:
                pass                   # it is a daemon thread: blocked in the input
        if failed is not None and partition is not None:
            # The failure travels to the peers as an error frame on each channel
            # they read from us; the partition is consumed once each of them is
            # on its way.  Closing the connections before that would show them
            # a dropped connection instead of the error.
            partition.wait_consumed(min(timeout, _ERROR_GRACE))
        self.env.close()


def _wait_until_served(partition, timeout):
    """Wait until every peer has taken its subpartition to its end (or
    released it), EndOfPartition included: a peer keeps what it received
    when the connection closes.  A slow peer may take its time: this fails
    only after ``timeout`` seconds in which no peer took anything.
    (Cheaper than a last ``barrier()``, which Spark answers on a 1 s poll.)"""
    if not partition.wait_consumed(timeout, reset_on_progress=True):
        raise TimeoutError(f"the peers took nothing more of this task's output for "
                           f"{timeout:g} s")


def _join(thread, timeout):
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the producer thread of the exchange did not end within "
                               f"{timeout:g} s")
        thread.join(_JOIN_SLICE)
