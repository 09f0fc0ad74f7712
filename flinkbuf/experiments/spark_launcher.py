"""Starting Spark for the Spark demo, the benchmarks and the tests: what a
master URL gives a barrier stage (:func:`master_slots`, :func:`check_slots`,
checked before Spark starts), the Java runtime Spark needs
(:func:`check_environment`), a session on a JVM started here
(:func:`spark_session`: its output in a log file, Ctrl-C while it starts
ending the JVM) and its executors registered (:func:`wait_for_executors`).

PySpark is imported only by the functions that start Spark.
"""

import os
import re
import shutil
import subprocess
import sys
import threading
import time

from flinkbuf.experiments.arguments import MissingRequirementError, fail
from flinkbuf.experiments.failures import RunFailed

MASTER_FORMS = ("local, local[N], local[*], local[N,F], local[*,F], local-cluster[W,C,M], "
                "spark://HOST:PORT[,HOST:PORT...], yarn or k8s://URL")
EXECUTORS_TIMEOUT = 120.0       # seconds for a cluster's executors to register
BARRIER_SYNC_TIMEOUT = "120s"   # spark.barrier.sync.timeout: fail fast, not in a year


# ---- what a master URL gives -----------------------------------------------------------

_LOCAL_N = re.compile(r"local\[([0-9]+|\*)\]")
_LOCAL_N_FAILURES = re.compile(r"local\[([0-9]+|\*)\s*,\s*([0-9]+)\]")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*]")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.%\w]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


