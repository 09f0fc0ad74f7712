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
    task launched while the cluster has fewer slots than it has tasks is
    cancelled (with its job) once that has lasted the exchange's
    ``slots`` bound; when the slots come back in time, the attempt runs."""

    POLL = 0.5
    _lock = threading.Lock()
    # [weakref to RendezvousServer, sc, n, timeout, {(stage, attempt): since}]
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
