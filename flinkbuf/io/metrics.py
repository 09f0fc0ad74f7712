"""Task metrics with Flink's (>= 1.13) names, readable while the task runs.

:class:`TaskMetrics` reads the counters of a task's record writers and input
gates (plain integers updated by the task thread under the GIL, so a reader
in any thread sees a consistent value) and turns them into Flink's task
metrics::

    backPressuredTimeMsPerSecond  time blocked on output: waiting for a buffer
                                  (or, backlog-aware, for a free channel)
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
0.5, ``HIGH`` above.  Rates are averages over the last ``window`` seconds
(measured between snapshots; the first covers the time since creation).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, TypeVar

from flinkbuf.checks import check_seconds
from flinkbuf.io._io import InputGate, RecordWriter, monotonic_ns

if TYPE_CHECKING:
    from flinkbuf.buffer import LocalBufferPool

__all__ = [
    "HIGH",
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


class _TaskMetricValues(_OwnBufferMetrics):
    # A snapshot's metrics, without the task's name (what the live view
    # of flinkbuf.spark receives from each task).
    intervalSeconds: float
    backPressuredTimeMsPerSecond: float
    idleTimeMsPerSecond: float
    busyTimeMsPerSecond: float
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


# (time ns, records in, bytes in, buffers in, idle ns,
#  records out, bytes out, buffers out, back-pressured ns)
_Sample = tuple[int, int, int, int, int, int, int, int, int]


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
    """

    def __init__(self, name: str, *, writers: Iterable[RecordWriter] = (),
                 gates: Iterable[InputGate] = (), window: float = 1.0) -> None:
        window = check_seconds(window, "window")
        self.name = name
        self.writers: list[RecordWriter] = _all_of(writers, RecordWriter, "writers")
        self.gates: list[InputGate] = _all_of(gates, InputGate, "gates")
        self.window = window
        self._lock = threading.Lock()
        self._samples: deque[_Sample] = deque()
        self._samples.append(self._sample())

    def _sample(self) -> _Sample:
        rec_out = bytes_out = buf_out = bp = 0
        for w in self.writers:
            r, b, n, t = w._metric_counters()
            rec_out += r
            bytes_out += b
            buf_out += n
            bp += t
        rec_in = bytes_in = buf_in = idle = 0
        for g in self.gates:
            r, b, n, t = g._metric_counters()
            rec_in += r
            bytes_in += b
            buf_in += n
            idle += t
        return (monotonic_ns(), rec_in, bytes_in, buf_in, idle, rec_out, bytes_out, buf_out, bp)

    def snapshot(self) -> TaskMetricsSnapshot:
        """The metrics now, as a dict of Flink's metric names."""
        with self._lock:
            now = self._sample()
            # The rate base: the newest sample at least `window` old, else the oldest.
            horizon = now[0] - int(self.window * 1e9)
            while len(self._samples) > 1 and self._samples[1][0] <= horizon:
                self._samples.popleft()
            base = self._samples[0]
            self._samples.append(now)
        dt_ns = now[0] - base[0]
        seconds = dt_ns / 1e9 if dt_ns > 0 else 0.0

        def per_second(i: int) -> float:
            return (now[i] - base[i]) / seconds if seconds else 0.0

        def ms_per_second(i: int) -> float:
            if not dt_ns:
                return 0.0
            return min(1000.0, max(0.0, (now[i] - base[i]) / dt_ns * 1000.0))

        idle = ms_per_second(4) if self.gates else 0.0
        bp = ms_per_second(8) if self.writers else 0.0
        ratio = bp / 1000.0
        own, own_used, own_size, queued = _input_buffers(self.gates)
        return {
            "task": self.name,
            "intervalSeconds": seconds,
            "backPressuredTimeMsPerSecond": bp,
            "idleTimeMsPerSecond": idle,
            "busyTimeMsPerSecond": max(0.0, 1000.0 - idle - bp),
            "backPressureRatio": ratio,
            "backPressureLevel": backpressure_level(ratio),
            "outPoolUsage": _pool_usage(w.partition.pool for w in self.writers),
            "inPoolUsage": self._in_pool_usage(queued, own_used, own_size),
            "numRecordsIn": now[1],
            "numBytesIn": now[2],
            "numBuffersIn": now[3],
            "numRecordsOut": now[5],
            "numBytesOut": now[6],
            "numBuffersOut": now[7],
            "numRecordsInPerSecond": per_second(1),
            "numBytesInPerSecond": per_second(2),
            "numRecordsOutPerSecond": per_second(5),
            "numBytesOutPerSecond": per_second(6),
            **own,
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
