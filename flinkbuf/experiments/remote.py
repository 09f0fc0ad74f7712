"""Consumer tasks in another process, for the experiments' ``--remote``:
the child reads this process's partitions over a NetworkEnvironment (a
local connection, authenticated: shared memory with transport ``"auto"``
where the network layer has it, or the transport named), with the same
throttles as the local consumers, and answers the experiment's questions
(counts, metrics) through a pipe.  The child ignores
Ctrl-C: the experiment stops it."""

import collections
import contextlib
import multiprocessing
import os
import secrets
import signal
import sys
import threading
import time
from multiprocessing import reduction

from flinkbuf.experiments.arguments import check_choice, fail
from flinkbuf.experiments.failures import RunFailed

_BATCH = 64
# Buffers lent to the consumers' process come back moments after it let go
# of them (its last releases, or its connection's ledger once it ended).
_RETURN_S = 5.0

# NetworkEnvironment's transports: "auto" (the fastest on this host), and
# each of them by name.
TRANSPORTS = ("auto", "tcp", "unix", "shm")
_TRANSPORT_NAMES = {"tcp": "TCP on loopback", "unix": "a Unix socket",
                    "shm": "shared memory", None: "a local connection"}


def _child(stderr, conn, producer_address, secret, specs, segment_size, exclusive, floating,
           blocked, full_rates, transport="auto", debloat=None, stamped=False):
    """The child process: one consumer task per spec, then a command loop.
    ``debloat``: the environment's ``buffer_debloat*`` keywords; ``stamped``:
    the records are ``(emit ns, ...)`` and each one's sojourn is kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a terminal's Ctrl-C: the parent's
    os.dup2(stderr.fd, 2)                             # see _quiet_spawn
    os.close(stderr.fd)
    import flinkbuf as fb
    from flinkbuf.experiments._throttle import Throttle
    from flinkbuf.io import task_segments
    from flinkbuf.network import NetworkEnvironment

    num_segments = task_segments(remote_channels=[1] * len(specs),
                                 exclusive_buffers_per_channel=exclusive,
                                 floating_buffers_per_gate=floating)
    env = NetworkEnvironment(num_segments, segment_size, secret=secret,
                             exclusive_buffers_per_channel=exclusive,
                             floating_buffers_per_gate=floating, transport=transport,
                             **(debloat or {}))
    gates = [env.create_input_gate([(producer_address, pid, sub)], name=f"consumer-{k}")
             for k, (pid, sub) in enumerate(specs)]
    throttles = [Throttle(rate) for rate in full_rates]
    release = threading.Event()
    errors = []
    metrics = [fb.TaskMetrics(f"consumer-{k}", gates=[g], window=0.05)
               for k, g in enumerate(gates)]

    sojourns = [collections.deque() for _ in gates]
    threads = [threading.Thread(target=_consume, daemon=True, args=(
        g, th.pace, stuck, release, errors, kept.append if stamped else None))
        for g, th, stuck, kept in zip(gates, throttles, blocked, sojourns)]
    for t in threads:
        t.start()
    conn.send(("ready", None))
    try:
        while True:
            cmd, arg = conn.recv()
            if cmd == "counts":
                conn.send(([g.num_records_in for g in gates], list(errors)))
            elif cmd == "snapshot":
                conn.send(metrics[arg].snapshot())
            elif cmd == "sample":
                conn.send(_sample(gates[arg], sojourns[arg], errors))
            elif cmd == "limit":
                k, pct, rate = arg
                if pct is None:
                    throttles[k].unthrottle()
                else:
                    throttles[k].set_limit(pct, rate)
                conn.send(None)
            elif cmd == "release":
                release.set()
                conn.send(None)
            elif cmd == "stop":
                release.set()
                for th in throttles:
                    th.unthrottle()
                for t in threads:
                    t.join(arg)
                alive = sum(t.is_alive() for t in threads)
                for g in gates:
                    g.close()
                env.close()
                counters = fb.buffer.debug_counters()
                conn.send((alive, list(errors), counters))
                return
    finally:
        env.close()


def _consume(gate, pace, stuck, release, errors, keep):
    """A consumer task of the child: reads ``gate`` to the end, paced; if
    ``stuck``, waits for ``release`` after its first record; with ``keep``,
    the records are stamped and their sojourns go to it
    (:func:`consume_sojourns`).  Its error goes to ``errors``."""
    try:
        if keep is not None:
            consume_sojourns(gate, pace, keep)
            return
        n = 0
        for _ in gate:
            if stuck and not release.is_set():
                release.wait()
            n += 1
            if n == _BATCH:
                pace(n)
                n = 0
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        errors.append(repr(exc))
    finally:
        gate.close()


def consume_sojourns(gate, pace, keep, batch=_BATCH):
    """Read ``gate``'s ``(emit ns, ...)`` records to the end, calling
    ``keep`` with each one's sojourn (ns from its emit, by
    ``time.monotonic_ns``: one clock for every process of the host) and
    ``pace`` after every ``batch`` records."""
    clock = time.monotonic_ns
    n = 0
    for record in gate:
        keep(clock() - record[0])
        n += 1
        if n == batch:
            pace(n)
            n = 0


def _sample(gate, sojourns, errors):
    """A stamped consumer's state for the parent: records read, the
    sojourns (ns) since the last sample, the gate's debloating metrics
    (None when off), per channel its queued buffers and its own buffers
    (in use, in all), and the errors so far."""
    taken = [sojourns.popleft() for _ in range(len(sojourns))]
    own = [tuple(c[:2]) if c is not None else (0, 0) for c in gate._own_buffer_counters()]
    return {"records_in": gate.num_records_in, "sojourns_ns": taken,
            "debloat": gate._debloat_metrics(), "backlogs": gate.backlogs(),
            "own_buffers": own, "errors": list(errors)}


def buffers_not_returned(pool):
    """``pool``'s buffers still handed out, once those the consumers'
    process let go of have had the time to come back."""
    deadline = time.monotonic() + _RETURN_S
    while pool.num_requested > pool.num_available and time.monotonic() < deadline:
        time.sleep(0.005)
    return pool.num_requested - pool.num_available


class RemoteConsumers:
    """Consumer tasks in a child process reading ``specs`` (``(partition_id,
    subpartition)`` pairs registered in ``env``) over the network: consumer
    k is throttled to ``full_rates[k]`` records/s (None: unthrottled) and,
    if ``blocked[k]``, stops after its first record until :meth:`release`.
    ``debloat``: the ``buffer_debloat*`` keywords of the consumers'
    environment; ``stamped``: the records are ``(emit ns, ...)`` and
    :meth:`sample` returns their sojourns."""

    def __init__(self, env, secret, specs, *, segment_size, exclusive=2, floating=0,
                 blocked=None, full_rates=None, start_timeout=60.0, transport="auto",
                 debloat=None, stamped=False):
        n = len(specs)
        blocked = list(blocked or [False] * n)
        full_rates = list(full_rates or [None] * n)
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._lock = threading.Lock()
        with _quiet_spawn() as stderr:
            self._process = ctx.Process(
                target=_child, daemon=True, name="flinkbuf-remote-consumers",
                args=(stderr, child_conn, env.address, secret, specs, segment_size, exclusive,
                      floating, blocked, full_rates, transport, debloat, stamped))
            self._process.start()
        child_conn.close()
        if not self._conn.poll(start_timeout):
            self._process.kill()
            raise RunFailed("the consumer process did not start")
        self._conn.recv()

    def _ask(self, cmd, arg=None):
        with self._lock:
            self._conn.send((cmd, arg))
            return self._conn.recv()

    def counts(self):
        """Records each consumer read so far; raises a consumer's error."""
        counts, errors = self._ask("counts")
        if errors:
            raise RunFailed(f"a remote consumer failed: {errors[0]}")
        return counts

    def snapshot(self, k=0):
        return self._ask("snapshot", k)

    def sample(self, k=0):
        """Consumer k's state (stamped records): a dict of ``records_in``,
        ``sojourns_ns`` (since the last sample), ``debloat`` (the gate's
        debloating metrics, None when off), ``backlogs`` and ``own_buffers``
        (per channel: in use, in all); raises a consumer's error."""
        state = self._ask("sample", k)
        if state["errors"]:
            raise RunFailed(f"a remote consumer failed: {state['errors'][0]}")
        return state

    def set_limit(self, k, pct, full_rate=None):
        """Consumer k at ``pct`` % of ``full_rate``; ``pct`` None unthrottles."""
        self._ask("limit", (k, pct, full_rate))

    def release(self):
        self._ask("release")

    def stop(self, timeout=30.0):
        """Let the consumers read to the end (the producer has finished),
        close them and the child's environment: (consumers still running,
        their errors, the child's debug counters or None)."""
        try:
            result = self._ask("stop", timeout)
        except (EOFError, OSError):
            result = (None, ["the consumer process died"], None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
        return result


class MetricsProxy:
    """A consumer's TaskMetrics, read in its process (``snapshot()``)."""

    def __init__(self, consumers, k=0):
        self._consumers = consumers
        self._k = k

    def snapshot(self):
        return self._consumers.snapshot(self._k)


def new_secret():
    return secrets.token_bytes(32)


def check_transport(transport, remote, *, names=None):
    """``transport`` is one of :data:`TRANSPORTS`; other than ``"auto"``
    only with ``remote`` (nothing else has a connection)."""
    n = (names or {}).get
    check_choice("transport", transport, TRANSPORTS, names=names)
    if transport != "auto" and not remote:
        fail(f"{n('transport', 'transport')} {transport} needs {n('remote', 'remote')}: "
             "only the consumer in another process reads over a connection")


class _Stderr:
    """This process's standard error as a descriptor, for a spawned child to
    take back (pickled as a descriptor the child inherits)."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return (_Stderr._inherited, (reduction.DupFd(self.fd),))

    @staticmethod
    def _inherited(dup):
        return _Stderr(dup.detach())


@contextlib.contextmanager
def _quiet_spawn():
    """While a child is spawned inside, fd 2 is ``/dev/null``: the child
    starts with it, so what it prints before its target runs (a traceback
    of a Ctrl-C that reaches it while it imports: the terminal sends it to
    the whole process group) goes nowhere; its target takes the real
    standard error back (yielded as a :class:`_Stderr` to pass to it).  A
    Ctrl-C of those moments reaches this process's handler afterwards,
    with fd 2 restored (in the main thread: only it may change handlers)."""
    deferred = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: deferred.append(signum))
    sys.stderr.flush()
    real = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield _Stderr(real)
    finally:
        os.dup2(real, 2)
        os.close(real)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
            if deferred:
                signal.raise_signal(signal.SIGINT)


def describe_transport(transport):
    """Words for a transport of :func:`transport_in_use`."""
    return _TRANSPORT_NAMES[transport]


def transport_in_use(env):
    """How the connections to ``env``'s server run, as the first open one
    says: ``"tcp"``, ``"unix"`` or ``"shm"``; None before any connection is
    open."""
    for conn in env.connections():
        if conn.is_open:
            return conn.transport
    return None


def wait_for(predicate, timeout, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
