"""What both exchanges of this package run (:func:`~flinkbuf.spark.pipelined_exchange`
over an RDD, :func:`~flinkbuf.spark.arrow_exchange` over a DataFrame): on the
driver, the checks of the arguments and the spec they make
(:func:`make_spec`), the check of the slots (:func:`check_slots`) and the
rendezvous (:func:`start_rendezvous`, :func:`serve_while`); in each barrier
task, its body (:func:`run_task`: an environment, a partition, a producer
thread and a gate, as :mod:`flinkbuf.spark.exchange` describes).
"""

import errno
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
import weakref

from flinkbuf.checks import check_choice, check_int, check_seconds
from flinkbuf.errors import (
    AuthenticationError,
    InsufficientSlotsError,
    PartitionReleasedError,
    ProducerFailedError,
    RemoteConnectionError,
    RemoteError,
)
from flinkbuf.io import (
    CustomSelector,
    HashSelector,
    RecordWriter,
    UnknownInputChannel,
    create_partition,
    default_max_parallelism,
    partition_buffers,
    task_segments,
)
from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.io.producer import ProducerThread, emit_all
from flinkbuf.network import NetworkEnvironment, format_address
# The hosts that name every interface: never an address a peer can dial.
from flinkbuf.network.addresses import is_wildcard
from flinkbuf.serialization import CODECS
from flinkbuf.spark import _rendezvous, _reports

_LOG = logging.getLogger("flinkbuf.spark")

# How the tasks of an exchange learn each other's addresses.
RENDEZVOUS = ("driver", "barrier")

# The selectors by name: what pipelined_exchange accepts besides a callable.
# Each but "hash" is the RecordWriter's selector of that name (Flink's
# meanings: "rebalance" is round robin, as "round_robin"; "backlog_aware"
# is the round robin that steers around a consumer whose backlog is full).
SELECTORS = ("hash", "round_robin", "rebalance", "backlog_aware", "broadcast")
_JOIN_SLICE = 0.05
_ERROR_GRACE = 2.0     # seconds a failing task waits for its error to reach its peers
# Errors that only say a peer went away, and how long a task that sees one
# waits before it fails (the peer's own failure, the cause, is reported first).
_CONSEQUENCES = (PartitionReleasedError, RemoteConnectionError)
_CONSEQUENCE_NAMES = frozenset(("PartitionReleasedError", "RemoteConnectionError",
                                "AuthenticationError"))
_CONSEQUENCE_DELAY = 3.0
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
    thread).  :meth:`stats` sums it up in one dict.
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
        self.metrics = TaskMetrics(f"exchange-{index}", writers=[writer], gates=[gate],
                                   window=1.0)
        self.started = time.monotonic()
        self.first_record_seconds = None

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


def _make_selector(selector, key, max_parallelism):
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


def _is_own_address(host):
    """Whether ``host`` is an address of this host (a socket binds it)."""
    if is_wildcard(host):
        return False
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM,
                                   flags=getattr(socket, "AI_NUMERICHOST", 0))
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(sockaddr[:1] + (0,) + tuple(sockaddr[2:]))
            return True
        except OSError:
            continue
    return False


