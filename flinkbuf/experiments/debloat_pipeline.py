"""The two tasks of the debloating experiment, with buffer debloating off or
on: a producer emitting ``(emit ns, sequence)`` records and a consumer that
keeps each record's sojourn (its read time minus its emit time, both by
``time.monotonic_ns``: one clock for every process of the host), each
paced by a :class:`~flinkbuf.experiments._throttle.Throttle`.

:class:`LocalPipeline` runs both in this process (the consumer reads the
producer's buffers by reference); :class:`RemotePipeline` runs the
consumer in another process, reading over a connection
(:mod:`flinkbuf.experiments.remote`).  Both are the backpressure
experiment's pipelines (started, throttled, counted and stopped as
those) with these tasks, and answer :meth:`sample`: the state of the
exchange now (see :class:`Sample`)."""

import collections
import threading
import time
from dataclasses import dataclass

import flinkbuf as fb
from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.experiments.remote import RemoteConsumers, consume_sojourns, new_secret
from flinkbuf.io import task_segments

_BATCH = 128                    # records between throttle checks


@dataclass
class Sample:
    """The exchange at one moment: cumulative records out and in (with the
    moment, ``perf_counter``), the sojourns (ns) of the records read since
    the last sample, the bytes in flight toward the consumer (the buffers
    between the producer and the consumer's reads as the gate counts them:
    queued, being filled, held as credit for the producer; with
    debloating the gate's own count at its debloated size, without the
    same buffers counted from the channels and the partition at the
    segment size), the bytes of the segments the exchange's buffers hold
    (memory), the debloated buffer size (None: off, or before the first
    announcement) and the segments handed back to the network pools so
    far (the gate's and the partition's)."""

    t: float
    records_out: int
    records_in: int
    sojourns_ns: list
    in_flight_bytes: int
    held_bytes: int
    buffer_size: object
    given_back: int


def _with_metrics(sample, metrics):
    """``sample`` with a gate's debloating metrics: its in-flight bytes, its
    buffer size, and the segments it handed back added."""
    sample.in_flight_bytes = sum(metrics["in_flight_bytes"])
    sample.buffer_size = metrics["buffer_size"]
    sample.given_back += metrics["given_back"]
    return sample


def _debloat_options(debloat, options):
    """The ``buffer_debloat*`` keywords of a gate or an environment."""
    return {"buffer_debloat": bool(debloat),
            **{f"buffer_debloat_{k}": v for k, v in options.items()}}


def _produce_stamped(pipe):
    """The producer task of ``pipe``: ``(emit ns, i)`` records, paced,
    until ``pipe.stop``."""
    emit = pipe.writer.emit
    pace = pipe.producer_throttle.pace
    stop = pipe.stop
    clock = time.monotonic_ns
    i = 0
    try:
        while not stop.is_set():
            for _ in range(_BATCH):
                emit((clock(), i))
                i += 1
            pace(_BATCH)
        pipe.writer.close()
    except BaseException as exc:  # noqa: BLE001 - raised by the experiment
        pipe.errors.append(exc)
        pipe.writer.fail(exc)


def _start_producer(pipe, partition, buffer_timeout):
    """``pipe``'s producer task on ``partition`` (not started)."""
    pipe.partition = partition
    pipe.writer = fb.RecordWriter(partition, fb.ForwardSelector(),
                                  buffer_timeout=buffer_timeout, name="producer")
    pipe.producer_throttle = Throttle()
    pipe.stop = threading.Event()
    pipe.errors = []
    pipe.max_in_use = 0
    pipe.threads = [threading.Thread(target=_produce_stamped, args=(pipe,),
                                     name="debloat-producer", daemon=True)]


def _held_by_producer(pipe):
    pool = pipe.partition.pool
    return pool.num_requested - pool.num_available


