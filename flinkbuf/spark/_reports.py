"""What the tasks of an exchange tell the driver's live view while they run
(:mod:`flinkbuf.spark.live`): the messages, their strict decoding, and
the task's side (:class:`Reporter`, a thread per task).

A task connects to the view's report server on the driver, proves the
view's secret with flinkbuf's handshake (HMAC-SHA256 over fresh nonces in
both directions, as the exchange's rendezvous does), and then sends
messages, each a 4-byte big-endian length and that many bytes of UTF-8
JSON (an object):

``hello``   once: which task this is (exchange id, task index, number of
            tasks, Spark's task attempt id and attempt number, stage id,
            the address its peers read from);
``report``  every ``interval`` seconds: the task's metrics
            (:class:`~flinkbuf.TaskMetrics`'s snapshot, Flink's names; a
            message that would be too long goes without the in-flight
            bytes per channel of its gates), its
            totals (:meth:`~flinkbuf.spark.ExchangeTask.stats`), the backlog
            of each of its subpartitions and the CPU seconds its reporter
            thread used;
``end``     once, last: the same, and how the task ended (FINISHED,
            FAILED with its error in one line, or CANCELED).

Nothing travels back.  :func:`decode` accepts exactly these messages and
raises ``ValueError`` for anything else (a size, a type, a number out of
range, a missing or unknown field), so the server can drop a peer that
sends one without harming anybody else.
"""

import json
import logging
import math
import os
import socket
import struct
import threading
import time

from flinkbuf.errors import RemoteConnectionError
from flinkbuf.io.metrics import HIGH, LOW, OK
from flinkbuf.network import handshake

_LOG = logging.getLogger("flinkbuf.spark")
VERSION = 1
LENGTH = struct.Struct(">I")
MAX_MESSAGE = 64 * 1024       # bytes of one message's JSON
MAX_TASKS = 4096              # tasks of one exchange the view follows
MAX_ERROR = 500               # characters of an error's line
MAX_GATES = 64                # input gates of one task in a report
SEGMENT_SIZE = 0              # the handshake's segment-size field: unused here
_MAX_INT = 2 ** 63 - 1
_CONNECT_TIMEOUT = 5.0        # seconds, at most, to reach the driver and to send
_STOP_TIMEOUT = 15.0          # seconds stop() waits for the thread (bounded by the above)

LEVELS = (OK, LOW, HIGH)
END_STATES = ("FINISHED", "FAILED", "CANCELED")