def _source_address(target):
    """The address of this host the kernel sends from to reach ``target``
    (host, port), or None: the address on the route to the driver, which
    executors' peers on the driver's network reach (no packet is sent)."""
    try:
        family = socket.AF_INET6 if ":" in target[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(target)
            host = s.getsockname()[0]
    except (OSError, ValueError, TypeError):
        return None
    return None if is_wildcard(host) else host


def own_host(ctx, index, driver=None):
    """An address of this task's host for its peers, as Spark's own
    services on the executor use: ``SPARK_LOCAL_IP`` (set on the executor's
    host); else the executor's address in the task infos when it is one of
    this host's (it is the address the driver saw the executor's
    connection come from: behind a NAT or with several interfaces, another
    host's); else the address this host reaches the driver (``driver``,
    ``(host, port)``) from; else the address of this host's name."""
    local_ip = os.environ.get("SPARK_LOCAL_IP", "").strip().strip("[]")
    if local_ip and _is_own_address(local_ip):
        return local_ip
    try:
        seen = ctx.getTaskInfos()[index].address.rpartition(":")[0].strip("[]")
    except Exception:       # noqa: BLE001 - fall back below
        seen = ""
    if _is_own_address(seen):
        return seen
    if driver is not None:
        source = _source_address(driver)
        if source is not None:
            return source
    try:
        name = socket.gethostbyname(socket.gethostname())
    except OSError:
        name = ""
    if _is_own_address(name):
        return name
    raise RemoteConnectionError(
        f"task {index} found no address of its own host for its peers to reach it at "
        f"(SPARK_LOCAL_IP is {local_ip or 'not set'}, Spark saw the executor at "
        f"{seen or 'an unknown address'}): set SPARK_LOCAL_IP on the executor's host, or "
        f"host= and advertise=")


def _addresses(ctx, index, spec):
    """``(bind, advertised)``: the host this task's server binds (``host``
    if given, else :func:`own_host`) and the host its peers dial (from
    ``advertise`` if it names one, else the bound host, or the own one
    when the bind is on all interfaces; never a wildcard)."""
    own = None
    bind = spec.host
    if not bind:
        bind = own = own_host(ctx, index, spec.rendezvous)
    advertised = None
    if isinstance(spec.advertise, str):
        advertised = spec.advertise
    elif spec.advertise is not None:
        if own is None:
            own = bind if not is_wildcard(bind) else own_host(ctx, index, spec.rendezvous)
        advertised = spec.advertise.get(own)
    if advertised is None:
        advertised = bind if not is_wildcard(bind) else (
            own or own_host(ctx, index, spec.rendezvous))
    return bind, advertised


def _start_environment(spec, n, bind, advertised, peer_id, out_buffers):
    """The task's NetworkEnvironment, its server on ``bind`` at
    ``task_port`` or, when taken, one of the next ``port_retries`` ports."""
    segments = task_segments([out_buffers], [n - 1],
                             exclusive_buffers_per_channel=spec.buffers_per_channel,
                             floating_buffers_per_gate=spec.floating_buffers)

    def start(port):
        return NetworkEnvironment(
            segments, spec.segment_size, host=bind, port=port, secret=spec.secret,
            exclusive_buffers_per_channel=spec.buffers_per_channel,
            floating_buffers_per_gate=spec.floating_buffers,
            connect_timeout=spec.connect_timeout, request_timeout=spec.timeout,
            io_timeout=spec.timeout, encryption=spec.encryption, advertise=advertised,
            peer_id=peer_id)

    try:
        return _rendezvous.bind_in_range(start, bind, spec.task_port, spec.port_retries or 0,
                                         "the exchange's task server", "task_port")
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise RemoteConnectionError(
                f"the exchange's task server cannot bind {bind} ({exc}): it is not an "
                f"address of this host (host= names the address to bind, advertise= the one "
                f"peers dial)") from None
        raise


def _peer_id(task_attempt_id):
    return f"task attempt {task_attempt_id}"


def _records(task):
    """The gate's records (no events: the exchange sends none of its own)."""
    gate = task.gate
    first = True
    for record in gate:
        if first:
            task.first_record_seconds = time.monotonic() - task.started
            first = False
        yield record


class _Spec:
    """Everything a task needs, made on the driver (picklable)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


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
    index = ctx.partitionId()
    n = len(ctx.getTaskInfos())
    tid = ctx.taskAttemptId()
    bind, advertised = _addresses(ctx, index, spec)
    out_buffers = partition_buffers(n, spec.buffers_per_channel)
    env = _start_environment(spec, n, bind, advertised, _peer_id(tid), out_buffers)
    producer = None
    gate = None
    writer = None
    partition = None
    done = None
    failed = None
    connector = None
    peers = None
    reports = None
    try:
        partition = create_partition(env.network_buffer_pool, n, min_buffers=out_buffers,
                                     name=f"{spec.exchange_id}-{index}")
        env.register_partition(spec.exchange_id, partition)
        published = format_address(env.advertised_address)
        writer = RecordWriter(partition,
                              _make_selector(spec.selector, spec.key, spec.max_parallelism),
                              codec=spec.codec, buffer_timeout=spec.buffer_timeout,
                              name=f"exchange-{index}")
        gate_options = {"codec": spec.codec, "max_record_size": spec.max_record_size,
                        "name": f"exchange-{index}"}
        if spec.monitor is None:
            gate = env.create_input_gate(
                [(published if i == index else None, spec.exchange_id, index)
                 for i in range(n)], **gate_options)
            # Registered before any record flows (only the answer is awaited
            # in the thread): a task that fails on its input is known to
            # its stage attempt, whose retry's tasks then start a new one.
            registration = None if spec.rendezvous is None else _register(spec, ctx, tid,
                                                                           published)
            connector = _Connector(spec, ctx, env, gate, tid, published, registration)
            connector.start()
        else:
            addresses, tids = _gather(spec, ctx, index, n, tid, published)
            peers = _Peers(index, addresses)
            _expect_peers(env, index, addresses, tids)
            try:
                gate = env.create_input_gate(
                    [(addresses[i], spec.exchange_id, index) for i in range(n)],
                    **gate_options)
            except RemoteConnectionError as exc:
                _raise_connecting(peers, exc, spec)
        task = ExchangeTask(index, n, published, env, partition, writer, gate)
        if getattr(spec, "live", None) is not None:     # reports to a live view
            reports = spec.live.start(task, ctx)
        if spec.monitor is not None:
            done = spec.monitor(task)
        producer = ProducerThread(writer, iterator, produce=spec.produce,
                                  name=f"flinkbuf-exchange-producer-{index}")
        task.started = time.monotonic()
        producer.start()
        records = spec.read(task)
        _CURRENT.task = task
        try:
            for out in (spec.fn(records) if spec.fn is not None else records):
                yield out
            for _ in records:          # fn stopped early: the rest is still read
                pass
        except BaseException as exc:
            error = _root_error(exc, producer.error)
            if connector is not None:
                peers = connector.peers
            named = None
            if (isinstance(error, RemoteConnectionError) and peers is not None
                    and (connector is None or error is not connector.error)):
                named = peers.named(error)
            if named is not None:
                raise named from error
            if error is not exc:
                raise error from None
            raise
        _join(producer, spec.timeout)
        if producer.error is not None:
            raise _root_error(None, producer.error)
        gate.close()
        _wait_until_served(partition, spec.timeout)
    except BaseException as exc:
        failed = exc
        if connector is not None:
            peers = connector.peers
        if peers is not None and _is_consequence(exc):
            # It only says that a peer went away, whenever it came (connecting,
            # reading, writing): wait a moment, so that Spark hears of the
            # peer's own failure, the cause, before this one.
            time.sleep(min(spec.timeout, _CONSEQUENCE_DELAY))
        raise
    finally:
        _CURRENT.task = None
        _reports.stop(reports, failed)
        if connector is not None and failed is not None:
            connector.cancel()
        _cleanup(env, partition, writer, gate, producer, failed, spec.timeout)
        if connector is not None:
            connector.join(_CONNECTOR_GRACE if failed is not None else spec.timeout)
        if done is not None:
            done()


def _register(spec, ctx, tid, published):
    """The task's registration at the driver's rendezvous, sent."""
    return _rendezvous.Registration(
        spec.rendezvous, spec.secret, stage=ctx.stageId(), task_attempt_id=tid,
        index=ctx.partitionId(), num_tasks=len(ctx.getTaskInfos()), address=published,
        timeout=spec.timeout, connect_timeout=spec.connect_timeout)


def _gather(spec, ctx, index, n, tid, published, registration=None):
    """Every task's address and task attempt id, by index: from the
    driver's rendezvous (the answer to ``registration`` if it was sent
    already), or through Spark's ``allGather``."""
    if spec.rendezvous is not None:
        if registration is None:
            registration = _register(spec, ctx, tid, published)
        addresses = registration.answer()
        return addresses, addresses.task_attempt_ids
    gathered = ctx.allGather(json.dumps({"index": index, "address": published,
                                         "task_attempt_id": tid}))
    addresses, tids = [None] * n, [None] * n
    for message in gathered:
        entry = json.loads(message)
        addresses[entry["index"]] = entry["address"]
        tids[entry["index"]] = entry["task_attempt_id"]
    return addresses, tids


