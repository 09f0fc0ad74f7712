"""The main demo on Spark: PySpark tasks exchange records through flinkbuf
under Flink's 2015 backpressure schedule, then the same keyed job runs
through flinkbuf and through Spark's own shuffle, side by side.

A PySpark job (local mode by default) of ``tasks`` barrier tasks runs
:func:`flinkbuf.spark.pipelined_exchange`: each task's producer thread
generates ``(key, i)`` records, hashed by key to the consumers, and each
task's consumer counts records per key.  Every task holds
``tasks * 2 + 1`` output buffers of ``segment_size`` bytes.  The driver
steers the tasks over a small control connection: the producers run at 60
% of full speed, the consumers are slowed to 30 %, released, slowed and
released (the blog post "How Apache Flink handles backpressure"); every
interval it prints both throughputs (the sum over the tasks, in % of full
speed) and the producers' backpressure level.  Full speed is measured
first, as in the in-process experiment: a fraction of the unthrottled
rate.

Then the keyed job itself (``records`` records, counted per key in the
consumer) runs unthrottled twice: through flinkbuf's pipelined exchange
and through Spark's shuffle (``partitionBy(tasks).mapPartitions``), and
both are printed side by side (records/s, time from the job's start to the
consumer's first record) with a check that they counted the same.

Each interval's backpressure level comes from the producers' back-pressured
time over exactly that interval (the difference of each writer's
cumulative counter between two samples; the highest over the tasks), so
the levels change with the phases.

While it runs, the driver serves a live view of the exchanges
(:func:`flinkbuf.spark.live_view`, on ``live_view``, ``"HOST:PORT"``:
loopback and any free port by default) and prints its URL: each task's
backpressure level, the bottleneck named, charts over time.

Outputs in ``out_dir``: ``spark-backpressure.csv`` (a row per interval, the
columns of the in-process experiment), ``spark-backpressure.json``
(configuration, rows, per-task metrics, the comparison, the checks), with
matplotlib ``spark-backpressure.png``, and, when the demo starts Spark
itself, ``spark-backpressure.log``: what Spark's JVM and its Python workers
print (Spark's log), kept off the terminal.
"""

import collections
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time

from flinkbuf.experiments import backpressure as _bp
from flinkbuf.experiments._throttle import Throttle
from flinkbuf.experiments.arguments import (
    MissingRequirementError,
    check_int,
    check_real,
    check_seconds,
    fail,
)
from flinkbuf.experiments.failures import RunFailed
from flinkbuf.experiments.output import (
    VERDICT,
    load_plotting,
    prepare_out_dir,
    write_table_and_doc,
)

NAME = "spark-backpressure"
LOG_FILE = f"{NAME}.log"
OUTPUT_FILES = (f"{NAME}.csv", f"{NAME}.json", f"{NAME}.png", LOG_FILE)
DEFAULT_SCHEDULE = _bp.DEFAULT_SCHEDULE
MAX_TASKS = 64
MAX_RECORDS = 10**9
MASTER_FORMS = ("local, local[N], local[*], local[N,F], local[*,F], local-cluster[W,C,M], "
                "spark://HOST:PORT[,HOST:PORT...], yarn or k8s://URL")
_BATCH = 128
_KEYS = 10_000
_CONTROL_TIMEOUT = 120.0        # seconds for the tasks to start and call in
_EXECUTORS_TIMEOUT = 120.0      # seconds for local-cluster's executors to register


# ---- in the tasks ----------------------------------------------------------------------

class _TaskControl:
    """One task's end of the control connection (in its Python worker): the
    throttles of its producer and consumer, and a thread that answers the
    driver."""

    def __init__(self, task, address, token):
        self.task = task
        self.producer = Throttle()
        self.consumer = Throttle()
        self.stop = threading.Event()
        self.max_out_pool = 0.0
        self.sock = socket.create_connection(address, timeout=_CONTROL_TIMEOUT)
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
                    self._send({"t_ns": time.monotonic_ns(),
                                "out": writer.num_records_out,
                                "in": self.task.gate.num_records_in,
                                "bp_ns": writer.back_pressured_time_ns,
                                "out_pool": snap["outPoolUsage"],
                                "in_pool": snap["inPoolUsage"]})
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


