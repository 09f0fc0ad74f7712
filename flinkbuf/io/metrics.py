"""Task metrics with Flink's (>= 1.13) names, readable while the task runs.

:class:`TaskMetrics` reads the counters of a task's record writers and input
gates (plain integers updated by the task thread under the GIL, so a reader
in any thread sees a consistent value) and turns them into Flink's task
metrics::

    backPressuredTimeMsPerSecond  time blocked on output, soft + hard:
    hardBackPressuredTimeMsPerSecond   blocked requesting an output buffer the
                                  pool does not have
    softBackPressuredTimeMsPerSecond   waiting while the output is unavailable
                                  but its pool has buffers (backlog-aware: for
                                  a free channel; a channel at its cap; room
                                  for an event): :class:`RecordWriter` says
                                  which wait is which
    idleTimeMsPerSecond           time waiting for input
    busyTimeMsPerSecond           1000 - idle - back-pressured (as in Flink)
    outPoolUsage                  buffers of the output pools in use / their size
    inPoolUsage                   buffers queued for the input gates / the size
                                  of the pools they come from (local channels
                                  read the producer's buffers; Flink counts only
                                  remote channels' own buffers here)
    numRecordsIn/OutPerSecond, numBytesIn/OutPerSecond

and, over the channels that receive into buffers of their own instead of
reading their producer's (the remote channels of :mod:`flinkbuf.network`,
which report these counters themselves; local channels count for none of
these)::

    inputExclusiveBuffersUsage    exclusive buffers not held for the sender /
                                  all exclusive buffers
    inputFloatingBuffersUsage     the gates' floating buffers lent out / all
    numBytesInRemote, numBuffersInRemote   what arrived into those buffers

and the back-pressure level of Flink's web UI from the back-pressured ratio
(``backPressuredTimeMsPerSecond / 1000``): ``OK`` up to 0.10, ``LOW`` up to
0.5, ``HIGH`` above.

A task whose writers and gates run in threads of their own (a Spark
exchange task: a producer thread writes, the task's thread reads) has
Flink's busy, idle and back-pressured time per side, each side's three
summing to 1000 (within rounding; a side without writers, or gates, is
all 0)::

    producerBusyTimeMsPerSecond   1000 - producer idle - backPressured
    producerIdleTimeMsPerSecond   the producer has nothing to write: not
                                  started or done (``producer_idle``; 0 if not
                                  given); its back-pressured time is
                                  backPressuredTimeMsPerSecond
    consumerBusyTimeMsPerSecond   1000 - consumer idle
    consumerIdleTimeMsPerSecond   time waiting for input (= idleTimeMsPerSecond)

Buffer debloating (gates made with ``buffer_debloat``), with Flink's names,
per gate in ``inputGates`` (one entry per gate, in order; None, or an empty
list, for a gate that does not debloat or before its first sample) and for
the task::

    debloatedBufferSize           the buffer size the gate announced to its
                                  producers, bytes; the task's: the largest of
                                  its gates'
    estimatedTimeToConsumeBuffersMs    time to consume the buffers in flight
                                  at the gate's last measured throughput; the
                                  task's: the longest (as Flink's task gauge)
    buffersInUse                  (per gate) buffers in flight at its last sample
    inFlightBytes                 bytes in flight now (each channel's buffers in
                                  use x the buffer size); per gate also
                                  ``inFlightBytesPerChannel``; the task's: the sum
    debloatGivenBackSegments      segments debloating gave back to the
                                  NetworkBufferPool: the gates' channels' and
                                  (task only) the writers' partitions'; the sum
    debloatGivenBackBytes         (task only) those segments x their segment size

Rates are averages over the last ``window`` seconds (measured between
snapshots; the first covers the time since creation).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypedDict, TypeVar

from flinkbuf.checks import check_seconds
from flinkbuf.io._io import InputGate, RecordWriter, monotonic_ns

if TYPE_CHECKING:
    from flinkbuf.buffer import LocalBufferPool

__all__ = [
    "HIGH",
    "InputGateMetrics",
    "LOW",
    "LOW_THRESHOLD",
    "OK",
    "OK_THRESHOLD",
    "TaskMetrics",
    "TaskMetricsSnapshot",
    "backpressure_level",
]

OK: Final = "OK"
LOW: Final = "LOW"
HIGH: Final = "HIGH"
OK_THRESHOLD: Final = 0.10
LOW_THRESHOLD: Final = 0.5


class _OwnBufferMetrics(TypedDict):
    inputExclusiveBuffersUsage: float
    inputFloatingBuffersUsage: float
    numBytesInRemote: int
    numBuffersInRemote: int


class InputGateMetrics(TypedDict):
    """One input gate's buffer debloating, in :class:`TaskMetricsSnapshot`'s
    ``inputGates`` (``gate``: its index in :attr:`TaskMetrics.gates`)."""

    gate: int
    bufferDebloat: bool
    debloatedBufferSize: int | None
    estimatedTimeToConsumeBuffersMs: float | None
    buffersInUse: int | None
    inFlightBytes: int | None
    inFlightBytesPerChannel: list[int]
    debloatGivenBackSegments: int


class _DebloatMetrics(TypedDict):
    debloatedBufferSize: int | None
    estimatedTimeToConsumeBuffersMs: float | None
    inFlightBytes: int | None
    debloatGivenBackSegments: int
    debloatGivenBackBytes: int
    inputGates: list[InputGateMetrics]


class _TaskMetricValues(_OwnBufferMetrics, _DebloatMetrics):
    # A snapshot's metrics, without the task's name (what the live view
    # of flinkbuf.spark receives from each task).
    intervalSeconds: float
    backPressuredTimeMsPerSecond: float
    softBackPressuredTimeMsPerSecond: float
    hardBackPressuredTimeMsPerSecond: float
    idleTimeMsPerSecond: float
    busyTimeMsPerSecond: float
    producerBusyTimeMsPerSecond: float
    producerIdleTimeMsPerSecond: float
    consumerBusyTimeMsPerSecond: float
    consumerIdleTimeMsPerSecond: float
    backPressureRatio: float
    backPressureLevel: Literal["OK", "LOW", "HIGH"]
    outPoolUsage: float
    inPoolUsage: float
    numRecordsIn: int
    numBytesIn: int
    numBuffersIn: int
    numRecordsOut: int
    numBytesOut: int
    numBuffersOut: int
    numRecordsInPerSecond: float
    numBytesInPerSecond: float
    numRecordsOutPerSecond: float
    numBytesOutPerSecond: float


class TaskMetricsSnapshot(_TaskMetricValues):
    """What :meth:`TaskMetrics.snapshot` returns: Flink's metric names
    (counts are totals since the task started; rates, per second, and
    times, in ms per second, are over the window)."""

    task: str


class _Sample(NamedTuple):
    time: int
    records_in: int
    bytes_in: int
    buffers_in: int
    idle: int               # ns, the gates'
    records_out: int
    bytes_out: int
    buffers_out: int
    bp: int                 # ns back-pressured, the writers'
    soft: int               # ns of those soft
    producer_idle: int      # ns, producer_idle()


def backpressure_level(ratio: float) -> Literal["OK", "LOW", "HIGH"]:
    """Flink's level for a back-pressured ratio in [0, 1]: OK (<= 0.10),
    LOW (<= 0.5) or HIGH."""
    if ratio != ratio:   # NaN
        raise ValueError("ratio is NaN")
    if ratio <= OK_THRESHOLD:
        return OK
    if ratio <= LOW_THRESHOLD:
        return LOW
    return HIGH


def _input_buffers(gates: Iterable[InputGate]) -> tuple[_OwnBufferMetrics, int, int, int]:
    """Over the channels of ``gates`` that receive into buffers of their own
    (each reports its counters, ``InputGate._own_buffer_counters``): their
    metrics, and their buffers in use and in all; and the buffers queued
    for the other channels (which hand over their producer's buffers)."""
    own_total = own_used = bytes_in = buffers_in = queued = 0
    borrowed: list[LocalBufferPool] = []
    for g in gates:
        for backlog, own in zip(g.backlogs(), g._own_buffer_counters()):
            if own is None:
                queued += backlog
                continue
            used, total, nbytes, nbuffers, pool = own
            own_used += used
            own_total += total
            bytes_in += nbytes
            buffers_in += nbuffers
            if pool is not None and all(pool is not p for p in borrowed):
                borrowed.append(pool)
    live = [p for p in borrowed if not p.is_destroyed]
    fl_size = sum(p.num_buffers for p in live)
    fl_lent = sum(p.num_requested - p.num_available for p in live)
    metrics: _OwnBufferMetrics = {
        "inputExclusiveBuffersUsage": own_used / own_total if own_total else 0.0,
        "inputFloatingBuffersUsage": min(1.0, fl_lent / fl_size) if fl_size else 0.0,
        "numBytesInRemote": bytes_in,
        "numBuffersInRemote": buffers_in,
    }
    return metrics, own_used + fl_lent, own_total + fl_size, queued


def _pool_usage(pools: Iterable[LocalBufferPool]) -> float:
    used = size = 0
    for pool in pools:
        if pool.is_destroyed:
            continue
        n = pool.num_buffers
        size += n
        used += max(0, min(n, pool.num_requested - pool.num_available))
    return used / size if size else 0.0


_N = TypeVar("_N", int, float)


def _gate_debloat(index: int, m: dict[str, Any] | None) -> InputGateMetrics:
    """A gate's entry of ``inputGates`` from its ``_debloat_metrics()``."""
    if m is None:
        return {"gate": index, "bufferDebloat": False, "debloatedBufferSize": None,
                "estimatedTimeToConsumeBuffersMs": None, "buffersInUse": None,
                "inFlightBytes": None, "inFlightBytesPerChannel": [],
                "debloatGivenBackSegments": 0}
    ttc = m["time_to_consume"]
    per_channel = [int(b) for b in m["in_flight_bytes"]]
    return {"gate": index, "bufferDebloat": True, "debloatedBufferSize": m["buffer_size"],
            "estimatedTimeToConsumeBuffersMs": None if ttc is None else ttc * 1000.0,
            "buffersInUse": m["buffers_in_use"], "inFlightBytes": sum(per_channel),
            "inFlightBytesPerChannel": per_channel,
            "debloatGivenBackSegments": int(m["given_back"])}


def _largest(values: Iterable[_N | None]) -> _N | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _gate_segment_size(gate: InputGate) -> int | None:
    """The segment size of the pools ``gate``'s buffers come from (None if
    it cannot tell: remote channels without floating buffers only)."""
    for pool in gate.source_pools():
        return pool.network_buffer_pool.segment_size
    for own in gate._own_buffer_counters():
        if own is not None and own[4] is not None:
            return own[4].network_buffer_pool.segment_size
    return None


def _debloat(gates: list[InputGate], writers: list[RecordWriter]) -> _DebloatMetrics:
    """The buffer debloating metrics of a task's ``gates`` and ``writers``
    (see the module's table)."""
    per_gate = [_gate_debloat(i, g._debloat_metrics()) for i, g in enumerate(gates)]
    partitions: list[Any] = []
    for w in writers:
        if all(w.partition is not p for p in partitions):
            partitions.append(w.partition)
    out_segments = [(p._debloat_given_back(), p.pool.network_buffer_pool.segment_size)
                    for p in partitions]
    out_size = out_segments[0][1] if out_segments else 0
    given_bytes = sum(n * size for n, size in out_segments)
    for gate, entry in zip(gates, per_gate):
        n = entry["debloatGivenBackSegments"]
        if n:
            size = _gate_segment_size(gate)
            given_bytes += n * (out_size if size is None else size)
    debloating = [e for e in per_gate if e["bufferDebloat"]]
    return {
        "debloatedBufferSize": _largest(e["debloatedBufferSize"] for e in per_gate),
        "estimatedTimeToConsumeBuffersMs": _largest(e["estimatedTimeToConsumeBuffersMs"]
                                                    for e in per_gate),
        "inFlightBytes": sum(e["inFlightBytes"] or 0 for e in debloating) if debloating
        else None,
        "debloatGivenBackSegments": sum(e["debloatGivenBackSegments"] for e in per_gate)
        + sum(n for n, _ in out_segments),
        "debloatGivenBackBytes": given_bytes,
        "inputGates": per_gate,
    }


_T = TypeVar("_T")


def _all_of(items: Iterable[object], cls: type[_T], what: str) -> list[_T]:
    """``items`` as a list, each a ``cls``, else TypeError."""
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{what} must be an iterable of {cls.__name__}s, got "
                        f"{type(items).__name__}")
    checked: list[_T] = []
    for item in items:
        if not isinstance(item, cls):
            raise TypeError(f"{what} must hold {cls.__name__}s, got a {type(item).__name__}")
        checked.append(item)
    return checked