# The fields of a report's "metrics" (a TaskMetrics snapshot without its
# "task") and what each holds: "count" an int >= 0, "seconds", "millis" and
# "rate" a number >= 0, "ms" a number in [0, 1000], "ratio" one in [0, 1],
# "level" OK, LOW or HIGH, "flag" a bool, "gates" a list of at most
# MAX_GATES objects of GATE's fields, "channels" a list of at most MAX_TASKS
# counts; a kind ending in "?" may also be None.
METRICS = {
    "intervalSeconds": "seconds",
    "backPressuredTimeMsPerSecond": "ms",
    "softBackPressuredTimeMsPerSecond": "ms",
    "hardBackPressuredTimeMsPerSecond": "ms",
    "idleTimeMsPerSecond": "ms",
    "busyTimeMsPerSecond": "ms",
    "producerBusyTimeMsPerSecond": "ms",
    "producerIdleTimeMsPerSecond": "ms",
    "consumerBusyTimeMsPerSecond": "ms",
    "consumerIdleTimeMsPerSecond": "ms",
    "backPressureRatio": "ratio",
    "backPressureLevel": "level",
    "outPoolUsage": "ratio",
    "inPoolUsage": "ratio",
    "numRecordsIn": "count",
    "numBytesIn": "count",
    "numBuffersIn": "count",
    "numRecordsOut": "count",
    "numBytesOut": "count",
    "numBuffersOut": "count",
    "numRecordsInPerSecond": "rate",
    "numBytesInPerSecond": "rate",
    "numRecordsOutPerSecond": "rate",
    "numBytesOutPerSecond": "rate",
    "inputExclusiveBuffersUsage": "ratio",
    "inputFloatingBuffersUsage": "ratio",
    "numBytesInRemote": "count",
    "numBuffersInRemote": "count",
    "debloatedBufferSize": "count?",
    "estimatedTimeToConsumeBuffersMs": "millis?",
    "inFlightBytes": "count?",
    "debloatGivenBackSegments": "count",
    "debloatGivenBackBytes": "count",
    "inputGates": "gates",
}
# The fields of each of "metrics"' "inputGates" (TaskMetrics' InputGateMetrics).
GATE = {
    "gate": "count",
    "bufferDebloat": "flag",
    "debloatedBufferSize": "count?",
    "estimatedTimeToConsumeBuffersMs": "millis?",
    "buffersInUse": "count?",
    "inFlightBytes": "count?",
    "inFlightBytesPerChannel": "channels",
    "debloatGivenBackSegments": "count",
}
# The fields of a report's "stats" (ExchangeTask.stats() without "task").
STATS = {
    "records_out": "count",
    "bytes_out": "count",
    "records_in": "count",
    "bytes_in": "count",
    "back_pressured_seconds": "seconds",
    "idle_seconds": "seconds",
    "out_pool_in_use": "count",
    "out_pool_size": "count",
    "first_record_seconds": "seconds?",
}
HELLO = {
    "type": "type",
    "version": "version",
    "exchange": "name",
    "task": "index",
    "num_tasks": "num_tasks",
    "attempt": "count",
    "attempt_number": "count",
    "stage": "count",
    "address": "address",
}
REPORT = {
    "type": "type",
    "seq": "count",
    "elapsed": "seconds",
    "cpu": "seconds",
    "metrics": "metrics",
    "stats": "stats",
    "backlogs": "backlogs",
}
END = dict(REPORT, state="state", error="error?")
SCHEMAS = {"hello": HELLO, "report": REPORT, "end": END}


def _number(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} must be finite")
    if not 0 <= value <= _MAX_INT:
        raise ValueError(f"{what} is out of range")
    return value


def _text(value, what, longest, *, empty=False):
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > longest or (not value and not empty):
        raise ValueError(f"{what} must have 1 to {longest} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} holds control characters")
    return value


def _value(kind, value, what, num_tasks):
    """``value`` checked as ``kind`` (see the tables above)."""
    if kind.endswith("?"):
        if value is None:
            return None
        kind = kind[:-1]
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{what} must be an integer, got {type(value).__name__}")
        return _number(value, what)
    if kind in ("seconds", "rate", "millis"):
        return float(_number(value, what))
    if kind == "ms":
        value = float(_number(value, what))
        if value > 1000.0:
            raise ValueError(f"{what} must be at most 1000 ms per second")
        return value
    if kind == "ratio":
        value = float(_number(value, what))
        if value > 1.0:
            raise ValueError(f"{what} must be at most 1")
        return value
    if kind == "flag":
        if not isinstance(value, bool):
            raise ValueError(f"{what} must be true or false, got {type(value).__name__}")
        return value
    if kind in ("gates", "channels"):
        return _list(kind, value, what, num_tasks)
    if kind == "level":
        if value not in LEVELS:
            raise ValueError(f"{what} must be one of {', '.join(LEVELS)}")
        return value
    if kind == "state":
        if value not in END_STATES:
            raise ValueError(f"{what} must be one of {', '.join(END_STATES)}")
        return value
    if kind == "version":
        if value != VERSION:
            raise ValueError(f"protocol version {value!r}, this side speaks {VERSION}")
        return value
    if kind == "name":
        return _text(value, what, 128)
    if kind == "address":
        return _text(value, what, 300)
    if kind == "error":
        return _text(value, what, MAX_ERROR, empty=True)
    if kind == "num_tasks":
        value = _value("count", value, what, num_tasks)
        if not 1 <= value <= MAX_TASKS:
            raise ValueError(f"{what} must be in [1, {MAX_TASKS}]")
        return value
    if kind == "index":
        return _value("count", value, what, num_tasks)
    if kind == "metrics":
        return _fields(value, METRICS, what, num_tasks)
    if kind == "stats":
        return _fields(value, STATS, what, num_tasks)
    if kind == "backlogs":
        if not isinstance(value, list) or len(value) != num_tasks:
            raise ValueError(f"{what} must be a list of {num_tasks} integers")
        return [_value("count", v, what, num_tasks) for v in value]
    raise AssertionError(kind)       # pragma: no cover - the tables name known kinds