def _expect_peers(env, index, addresses, tids):
    # Each peer is the task attempt that registered at its address: a
    # connection that reaches another (the same port on another host,
    # one advertised address for two hosts) is refused, both ways.
    env.expect_peers({addresses[i]: _peer_id(tids[i])
                      for i in range(len(addresses)) if i != index})


def _raise_connecting(peers, exc, spec):
    """Raise ``exc``, an error connecting to a peer, with the peer named
    (as it is if its message names none)."""
    named = peers.named(exc, connecting=True, connect_timeout=spec.connect_timeout)
    if named is None:
        raise exc
    raise named from exc


class _Connector(threading.Thread):
    """Connects a task's gate to its peers while records already flow:
    learns every task's address, then puts a channel reading each peer in
    the place of that peer's unknown channel.  On a failure, the channels
    still unknown fail with its error (peers named), which the gate raises
    to the task's reader."""

    def __init__(self, spec, ctx, env, gate, tid, published, registration):
        super().__init__(name=f"flinkbuf-exchange-connect-{ctx.partitionId()}", daemon=True)
        self._spec, self._ctx, self._env, self._gate = spec, ctx, env, gate
        self._tid, self._published = tid, published
        self._registration = registration
        self.peers = None
        self.error = None

    def run(self):
        spec, env, gate = self._spec, self._env, self._gate
        index, n = self._ctx.partitionId(), gate.num_channels
        try:
            addresses, tids = _gather(spec, self._ctx, index, n, self._tid, self._published,
                                      self._registration)
            self.peers = peers = _Peers(index, addresses)
            _expect_peers(env, index, addresses, tids)
            for i, channel in enumerate(gate.channels):
                if i == index:
                    continue
                try:
                    env.update_input_channel(channel, addresses[i])
                except RemoteConnectionError as exc:
                    _raise_connecting(peers, exc, spec)
        except BaseException as exc:     # noqa: BLE001 - the gate raises it to the reader
            self.error = exc
            for channel in gate.channels:
                if isinstance(channel, UnknownInputChannel):
                    channel.fail(exc)

    def cancel(self):
        """The task failed: stop waiting for the rendezvous's answer."""
        if self._registration is not None:
            self._registration.cancel()


