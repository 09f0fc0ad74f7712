"""The Spark session an exchange is made in, of either kind, as the
driver's side of an exchange reads it (:func:`session_of`):

* :class:`ClassicSession` -- a SparkContext in this process: the driver is
  here, and its JVM answers what PySpark has no call for
  (:mod:`flinkbuf.spark.driver`);
* :class:`ConnectSession` -- a Spark Connect client: the driver is the
  Connect server's, there is no SparkContext and no RDD, and everything is
  read from the session's settings (``spark.conf``).

Where the tasks of a Connect session can reach this client (its server runs
on this machine), the exchange's rendezvous and the live view are served
here, as on a classic driver; otherwise the tasks find each other through
``BarrierTaskContext.allGather``.
"""

import re

from flinkbuf.errors import InsufficientSlotsError
from flinkbuf.network.addresses import is_host_address, source_address
from flinkbuf.spark import driver

__all__ = ["ClassicSession", "ConnectSession", "is_connect", "master_slots", "session_of"]

_LOOPBACK_NAMES = ("localhost", "localhost.", "ip6-localhost")
_LOCAL = re.compile(r"local(?:\[\s*([0-9]+|\*)\s*(?:,\s*[0-9]+\s*)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*[0-9]+\s*\]")
_CONNECT_NAME = ("pyspark.sql.connect.", "pyspark.sql.connect")


def is_connect(obj):
    """Whether ``obj`` belongs to Spark Connect (a Connect SparkSession,
    DataFrame, ...), told from its type without importing PySpark."""
    return type(obj).__module__.startswith(_CONNECT_NAME)


def is_alive(spark):
    """Whether ``spark`` (a SparkContext, or a session of either kind) can
    still run jobs: a stopped SparkContext has no ``_jsc``, a closed Connect
    client says so.  Never raises."""
    if is_connect(spark):
        client = getattr(spark, "client", None)
        return client is not None and not getattr(client, "is_closed", True)
    sc = getattr(spark, "sparkContext", spark)
    return getattr(sc, "_jsc", None) is not None


def _true(value):
    return str(value).strip().lower() == "true"


