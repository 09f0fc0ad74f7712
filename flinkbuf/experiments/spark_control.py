"""The Spark demo's control protocol: the driver steers the tasks of its
exchange while they run, over one connection per task (JSON lines).

In each task (its Python worker), the exchange's monitor (:class:`Monitor`)
connects to the driver and answers it from a thread (:class:`TaskControl`):
``limits`` sets the throttles of the task's producer and consumer (in % of
full speed; None: unthrottled), ``sample`` returns its cumulative counters
(records out and in, back-pressured nanoseconds, pool usage) and the moment
it read them, with the sojourn marks since the last sample (see below),
``stop`` ends its producer.

Sojourn through a side channel, the records unchanged: the producer notes
the wall-clock time (``time.time_ns``) at which it emits the first record
of each batch (its sequence number, the record's second field, unique over
the tasks), the consumer the time at which it reads a record with such a
sequence number; the driver joins the two by sequence number (read time
minus emit time).  On one host that is exact to the clock's resolution;
across hosts it includes the offset between their clocks.  The task's producer
(:func:`paced_source`) and consumer (:func:`paced_count`) run at those
limits; on a Spark Connect session, where the exchange is
:func:`~flinkbuf.spark.arrow_exchange`, the same as Arrow batches
(:func:`paced_batches`, the exchange's ``map_input``, and
:func:`paced_count_batches`), each task counting its rows itself (the
exchange's writer and gate count pieces of batches).  On the driver,
:class:`Control` accepts a connection per task (each proving the run's
token) and asks them all at once, while the job runs in a thread of its own
(:class:`Job`).
"""

import collections
import json
import secrets
import socket
import threading
import time

from flinkbuf.experiments._throttle import Throttle
from flinkbuf.experiments.failures import RunFailed
from flinkbuf.experiments.shuffle_comparison import KEYS

BATCH = 128                     # records between two calls of a throttle
CONTROL_TIMEOUT = 120.0         # seconds for the tasks to start and call in


# ---- in the tasks ----------------------------------------------------------------------

class TaskControl:
    """One task's end of the control connection (in its Python worker): the
    throttles of its producer and consumer, and a thread that answers the
    driver."""

    def __init__(self, task, address, token, rows=False):
        self.task = task
        self.rows = rows                     # count rows here, not the writer's records
        self.rows_out = self.rows_in = 0
        self.producer = Throttle()
        self.consumer = Throttle()
        self.stop = threading.Event()
        self.max_out_pool = 0.0
        self.emitted = collections.deque()   # (sequence, emit ns) of sampled records
        self.read = collections.deque()      # (sequence, read ns) of sampled records
        self.sock = socket.create_connection(address, timeout=CONTROL_TIMEOUT)
        self.sock.settimeout(None)
        self.file = self.sock.makefile("rw", encoding="utf-8", newline="\n")
        self._send({"hello": token, "task": task.index})
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"demo-control-{task.index}")
        self.thread.start()

    def _send(self, msg):
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()

    def _serve(self):
        try:
            for line in self.file:
                msg = json.loads(line)
                cmd = msg["cmd"]
                if cmd == "limits":
                    for throttle, pct in ((self.producer, msg["producer"]),
                                          (self.consumer, msg["consumer"])):
                        if pct is None:
                            throttle.unthrottle()
                        else:
                            throttle.set_limit(pct, msg["rate"])
                    self._send({"ok": True})
                elif cmd == "sample":
                    # cumulative counters and the time they were read at: the
                    # driver takes differences over exactly its intervals
                    writer = self.task.writer
                    snap = self.task.metrics.snapshot()
                    self.max_out_pool = max(self.max_out_pool, snap["outPoolUsage"])
                    out, in_ = ((self.rows_out, self.rows_in) if self.rows else
                                (writer.num_records_out, self.task.gate.num_records_in))
                    self._send({"t_ns": time.monotonic_ns(),
                                "out": out,
                                "in": in_,
                                "bp_ns": writer.back_pressured_time_ns,
                                "out_pool": snap["outPoolUsage"],
                                "in_pool": snap["inPoolUsage"],
                                "emitted": _drain(self.emitted),
                                "read": _drain(self.read)})
                elif cmd == "stop":
                    self.stop.set()
                    self.producer.unthrottle()
                    self.consumer.unthrottle()
                    self._send({"ok": True})
        except (OSError, ValueError):
            pass
        finally:
            self.stop.set()
            self.producer.unthrottle()
            self.consumer.unthrottle()

    def close(self):
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.thread.join(5)
        self.file.close()
        self.sock.close()


