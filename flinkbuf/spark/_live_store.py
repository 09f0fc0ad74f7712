"""What a live view knows: the exchanges that report to it, each task's
latest report and recent history, and the readings made from them (the
backpressure level, the bottleneck); the JSON document and the
Prometheus exposition it serves.  Thread-safe: the report server writes,
the page's requests read."""

import collections
import threading
import time

from flinkbuf.io.metrics import LOW_THRESHOLD, OK_THRESHOLD
from flinkbuf.spark import _prometheus

DOC_VERSION = 1
HISTORY = 240                  # samples kept per task (two minutes at 0.5 s)
MAX_EXCHANGES = 32             # exchanges kept; past it the oldest that ended goes
MAX_ATTEMPTS = 4               # attempts kept per task index
# A task is busy consuming (a candidate bottleneck) when its consumer waits
# for input less than this many ms per second.
BUSY_IDLE_MS = 500.0
RUNNING, FINISHED, FAILED, CANCELED, LOST = "RUNNING", "FINISHED", "FAILED", "CANCELED", "LOST"
STATES = (RUNNING, FINISHED, FAILED, CANCELED, LOST)
# Flink's web UI colours of the backpressure levels.
LEVEL_COLOURS = {"OK": "#52c41a", "LOW": "#faad14", "HIGH": "#f5222d"}

# The metrics a task's history keeps (and the page can chart), in order
# (a sample holds None where its report did: a size before debloating's
# first sample, say).
HISTORY_FIELDS = (
    "backPressuredTimeMsPerSecond", "idleTimeMsPerSecond", "busyTimeMsPerSecond",
    "numRecordsInPerSecond", "numRecordsOutPerSecond", "numBytesInPerSecond",
    "numBytesOutPerSecond", "outPoolUsage", "inPoolUsage", "inputExclusiveBuffersUsage",
    "inputFloatingBuffersUsage", "softBackPressuredTimeMsPerSecond",
    "hardBackPressuredTimeMsPerSecond", "producerBusyTimeMsPerSecond",
    "producerIdleTimeMsPerSecond", "consumerBusyTimeMsPerSecond", "debloatedBufferSize",
    "estimatedTimeToConsumeBuffersMs", "inFlightBytes",
)

# /metrics: (metric name, Prometheus type, help) of each task's metric,
# Flink's names and, in Flink's style, flinkbuf's own, from its latest
# report (a metric the report has as None, none).
FLINK_METRICS = (
    ("busyTimeMsPerSecond", "gauge",
     "Time busy (neither idle nor backpressured), ms per s, as Flink computes it: the "
     "producer and the consumer counted as one thread."),
    ("backPressuredTimeMsPerSecond", "gauge",
     "Time the producer was blocked on output (backpressured), ms per s: soft + hard."),
    ("softBackPressuredTimeMsPerSecond", "gauge",
     "Time the producer waited while its output was unavailable but its pool had buffers "
     "(a channel at its cap, every channel's backlog full, room for an event), ms per s."),
    ("hardBackPressuredTimeMsPerSecond", "gauge",
     "Time the producer was blocked requesting an output buffer, ms per s."),
    ("idleTimeMsPerSecond", "gauge", "Time the consumer waited for input, ms per s."),
    ("producerBusyTimeMsPerSecond", "gauge",
     "Time the producer was busy (neither idle nor backpressured), ms per s."),
    ("producerIdleTimeMsPerSecond", "gauge",
     "Time the producer had nothing to write (not started yet, or done), ms per s."),
    ("consumerBusyTimeMsPerSecond", "gauge", "Time the consumer was busy, ms per s."),
    ("consumerIdleTimeMsPerSecond", "gauge", "Time the consumer waited for input, ms per s."),
    ("numRecordsInPerSecond", "gauge", "Records read per second."),
    ("numRecordsOutPerSecond", "gauge", "Records written per second."),
    ("numBytesInPerSecond", "gauge", "Bytes read per second."),
    ("numBytesOutPerSecond", "gauge", "Bytes written per second."),
    ("numRecordsIn", "counter", "Records read since the task started."),
    ("numRecordsOut", "counter", "Records written since the task started."),
    ("numBytesIn", "counter", "Bytes read since the task started."),
    ("numBytesOut", "counter", "Bytes written since the task started."),
    ("numBuffersIn", "counter", "Buffers read since the task started."),
    ("numBuffersOut", "counter", "Buffers written since the task started."),
    ("outPoolUsage", "gauge", "Output buffers in use / the output pool's size."),
    ("inPoolUsage", "gauge", "Input buffers in use / the input pools' size."),
    ("inputExclusiveBuffersUsage", "gauge", "Exclusive input buffers in use / all of them."),
    ("inputFloatingBuffersUsage", "gauge", "Floating input buffers in use / all of them."),
    ("backPressureRatio", "gauge",
     "Backpressured time / the window (Flink's ratio: OK <= 0.1 < LOW <= 0.5 < HIGH)."),
    ("debloatedBufferSize", "gauge",
     "Buffer debloating: the largest buffer size the task's gates announced, bytes."),
    ("estimatedTimeToConsumeBuffersMs", "gauge",
     "Buffer debloating: the longest time a gate takes to consume its buffers in flight, ms."),
    ("inFlightBytes", "gauge", "Buffer debloating: bytes in flight to the task's gates."),
    ("debloatGivenBackSegments", "gauge",
     "Buffer debloating: segments given back to the NetworkBufferPool."),
    ("debloatGivenBackBytes", "gauge",
     "Buffer debloating: bytes given back to the NetworkBufferPool."),
)
# /metrics, per input gate that debloats (label "gate"): (name, type, help).
GATE_METRICS = (
    ("debloatedBufferSize", "gauge", "The buffer size the gate announced, bytes."),
    ("estimatedTimeToConsumeBuffersMs", "gauge",
     "Time to consume the gate's buffers in flight at its last throughput, ms."),
    ("buffersInUse", "gauge", "Buffers in flight to the gate at its last sample."),
    ("inFlightBytes", "gauge", "Bytes in flight to the gate."),
    ("debloatGivenBackSegments", "gauge",
     "Segments the gate's channels gave back to the NetworkBufferPool."),
)
PREFIX = "flinkbuf_task_"