_CONTROL: "dict[str, _TaskControl]" = {}   # in a Python worker: the running task's control


class _Monitor:
    """The exchange's monitor: calls the driver from each task.  A class at
    module level, so that it travels by reference and shares this module's
    state in the worker with the source and the consumer."""

    def __init__(self, address, token):
        self.address = tuple(address)
        self.token = token

    def __call__(self, task):
        control = _TaskControl(task, self.address, self.token)
        _CONTROL["current"] = control

        def done():
            _CONTROL.pop("current", None)
            control.close()
        return done


def _paced_source(index, _):
    """A producer's records until the driver says stop, paced by its throttle."""
    control = _CONTROL["current"]
    pace, stop = control.producer.pace, control.stop
    i = index
    step = control.task.num_tasks
    while not stop.is_set():
        for _ in range(_BATCH):
            yield (i % _KEYS, i)
            i += step
        pace(_BATCH)


def _paced_count(records):
    """A consumer: counts per key, paced by its throttle; yields its totals."""
    control = _CONTROL["current"]
    pace = control.consumer.pace
    counts = collections.Counter()
    n = 0
    for key, _ in records:
        counts[key] += 1
        n += 1
        if n == _BATCH:
            pace(n)
            n = 0
    stats = control.task.stats()
    stats["max_out_pool_usage"] = control.max_out_pool
    yield {"stats": stats, "keys": len(counts), "records": sum(counts.values())}


def _keyed_source(count, num_tasks):
    def source(index, _):
        for i in range(index, count, num_tasks):
            yield (i % _KEYS, i)
    return source


def _count_per_key(records):
    """The keyed job's consumer: (first record's time, counts per key)."""
    first = None
    counts = collections.Counter()
    for key, _ in records:
        if first is None:
            first = time.time()
        counts[key] += 1
    yield (first, dict(counts))


# ---- on the driver --------------------------------------------------------------------

class _Control:
    """The driver's end: accepts one connection per task and asks them."""

    def __init__(self, host, num_tasks):
        self.token = secrets.token_hex(16)
        self.server = socket.create_server((host, 0))
        self.server.settimeout(1.0)
        self.address = self.server.getsockname()[:2]
        self.num_tasks = num_tasks
        self.tasks = {}

    def accept(self, job, timeout=_CONTROL_TIMEOUT):
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
            sock.settimeout(_CONTROL_TIMEOUT)
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
        for sock, f in self.tasks.values():
            try:
                f.close()
                sock.close()
            except OSError:
                pass
        self.server.close()


class _Job(threading.Thread):
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


# ---- checks ---------------------------------------------------------------------------

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


def check_arguments(phase_seconds, interval=0.5, tasks=2, records=1_000_000, segment_size=4096,
                    full_speed_fraction=0.25, master=None, *, live_view=None, names=None):
    """Raise :class:`ExperimentArgumentError` (a ``ValueError``) unless every
    argument of :func:`run_spark_demo` is in range, ``master`` (if
    given) a Spark master URL with a slot for each task where it says, and
    ``live_view`` (if given) ``"HOST:PORT"``."""
    if live_view is not None:
        check_live_view(live_view, names=names)
    check_real("interval", interval, ge=_bp.MIN_INTERVAL, le=10.0, names=names)
    check_seconds("phase_seconds", phase_seconds, names=names)
    if not phase_seconds >= interval:
        n = (names or {}).get
        fail(f"{n('phase_seconds', 'phase_seconds')} ({phase_seconds:g}) must be >= "
             f"{n('interval', 'interval')} ({interval:g})")
    _bp.check_settles(phase_seconds, interval, names=names)
    check_int("tasks", tasks, ge=1, le=MAX_TASKS, names=names)
    check_int("records", records, ge=1, le=MAX_RECORDS, names=names,
              why_low=" (the keyed job compares the counts of at least one record)")
    check_int("segment_size", segment_size, ge=64, le=1 << 20, names=names)
    check_real("full_speed_fraction", full_speed_fraction, ge=_bp.MIN_FULL_SPEED_FRACTION,
               le=1.0, names=names)
    if master is not None:
        check_slots(tasks, master, names=names)


