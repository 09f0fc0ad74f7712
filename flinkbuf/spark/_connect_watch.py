"""The client's watch over the jobs of its exchanges on a Spark Connect
session (:func:`watch`): there is no SparkContext to ask for slots, and a
barrier stage that lacks them makes Spark repeat its slot check for up to
ten minutes.

Once a session has an exchange, its client tags every operation whose plan
holds an exchange (its tasks' code carries the exchange's id) with the
exchange's own tag, and watches it while it runs: when, for the exchange's
``timeout``, the operation has shown no running task and the exchange's
tasks have not started (no stage of its tasks in the server's progress
reports, no registration at this client's rendezvous), the client
interrupts the tag (``interruptTag``) and the action raises
:class:`~flinkbuf.errors.InsufficientSlotsError` naming what to set.
"""

import collections
import logging
import re
import threading
import time

from flinkbuf.errors import InsufficientSlotsError

_LOG = logging.getLogger("flinkbuf.spark")
_ID = re.compile(rb"flinkbuf-exchange-[0-9a-f]{16}")
_POLL = 0.2
_KEEP = 1024                 # exchanges remembered per process (the newest)
# How Spark's own barrier slot check says that it failed.
_SPARK_CHECK = ("BarrierJobSlotsNumberCheckFailed", "SPARK-24819")

_lock = threading.Lock()
_exchanges: "collections.OrderedDict[str, Watched]" = collections.OrderedDict()
_operations: "dict[str, Operation]" = {}


class Watched:
    """An exchange of a Connect session: its ``tag``, its ``num_tasks``,
    its ``timeout``, its rendezvous ``server`` on this client (None: the
    tasks use ``allGather``) and what the settings say of the slots."""

    def __init__(self, exchange_id, num_tasks, timeout, server, master, slots):
        self.exchange_id = exchange_id
        self.tag = exchange_id
        self.num_tasks = num_tasks
        self.timeout = timeout
        self.server = server
        self.master = master
        self.slots = slots

    def started(self, stages):
        """Whether its tasks have started: registered at the rendezvous,
        or a stage of its tasks in a progress report (Spark submits a
        barrier stage once it has every slot)."""
        if self.server is not None and self.server.stages():
            return True
        return any(s.num_tasks == self.num_tasks for s in stages)

    def reason(self, checked=False):
        """What the InsufficientSlotsError says (``checked``: Spark's own
        slot check failed first)."""
        slots = "" if self.slots is None else f", which has {self.slots} task slots"
        n = self.num_tasks
        what = "could not start (Spark's barrier slot check failed)" if checked else \
            f"did not start within its timeout ({self.timeout:g} s)"
        return (f"the exchange's {n} tasks {what}: a barrier stage needs a task slot for "
                f"each of its tasks at once, and master {self.master}{slots} did not offer "
                f"them. Give the session {n} slots (a master such as local[{n}], or more executors or "
                f"spark.executor.cores), or fewer tasks (num_partitions=), or a longer "
                f"timeout while its executors start")


def watch(session, exchange_id, num_tasks, timeout, server):
    """Watch the operations of Connect ``session`` that run exchange
    ``exchange_id`` (``num_tasks`` tasks, ``server``: its rendezvous on
    this client or None)."""
    entry = Watched(exchange_id, num_tasks, timeout, server, session.master, session.slots())
    with _lock:
        _exchanges[exchange_id] = entry
        while len(_exchanges) > _KEEP:
            _exchanges.popitem(last=False)
    _install(session.spark.client)


def _install(client):
    """Make ``client`` tag and watch the operations that run an exchange
    (once per client)."""
    if getattr(client, "_flinkbuf_watched", False):
        return
    original = getattr(client, "_execute_and_fetch_as_iterator", None)
    if original is None:             # pragma: no cover - another PySpark
        _LOG.warning("flinkbuf: this PySpark's Connect client cannot be watched: an exchange "
                     "that lacks slots waits as long as Spark's own barrier check")
        return

    def execute(req, observations, *args, **kwargs):
        return _execute(client, original, req, observations, *args, **kwargs)

    client._execute_and_fetch_as_iterator = execute
    client.register_progress_handler(_progress)
    client._flinkbuf_watched = True


def _found(req):
    """The watched exchanges whose tasks' code is in request ``req``."""
    try:
        data = req.plan.SerializeToString()
    except Exception:                  # noqa: BLE001 - no plan: nothing to watch
        return []
    ids = {m.decode() for m in _ID.findall(data)}
    with _lock:
        return [_exchanges[i] for i in sorted(ids) if i in _exchanges]


def _execute(client, original, req, observations, *args, **kwargs):
    found = _found(req) if req.operation_id else []
    if not found:
        yield from original(req, observations, *args, **kwargs)
        return
    for entry in found:
        if entry.tag not in req.tags:
            req.tags.append(entry.tag)
    operation = Operation(client, req.operation_id, found)
    try:
        yield from original(req, observations, *args, **kwargs)
    except Exception as exc:
        if operation.fired is not None:
            raise InsufficientSlotsError(operation.fired.reason()) from exc
        if any(sign in str(exc) for sign in _SPARK_CHECK):
            raise InsufficientSlotsError(found[0].reason(checked=True)) from exc
        raise
    finally:
        operation.stop()


def _progress(stages, inflight_tasks, operation_id, done):
    """The session's progress handler: what the server reports of a
    watched operation."""
    operation = _operations.get(operation_id)
    if operation is not None:
        operation.progress(list(stages or ()), inflight_tasks)


class Operation:
    """One watched operation (its thread checks every ``_POLL`` seconds)."""

    def __init__(self, client, operation_id, watched):
        self.client, self.operation_id, self.watched = client, operation_id, watched
        self.active = time.monotonic()      # last sign of a running task
        self.stages = []
        self.fired = None
        self._stop = threading.Event()
        _operations[operation_id] = self
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="flinkbuf-connect-slot-watch")
        self._thread.start()

    def progress(self, stages, inflight_tasks):
        self.stages = stages
        if inflight_tasks > 0:
            self.active = time.monotonic()

    def stop(self):
        self._stop.set()
        _operations.pop(self.operation_id, None)

    def _run(self):
        waiting = list(self.watched)
        while waiting and not self._stop.wait(_POLL):
            waiting = [w for w in waiting if not w.started(self.stages)]
            late = [w for w in waiting if time.monotonic() - self.active >= w.timeout]
            if late:
                self.fired = late[0]
                _LOG.error("flinkbuf: %s", self.fired.reason())
                try:
                    self.client.interrupt_tag(self.fired.tag)
                except Exception:          # noqa: BLE001 - the session is going away
                    _LOG.debug("flinkbuf: interrupting %s", self.fired.tag, exc_info=True)
                return