def _now():
    return time.monotonic()


class _Task:
    def __init__(self, hello, peer, now):
        self.index = hello["task"]
        self.attempt = hello["attempt"]
        self.attempt_number = hello["attempt_number"]
        self.stage = hello["stage"]
        self.address = hello["address"]
        self.peer = peer
        self.state = RUNNING
        self.error = None
        self.since = now
        self.updated = now
        self.elapsed = 0.0
        self.cpu = 0.0
        self.metrics = None
        self.stats = None
        self.backlogs = [0] * hello["num_tasks"]
        self.reports = 0
        self.history = collections.deque(maxlen=HISTORY)


class _Exchange:
    def __init__(self, exchange_id, name, num_tasks, now, wall):
        self.id = exchange_id
        self.name = name
        self.num_tasks = num_tasks
        self.created = now
        self.created_wall = wall
        self.tasks = {}              # (index, attempt) -> _Task

    def latest(self):
        """The newest attempt of each task index, by index."""
        newest = {}
        for (index, _), task in self.tasks.items():
            if index not in newest or task.since >= newest[index].since:
                newest[index] = task
        return [newest[i] for i in sorted(newest)]

    def state(self):
        tasks = self.latest()
        if not tasks:
            return "WAITING"
        states = {t.state for t in tasks}
        if RUNNING in states:
            return RUNNING
        if states == {FINISHED} and len(tasks) == self.num_tasks:
            return FINISHED
        if states <= {FINISHED}:
            return RUNNING            # tasks still to come
        return FAILED if FAILED in states or LOST in states else CANCELED


def bottlenecks(tasks):
    """Flink's reading of its backpressure tab, over the running tasks of
    one exchange (every task feeds every task: each writes to all the
    consumers): a task is a bottleneck when its consumer is busy (it
    waits for input less than half the time, and has input: records
    arrive or buffers wait for it) while tasks that feed it are
    backpressured (LOW or HIGH).  Returns ``[(task, why, feeders)]``,
    the busiest first."""
    running = [t for t in tasks if t.state == RUNNING and t.metrics is not None]
    feeders = [t for t in running if t.metrics["backPressureLevel"] != "OK"]
    if not feeders:
        return []
    found = []
    for t in running:
        m = t.metrics
        has_input = m["numRecordsInPerSecond"] > 0 or m["inPoolUsage"] > 0
        if m["idleTimeMsPerSecond"] < BUSY_IDLE_MS and has_input:
            names = ", ".join(f"task {f.index} {f.metrics['backPressureLevel']}"
                              for f in feeders)
            why = (f"its consumer waits for input only {m['idleTimeMsPerSecond']:.0f} ms/s "
                   f"(input buffers {m['inPoolUsage']:.0%} in use) while the tasks feeding it "
                   f"are backpressured: {names}")
            found.append((t, why, feeders))
    found.sort(key=lambda item: (item[0].metrics["idleTimeMsPerSecond"], item[0].index))
    return found