def _drain(marks):
    """What ``marks`` (a deque another thread appends to) holds now, taken out."""
    return [marks.popleft() for _ in range(len(marks))]


_CURRENT: "dict[str, TaskControl]" = {}   # in a Python worker: the running task's control


class Monitor:
    """The exchange's monitor: calls the driver from each task.  A class at
    module level, so that it travels by reference and shares this module's
    state in the worker with the source and the consumer.  ``rows``: the
    task's source and consumer count its rows (Arrow batches)."""

    def __init__(self, address, token, rows=False):
        self.address = tuple(address)
        self.token = token
        self.rows = rows

    def __call__(self, task):
        control = TaskControl(task, self.address, self.token, self.rows)
        _CURRENT["current"] = control

        def done():
            _CURRENT.pop("current", None)
            control.close()
        return done


def _batch_starts(control):
    """The sequence number of the first record of each of the task's
    batches until the driver says stop, its emit time noted; the next is
    asked for once the batch is out, and paced by the producer's throttle."""
    pace, stop, mark = control.producer.pace, control.stop, control.emitted.append
    clock = time.time_ns
    i = control.task.index
    step = control.task.num_tasks
    while not stop.is_set():
        mark((i, clock()))
        yield i
        i += step * BATCH
        pace(BATCH)


def paced_source(index, _):
    """A producer's records until the driver says stop, paced by its
    throttle; the emit time of each batch's first record is noted."""
    control = _CURRENT["current"]
    step = control.task.num_tasks
    for i in _batch_starts(control):
        for seq in range(i, i + step * BATCH, step):
            yield (seq % KEYS, seq)