class LocalPipeline(_bp._Pipeline):
    """Producer and consumer in this process, through a partition of
    ``buffers`` buffers of ``segment_size`` bytes; ``debloat`` turns
    debloating on for the partition and the gate, with ``options`` (the
    ``buffer_debloat_*`` keywords without their prefix: target, period, ...).
    Started, stopped and throttled as the backpressure experiment's."""

    def __init__(self, debloat, options, *, segment_size, buffers, buffer_timeout):
        self.segment_size = segment_size
        self.buffers = buffers
        self.nbp = fb.NetworkBufferPool(task_segments([buffers]), segment_size)
        partition = fb.create_partition(
            self.nbp, 1, min_buffers=buffers, name="producer", buffer_debloat=debloat,
            buffer_debloat_min_size=options.get("min_size"))
        _start_producer(self, partition, buffer_timeout)
        self.gate = fb.InputGate([(partition, 0)], name="consumer",
                                 **_debloat_options(debloat, options))
        self.consumer_throttle = Throttle()
        self._sojourns = collections.deque()
        self.threads.append(threading.Thread(target=self._consume, name="debloat-consumer",
                                             daemon=True))

    def _consume(self):
        try:
            consume_sojourns(self.gate, self.consumer_throttle.pace, self._sojourns.append,
                             _BATCH)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)
        finally:
            self.gate.close()

    def sample(self):
        t, out, records_in = time.perf_counter(), self.writer.num_records_out, \
            self.gate.num_records_in
        taken = [self._sojourns.popleft() for _ in range(len(self._sojourns))]
        metrics = self.gate._debloat_metrics()
        held = _held_by_producer(self) * self.segment_size
        given = self.partition._debloat_given_back()
        if metrics is None:
            # as the gate counts them: the queued buffers and the one being filled
            in_use = 0 if self.partition.is_finished else sum(self.gate.backlogs()) + 1
            return Sample(t, out, records_in, taken, in_use * self.segment_size, held, None,
                          given)
        return _with_metrics(Sample(t, out, records_in, taken, 0, held, None, given), metrics)


class RemotePipeline(_bp._RemotePipeline):
    """The producer in this process, the consumer in another one reading
    over a connection of ``transport`` with ``buffers`` exclusive buffers
    of credit; debloating (off or on) for both environments."""

    def __init__(self, debloat, options, *, segment_size, buffers, buffer_timeout,
                 transport="auto"):
        from flinkbuf.network import NetworkEnvironment
        secret = new_secret()
        self.segment_size = segment_size
        self.buffers = buffers
        self.transport = transport
        keywords = _debloat_options(debloat, options)
        self.env = NetworkEnvironment(task_segments([buffers]), segment_size, secret=secret,
                                      transport=transport, **keywords)
        self.nbp = self.env.network_buffer_pool
        partition = fb.create_partition(
            self.nbp, 1, min_buffers=buffers, name="producer", buffer_debloat=debloat,
            buffer_debloat_min_size=options.get("min_size"))
        self.env.register_partition("producer", partition)
        _start_producer(self, partition, buffer_timeout)
        try:
            self.consumers = RemoteConsumers(
                self.env, secret, [("producer", 0)], segment_size=segment_size,
                exclusive=buffers, transport=transport, debloat=keywords, stamped=True)
        except BaseException:
            self.writer.fail()
            self.env.close()
            raise

    def sample(self):
        out = self.writer.num_records_out
        state = self.consumers.sample()
        t = time.perf_counter()
        in_use = sum(u for u, _ in state["own_buffers"])
        credit = sum(n for _, n in state["own_buffers"]) - in_use
        held = _held_by_producer(self) + sum(n for _, n in state["own_buffers"])
        sample = Sample(t, out, state["records_in"], state["sojourns_ns"], 0,
                        held * self.segment_size, None, self.partition._debloat_given_back())
        if state["debloat"] is not None:
            return _with_metrics(sample, state["debloat"])
        # as the gate counts them: what arrived and waits, the credit held
        # for the producer, and the producer's backlog
        queued = sum(state["backlogs"]) + credit + sum(self.partition.backlogs())
        sample.in_flight_bytes = queued * self.segment_size
        return sample
