"""What the driver of an exchange reads of its Spark session: where the
driver is (:func:`driver_addresses`), the session's settings an exchange
takes by default (:func:`session_encryption`, :func:`session_port_retries`),
whether the master can run a barrier stage's tasks at once
(:func:`check_slots`), and the task attempt ids Spark has issued
(:func:`issued_task_ids`).

Each takes a SparkContext and asks its JVM (``sc._jsc``) where PySpark
has no public call for it; the settings are read from a SparkSession of
either kind too (Spark Connect's through ``spark.conf``); none starts
anything.
"""

import os
import socket
import time

from flinkbuf.errors import InsufficientSlotsError

__all__ = ["check_slots", "driver_addresses", "issued_task_ids", "session_encryption",
           "session_port_retries", "slots_message"]

_SLOT_POLL = 0.1
_DEFAULT_PORT_RETRIES = 16       # Spark's spark.port.maxRetries


def driver_addresses(sc):
    """``(bind, advertised)``: the host the driver binds its own servers to
    and the one its executors reach it at, as Spark knows them:
    ``spark.driver.bindAddress`` / ``spark.driver.host``, else the
    SparkContext's host (then ``SPARK_LOCAL_IP``, then the address of this
    host's name)."""
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


def _conf(sc):
    """The settings of ``sc`` (a SparkContext, or a SparkSession of either
    kind): anything with ``get(key, default)``."""
    return sc.getConf() if hasattr(sc, "getConf") else sc.conf


def session_port_retries(sc, port_retries):
    """``port_retries`` of an exchange as its tasks take it: as given, or,
    when None, the session's ``spark.port.maxRetries`` (16 by default).
    ``sc``: a SparkContext, or a SparkSession of either kind."""
    if port_retries is not None:
        return port_retries
    value = _conf(sc).get("spark.port.maxRetries", None) or str(_DEFAULT_PORT_RETRIES)
    try:
        return max(0, min(65535, int(str(value).strip())))
    except ValueError:
        return _DEFAULT_PORT_RETRIES


def session_encryption(sc, encryption):
    """``encryption`` of an exchange as its tasks take it: as given, or,
    when None, True if the Spark session encrypts its own traffic
    (``spark.network.crypto.enabled`` or ``spark.ssl.enabled``), else None
    (sealed between hosts only, as NetworkEnvironment does by default).
    ``sc``: a SparkContext, or a SparkSession of either kind."""
    if encryption is not None:
        return encryption
    conf = _conf(sc)
    for key in ("spark.network.crypto.enabled", "spark.ssl.enabled"):
        if str(conf.get(key, None) or "false").strip().lower() == "true":
            return True
    return None


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
    raise InsufficientSlotsError(slots_message(num_tasks, master, slots,
                                               sc.getConf().get("spark.task.cpus", "1"),
                                               fixed=fixed, waited=timeout))


def slots_message(num_tasks, master, slots, cpus, *, fixed, waited=None, num_partitions=False):
    """What an :class:`~flinkbuf.errors.InsufficientSlotsError` says: the
    exchange's ``num_tasks`` against the ``slots`` of ``master``
    (``cpus``: ``spark.task.cpus``; ``fixed``: a local master, whose slots
    no wait changes; ``waited``: the seconds waited for executors;
    ``num_partitions``: the exchange repartitions with ``num_partitions=``)."""
    cpus = str(cpus)
    per_task = "" if cpus == "1" else f" (spark.task.cpus={cpus} cores per task)"
    if fixed and str(master).startswith("local") and not str(master).startswith("local-"):
        more = f"a master such as local[{num_tasks * int(cpus) if cpus.isdigit() else num_tasks}]"
    else:
        more = "more executor cores or executors"
    plural = "" if slots == 1 else "s"
    fewer = "" if slots < 1 else (
        f", or num_partitions={slots} (the exchange repartitions first)" if num_partitions
        else f", or repartition the input to {slots} partition{plural} or fewer")
    after = "" if fixed or waited is None else f" after {waited:g} s"
    return (f"the exchange runs {num_tasks} tasks at once (a barrier stage, one task per input "
            f"partition) but master {master} has {slots} task slot{plural}{per_task}{after}: "
            f"use {more}{fewer}")


def issued_task_ids(sc):
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