def paced_batches(batches):
    """:func:`paced_source` as Arrow batches (``key``, ``i``: longs), one
    per batch of records: the ``map_input`` of the exchange's tasks (their
    input, a row each, is read and left)."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    for _ in batches:
        pass
    control = _CURRENT["current"]
    offsets = np.arange(0, control.task.num_tasks * BATCH, control.task.num_tasks,
                        dtype=np.int64)
    for i in _batch_starts(control):
        seq = offsets + i
        yield pa.RecordBatch.from_arrays([pa.array(seq % KEYS), pa.array(seq)],
                                         names=["key", "i"])
        control.rows_out += BATCH


def paced_count(records):
    """A consumer: counts per key, paced by its throttle; notes the read
    time of the records whose emit time their producer noted (the first
    of each of its batches); yields its totals."""
    control = _CURRENT["current"]
    pace, mark = control.consumer.pace, control.read.append
    clock = time.time_ns
    step = control.task.num_tasks
    span = step * BATCH
    counts = collections.Counter()
    n = 0
    for key, i in records:
        if i % span < step:
            mark((i, clock()))
        counts[key] += 1
        n += 1
        if n == BATCH:
            pace(n)
            n = 0
    stats = control.task.stats()
    stats["max_out_pool_usage"] = control.max_out_pool
    yield {"stats": stats, "keys": len(counts), "records": sum(counts.values())}


def paced_count_batches(batches):
    """:func:`paced_count` over Arrow batches (``key``, ``i``), paced per
    batch; yields a batch of one row, its totals as JSON (``stats``)."""
    import json

    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    control = _CURRENT["current"]
    pace, mark = control.consumer.pace, control.read.extend
    clock = time.time_ns
    step = control.task.num_tasks
    span = step * BATCH
    counts = np.zeros(KEYS, dtype=np.int64)
    for batch in batches:
        keys, seq = batch.column(0).to_numpy(), batch.column(1).to_numpy()
        firsts = seq[seq % span < step]
        if len(firsts):
            now = clock()
            mark((s, now) for s in firsts.tolist())
        np.add.at(counts, keys, 1)
        control.rows_in += len(seq)
        pace(len(seq))
    stats = control.task.stats()
    stats.update(records_out=control.rows_out, records_in=control.rows_in,
                 max_out_pool_usage=control.max_out_pool)
    totals = {"stats": stats, "keys": int(np.count_nonzero(counts)),
              "records": int(counts.sum())}
    yield pa.RecordBatch.from_pydict({"totals": [json.dumps(totals)]})


class Sojourns:
    """On the driver: the records' sojourns (ns), from the marks the tasks
    report with each sample (:meth:`add`: emit and read marks joined by
    sequence number, whichever sample brings either).  An emit mark
    whose read never comes (the record was read before the consumer's
    sample, or is still in flight when the run ends) stays pending, at
    most ``max_pending`` of them (the oldest are dropped)."""

    def __init__(self, max_pending=1 << 20):
        self._emitted = {}
        self._read = {}
        self._max = max_pending

    def add(self, samples):
        """The sojourns (ns) that the marks of ``samples`` (every task's
        answer to one ``sample``) complete."""
        done = []
        for s in samples:
            for seq, t in s.get("emitted", ()):
                read = self._read.pop(seq, None)
                if read is None:
                    self._emitted[seq] = t
                else:
                    done.append(read - t)
            for seq, t in s.get("read", ()):
                emitted = self._emitted.pop(seq, None)
                if emitted is None:
                    self._read[seq] = t
                else:
                    done.append(t - emitted)
        for pending in (self._emitted, self._read):
            while len(pending) > self._max:
                del pending[next(iter(pending))]
        return done


# ---- on the driver --------------------------------------------------------------------

class Control:
    """The driver's end: accepts one connection per task and asks them."""

    def __init__(self, host, num_tasks):
        self.token = secrets.token_hex(16)
        self.server = socket.create_server((host, 0))
        self.server.settimeout(1.0)
        self.address = self.server.getsockname()[:2]
        self.num_tasks = num_tasks
        self.tasks = {}

    def accept(self, job, timeout=CONTROL_TIMEOUT):
        """Take every task's connection as it calls in; RunFailed if the
        ``job`` fails or ends first, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(self.tasks) < self.num_tasks:
            alive = job.is_alive()
            if job.error is not None:
                raise RunFailed.because("the Spark job failed before its tasks started",
                                        job.error)
            if not alive:
                raise RunFailed("the Spark job ended before its tasks started")
            if time.monotonic() > deadline:
                raise RunFailed(f"the demo's {self.num_tasks} tasks did not start within "
                                f"{timeout:g} s (they run as one barrier stage: each needs a "
                                "slot at the same time)")
            try:
                sock, _ = self.server.accept()
            except socket.timeout:
                continue
            sock.settimeout(10.0)
            f = sock.makefile("rw", encoding="utf-8", newline="\n")
            try:
                hello = json.loads(f.readline())
            except (OSError, ValueError):
                hello = None
            if not isinstance(hello, dict) or hello.get("hello") != self.token:
                f.close()
                sock.close()
                continue
            sock.settimeout(CONTROL_TIMEOUT)
            self.tasks[hello["task"]] = (sock, f)

    def ask(self, msg):
        """Send ``msg`` to every task; their answers, in task order."""
        out = []
        for index in sorted(self.tasks):
            _, f = self.tasks[index]
            f.write(json.dumps(msg) + "\n")
            f.flush()
        for index in sorted(self.tasks):
            line = self.tasks[index][1].readline()
            if not line:
                raise RunFailed(f"task {index} of the demo went away")
            out.append(json.loads(line))
        return out

    def close(self):
        """Close every task's connection and the server."""
        for sock, f in self.tasks.values():
            try:
                f.close()
                sock.close()
            except OSError:
                pass
        self.server.close()


class Job(threading.Thread):
    """A Spark action in a thread of its own (the driver steers meanwhile)."""

    def __init__(self, action):
        super().__init__(daemon=True, name="spark-demo-job")
        self._action = action
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self._action()
        except BaseException as exc:    # noqa: BLE001 - raised by the demo
            self.error = exc