class _Peers:
    """The addresses of an exchange's tasks, seen from task ``index``: to
    name the peer and the direction in an error about a connection."""

    def __init__(self, index, addresses):
        self.index = index
        self.addresses = addresses

    def _peer_in(self, text):
        for j, address in enumerate(self.addresses):
            if j != self.index and address and re.search(
                    rf"(?<![\w.:]){re.escape(address)}(?!\d)", text):
                return j
        return None

    def named(self, exc, connecting=False, connect_timeout=None):
        """``exc`` (a RemoteConnectionError) with the task at the other end
        named, and which way: this task connecting to it, or reading from
        it; None when its message names no peer."""
        text = str(exc)
        j = self._peer_in(text)
        if j is None:
            return None
        me = f"task {self.index} at {self.addresses[self.index]}"
        peer = f"task {j} at {self.addresses[j]}"
        if connecting:
            low = text.lower()
            if "timed out" in low or "did not complete the handshake in time" in low:
                hint = (f" (within connect_timeout={connect_timeout:g} s): connections from "
                        f"this host to that one's task ports must be let through (pin them with "
                        f"task_port= and open them)")
            elif "refused" in low and "server refused" not in low:
                hint = (": nothing listens there any more (the task ended), or a firewall "
                        "rejects connections to that host's task ports (pin them with "
                        "task_port= and open them)")
            else:
                hint = ""
            message = f"{me} could not connect to {peer} to read its output{hint}: {text}"
        else:
            message = f"{me} lost its connection to {peer} while reading its output: {text}"
        kind = AuthenticationError if isinstance(exc, AuthenticationError) else \
            RemoteConnectionError
        return kind(message)