def _list(kind, value, what, num_tasks):
    """A "gates" or a "channels" list, checked item by item."""
    longest = MAX_GATES if kind == "gates" else MAX_TASKS
    if not isinstance(value, list) or len(value) > longest:
        raise ValueError(f"{what} must be a list of at most {longest} items")
    if kind == "gates":
        return [_fields(v, GATE, f"{what}[{i}]", num_tasks) for i, v in enumerate(value)]
    return [_value("count", v, what, num_tasks) for v in value]


def _fields(doc, schema, what, num_tasks):
    if not isinstance(doc, dict):
        raise ValueError(f"{what} must be an object, got {type(doc).__name__}")
    missing = [k for k in schema if k not in doc]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(sorted(missing))}")
    unknown = [k for k in doc if k not in schema]
    if unknown:
        raise ValueError(f"{what} has unknown fields")
    return {k: doc[k] if kind == "type" else _value(kind, doc[k], f"{what}.{k}", num_tasks)
            for k, kind in schema.items()}


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def decode(body, num_tasks=None):
    """The message in ``body`` (bytes: one message's JSON, without its
    length) as a dict, checked field by field.  ``num_tasks``: None until
    the hello came (then only a hello is accepted), afterwards the task's
    number of tasks (then a report or an end).  Raises ValueError for
    anything else, saying what."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"a message is bytes, got {type(body).__name__}")
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(body)} bytes (at most {MAX_MESSAGE})")
    try:
        doc = json.loads(bytes(body).decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise ValueError(f"not a JSON message: {type(exc).__name__}") from None
    if not isinstance(doc, dict):
        raise ValueError("a message must be a JSON object")
    kind = doc.get("type")
    if num_tasks is None:
        if kind != "hello":
            raise ValueError("the first message must be a hello")
        doc = _fields(doc, HELLO, "hello", None)
        if doc["task"] >= doc["num_tasks"]:
            raise ValueError(f"hello.task {doc['task']} of {doc['num_tasks']} tasks")
        return doc
    if kind not in ("report", "end"):
        raise ValueError("a message must be a report or an end")
    return _fields(doc, SCHEMAS[kind], kind, num_tasks)


def encode(doc):
    """``doc`` as one message: its length and its JSON (non-finite numbers
    are refused: the reporter sends finite ones only)."""
    body = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(body) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(body)} bytes (at most {MAX_MESSAGE})")
    return LENGTH.pack(len(body)) + body


# ---- in the task ------------------------------------------------------------------------

def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return 0.0
    return value


def _one_line(exc):
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR else line[:MAX_ERROR - 3] + "..."


def end_state(failed):
    """(state, error line) of a task that ended with ``failed`` (None: it
    finished)."""
    if failed is None:
        return "FINISHED", None
    if isinstance(failed, (GeneratorExit, KeyboardInterrupt)):
        return "CANCELED", None
    return "FAILED", _one_line(failed)


class Target:
    """Where the tasks of one exchange report: the view's report server
    ``(host, port)``, its ``secret``, the ``exchange`` id, every
    ``interval`` seconds (picklable: it travels to the tasks in the
    stage's closure)."""

    def __init__(self, address, secret, exchange, num_tasks, interval):
        self.address = tuple(address)
        self.secret = secret
        self.exchange = exchange
        self.num_tasks = num_tasks
        self.interval = interval

    def start(self, task, ctx):
        """A :class:`Reporter` for ``task`` (an ExchangeTask) in the task
        whose BarrierTaskContext is ``ctx``, or None if it cannot start
        (logged: the exchange runs on without reports)."""
        try:
            hello = {"type": "hello", "version": VERSION, "exchange": self.exchange,
                     "task": task.index, "num_tasks": task.num_tasks,
                     "attempt": int(ctx.taskAttemptId()),
                     "attempt_number": int(ctx.attemptNumber()),
                     "stage": int(ctx.stageId()), "address": task.address}
            return Reporter(self, task, hello)
        except Exception as exc:           # noqa: BLE001 - reports are optional
            _LOG.warning("flinkbuf live view: task %s does not report: %s", task.index, exc)
            return None


def stop(reporter, failed):
    """Stop ``reporter`` (None: nothing to stop) as its task ends with
    ``failed`` (None: it finished); never raises."""
    if reporter is not None:
        try:
            reporter.stop(failed)
        except Exception:                  # noqa: BLE001 - reports are optional
            pass


class Reporter:
    """The task's side: a thread (``flinkbuf-live-report-<index>``) that
    connects to ``target``, proves its secret, sends ``hello`` and then a
    report every ``target.interval`` seconds until :meth:`stop`, which
    sends the last one (with how the task ended) and ends the thread.  A
    driver that cannot be reached, refuses the connection or goes away
    ends the reports (logged once), never the task.  ``task`` needs
    ``metrics.snapshot()``, ``stats()``, ``partition.backlogs()`` and
    ``index``."""

    def __init__(self, target, task, hello):
        self._target = target
        self._task = task
        self._hello = hello
        self._stopping = threading.Event()
        self._end = None
        self._seq = 0
        self._started = time.monotonic()
        self.sent = 0                      # reports sent, the last one included
        self.error = None                  # why the reports ended early, if they did
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"flinkbuf-live-report-{task.index}")
        self._thread.start()

    def _message(self, end):
        task = self._task
        metrics = dict(task.metrics.snapshot())
        metrics.pop("task", None)
        stats = dict(task.stats())
        stats.pop("task", None)
        try:
            backlogs = list(task.partition.backlogs())
        except Exception:                  # noqa: BLE001 - a released partition
            backlogs = [0] * self._hello["num_tasks"]
        doc = {"type": "report", "seq": self._seq,
               "elapsed": max(0.0, time.monotonic() - self._started),
               "cpu": time.thread_time(),
               "metrics": {k: _finite(v) for k, v in metrics.items()},
               "stats": {k: _finite(v) for k, v in stats.items()},
               "backlogs": backlogs}
        self._seq += 1
        if end is not None:
            doc["type"] = "end"
            doc["state"], doc["error"] = end
        try:
            return encode(doc)
        except ValueError:
            # Too long (a gate of thousands of channels): without the per-channel bytes.
            doc["metrics"]["inputGates"] = [dict(g, inFlightBytesPerChannel=[])
                                            for g in doc["metrics"]["inputGates"]]
            return encode(doc)

    def _run(self):
        sock = None
        timeout = min(_CONNECT_TIMEOUT, self._target.interval * 10 + 1.0)
        try:
            sock = socket.create_connection(self._target.address, timeout=_CONNECT_TIMEOUT)
            handshake.client(sock, self._target.secret, self._hello["address"],
                             SEGMENT_SIZE, _CONNECT_TIMEOUT)
            sock.settimeout(timeout)
            sock.sendall(encode(self._hello))
            while not self._stopping.wait(self._target.interval):
                sock.sendall(self._message(None))
                self.sent += 1
            sock.sendall(self._message(self._end))
            self.sent += 1
        except (OSError, RemoteConnectionError, ValueError) as exc:
            self.error = exc
            host, port = self._target.address
            _LOG.warning("flinkbuf live view: task %s stopped reporting to %s:%s: %s",
                         self._task.index, host, port, exc)
        finally:
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_WR)   # the end, after the last report
                except OSError:
                    pass
                sock.close()

    def stop(self, failed=None):
        """The task ended (``failed``: its exception, None if it
        finished): send the last report and end the thread (within a few
        seconds: every send and the connection have a timeout)."""
        if self._end is None:
            self._end = end_state(failed)
        self._stopping.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(_STOP_TIMEOUT)

    @property
    def alive(self):
        return self._thread.is_alive()

    def __repr__(self):
        return (f"<flinkbuf live report of task {self._hello['task']} to "
                f"{self._target.address[0]}:{self._target.address[1]} pid {os.getpid()}>")