def check_live_view(text, *, names=None):
    """``(host, port)`` of ``text``, the live view's ``"HOST:PORT"`` (port 0:
    any free one), else :class:`ExperimentArgumentError`."""
    name = (names or {}).get("live_view", "live_view")
    host, sep, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        fail(f"{name} must be HOST:PORT (port 0: any free one), got {text!r}")
    return host, int(port)


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


def check_environment(master="local[2]", *, names=None):
    """Before Spark starts: PySpark imports, a Java runtime recent enough for
    it is there, and this Spark runs ``master``'s kind of cluster.  Raises
    :class:`MissingRequirementError` (saying what to install) or
    :class:`ExperimentArgumentError`."""
    try:
        import pyspark
    except ImportError:
        raise MissingRequirementError(
            "PySpark is not installed: pip install 'flinkbuf[spark]'") from None
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


# ---- on the driver --------------------------------------------------------------------

def spark_session(master="local[2]", log_path=None):
    """A SparkSession for the demo: loopback addresses, no UI, executors
    running this interpreter, barrier settings that fail fast.  With
    ``log_path``, a JVM started here writes what it prints (Spark's log and
    its Python workers' output) to that file instead of the terminal.

    The session starts in a thread of its own, so that PySpark keeps the
    caller's SIGINT handler (in the main thread it installs one that calls
    into the JVM from the signal handler); a KeyboardInterrupt while it
    starts ends the JVM started here."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    host = os.environ["SPARK_LOCAL_IP"]
    conf = (SparkConf().setMaster(master).setAppName("flinkbuf-spark-demo")
            .set("spark.driver.host", host)
            .set("spark.driver.bindAddress", host)
            .set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false")
            .set("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
            .set("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
            .set("spark.barrier.sync.timeout", "120s"))
    launch = _Launch()
    if (log_path is not None and SparkContext._gateway is None
            and "PYSPARK_GATEWAY_PORT" not in os.environ):
        def start():
            return _session_logging_to(conf, log_path, launch)
    else:
        def start():
            return SparkSession.builder.config(conf=conf).getOrCreate()
    try:
        spark = _in_thread(start, "spark-demo-start")
        spark.sparkContext.setLogLevel("WARN" if log_path is not None else "ERROR")
    except BaseException:
        launch.abandon()
        raise
    return spark


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


def _wait_for_executors(sc, count, timeout=_EXECUTORS_TIMEOUT):
    """Until ``count`` executors registered (local-cluster starts them
    after the session; a barrier stage needs their slots at once)."""
    tracker = sc._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while len(tracker.getExecutorInfos()) - 1 < count:     # the driver is listed too
        if time.monotonic() > deadline:
            raise RunFailed(f"the {count} executors of {sc.master} did not register within "
                            f"{timeout:g} s")
        time.sleep(0.2)


def run_spark_demo(out_dir, phase_seconds=4.0, *, interval=0.5, tasks=2, records=1_000_000,
                   segment_size=4096, full_speed_fraction=0.25, schedule=DEFAULT_SCHEDULE,
                   spark=None, master="local[2]", plot=True, printer=print,
                   live_view="127.0.0.1:0"):
    """Run the demo and return its JSON document (``doc["checks"]["passed"]``
    says whether the expectations held).  ``spark``: a running SparkSession
    (its master needs ``tasks`` slots); else one is started on ``master``,
    its JVM's output going to ``out_dir/spark-backpressure.log``.
    Arguments, the master's slots, PySpark and Java are checked and
    ``out_dir`` made before anything runs; a failure once Spark runs raises
    :class:`~flinkbuf.experiments.failures.RunFailed`, its cause in one
    line."""
    own = spark is None
    check_arguments(phase_seconds, interval, tasks, records, segment_size, full_speed_fraction,
                    master if own else spark.sparkContext.master)
    if own:
        check_environment(master)
    prepare_out_dir(out_dir, OUTPUT_FILES)
    from flinkbuf.spark import pipelined_exchange

    log_path = os.path.join(out_dir, LOG_FILE) if own else None
    hint = f"Spark's log: {log_path}" if own else None
    started = time.monotonic()
    if own:
        printer(f"starting Spark ({master}; its log: {log_path}) ...")
        try:
            spark = spark_session(master, log_path)
        except Exception as exc:
            raise RunFailed.because("Spark did not start", exc, hint) from exc
    view = None
    try:
        sc = spark.sparkContext
        cluster = _LOCAL_CLUSTER.fullmatch(sc.master)
        if own and cluster:
            try:
                _wait_for_executors(sc, int(cluster.group(1)))
            except Exception as exc:
                raise RunFailed.because("Spark did not start", exc, hint) from exc
        printer(f"Spark {spark.version}, {sc.master}: {tasks} tasks exchange records through "
                f"flinkbuf ({tasks * 2 + 1} output buffers of {segment_size} bytes per task)")
        view = _start_live_view(sc, live_view, printer)
        host = sc.getConf().get("spark.driver.host", "127.0.0.1")
        control = _Control(host, tasks)
        job = None
        try:
            rdd = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(_paced_source)
            exchanged = pipelined_exchange(
                rdd, _paced_count, segment_size=segment_size, buffers_per_channel=2,
                floating_buffers=0, monitor=_Monitor(control.address, control.token),
                live_view=view if view is not None else False)
            job = _Job(exchanged.collect)
            job.start()
            control.accept(job)
            rows, unthrottled, full_rate = _steer(control, job, phase_seconds, interval,
                                                  schedule, full_speed_fraction, printer)
            control.ask({"cmd": "stop"})
            job.join(_CONTROL_TIMEOUT)
            if job.is_alive():
                raise RunFailed("the demo's Spark job did not end")
            if job.error is not None:
                raise RunFailed.because("the demo's Spark job failed", job.error)
        except Exception as exc:
            raise _failure(exc, job, hint) from exc
        finally:
            control.close()
        per_task = sorted((r["stats"] for r in job.result), key=lambda s: s["task"])
        _print_tasks(per_task, printer)
        try:
            comparison = compare_with_spark_shuffle(sc, records, tasks, segment_size, printer,
                                                    live_view=view if view is not None else False)
        except Exception as exc:
            raise RunFailed.because("the keyed job failed", exc, hint) from exc
        spark_master = sc.master
    finally:
        if view is not None:
            view.close()
        if own:
            _stop(spark)
    ticks = max(1, round(phase_seconds / interval))
    checks = _bp.check_backpressure(rows, interval, ticks)
    checks["same_counts"] = comparison["same_counts"]
    checks["passed"] = all(checks[k] is not False for k in (
        "consumer_slowed", "tracks_consumer", "returns_to_full_speed", "same_counts"))
    doc = {
        "experiment": NAME,
        "config": {
            "master": spark_master,
            "tasks": tasks,
            "phase_seconds": ticks * interval,
            "interval_seconds": interval,
            "schedule": [list(s) for s in schedule],
            "segment_size": segment_size,
            "buffers_per_task": tasks * 2 + 1,
            "full_speed_fraction": full_speed_fraction,
            "record": "(int, int), hashed by the first field, typed codec",
            "backpressure": "per interval: the producers' back-pressured time over exactly that "
                            "interval, the highest of the tasks",
        },
        "unthrottled_records_per_s": round(unthrottled),
        "full_speed_records_per_s": round(full_rate),
        "rows": rows,
        "tasks": per_task,
        "comparison": comparison,
        "checks": checks,
        "seconds": round(time.monotonic() - started, 1),
    }
    write_table_and_doc(out_dir, NAME, _bp.CSV_COLUMNS, rows, doc)
    drawn = False
    plotting = load_plotting(printer) if plot else None
    if plotting is not None:
        plotting.plot_backpressure(rows, doc, os.path.join(out_dir, f"{NAME}.png"))
        drawn = True
    _bp._print_summary(doc, printer, tasks=tasks)
    printer(f"wrote {os.path.join(out_dir, NAME + '.csv')}, {NAME}.json"
            + (f" and {NAME}.png" if drawn else ""))
    return doc


def _start_live_view(sc, address, printer):
    """The driver's live view of the demo's exchanges on ``address``
    (``"HOST:PORT"``; None: none), its URL printed."""
    if address is None:
        return None
    from flinkbuf.spark import LiveView
    from flinkbuf.spark.driver import driver_addresses

    host, port = check_live_view(address)
    bind, advertised = driver_addresses(sc)
    try:
        view = LiveView(host, port, report_host=bind, report_advertise=advertised)
    except OSError as exc:
        raise RunFailed(f"the live view did not start: {exc}") from exc
    printer(f"live view: {view.url}   (in a terminal: flinkbuf monitor {view.url})")
    return view


def _stop(spark):
    """Stop the session started here; a JVM that is gone already has
    nothing to stop (and the run's own error, if any, is the one to tell)."""
    try:
        spark.stop()
    except Exception:               # noqa: BLE001
        pass


def _failure(exc, job, hint, grace=5.0):
    """The RunFailed for ``exc`` raised while steering the tasks: the Spark
    job's own error when it has one (a task that fails drops its control
    connection first; its error reaches the job a moment later)."""
    if job is not None and job.error is None:
        job.join(grace)
    if job is not None and job.error is not None:
        return RunFailed.because("the demo's Spark job failed", job.error, hint)
    if isinstance(exc, RunFailed):
        return RunFailed(f"{exc} ({hint})") if hint else exc
    return RunFailed.because("the control connection to the demo's tasks failed", exc, hint)


def _sample(control):
    """(this moment, every task's counters)."""
    return time.perf_counter(), control.ask({"cmd": "sample"})


def _rates(prev, now):
    """Records/s out and in, summed over the tasks, between two samples."""
    (t0, before), (t1, after) = prev, now
    dt = t1 - t0
    produced = sum(s["out"] for s in after) - sum(s["out"] for s in before)
    consumed = sum(s["in"] for s in after) - sum(s["in"] for s in before)
    return produced / dt, consumed / dt


def interval_row(t_seconds, limits, prev, now, full_rate):
    """One interval's row from two samples of every task (``(time, [the
    counters of each task])``, the tasks in the same order in both): both
    throughputs summed over the tasks, and the producers' back-pressured
    ms per second over exactly this interval, from each task's cumulative
    back-pressured time (the highest of the tasks, whose level it gives)."""
    produced, consumed = _rates(prev, now)
    bp = max(_bp.ms_per_second(a["bp_ns"] - b["bp_ns"], a["t_ns"] - b["t_ns"])
             for b, a in zip(prev[1], now[1]))
    return {
        **_bp.schedule_row(t_seconds, limits, produced, consumed, bp, full_rate),
        "out_pool_usage": round(max(s["out_pool"] for s in now[1]), 3),
        "in_pool_usage": round(max(s["in_pool"] for s in now[1]), 3),
    }


def _steer(control, job, phase_seconds, interval, schedule, fraction, printer):
    """Calibrate, then run the schedule: a row (and a line) per interval."""
    n = control.num_tasks
    control.ask({"cmd": "limits", "producer": None, "consumer": None, "rate": None})
    start = time.perf_counter()
    _wait(job, start + interval)          # warm-up
    prev = _sample(control)
    samples = []
    for k in range(1, 5):
        _wait(job, start + (k + 1) * interval)
        now = _sample(control)
        samples.append(_rates(prev, now)[1])
        prev = now
    unthrottled = sorted(samples)[len(samples) // 4]
    if not unthrottled > 0:
        raise RunFailed("no records flowed between the tasks")
    full_rate = fraction * unthrottled
    printer(f"unthrottled: {unthrottled:,.0f} records/s over {n} tasks; full speed (100 %): "
            f"{full_rate:,.0f} records/s = {fraction:g} x unthrottled")
    printer(f"{'t [s]':>6} {'limits P/C [%]':>15} {'producers':>10} {'consumers':>10} "
            f"{'backpressure':>12} {'bp ms/s':>8} {'outPool':>7}")
    ticks = max(1, round(phase_seconds / interval))
    rows = []

    def limits(p, c):
        control.ask({"cmd": "limits", "producer": p, "consumer": None if c >= 100 else c,
                     "rate": full_rate / n})

    limits(*schedule[0])
    start = time.perf_counter()
    prev = _sample(control)
    for tick in range(1, ticks * len(schedule) + 1):
        phase = (tick - 1) // ticks
        _wait(job, start + tick * interval)
        now = _sample(control)
        row = interval_row(tick * interval, schedule[phase], prev, now, full_rate)
        prev = now
        rows.append(row)
        printer(f"{row['t_seconds']:6.1f} {row['producer_limit_pct']:>7g}/"
                f"{row['consumer_limit_pct']:<7g} {row['producer_pct']:9.1f}% "
                f"{row['consumer_pct']:9.1f}% {row['backpressure_level']:>12} "
                f"{row['producer_back_pressured_ms_per_s']:8.0f} {row['out_pool_usage']:7.2f}")
        if tick % ticks == 0 and tick < ticks * len(schedule):
            limits(*schedule[phase + 1])
    return rows, unthrottled, full_rate


def _wait(job, deadline):
    while True:
        if job.error is not None:
            raise RunFailed.because("the demo's Spark job failed", job.error)
        now = time.perf_counter()
        if now >= deadline:
            return
        time.sleep(min(0.01, deadline - now))


def _print_tasks(per_task, printer):
    printer("per task:")
    printer(f"{'task':>4} {'records out':>12} {'MB out':>8} {'records in':>11} {'MB in':>7} "
            f"{'backpressured s':>15} {'idle s':>7} {'max outPool':>11}")
    for s in per_task:
        printer(f"{s['task']:>4} {s['records_out']:>12,} {s['bytes_out'] / 1e6:8.1f} "
                f"{s['records_in']:>11,} {s['bytes_in'] / 1e6:7.1f} "
                f"{s['back_pressured_seconds']:15.2f} {s['idle_seconds']:7.2f} "
                f"{s['max_out_pool_usage']:11.2f}")


def compare_with_spark_shuffle(sc, records, tasks, segment_size=32768, printer=print, *,
                               live_view=None):
    """The keyed job (``records`` ``(key, i)`` records in ``tasks``
    partitions, counted per key in the consumer) through flinkbuf's
    pipelined exchange and through Spark's shuffle; prints both side by
    side and returns them.  ``same_counts``: both counted every record,
    and the same per key."""
    from flinkbuf.io import assign_key_to_operator
    from flinkbuf.spark import pipelined_exchange

    source = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(
        _keyed_source(records, tasks))
    runs = {}
    for name, make in (
            ("flinkbuf", lambda: pipelined_exchange(source, _count_per_key,
                                                    segment_size=max(segment_size, 32768),
                                                    live_view=live_view)),
            ("Spark shuffle", lambda: source.partitionBy(
                tasks, lambda k: assign_key_to_operator(k, tasks)).mapPartitions(
                    _count_per_key))):
        t0 = time.time()
        out = make().collect()
        took = time.time() - t0
        firsts = [f for f, _ in out if f is not None]
        counts = collections.Counter()
        for _, c in out:
            counts.update(c)
        runs[name] = {
            "seconds": round(took, 3),
            "records_per_s": round(records / took) if took > 0 else None,
            "first_record_seconds": round(min(firsts) - t0, 3) if firsts else None,
            "records": sum(counts.values()),
            "counts": counts,
        }
    f, s = runs["flinkbuf"], runs["Spark shuffle"]
    same = f["counts"] == s["counts"] and f["records"] == s["records"] == records > 0
    printer(f"the keyed job: {records:,} (int, int) records in {tasks} partitions, counted "
            f"per key in the consumer")
    printer(f"{'':>22} {'flinkbuf':>14} {'Spark shuffle':>14}")

    def rate(r):
        return "-" if r["records_per_s"] is None else f"{r['records_per_s']:,}"

    def first(r):
        return "-" if r["first_record_seconds"] is None else f"{r['first_record_seconds']:.3f}"
    printer(f"{'records/s':>22} {rate(f):>14} {rate(s):>14}")
    printer(f"{'seconds':>22} {f['seconds']:>14.2f} {s['seconds']:>14.2f}")
    printer(f"{'first record after s':>22} {first(f):>14} {first(s):>14}")
    printer(f"{'records counted':>22} {f['records']:>14,} {s['records']:>14,}")
    printer(f"same counts per key, every record counted: {VERDICT[same]}")
    for r in runs.values():
        del r["counts"]
    return {"records": records, "tasks": tasks, "runs": runs, "same_counts": same}