def _root_error(consumer_error, producer_error):
    """The error a failing task raises: its own (its input's, its
    ``fn``'s, a peer's error that its gate carries) before one that only
    says that a peer went away (a released subpartition, a dropped
    connection)."""
    for error in (producer_error, consumer_error):
        if error is not None and not _is_consequence(error):
            return error
    return consumer_error if consumer_error is not None else producer_error


def _is_consequence(error, depth=0):
    """True for an error that only says a peer went away: a released
    subpartition, a dropped connection, or a producer (this task's own, or
    a peer's) that failed with one of those."""
    if isinstance(error, _CONSEQUENCES):
        return True
    if isinstance(error, RemoteError):
        return error.type_name in _CONSEQUENCE_NAMES
    if isinstance(error, ProducerFailedError) and depth < 8:
        return _is_consequence(error.__cause__, depth + 1)
    return False


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


def _cleanup(env, partition, writer, gate, producer, failed, timeout):
    """Leave nothing behind: on a failure the partition fails (peers raise
    the error) and the producer is aborted; the gate and the environment
    close (its threads and sockets end)."""
    if failed is not None:
        if writer is not None:
            try:
                writer.fail(failed if isinstance(failed, Exception) else None)
            except Exception:         # noqa: BLE001
                pass
        elif partition is not None:
            try:
                partition.fail(failed if isinstance(failed, Exception) else None)
            except Exception:         # noqa: BLE001
                pass
    if gate is not None:
        gate.close()
    if producer is not None and producer.is_alive():
        try:
            _join(producer, timeout)
        except TimeoutError:
            pass                       # it is a daemon thread: blocked in the input
    if failed is not None and partition is not None:
        # The failure travels to the peers as an error frame on each channel
        # they read from us; the partition is consumed once each of them is
        # on its way.  Closing the connections before that would show them
        # a dropped connection instead of the error.
        partition.wait_consumed(min(timeout, _ERROR_GRACE))
    env.close()


def check_buffers(buffers_per_channel, floating_buffers):
    """Check an exchange's ``buffers_per_channel`` and ``floating_buffers``."""
    check_int(buffers_per_channel, "buffers_per_channel", 1, 1 << 16)
    check_int(floating_buffers, "floating_buffers", 0, 1 << 16)