class Store:
    """The live view's state.  ``interval``: seconds between a task's
    reports."""

    def __init__(self, interval):
        self.interval = interval
        self._lock = threading.Lock()
        self._exchanges = collections.OrderedDict()
        self._seq = 0
        self._start = _now()
        self.refused_hellos = 0

    # ---- written by the report server --------------------------------------------------

    def register(self, exchange_id, name, num_tasks):
        """An exchange made on the driver that will report here."""
        with self._lock:
            if exchange_id not in self._exchanges:
                self._exchanges[exchange_id] = _Exchange(exchange_id, name, num_tasks, _now(),
                                                         time.time())
            self._prune()

    def _prune(self):
        while len(self._exchanges) > MAX_EXCHANGES:
            ended = [e for e in self._exchanges.values() if e.state() not in (RUNNING,)]
            victim = (ended or list(self._exchanges.values()))[0]
            del self._exchanges[victim.id]

    def hello(self, doc, peer):
        """A task says who it is: its key, or why it is refused (a str)."""
        with self._lock:
            exchange = self._exchanges.get(doc["exchange"])
            if exchange is None:
                self.refused_hellos += 1
                return f"exchange {doc['exchange']!r} does not report to this view"
            if doc["num_tasks"] != exchange.num_tasks:
                self.refused_hellos += 1
                return (f"task {doc['task']} of {doc['num_tasks']}: exchange "
                        f"{exchange.id} has {exchange.num_tasks} tasks")
            key = (doc["task"], doc["attempt"])
            if key in exchange.tasks:
                self.refused_hellos += 1
                return f"task {doc['task']} attempt {doc['attempt']} reported already"
            attempts = sorted((t for (i, _), t in exchange.tasks.items() if i == doc["task"]),
                              key=lambda t: t.since)
            for old in attempts[:max(0, len(attempts) - MAX_ATTEMPTS + 1)]:
                del exchange.tasks[(old.index, old.attempt)]
            exchange.tasks[key] = _Task(doc, peer, _now() - self._start)
            return (exchange.id,) + key

    def report(self, key, doc):
        """A task's report (or its last one, ``doc["type"] == "end"``)."""
        with self._lock:
            task = self._task(key)
            if task is None or task.state != RUNNING:
                return
            now = _now() - self._start
            task.updated = now
            task.elapsed = doc["elapsed"]
            task.cpu = doc["cpu"]
            task.metrics = doc["metrics"]
            task.stats = doc["stats"]
            task.backlogs = doc["backlogs"]
            task.reports += 1
            self._seq += 1
            m = doc["metrics"]
            task.history.append((self._seq, round(now, 3))
                                + tuple(m[f] for f in HISTORY_FIELDS))
            if doc["type"] == "end":
                task.state = doc["state"]
                task.error = doc["error"]

    def lost(self, key, why):
        """A task's reports ended without its last one."""
        with self._lock:
            task = self._task(key)
            if task is not None and task.state == RUNNING:
                task.state = LOST
                task.error = why
                task.updated = _now() - self._start

    def _task(self, key):
        exchange = self._exchanges.get(key[0])
        return None if exchange is None else exchange.tasks.get(key[1:])

    # ---- read by the page ------------------------------------------------------------------

    def document(self, since=0, extra=None):
        """The JSON document: every exchange and task, and the history
        samples after ``since`` (a ``seq`` of an earlier document)."""
        with self._lock:
            now = _now() - self._start
            exchanges = []
            history = {}
            for exchange in reversed(self._exchanges.values()):
                latest = exchange.latest()
                found = bottlenecks(latest)
                named = {t.index for t, _, _ in found}
                tasks = []
                for task in sorted(exchange.tasks.values(), key=lambda t: (t.index, t.since)):
                    is_latest = any(task is t for t in latest)
                    tasks.append(self._task_doc(task, now, is_latest,
                                                is_latest and task.index in named))
                    samples = [list(s) for s in task.history if s[0] > since]
                    if samples:
                        history[f"{exchange.id}|{task.index}|{task.attempt}"] = samples
                exchanges.append({
                    "id": exchange.id, "name": exchange.name, "num_tasks": exchange.num_tasks,
                    "created": exchange.created_wall, "state": exchange.state(),
                    "bottleneck": [{"task": t.index, "attempt": t.attempt, "why": why,
                                    "feeders": [f.index for f in feeders]}
                                   for t, why, feeders in found],
                    "tasks": tasks,
                })
            doc = {
                "flinkbuf_live_view": DOC_VERSION,
                "now": round(now, 3),
                "interval": self.interval,
                "thresholds": {"OK": OK_THRESHOLD, "LOW": LOW_THRESHOLD},
                "colours": dict(LEVEL_COLOURS),
                "seq": self._seq,
                "exchanges": exchanges,
                "history": {"fields": list(HISTORY_FIELDS), "since": since,
                            "samples": history},
            }
        if extra:
            doc.update(extra)
        return doc

    @staticmethod
    def _task_doc(task, now, latest, bottleneck):
        return {
            "task": task.index, "attempt": task.attempt, "attempt_number": task.attempt_number,
            "stage": task.stage, "address": task.address, "state": task.state,
            "error": task.error, "latest": latest, "bottleneck": bottleneck,
            "since": round(task.since, 3), "updated": round(task.updated, 3),
            "age": round(max(0.0, now - task.updated), 3), "elapsed": task.elapsed,
            "reports": task.reports, "report_cpu_seconds": task.cpu,
            "metrics": None if task.metrics is None else dict(task.metrics),
            "stats": None if task.stats is None else dict(task.stats),
            "backlogs": list(task.backlogs),
        }

    def prometheus(self, refused=0):
        """The Prometheus exposition of every task's latest report:
        ``flinkbuf_task_<Flink's name>`` with labels ``exchange``,
        ``task`` (the index) and ``attempt`` (Spark's task attempt id),
        ``flinkbuf_task_gate_<name>`` of each gate that debloats (label
        ``gate`` too), and what Flink has no name for: the level, the
        state, whether the task is named a bottleneck, whether it still
        reports."""
        rows = []
        with self._lock:
            for exchange in self._exchanges.values():
                named = {t.index for t, _, _ in bottlenecks(exchange.latest())}
                latest = exchange.latest()
                for task in sorted(exchange.tasks.values(), key=lambda t: (t.index, t.since)):
                    labels = {"exchange": exchange.id, "task": str(task.index),
                              "attempt": str(task.attempt)}
                    is_latest = any(task is t for t in latest)
                    rows.append((labels, task.state, task.metrics,
                                 is_latest and task.index in named))
        families = []
        for name, kind, help_text in FLINK_METRICS:
            families.append((PREFIX + name, kind, help_text,
                             [(labels, m[name]) for labels, _, m, _ in rows
                              if m is not None and m[name] is not None]))
        for name, kind, help_text in GATE_METRICS:
            families.append((PREFIX + "gate_" + name, kind, help_text,
                             [(dict(labels, gate=str(g["gate"])), g[name])
                              for labels, _, m, _ in rows if m is not None
                              for g in m["inputGates"]
                              if g["bufferDebloat"] and g[name] is not None]))
        families.append((PREFIX + "backPressureLevel", "gauge",
                         "1 for the task's backpressure level (Flink's OK, LOW or HIGH), "
                         "0 for the others.",
                         [(dict(labels, level=level), int(m["backPressureLevel"] == level))
                          for labels, _, m, _ in rows if m is not None
                          for level in LEVEL_COLOURS]))
        families.append((PREFIX + "state", "gauge",
                         "1 for the task's state (RUNNING, FINISHED, FAILED, CANCELED or LOST: "
                         "its reports ended without a last one), 0 for the others.",
                         [(dict(labels, state=state), int(s == state))
                          for labels, s, _, _ in rows for state in STATES]))
        families.append((PREFIX + "bottleneck", "gauge",
                         "1 if the task is named a bottleneck: its consumer is busy while "
                         "tasks feeding it are backpressured.",
                         [(labels, int(b)) for labels, _, _, b in rows]))
        families.append(("flinkbuf_live_reports_refused", "counter",
                         "Report connections and messages the view refused (not authenticated, "
                         "malformed, or from an exchange it does not know).",
                         [({}, refused)]))
        return _prometheus.format_families(families)
