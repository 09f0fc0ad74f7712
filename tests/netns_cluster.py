"""A Spark standalone cluster of simulated hosts, for the multi-host tests:
Linux network namespaces joined by a bridge, each host with an address of
its own, a master and the driver on the first, a worker on each of the
others (``spark-class`` of the pip-installed PySpark), and the driver
program (``netns_driver.py``) run inside the first namespace, steered by
the test through a pipe.

Layout (``SUBNET`` 10.231.0.0/24 on the bridge; nothing is routed out of
the namespaces, and the bridge sits in a namespace of its own, so no
traffic touches this machine's own network)::

    h0   10.231.0.1   master, driver
    h1   10.231.0.2   worker
    h2   10.231.0.3   worker
    nat  10.231.0.9   a router: forwards and masquerades for 10.231.1.0/24
    h3   10.231.1.2   behind nat (its worker is started on demand)

The hosts on the bridge route 10.231.1.0/24 through ``nat``, which
masquerades what h3 sends: the driver sees h3's connections come from
10.231.0.9, an address that is not h3's own (as behind a NAT or with
several interfaces).

A worker may run as on a host that sets no ``SPARK_LOCAL_IP`` and whose
name resolves to a loopback address (``start_worker(..., name_ip=...)``):
``ip netns exec`` puts ``/etc/netns/<namespace>/hosts`` in the place of
``/etc/hosts`` for what it runs, and the harness writes one there mapping
this machine's name to that address (127.0.1.1, as on Debian); the
namespaces share the machine's host name.

Every process runs in a process group of its own; :meth:`Cluster.kill_host`
kills every process of a namespace (``ip netns pids``), :meth:`Cluster.close`
every process of every namespace and deletes the namespaces.  Namespace
names carry this process's id, so that a later run removes what a killed
run left behind.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
SUBNET = "10.231.0"
PRIVATE = "10.231.1"
ADDRESSES = {"h0": f"{SUBNET}.1", "h1": f"{SUBNET}.2", "h2": f"{SUBNET}.3",
             "nat": f"{SUBNET}.9", "h3": f"{PRIVATE}.2"}
MASTER_PORT = 7077
WORKER_PORT = 7080
# The driver's pinned ports (spark.driver.port, spark.blockManager.port).
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
_PREFIX = "fbmh"
NETNS_ETC = "/etc/netns"     # where `ip netns exec` finds a namespace's own /etc files
_DIE = 10.0                 # seconds for the processes of a namespace to go


class HarnessError(RuntimeError):
    """The cluster could not be set up or steered."""


def _run(*argv, check=True, timeout=20):
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise HarnessError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def unavailable():
    """Why namespaces cannot be made here (a reason to skip), or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"{_PREFIX}{os.getpid()}probe"
    try:
        r = _run("ip", "netns", "add", name, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` failed: {exc}"
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _run("ip", "netns", "del", name, check=False)
    return None


def _pids(ns):
    r = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_namespace(ns):
    """SIGKILL every process in namespace ``ns``; True once none is left."""
    deadline = time.monotonic() + _DIE
    while True:
        pids = _pids(ns)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def remove_stale():
    """Delete the namespaces of earlier runs whose process is gone."""
    r = _run("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = re.match(rf"{_PREFIX}(\d+)", name)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue                       # its run is still going
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_namespace(name)
        _run("ip", "netns", "del", name, check=False)
        shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def spark_home():
    import pyspark
    return os.path.dirname(pyspark.__file__)


class Driver:
    """The driver program in h0: each :meth:`call` runs a function of
    ``netns_driver`` there and returns its result (JSON), or raises
    :class:`DriverError` with the error it raised."""

    def __init__(self, proc, replies, log):
        self.proc = proc
        self._replies = replies          # read end of the reply pipe
        self._buf = b""
        self._pending = {}               # replies read while waiting for another call
        self._next = 0
        self.log = log
        self._lock = threading.Lock()

    def submit(self, fn, **kwargs):
        """Start ``fn(**kwargs)`` in the driver; returns its call id for
        :meth:`result`."""
        with self._lock:
            self._next += 1
            ident = self._next
        line = json.dumps({"id": ident, "fn": fn, "kwargs": kwargs}) + "\n"
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise HarnessError(f"the driver is gone ({exc}):\n{self.tail()}") from None
        return ident

    def result(self, ident, timeout):
        """The reply to call ``ident`` (calls are answered in order of
        completion; earlier replies to other ids are kept)."""
        deadline = time.monotonic() + timeout
        reply = self._pending.pop(ident, None)
        while reply is None:
            line = self._readline(deadline)
            if line is None:
                raise HarnessError(f"the driver did not answer call {ident} within {timeout} s:"
                                   f"\n{self.tail()}")
            doc = json.loads(line)
            if doc["id"] == ident:
                reply = doc
            else:
                self._pending[doc["id"]] = doc
        if "error" in reply:
            raise DriverError(reply["error"], reply["message"], reply.get("seconds"))
        return reply["result"]

    def call(self, fn, timeout=120, **kwargs):
        return self.result(self.submit(fn, **kwargs), timeout)

    def _readline(self, deadline):
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None and not self._readable(0):
                return None
            if not self._readable(min(remaining, 0.5)):
                continue
            chunk = os.read(self._replies, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _readable(self, timeout):
        return bool(select.select([self._replies], [], [], timeout)[0])

    def tail(self, lines=40):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


class DriverError(Exception):
    """A call in the driver raised: ``kind`` (the exception's class name),
    ``message``, and the ``seconds`` it ran."""

    def __init__(self, kind, message, seconds):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.seconds = seconds


class Cluster:
    """The namespaces, the Spark daemons and the driver (see the module's
    docstring).  ``logs``: a directory for the processes' output."""

    def __init__(self, logs):
        self.logs = logs
        self.tag = f"{_PREFIX}{os.getpid()}"
        self.namespaces = []
        self.procs = {}                     # host -> [Popen]
        self.workers = set()                # hosts whose worker runs
        self.driver = None
        self.java_opts = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"

    # ---- the network ---------------------------------------------------------------------

    def ns(self, host):
        return f"{self.tag}{host}"

    def ip(self, host, *args, check=True):
        return _run("ip", "-n", self.ns(host), *args, check=check)

    def exec(self, host, *argv, check=True, timeout=20):
        """Run a command in ``host``'s namespace (to its end)."""
        return _run("ip", "netns", "exec", self.ns(host), *argv, check=check, timeout=timeout)

    def _add_ns(self, name):
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _link(self, host, ifname, other_ns, other_ifname):
        _run("ip", "link", "add", ifname, "netns", self.ns(host), "type", "veth",
             "peer", "name", other_ifname, "netns", other_ns)

    def up(self):
        """Make the namespaces, the bridge and the links (about 0.2 s)."""
        remove_stale()
        sw = self.ns("sw")
        self._add_ns(sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for host in ("h0", "h1", "h2", "nat"):
            self._add_ns(self.ns(host))
            self._link(host, "eth0", sw, f"p{host}")
            _run("ip", "-n", sw, "link", "set", f"p{host}", "master", "br0")
            _run("ip", "-n", sw, "link", "set", f"p{host}", "up")
            self.ip(host, "addr", "add", f"{ADDRESSES[host]}/24", "dev", "eth0")
            self.ip(host, "link", "set", "eth0", "up")
            if host != "nat":
                self.ip(host, "route", "add", f"{PRIVATE}.0/24", "via", ADDRESSES["nat"])
        # h3 behind nat
        self._add_ns(self.ns("h3"))
        self._link("h3", "eth0", self.ns("nat"), "inside")
        self.ip("h3", "addr", "add", f"{ADDRESSES['h3']}/24", "dev", "eth0")
        self.ip("h3", "link", "set", "eth0", "up")
        self.ip("h3", "route", "add", "default", "via", f"{PRIVATE}.1")
        self.ip("nat", "addr", "add", f"{PRIVATE}.1/24", "dev", "inside")
        self.ip("nat", "link", "set", "inside", "up")
        self.exec("nat", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        self.nft("nat", f"""
            table ip masq {{
                chain post {{
                    type nat hook postrouting priority 100;
                    ip saddr {PRIVATE}.0/24 oifname "eth0" masquerade
                }}
            }}""")

    def nft(self, host, ruleset):
        """Load an nftables ruleset in ``host``'s namespace."""
        if shutil.which("nft") is None:
            raise HarnessError("no `nft` command: scripts/bootstrap.sh installs nftables")
        r = subprocess.run(["ip", "netns", "exec", self.ns(host), "nft", "-f", "-"],
                           input=ruleset, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise HarnessError(f"nft in {host} failed: {r.stderr.strip()}")

    def flush_nft(self, host, table):
        self.exec(host, "nft", "delete", "table", "inet", table, check=False)

    def _far_end(self, host):
        """The namespace and name of the far end of ``host``'s link."""
        return (self.ns("nat"), "inside") if host == "h3" else (self.ns("sw"), f"p{host}")

    def cut(self, host):
        """Take ``host``'s link down at its far end (the bridge, or the
        router for h3): its packets go nowhere (no FIN, no RST), as with a
        pulled cable."""
        ns, ifname = self._far_end(host)
        _run("ip", "-n", ns, "link", "set", ifname, "down")

    def mend(self, host):
        ns, ifname = self._far_end(host)
        _run("ip", "-n", ns, "link", "set", ifname, "up")

    # ---- processes -----------------------------------------------------------------------

    def spawn(self, host, argv, name, env=None, **popen):
        """Start ``argv`` in ``host``'s namespace, in a process group of its
        own, its output to ``<logs>/<name>.log``; ``env``: variables to
        set (None: to unset)."""
        log = os.path.join(self.logs, f"{name}.log")
        full = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                full.pop(key, None)          # unset
            else:
                full[key] = value
        out = open(log, "ab")
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv],
                                    stdout=popen.pop("stdout", out), stderr=out, env=full,
                                    start_new_session=True, **popen)
        finally:
            out.close()
        proc.log = log
        self.procs.setdefault(host, []).append(proc)
        return proc

    def _spark_env(self, host):
        return {"SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": ADDRESSES[host],
                "SPARK_LOG_DIR": self.logs, "SPARK_DAEMON_JAVA_OPTS": self.java_opts,
                # the master forgets a silent worker after 8 s (a worker
                # beats every quarter of its own setting; at 4 s a loaded
                # machine's late beats lost live workers)
                "SPARK_MASTER_OPTS": "-Dspark.worker.timeout=8",
                "SPARK_WORKER_OPTS": "-Dspark.worker.timeout=8",
                "SPARK_WORKER_DIR": os.path.join(self.logs, f"work-{host}")}

    def start_master(self):
        cls = os.path.join(spark_home(), "bin", "spark-class")
        self.master_log = self.spawn(
            "h0", [cls, "org.apache.spark.deploy.master.Master", "--host", ADDRESSES["h0"],
                   "--port", str(MASTER_PORT), "--webui-port", "0"],
            "master", self._spark_env("h0")).log

    def start_spark(self, workers=("h1", "h2"), cores=2, registered=False):
        """The master in h0, once it leads, and a worker on each host of
        ``workers``; with ``registered``, once they have all registered."""
        self.start_master()
        self.wait_for_log(self.master_log, r"I have been elected leader", timeout=60)
        for host in workers:
            self.start_worker(host, cores=cores)
        if registered:
            self.wait_for_log(self.master_log, r"Registering worker", count=len(workers),
                              timeout=60)

    @property
    def master_url(self):
        return f"spark://{ADDRESSES['h0']}:{MASTER_PORT}"

    def start_worker(self, host, cores=2, name_ip=None):
        """A worker on ``host``; with ``name_ip``, as on a host that sets
        no ``SPARK_LOCAL_IP`` and whose name resolves to ``name_ip``."""
        cls = os.path.join(spark_home(), "bin", "spark-class")
        env = self._spark_env(host)
        self.set_name_ip(host, name_ip)
        if name_ip is not None:
            env["SPARK_LOCAL_IP"] = None
        self.spawn(host, [cls, "org.apache.spark.deploy.worker.Worker", "--host",
                          ADDRESSES[host], "--port", str(WORKER_PORT), "--webui-port", "0",
                          "--cores", str(cores), "--memory", "2g", self.master_url],
                   f"worker-{host}", env)
        self.workers.add(host)

    def set_name_ip(self, host, ip):
        """What this machine's name resolves to in ``host``'s namespace,
        for what starts there from now on: ``ip``, or (None) what
        ``/etc/hosts`` says."""
        directory = os.path.join(NETNS_ETC, self.ns(host))
        if ip is None:
            shutil.rmtree(directory, ignore_errors=True)
            return
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{ip} {socket.gethostname()}\n")

    def wait_for_log(self, log, pattern, count=1, timeout=60):
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            try:
                with open(log, errors="replace") as f:
                    if len(rx.findall(f.read())) >= count:
                        return
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise HarnessError(f"{pattern!r} did not appear {count} times in {log} "
                                   f"within {timeout} s")
            time.sleep(0.1)

    def start_driver(self, conf=None):
        """Start the driver program in h0 (it makes the session, then waits
        for calls)."""
        read_end, write_end = os.pipe()
        python_path = os.pathsep.join([ROOT, TESTS])
        env = {"PYTHONPATH": python_path, "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOCAL_IP": ADDRESSES["h0"], "SPARK_HOME": spark_home(),
               "FLINKBUF_DRIVER_REPLIES": str(write_end),
               "FLINKBUF_DRIVER_CONF": json.dumps({
                   "master": self.master_url, "host": ADDRESSES["h0"],
                   "driver_port": DRIVER_PORT, "block_manager_port": BLOCK_MANAGER_PORT,
                   "python_path": python_path, "java_opts": self.java_opts,
                   **(conf or {})})}
        proc = self.spawn("h0", [sys.executable, "-X", "faulthandler",
                                 os.path.join(TESTS, "netns_driver.py")], "driver", env,
                          stdin=subprocess.PIPE, pass_fds=(write_end,))
        os.close(write_end)
        self.driver = Driver(proc, read_end, proc.log)
        return self.driver

    def kill_host(self, host):
        """Every process of ``host`` dies at once (``kill -9``), as when the
        machine is lost."""
        if not _kill_namespace(self.ns(host)):
            raise HarnessError(f"processes of {host} survived SIGKILL for {_DIE} s")
        for proc in self.procs.pop(host, []):
            try:
                proc.wait(_DIE)
            except subprocess.TimeoutExpired:
                pass
        self.workers.discard(host)

    def close(self):
        """Kill every process, delete every namespace (and with them the
        links and the bridge).  Idempotent; never raises."""
        if self.driver is not None:
            try:
                self.driver.proc.stdin.close()
            except OSError:
                pass
            try:
                os.close(self.driver._replies)
            except OSError:
                pass
            self.driver = None
        for ns in self.namespaces:
            try:
                _kill_namespace(ns)
            except Exception:               # noqa: BLE001 - go on tearing down
                pass
        for procs in self.procs.values():
            for proc in procs:
                try:
                    proc.kill()
                    proc.wait(_DIE)
                except Exception:           # noqa: BLE001
                    pass
        self.procs.clear()
        for ns in reversed(self.namespaces):
            try:
                _run("ip", "netns", "del", ns, check=False)
            except Exception:               # noqa: BLE001
                pass
            shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)
        self.namespaces.clear()