def make_spec(n, fn, *, num_partitions, key, selector, codec, segment_size,
               buffers_per_channel, floating_buffers, buffer_timeout, max_record_size,
               max_parallelism, host, timeout, monitor, rendezvous="driver",
               produce=emit_all, read=_records, encryption=None, advertise=None, task_port=0,
               rendezvous_port=0, port_retries=None, connect_timeout=10.0):
    """Check the arguments of an exchange of ``n`` tasks (on the driver)
    and make what its tasks need, the exchange's secret included."""
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be callable (iterator -> iterable) or None, got "
                        f"{type(fn).__name__}")
    if num_partitions is not None:
        check_int(num_partitions, "num_partitions", 1)
        if num_partitions != n:
            raise ValueError(
                f"num_partitions is {num_partitions} but the RDD has {n} partitions: a barrier "
                f"stage runs one task per input partition (repartition the RDD first)")
    if isinstance(selector, str):
        selector = selector.replace("-", "_")
    if not (callable(selector) or selector in SELECTORS):
        raise ValueError(f"selector must be one of {', '.join(SELECTORS)} or a callable "
                         f"(record, num_partitions) -> int, got {selector!r}")
    if key is not None:
        if selector != "hash":
            raise ValueError(f"key applies to the hash selector only, not to {selector!r}")
        if not callable(key):
            check_int(key, "key", 0)
    check_choice(codec, "codec", CODECS)
    check_int(segment_size, "segment_size", 64, 1 << 30)
    check_buffers(buffers_per_channel, floating_buffers)
    check_seconds(buffer_timeout, "buffer_timeout", allow_none=True)
    check_int(max_record_size, "max_record_size", 1)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(n)
    else:
        check_int(max_parallelism, "max_parallelism", n, 32768)
    if host is not None and not isinstance(host, str):
        raise TypeError(f"host must be a str or None, got {type(host).__name__}")
    advertise = _check_advertise(advertise)
    check_int(task_port, "task_port", 0, 65535)
    check_int(rendezvous_port, "rendezvous_port", 0, 65535)
    if port_retries is not None:
        check_int(port_retries, "port_retries", 0, 65535)
    connect_timeout = check_seconds(connect_timeout, "connect_timeout")
    timeout = check_seconds(timeout, "timeout")
    if monitor is not None and not callable(monitor):
        raise TypeError(f"monitor must be callable or None, got {type(monitor).__name__}")
    check_choice(rendezvous, "rendezvous", RENDEZVOUS)
    if encryption is not None and not isinstance(encryption, bool):
        raise TypeError(f"encryption must be True, False or None, got "
                        f"{type(encryption).__name__}")
    return _Spec(encryption=encryption, rendezvous=rendezvous, fn=fn, key=key, produce=produce, read=read, selector=selector, codec=codec,
                 segment_size=segment_size, buffers_per_channel=buffers_per_channel, floating_buffers=floating_buffers,
                 buffer_timeout=buffer_timeout, max_record_size=max_record_size,
                 max_parallelism=max_parallelism, host=host, timeout=timeout, monitor=monitor,
                 advertise=advertise, task_port=task_port, rendezvous_port=rendezvous_port,
                 port_retries=port_retries, connect_timeout=connect_timeout,
                 secret=secrets.token_bytes(32),
                 exchange_id=f"flinkbuf-exchange-{secrets.token_hex(8)}")


def _check_advertise(advertise):
    """``advertise`` of an exchange: None, a host, or a dict of a host's own
    address to the one its tasks advertise (a copy)."""
    def host(value, name):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
        if is_wildcard(value.strip("[]")):
            raise ValueError(f"{name} must be an address peers can dial, not {value!r}")
        return value.strip("[]")

    if advertise is None:
        return None
    if isinstance(advertise, str):
        return host(advertise, "advertise")
    if isinstance(advertise, dict):
        return {host(k, "a key of advertise"): host(v, f"advertise[{k!r}]")
                for k, v in advertise.items()}
    raise TypeError(f"advertise must be a host, a dict of host -> host or None, got "
                    f"{type(advertise).__name__}")


def session_ports(sc, spec):
    """``port_retries`` of an exchange as its tasks take it: as given, or,
    when None, the session's ``spark.port.maxRetries`` (16 by default)."""
    if spec.port_retries is None:
        value = sc.getConf().get("spark.port.maxRetries", "16")
        try:
            spec.port_retries = max(0, min(65535, int(str(value).strip())))
        except ValueError:
            spec.port_retries = 16


