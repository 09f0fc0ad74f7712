"""The driver's watch over the stage attempts of its exchanges
(:class:`SlotWatch`)."""

import logging
import threading
import time
import weakref

_LOG = logging.getLogger("flinkbuf.spark")


class SlotWatch:
    """The driver's watch over the stage attempts of its exchanges: a
    barrier stage retried after a host or an executor was lost waits for
    all of its slots at once, and Spark checks the slots only when a job
    is submitted, so the attempt would wait forever.  One thread (while any
    rendezvous is open) looks every ``POLL`` seconds at the stages whose
    tasks registered with an open rendezvous: one that Spark runs with no
    task launched (an attempt waiting for its slots) for the exchange's
    ``slots`` bound, counted from the first look that found it so, is
    cancelled (with its job) once the cluster has fewer slots than it has
    tasks; when its tasks start in time, the clock stops.  So a stage
    retried because a peer stalled (a host that stopped answering keeps
    its slots until Spark declares its executor lost) is cancelled as soon
    as that executor is lost, if it has waited that long already."""

    POLL = 0.5
    _lock = threading.Lock()
    # [weakref to RendezvousServer, sc, n, timeout, {stage: waiting since}]
    _watched: list[list] = []
    _thread = None

    @classmethod
    def watch(cls, sc, server, n, timeout):
        """Watch the stages whose ``n`` tasks register with ``server``
        (a RendezvousServer of SparkContext ``sc``) while it is open, and
        cancel an attempt that lacks its slots for ``timeout`` seconds."""
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
            # Waiting for its slots, since this stage was first seen so
            # (whichever attempt: losing an executor may start another).
            waiting.add(stage)
            start = since.setdefault(stage, now)
            jsc = sc._jsc.sc()
            slots = jsc.maxNumConcurrentTasks(
                jsc.resourceProfileManager().defaultResourceProfile())
            if slots >= info.numTasks() or now - start < timeout:
                continue
            since.pop(stage, None)
            reason = (f"flinkbuf: attempt {info.currentAttemptId()} of stage {stage}, a barrier "
                      f"stage of an exchange, needs {info.numTasks()} task slots at once and the "
                      f"cluster has {slots} (a host or an executor was lost): the stage has "
                      f"waited for them longer than its timeout ({timeout:g} s), and Spark "
                      f"would wait forever. Add executors or cores, or give the exchange a "
                      f"longer timeout to wait for the lost ones to come back")
            _LOG.error("%s", reason)
            jsc.cancelStage(stage, reason)
        for key in list(since):
            if key not in waiting:
                del since[key]