def _cpus():
    """The CPUs this process may run on (what ``local[*]`` gives)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def master_slots(master, *, names=None):
    """The slots a Spark ``master`` URL gives a stage at once, where the URL
    says it (``local`` 1, ``local[N]`` N, ``local[*]`` this machine's CPUs,
    ``local[N,F]``, ``local-cluster[W,C,M]`` W x C), or None where the
    cluster decides (``spark://``, ``yarn``, ``k8s://``, ``mesos://``).
    Raises :class:`ExperimentArgumentError` for anything else."""
    name = (names or {}).get("master", "master")
    if not isinstance(master, str):
        fail(f"{name} must be a Spark master URL, got {master!r}")
    m = _LOCAL_N.fullmatch(master) or _LOCAL_N_FAILURES.fullmatch(master)
    if master == "local":
        return 1
    if m:
        if m.group(1) == "*":
            return _cpus()
        if int(m.group(1)) < 1:
            fail(f"{name} {master} runs no task: N in local[N] must be >= 1")
        return int(m.group(1))
    m = _LOCAL_CLUSTER.fullmatch(master)
    if m:
        workers, cores, memory = (int(g) for g in m.groups())
        if workers < 1 or cores < 1 or memory < 1:
            fail(f"{name} {master}: W workers, C cores each and M MiB each must all be >= 1")
        return workers * cores
    if master.startswith("spark://"):
        hosts = master[len("spark://"):].split(",")
        if all(_HOST_PORT.fullmatch(h) and 0 < int(_HOST_PORT.fullmatch(h).group(1)) < 65536
               for h in hosts):
            return None
        fail(f"{name} {master}: a standalone master is spark://HOST:PORT (several: "
             "spark://HOST1:PORT1,HOST2:PORT2)")
    if master == "yarn":
        return None
    for scheme in ("k8s://", "mesos://"):
        if master.startswith(scheme):
            if len(master) > len(scheme):
                return None
            fail(f"{name} {master}: the cluster's address is missing after {scheme}")
    fail(f"{name} must be a Spark master URL ({MASTER_FORMS}), got {master!r}")


def _with_slots(master, slots):
    """``master`` of the same form, with ``slots`` slots."""
    m = _LOCAL_N_FAILURES.fullmatch(master)
    if m:
        return f"local[{slots},{m.group(2)}]"
    m = _LOCAL_CLUSTER.fullmatch(master)
    if m:
        cores = int(m.group(2))
        return f"local-cluster[{-(-slots // cores)},{cores},{m.group(3)}]"
    return f"local[{slots}]"


def check_slots(tasks, master, *, names=None):
    """``master`` has a slot for each of ``tasks`` tasks at once (the demo's
    tasks are one barrier stage), where its URL tells; else the message
    says what to set."""
    slots = master_slots(master, names=names)
    if slots is None or tasks <= slots:
        return
    n = (names or {}).get
    why = ""
    if _LOCAL_CLUSTER.fullmatch(master):
        m = _LOCAL_CLUSTER.fullmatch(master)
        workers, cores = int(m.group(1)), int(m.group(2))
        why = (f" ({workers} worker{'s' if workers > 1 else ''} x {cores} "
               f"core{'s' if cores > 1 else ''})")
    elif "*" in master:
        why = " (the CPUs of this machine)"
    fail(f"{n('tasks', 'tasks')} {tasks} needs {tasks} slots at once but "
         f"{n('master', 'master')} {master} has {slots}{why}: use {n('master', 'master')} "
         f"{_with_slots(master, tasks)} or {n('tasks', 'tasks')} {slots}")


def executors_of(master):
    """The executors a ``local-cluster[W,C,M]`` master starts (W), or None
    for any other master (whose executors are there, or the cluster's)."""
    m = _LOCAL_CLUSTER.fullmatch(master)
    return int(m.group(1)) if m else None


# ---- Java ------------------------------------------------------------------------------

def _major(version):
    m = re.match(r"(\d+)", version)
    return int(m.group(1)) if m else 0


def _install_java(need):
    return (f"install Java {need} or later (on Debian and Ubuntu: apt-get install "
            f"openjdk-{max(need, 17)}-jre-headless)")


def java_command(need=17):
    """The java Spark's launch scripts run: ``$JAVA_HOME/bin/java`` when
    JAVA_HOME is set, else ``java`` on PATH.  Raises
    :class:`MissingRequirementError` if it is not there (saying to install
    Java ``need`` or later)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if os.path.isfile(java) and os.access(java, os.X_OK):
            return java
        raise MissingRequirementError(
            f"JAVA_HOME is set to {home}, which has no bin/java (Spark runs $JAVA_HOME/bin/java):"
            " set JAVA_HOME to a Java runtime, or unset it to use the java on PATH")
    java = shutil.which("java")
    if java is None:
        raise MissingRequirementError(
            f"no Java runtime (no java on PATH, JAVA_HOME not set): Spark needs one; "
            f"{_install_java(need)}")
    return java


def java_version(java, need=17):
    """The major version ``java -version`` reports (8 for 1.8), or None if
    it says none.  Raises :class:`MissingRequirementError` if it does not
    run."""
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise MissingRequirementError(f"{java} does not run ({exc}): "
                                      f"{_install_java(need)}") from None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if proc.returncode != 0 or m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_environment(master="local[2]", *, connect=False, names=None):
    """Before Spark starts: PySpark imports (with ``connect``, so do the
    packages of its Spark Connect client), a Java runtime recent enough for
    it is there, and this Spark runs ``master``'s kind of cluster.  Raises
    :class:`MissingRequirementError` (saying what to install) or
    :class:`ExperimentArgumentError`."""
    try:
        import pyspark
    except ImportError:
        raise MissingRequirementError(
            "PySpark is not installed: pip install 'flinkbuf[spark]'") from None
    if connect:
        _check_connect_client()
    spark4 = _major(pyspark.__version__) >= 4
    if master.startswith("mesos://") and spark4:
        fail(f"{(names or {}).get('master', 'master')} {master}: Spark {pyspark.__version__} "
             "has no Mesos support (Spark 4 removed it)")
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return                      # a JVM is running already (pyspark shell, spark-submit)
    need = 17 if spark4 else 8
    java = java_command(need)
    have = java_version(java, need)
    if have is not None and have < need:
        raise MissingRequirementError(
            f"Spark {pyspark.__version__} needs Java {need} or later, but {java} is Java {have}:"
            f" {_install_java(need)} and set JAVA_HOME to it")


def _check_connect_client():
    """The packages of PySpark's Spark Connect client are there, in the
    versions it needs (it checks them when imported)."""
    try:
        import pyspark.sql.connect  # noqa: F401
    except ImportError as exc:
        raise MissingRequirementError(
            f"the Spark Connect client's packages are missing ({exc}): "
            "pip install 'flinkbuf[spark]'") from None


# ---- the session -----------------------------------------------------------------------

def spark_session(master="local[2]", log_path=None, *, app="flinkbuf-spark-demo", host=None,
                  conf=None, log_level=None):
    """A SparkSession on ``master`` named ``app``: the driver on ``host``
    (default: ``SPARK_LOCAL_IP``, set to 127.0.0.1 when unset), no UI,
    executors running this interpreter (``PYSPARK_PYTHON``, set to it
    unless set), barrier settings that fail fast; ``conf``: more settings,
    or other values for these.  With ``log_path``, a JVM started here
    writes what it prints (Spark's log and its Python workers' output) to
    that file instead of the terminal.  Spark's ``log_level`` is by default
    WARN with a log file, else ERROR.

    The session starts in a thread of its own, so that PySpark keeps the
    caller's SIGINT handler (in the main thread it installs one that calls
    into the JVM from the signal handler); a KeyboardInterrupt while it
    starts ends the JVM started here."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    host = host or os.environ["SPARK_LOCAL_IP"]
    settings = {"spark.driver.host": host,
                "spark.driver.bindAddress": host,
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
                "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
                "spark.barrier.sync.timeout": BARRIER_SYNC_TIMEOUT,
                **(conf or {})}
    spark_conf = SparkConf().setMaster(master).setAppName(app).setAll(settings.items())
    launch = _Launch()
    if (log_path is not None and SparkContext._gateway is None
            and "PYSPARK_GATEWAY_PORT" not in os.environ):
        def start():
            return _session_logging_to(spark_conf, log_path, launch)
    else:
        def start():
            return SparkSession.builder.config(conf=spark_conf).getOrCreate()
    if log_level is None:
        log_level = "WARN" if log_path is not None else "ERROR"
    try:
        spark = _in_thread(start, "flinkbuf-spark-start")
        spark.sparkContext.setLogLevel(log_level)
    except BaseException:
        launch.abandon()
        raise
    return spark


CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def is_connect(spark):
    """Whether ``spark`` is a Spark Connect session (or another object of
    its client, a DataFrame say), told from its type."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_session(master="local[2]", log_path=None, *, app="flinkbuf-spark-demo", conf=None,
                    log_level=None):
    """``(classic, connect)``: a session started here as :func:`spark_session`
    starts one, serving Spark Connect on loopback (a free port, a token
    made here), and a Spark Connect session of this process on it (one
    driver, both kinds of session).  Stop ``connect`` and then
    ``classic``."""
    import secrets
    import socket

    from pyspark.sql.connect.session import SparkSession as ConnectSparkSession

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = secrets.token_hex(16)
    classic = spark_session(master, log_path, app=app, log_level=log_level, conf={
        "spark.plugins": CONNECT_PLUGIN, "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.authenticate.token": token, **(conf or {})})
    try:
        connect = ConnectSparkSession.builder.remote(
            f"sc://localhost:{port}/;token={token}").getOrCreate()
    except BaseException:
        stop(classic)
        raise
    return classic, connect


def _in_thread(fn, name):
    """``fn()`` run in a thread of its own; its result, or its exception
    raised here.  This thread waits in slices, so Ctrl-C interrupts it."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:    # noqa: BLE001 - raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if "error" in box:
        raise box["error"]
    return box["result"]


class _Launch:
    """The JVM processes a session start launched: ended if the start is
    abandoned (even one that is launched after that)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs = []
        self._abandoned = False

    def started(self, proc):
        with self._lock:
            self._procs.append(proc)
            abandoned = self._abandoned
        if abandoned:
            _end_process(proc)

    def abandon(self):
        with self._lock:
            self._abandoned = True
            procs = list(self._procs)
        for proc in procs:
            _end_process(proc)


def _end_process(proc, grace=10.0):
    """Terminate ``proc`` (a JVM runs its shutdown hooks then: Spark removes
    its temporary files), killing it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _session_logging_to(conf, log_path, launch):
    """A session on a JVM started here, its standard output and error in
    ``log_path``; ``launch`` learns the JVM's process."""
    from pyspark import SparkContext
    from pyspark import java_gateway
    from pyspark.sql import SparkSession

    popen = java_gateway.Popen

    class _Recorded(popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            launch.started(self)

    java_gateway.Popen = _Recorded          # the only way to learn the process early
    try:
        with open(log_path, "wb") as log:
            gateway = java_gateway.launch_gateway(conf, popen_kwargs={"stdout": log,
                                                                      "stderr": log})
    finally:
        java_gateway.Popen = popen
    try:
        return SparkSession(SparkContext(conf=conf, gateway=gateway))
    except BaseException:
        if SparkContext._gateway is gateway:
            SparkContext._gateway = SparkContext._jvm = None
        try:
            gateway.shutdown()
        except Exception:           # noqa: BLE001 - the JVM may be gone already
            pass
        launch.abandon()
        raise


def wait_for_executors(sc, count, timeout=EXECUTORS_TIMEOUT):
    """Until ``count`` executors registered with SparkContext ``sc`` (a
    cluster starts them after the session; a barrier stage needs their
    slots at once); :class:`~flinkbuf.experiments.failures.RunFailed` after
    ``timeout`` seconds."""
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while len(tracker.getExecutorInfos()) - 1 < count:     # the driver is listed too
        if time.monotonic() > deadline:
            raise RunFailed(f"the {count} executors of {sc.master} did not register within "
                            f"{timeout:g} s")
        time.sleep(0.2)


def stop(spark):
    """Stop a session started here; a JVM that is gone already has nothing
    to stop (and the run's own error, if any, is the one to tell)."""
    try:
        spark.stop()
    except Exception:               # noqa: BLE001
        pass