def session_encryption(sc, encryption):
    """``encryption`` of an exchange as its tasks take it: as given, or,
    when None, True if the Spark session encrypts its own traffic
    (``spark.network.crypto.enabled`` or ``spark.ssl.enabled``), else None
    (sealed between hosts only, as NetworkEnvironment does by default)."""
    if encryption is not None:
        return encryption
    conf = sc.getConf()
    for key in ("spark.network.crypto.enabled", "spark.ssl.enabled"):
        if str(conf.get(key, "false")).strip().lower() == "true":
            return True
    return None


_SLOT_POLL = 0.1


def check_slots(sc, num_tasks, timeout):
    """Raise :class:`~flinkbuf.errors.InsufficientSlotsError` unless the
    master of SparkContext ``sc`` can run ``num_tasks`` tasks at once, as a
    barrier stage needs (Spark's own check of the same, at submission, is
    retried for up to ten minutes by default).  A local master's slots are
    fixed; on a cluster this waits up to ``timeout`` seconds for
    executors to register.  Where Spark does not say, nothing is checked."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        slots = jsc.maxNumConcurrentTasks(profile)
    except Exception:                      # noqa: BLE001 - Spark's own check remains
        return
    master = sc.master
    fixed = master.startswith("local") and not master.startswith("local-cluster")
    deadline = time.monotonic() + timeout
    while slots < num_tasks and not fixed and time.monotonic() < deadline:
        time.sleep(_SLOT_POLL)
        slots = jsc.maxNumConcurrentTasks(profile)
    if slots >= num_tasks:
        return
    cpus = sc.getConf().get("spark.task.cpus", "1")
    per_task = "" if cpus == "1" else f" (spark.task.cpus={cpus} cores per task)"
    if fixed:
        more = f"a master such as local[{num_tasks * int(cpus) if cpus.isdigit() else num_tasks}]"
    else:
        more = "more executor cores or executors"
    fewer = "" if slots < 1 else \
        f", or repartition the input to {slots} partition{'' if slots == 1 else 's'} or fewer"
    raise InsufficientSlotsError(
        f"the exchange runs {num_tasks} tasks at once (a barrier stage, one task per input "
        f"partition) but master {master} has {slots} task slot{'' if slots == 1 else 's'}"
        f"{per_task}{'' if fixed else f' after {timeout:g} s'}: use {more}{fewer}")


def _driver_addresses(sc):
    """(bind, advertised) host of the driver as Spark knows it:
    ``spark.driver.bindAddress`` / ``spark.driver.host``, else the
    SparkContext's host."""
    conf = sc.getConf()
    host = conf.get("spark.driver.host", None)
    if not host:
        try:
            host = sc._jsc.sc().env().rpcEnv().address().host()
        except Exception:                  # noqa: BLE001 - fall back below
            host = None
    host = host or os.environ.get("SPARK_LOCAL_IP") or \
        socket.gethostbyname(socket.gethostname())
    bind = conf.get("spark.driver.bindAddress", None) or host
    return bind.strip("[]"), host.strip("[]")


def _issued_task_ids(sc):
    """A function that returns the task attempt id the driver's task
    scheduler issues next (None if it cannot say), or None when this Spark
    does not tell it."""
    def issued():
        try:
            value = scheduler.nextTaskId()
            # A long in some Spark versions, an AtomicLong in others.
            return int(value if isinstance(value, int) else value.get())
        except Exception:              # noqa: BLE001 - the JVM is going away
            return None

    try:
        scheduler = sc._jsc.sc().taskScheduler()
    except Exception:                  # noqa: BLE001 - not a JVM-backed SparkContext
        return None
    return issued if issued() is not None else None