class TaskMetrics:
    """Metrics of one task: its ``writers`` (output) and ``gates`` (input).

    ``snapshot()`` returns a dict (``to_json()`` the same as JSON) and may
    be called from any thread at any time without disturbing the task.
    ``producer_idle``: a callable returning the nanoseconds (monotonic) the
    thread that drives the writers has had nothing to write so far (not
    started yet, or done), for the producer side's idle time; None: never
    idle.
    """

    def __init__(self, name: str, *, writers: Iterable[RecordWriter] = (),
                 gates: Iterable[InputGate] = (), window: float = 1.0,
                 producer_idle: Callable[[], int] | None = None) -> None:
        window = check_seconds(window, "window")
        if producer_idle is not None and not callable(producer_idle):
            raise TypeError(f"producer_idle must be callable or None, got "
                            f"{type(producer_idle).__name__}")
        self.name = name
        self.writers: list[RecordWriter] = _all_of(writers, RecordWriter, "writers")
        self.gates: list[InputGate] = _all_of(gates, InputGate, "gates")
        self.window = window
        self._producer_idle = producer_idle
        self._lock = threading.Lock()
        self._samples: deque[_Sample] = deque()
        self._samples.append(self._sample())

    def _sample(self) -> _Sample:
        rec_out = bytes_out = buf_out = bp = soft = 0
        for w in self.writers:
            r, b, n, _ = w._metric_counters()
            t, t_soft = w._back_pressure_counters()
            rec_out += r
            bytes_out += b
            buf_out += n
            bp += t
            soft += t_soft
        rec_in = bytes_in = buf_in = idle = 0
        for g in self.gates:
            r, b, n, t = g._metric_counters()
            rec_in += r
            bytes_in += b
            buf_in += n
            idle += t
        producer_idle = self._producer_idle() if self._producer_idle is not None else 0
        return _Sample(monotonic_ns(), rec_in, bytes_in, buf_in, idle, rec_out, bytes_out,
                       buf_out, bp, soft, producer_idle)

    def _base(self, now: _Sample) -> _Sample:
        """The rate base for ``now``: the newest sample at least ``window``
        old, else the oldest; ``now`` joins the samples."""
        with self._lock:
            horizon = now.time - int(self.window * 1e9)
            while len(self._samples) > 1 and self._samples[1].time <= horizon:
                self._samples.popleft()
            base = self._samples[0]
            self._samples.append(now)
        return base

    def _times(self, now: _Sample, base: _Sample) -> dict[str, float]:
        """The ms-per-second metrics, Flink's and each side's."""
        dt_ns = now.time - base.time

        def ms_per_second(field: str) -> float:
            if dt_ns <= 0:
                return 0.0
            ns: float = getattr(now, field) - getattr(base, field)
            return min(1000.0, max(0.0, ns / dt_ns * 1000.0))

        idle = ms_per_second("idle") if self.gates else 0.0
        bp = soft = producer_idle = 0.0
        if self.writers:
            bp = ms_per_second("bp")
            soft = min(bp, ms_per_second("soft"))
            producer_idle = min(1000.0 - bp, ms_per_second("producer_idle"))
        return {
            "backPressuredTimeMsPerSecond": bp,
            "softBackPressuredTimeMsPerSecond": soft,
            "hardBackPressuredTimeMsPerSecond": bp - soft,
            "idleTimeMsPerSecond": idle,
            "busyTimeMsPerSecond": max(0.0, 1000.0 - idle - bp),
            "producerBusyTimeMsPerSecond": (max(0.0, 1000.0 - producer_idle - bp)
                                            if self.writers else 0.0),
            "producerIdleTimeMsPerSecond": producer_idle,
            "consumerBusyTimeMsPerSecond": 1000.0 - idle if self.gates else 0.0,
            "consumerIdleTimeMsPerSecond": idle,
        }

    def snapshot(self) -> TaskMetricsSnapshot:
        """The metrics now, as a dict of Flink's metric names."""
        now = self._sample()
        base = self._base(now)
        dt_ns = now.time - base.time
        seconds = dt_ns / 1e9 if dt_ns > 0 else 0.0

        def per_second(field: str) -> float:
            return (getattr(now, field) - getattr(base, field)) / seconds if seconds else 0.0

        times = self._times(now, base)
        ratio = times["backPressuredTimeMsPerSecond"] / 1000.0
        own, own_used, own_size, queued = _input_buffers(self.gates)
        return {
            "task": self.name,
            "intervalSeconds": seconds,
            "backPressuredTimeMsPerSecond": times["backPressuredTimeMsPerSecond"],
            "softBackPressuredTimeMsPerSecond": times["softBackPressuredTimeMsPerSecond"],
            "hardBackPressuredTimeMsPerSecond": times["hardBackPressuredTimeMsPerSecond"],
            "idleTimeMsPerSecond": times["idleTimeMsPerSecond"],
            "busyTimeMsPerSecond": times["busyTimeMsPerSecond"],
            "producerBusyTimeMsPerSecond": times["producerBusyTimeMsPerSecond"],
            "producerIdleTimeMsPerSecond": times["producerIdleTimeMsPerSecond"],
            "consumerBusyTimeMsPerSecond": times["consumerBusyTimeMsPerSecond"],
            "consumerIdleTimeMsPerSecond": times["consumerIdleTimeMsPerSecond"],
            "backPressureRatio": ratio,
            "backPressureLevel": backpressure_level(ratio),
            "outPoolUsage": _pool_usage(w.partition.pool for w in self.writers),
            "inPoolUsage": self._in_pool_usage(queued, own_used, own_size),
            "numRecordsIn": now.records_in,
            "numBytesIn": now.bytes_in,
            "numBuffersIn": now.buffers_in,
            "numRecordsOut": now.records_out,
            "numBytesOut": now.bytes_out,
            "numBuffersOut": now.buffers_out,
            "numRecordsInPerSecond": per_second("records_in"),
            "numBytesInPerSecond": per_second("bytes_in"),
            "numRecordsOutPerSecond": per_second("records_out"),
            "numBytesOutPerSecond": per_second("bytes_out"),
            **own,
            **_debloat(self.gates, self.writers),
        }

    def _in_pool_usage(self, queued: int, own_used: int, own_size: int) -> float:
        """Buffers ``queued`` for the channels that hand over their
        producer's buffers over the pools they come from, plus the other
        channels' own buffers in use over all of them."""
        in_pools: list[LocalBufferPool] = []
        for g in self.gates:
            in_pools.extend(p for p in g.source_pools() if all(p is not q for q in in_pools))
        size = sum(p.num_buffers for p in in_pools if not p.is_destroyed) + own_size
        return min(1.0, (queued + own_used) / size) if size else 0.0

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.snapshot(), **kwargs)

    def __repr__(self) -> str:
        return (f"<flinkbuf.TaskMetrics {self.name!r} writers={len(self.writers)} "
                f"gates={len(self.gates)}>")