def _int(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def master_slots(master, conf, cpus=None):
    """The task slots the settings of a session on ``master`` give a
    stage at once, where they tell (None where the cluster decides):
    ``local`` 1, ``local[N]`` N, ``local[*]`` ``cpus`` (None: unknown),
    ``local-cluster[W,C,M]`` W x C, else static executors
    (``spark.executor.instances`` x ``spark.executor.cores``, without
    dynamic allocation); each divided by ``spark.task.cpus``.  ``conf``:
    anything with ``get(key, default)``."""
    per_task = max(1, _int(conf.get("spark.task.cpus", None)) or 1)
    master = (master or "").strip()
    local, cluster = _LOCAL.fullmatch(master), _LOCAL_CLUSTER.fullmatch(master)
    if local:
        cores = 1 if local.group(1) is None else (
            cpus if local.group(1) == "*" else int(local.group(1)))
    elif cluster:
        cores = int(cluster.group(1)) * int(cluster.group(2))
    elif _true(conf.get("spark.dynamicAllocation.enabled", None)):
        cores = None
    else:
        instances = _int(conf.get("spark.executor.instances", None))
        each = _int(conf.get("spark.executor.cores", None))
        cores = instances * each if instances and each else None
    return None if cores is None else cores // per_task


class ClassicSession:
    """A session whose driver is this process (a SparkContext ``sc``)."""

    connect = False

    def __init__(self, sc):
        self.sc = sc
        self.key = sc        # what a session's live view is kept by, and its settings read from

    @property
    def master(self):
        return self.sc.master

    @property
    def conf(self):
        return self.sc.getConf()

    def alive(self):
        return is_alive(self.sc)

    def rendezvous(self, option):
        """The rendezvous the exchange uses (None: the driver's)."""
        return "driver" if option is None else option

    def check_slots(self, num_tasks, timeout):
        driver.check_slots(self.sc, num_tasks, timeout)

    def addresses(self, what="the exchange's rendezvous"):
        return driver.driver_addresses(self.sc)

    def issued_task_ids(self):
        return driver.issued_task_ids(self.sc)

    def watch(self, server, num_tasks, timeout, exchange_id):
        """Watch the exchange's stage attempts for lacking slots."""
        from flinkbuf.spark._slot_watch import SlotWatch

        SlotWatch.watch(self.sc, server, num_tasks, timeout)


class ConnectSession:
    """A Spark Connect session ``spark``: no SparkContext; its settings
    through ``spark.conf``, its server at ``server`` (``(host, port)``)."""

    connect = True

    def __init__(self, spark):
        self.spark = self.key = spark
        try:
            host, _, port = spark.client._builder.endpoint.rpartition(":")
        except AttributeError:             # another PySpark: its default port
            host, port = spark.client.host, ""
        self.server = (host.strip("[]"), int(port) if port.isdigit() else 15002)

    @property
    def conf(self):
        return self.spark.conf

    @property
    def master(self):
        return self.spark.conf.get("spark.master", None) or "(the Connect server's)"

    @property
    def local(self):
        """Whether the Connect server, and so the driver, runs on this
        machine (the executors of a local master run in it)."""
        host = self.server[0]
        return host in _LOOPBACK_NAMES or is_host_address(host)

    def alive(self):
        return is_alive(self.spark)

    def rendezvous(self, option):
        """None: this client's rendezvous when the server runs on this
        machine (its tasks reach this client), else ``allGather``."""
        if option is not None:
            return option
        return "driver" if self.local else "barrier"

    def cpus(self):
        """The CPUs of the server's machine (what ``local[*]`` gives), when
        it is this one; else None."""
        import os

        if not self.local:
            return None
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count()

    def slots(self):
        """The slots the master and settings give, where they tell."""
        return master_slots(self.master, self.conf, self.cpus())

    def check_slots(self, num_tasks, timeout):
        """InsufficientSlotsError at once when the master and settings
        give fewer slots than ``num_tasks``; where they do not tell, the
        exchange's job is watched instead (:mod:`~flinkbuf.spark._connect_watch`)."""
        slots = self.slots()
        if slots is not None and slots < num_tasks:
            raise InsufficientSlotsError(driver.slots_message(
                num_tasks, self.master, slots, self.conf.get("spark.task.cpus", None) or "1",
                fixed=True, num_partitions=True))

    def addresses(self, what="the exchange's rendezvous"):
        """``(bind, advertised)`` of a server of this client that the tasks
        reach: on the server's machine, the driver's address; else the
        address this machine reaches the server from (a client inside the
        cluster)."""
        conf = self.conf
        if self.local:
            host = conf.get("spark.driver.host", None) or "127.0.0.1"
            bind = conf.get("spark.driver.bindAddress", None) or host
            if is_host_address(bind.strip("[]")):
                return bind.strip("[]"), host.strip("[]")
            return "127.0.0.1", "127.0.0.1"
        source = source_address(self.server)
        if source is None:
            raise ValueError(f"{what}: this Spark Connect client has no route to its server "
                             f"{self.server[0]}, so its tasks cannot reach it here")
        return source, source

    def issued_task_ids(self):
        return None

    def watch(self, server, num_tasks, timeout, exchange_id):
        from flinkbuf.spark import _connect_watch

        _connect_watch.watch(self, exchange_id, num_tasks, timeout, server)


def session_of(spark):
    """The session of ``spark`` (a SparkSession of either kind, or a
    SparkContext); TypeError for anything else."""
    if is_connect(spark) and type(spark).__name__ == "SparkSession":
        return ConnectSession(spark)
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:                    # pragma: no cover - depends on the install
        raise ImportError("flinkbuf.spark needs PySpark: pip install 'flinkbuf[spark]'") \
            from None
    if isinstance(spark, SparkSession):
        return ClassicSession(spark.sparkContext)
    if isinstance(spark, SparkContext):
        return ClassicSession(spark)
    raise TypeError(f"spark must be a SparkSession (classic or Spark Connect) or a "
                    f"SparkContext, got {type(spark).__name__}")