def start_rendezvous(sc, spec, n):
    """Start the driver's rendezvous of an exchange whose spec says so (the
    caller ties its lifetime to the result with :func:`serve_while`)."""
    if spec.rendezvous != "driver":
        spec.rendezvous = None
        return None
    bind, advertised = _driver_addresses(sc)
    server = _rendezvous.RendezvousServer(spec.secret, n, host=bind, advertise=advertised,
                                          timeout=spec.timeout,
                                          issued_task_ids=_issued_task_ids(sc),
                                          port=spec.rendezvous_port,
                                          port_retries=spec.port_retries)
    spec.rendezvous = server.address
    _SlotWatch.watch(sc, server, n, spec.timeout)
    return server


def serve_while(server, owner):
    """Keep ``server`` up while ``owner`` lives; once it is garbage
    collected, until no task has registered for the exchange's timeout.
    :func:`~flinkbuf.spark.close_rendezvous` and the interpreter's exit close it at
    once."""
    if server is not None:
        weakref.finalize(owner, server.release).atexit = False


class _SlotWatch:
    """The driver's watch over the stage attempts of its exchanges: a
    barrier stage retried after a host or an executor was lost waits for
    all of its slots at once, and Spark checks the slots only when a job
    is submitted, so the attempt would wait forever.  One thread (while any
    rendezvous is open) looks every ``POLL`` seconds at the stages whose
    tasks registered with an open rendezvous: one that Spark runs with no
    task launched while the cluster has fewer slots than it has tasks is
    cancelled (with its job) once that has lasted the exchange's
    ``timeout``; when the slots come back in time, the attempt runs."""

    POLL = 0.5
    _lock = threading.Lock()
    # [weakref to RendezvousServer, sc, n, timeout, {(stage, attempt): since}]
    _watched: list[list] = []
    _thread = None

    @classmethod
    def watch(cls, sc, server, n, timeout):
        with cls._lock:
            cls._watched.append([weakref.ref(server), sc, n, timeout, {}])
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, daemon=True,
                                               name="flinkbuf-slot-watch")
                cls._thread.start()

    @classmethod
    def _run(cls):
        while True:
            time.sleep(cls.POLL)
            with cls._lock:
                live = []
                for entry in cls._watched:
                    server = entry[0]()
                    if server is not None and not server.closed and entry[1]._jsc is not None:
                        live.append(entry)
                cls._watched[:] = live
                if not live:
                    cls._thread = None
                    return
                work = list(live)
            for entry in work:
                try:
                    cls._check(*entry)
                except Exception:          # noqa: BLE001 - the JVM is going away; next round
                    _LOG.debug("flinkbuf slot watch", exc_info=True)

    @staticmethod
    def _check(ref, sc, n, timeout, since):
        server = ref()
        if server is None:
            return
        stages = server.stages()
        if not stages:
            return
        tracker = sc._jsc.statusTracker()
        active = set(tracker.getActiveStageIds())
        now = time.monotonic()
        waiting = set()
        for stage in stages:
            if stage not in active:
                continue
            info = tracker.getStageInfo(stage)
            if info is None or info.numActiveTasks() > 0:
                continue
            jsc = sc._jsc.sc()
            slots = jsc.maxNumConcurrentTasks(
                jsc.resourceProfileManager().defaultResourceProfile())
            if slots >= info.numTasks():
                continue
            key = (stage, info.currentAttemptId())
            waiting.add(key)
            start = since.setdefault(key, now)
            if now - start >= timeout:
                since.pop(key, None)
                reason = (f"flinkbuf: attempt {key[1]} of stage {stage}, a barrier stage of an "
                          f"exchange, needs {info.numTasks()} task slots at once and the "
                          f"cluster has had {slots} for {timeout:g} s (a host or an executor "
                          f"was lost): Spark would wait for the slots forever. Add executors "
                          f"or cores, or give the exchange a longer timeout to wait for the "
                          f"lost ones to come back")
                _LOG.error("%s", reason)
                jsc.cancelStage(stage, reason)
        for key in list(since):
            if key not in waiting:
                del since[key]
