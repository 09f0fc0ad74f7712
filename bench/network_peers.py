"""Two-process exchanges for bench/bench_network.py: flinkbuf.network and its
peers (raw TCP / Unix sockets, pyzmq PUSH/PULL, multiprocessing.Queue), run
the same way so that their numbers compare.

One measurement (``run_pair``) forks two processes from the caller (cheap,
and it lets them inherit a ``multiprocessing.Queue``), a *producer* and a
*consumer*.  Each sets itself up (sockets, connections, the flinkbuf
environment, a partition request), they exchange addresses, meet at a
barrier, and then:

  * the producer notes ``t0 = time.monotonic_ns()`` (CLOCK_MONOTONIC, one
    clock for every process on a Linux host) and emits its records;
  * the consumer iterates until its last record and notes ``t_end``.

``t_end - t0`` is the end-to-end time: producer start to last record
consumed.  Set-up and tear-down are outside it.  Every consumer hands each
record to Python as its own object (an int, a tuple, a bytes), also where
the peer moved them in batches; only the raw-socket peers, the machine's
ceiling, receive into one reused buffer.

``run_ping_pong`` measures round trips instead: one record at a time, there
and back, the next only after the previous one came back.

Records (``kind``): ``int64`` a Python int per record, ``int_int`` a tuple
of two, ``bytes32k`` a 32 KiB bytes object.  Channels: the producer writes
round robin to ``channels`` channels, and ONE consumer process reads them
all from one thread (Flink's networkThroughput receiver: one task reading a
union of gates; here one InputGate over ``channels`` remote channels, which
share the processes' one TCP connection).  The peers get the same shape:
one socket / queue per channel, read round robin in the order written (the
cheapest reading order there is, to their advantage).

Run as a script for one measurement by hand:
``python bench/network_peers.py flinkbuf int64 1000000 [channels] [buffer_timeout]``.
"""

import multiprocessing as mp
import os
import socket
import struct
import sys
import time
import traceback
from itertools import chain

# Imported here, before the fork, so that the measured processes do not.
from flinkbuf import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment

try:
    import zmq
except ImportError:                      # pyzmq is in the dev extra
    zmq = None

SEGMENT = 32 * 1024
SECRET = b"flinkbuf-network-benchmark-secret"
BYTES_RECORD = b"\xab" * SEGMENT
JOIN_TIMEOUT = 600.0

monotonic_ns = time.monotonic_ns


class PairFailed(RuntimeError):
    pass


# ---- the two processes --------------------------------------------------------------------

class Link:
    """What a side of a pair has: messages to the other side, a barrier,
    and the objects the parent made for both (multiprocessing queues)."""

    def __init__(self, inbox, outbox, barrier, shared, role=""):
        self._in, self._out, self._barrier, self.shared = inbox, outbox, barrier, shared
        self.cpu_marks = []               # process CPU time (all threads) at each wait()
        self.role = role
        self._tool = None

    def send(self, obj):
        self._out.put(obj)

    def recv(self):
        return self._in.get()

    def wait(self):
        tool = os.environ.get("NETBENCH_TOOL")
        if tool and not self.cpu_marks:
            # profiling by hand (bench/network_profile.py): a tool attached to
            # this process for the measured part, e.g. "perf stat -p {pid} -o F.{role}"
            import shlex
            import subprocess
            self._tool = subprocess.Popen(shlex.split(tool.format(pid=os.getpid(),
                                                                  role=self.role)))
            time.sleep(1.0)
        elif self._tool is not None:
            import signal
            self._tool.send_signal(signal.SIGINT)
            self._tool.wait()
            self._tool = None
        self._barrier.wait(JOIN_TIMEOUT)
        self.cpu_marks.append(time.process_time_ns())


def _side(role, fn, link, spec, results):
    try:
        pin = spec.get("pin", {}).get(role)     # experiments: this side on these CPUs
        if pin is not None:
            os.sched_setaffinity(0, pin)
        out = fn(link, spec) or {}
        # CPU time between the start and the end barrier: the measured part
        marks = link.cpu_marks
        out["cpu_ns"] = marks[-1] - marks[0] if len(marks) >= 2 else None
        results.put(("ok", role, out))
    except BaseException:                # noqa: BLE001 - reported to the parent
        link._barrier.abort()
        results.put(("error", role, traceback.format_exc()))


def _fork_pair(left, right, spec, shared_fn=None, names=("producer", "consumer")):
    mpc = mp.get_context("fork")
    a_to_b, b_to_a = mpc.SimpleQueue(), mpc.SimpleQueue()
    barrier = mpc.Barrier(2)
    results = mpc.Queue()
    shared = shared_fn(mpc, spec) if shared_fn else None
    links = (Link(b_to_a, a_to_b, barrier, shared, names[0]),
             Link(a_to_b, b_to_a, barrier, shared, names[1]))
    procs = [mpc.Process(target=_side, daemon=True, name=f"netbench-{name}",
                         args=(name, fn, link, spec, results))
             for name, fn, link in zip(names, (left, right), links)]
    for p in procs:
        p.start()
    out, errors = {}, []
    deadline = time.monotonic() + JOIN_TIMEOUT
    try:
        while len(out) + len(errors) < 2:
            status, role, payload = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if status == "ok":
                out[role] = payload
            else:
                errors.append(f"{role}:\n{payload}")
                # the other side may be blocked on its peer: give it a moment
                deadline = min(deadline, time.monotonic() + 5.0)
    except Exception as exc:            # noqa: BLE001 - queue.Empty: a side hung
        errors.append(f"no result within the time limit ({exc!r})")
    finally:
        for p in procs:
            p.join(5.0 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise PairFailed(f"{spec}: " + "\n".join(errors))
    return out


def run_pair(impl, spec):
    """One measurement: ``{"ns": t_end - t0, "count": n, ...}``.  ``spec``:
    kind, n, channels, buffer_timeout, batch (per-impl extras)."""
    producer, consumer, shared = IMPLS[impl]
    out = _fork_pair(producer, consumer, spec, shared)
    p, c = out["producer"], out["consumer"]
    if c["count"] != spec["n"]:
        raise PairFailed(f"{impl} {spec}: consumed {c['count']} of {spec['n']} records")
    return {"ns": c["t_end"] - p["t0"], "count": c["count"], "producer": p, "consumer": c}


def run_ping_pong(impl, spec):
    """Round trips: ``{"rtt_ns": [...]}`` (the warm-up ones dropped)."""
    pinger, ponger, shared = PING_IMPLS[impl]
    out = _fork_pair(pinger, ponger, spec, shared, names=("pinger", "ponger"))
    rtt = out["pinger"]["rtt_ns"][spec.get("warmup", 0):]
    return {"rtt_ns": rtt, "pinger": out["pinger"], "ponger": out["ponger"]}


# ---- flinkbuf.network ----------------------------------------------------------------------

def _switch(spec, name):
    """An on/off option of the spec (1/0, True/False), or None: the
    environment's default."""
    value = spec.get(name)
    return None if value is None else bool(value)


def _fb_env(spec):
    # Flink's defaults on the reading side: 2 exclusive buffers per channel,
    # 8 floating per gate (experiments: exclusive=N floating=N); the
    # environment's direct reads and caller's sends (direct_reads=0,
    # caller_sends=0 turn them off), lending over shared memory (lend_buffers=1),
    # sealed frames (encryption=1), buffer debloating (buffer_debloat=1).
    # Switches are passed only when the spec sets them, so that a build
    # from before they existed can be measured too (network_ab.py's @BUILD).
    switches = {name: _switch(spec, name)
                for name in ("direct_reads", "caller_sends", "lend_buffers", "encryption",
                             "buffer_debloat")
                if spec.get(name) is not None}
    return NetworkEnvironment(512, SEGMENT, secret=SECRET,
                              exclusive_buffers_per_channel=spec.get("exclusive", 2),
                              floating_buffers_per_gate=spec.get("floating", 8),
                              transport=spec.get("transport", "auto"), **switches)


def _out_buffers(spec, ch):
    # Flink's output pool: 2 buffers per subpartition + 8 floating, at least
    # 16 (experiments: out_buffers=N)
    return spec.get("out_buffers", max(16, 2 * ch + 8))


def fb_producer(link, spec):
    kind, n, ch = spec["kind"], spec["n"], spec["channels"]
    codec = "bytes" if kind == "bytes32k" else "typed"
    with _fb_env(spec) as env:
        debloat = {"buffer_debloat": True} if spec.get("buffer_debloat") else {}
        part = create_partition(env.network_buffer_pool, ch, min_buffers=_out_buffers(spec, ch),
                                **debloat)
        env.register_partition("p", part)
        link.send(env.address)
        writer = RecordWriter(part, "round_robin", codec=codec,
                              buffer_timeout=spec["buffer_timeout"])
        emit = writer.emit
        link.wait()
        t0 = monotonic_ns()
        if kind == "int64":
            for i in range(n):
                emit(i)
        elif kind == "int_int":
            for i in range(n):
                emit((i, i))
        else:
            for _ in range(n):
                emit(BYTES_RECORD)
        writer.close()
        t1 = monotonic_ns()
        link.wait()                       # the consumer has everything
        stats = env.connection_stats()
    return {"t0": t0, "t_produced": t1, "stats": stats,
            "back_pressured_ns": writer.back_pressured_time_ns}


def fb_consumer(link, spec):
    kind, ch = spec["kind"], spec["channels"]
    codec = "bytes" if kind == "bytes32k" else "typed"
    address = link.recv()
    with _fb_env(spec) as env:
        gate = env.create_input_gate([(address, "p", k) for k in range(ch)], codec=codec)
        link.wait()
        n = 0
        for _ in gate:
            n += 1
        t_end = monotonic_ns()
        link.wait()
        stats = env.connection_stats()
        idle = gate.idle_time_ns
        gate.close()
    return {"t_end": t_end, "count": n, "stats": stats, "idle_ns": idle}


def fb_pinger(link, spec):
    with _fb_env(spec) as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=16)
        env.register_partition("ping", part)
        link.send(env.address)
        gate = env.create_input_gate([(link.recv(), "pong", 0)])
        writer = RecordWriter(part, "round_robin", buffer_timeout=0)
        emit, it = writer.emit, iter(gate)
        rtt = []
        link.wait()
        for i in range(spec["warmup"] + spec["n"]):
            t = monotonic_ns()
            emit(i)
            r = next(it)
            rtt.append(monotonic_ns() - t)
            assert r == i
        writer.close()
        for _ in it:
            pass
        link.wait()
        gate.close()
    return {"rtt_ns": rtt}


def fb_ponger(link, spec):
    with _fb_env(spec) as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=16)
        env.register_partition("pong", part)
        link.send(env.address)
        gate = env.create_input_gate([(link.recv(), "ping", 0)])
        writer = RecordWriter(part, "round_robin", buffer_timeout=0)
        emit = writer.emit
        link.wait()
        for r in gate:
            emit(r)
        writer.close()
        link.wait()
        gate.close()
    return {}


# ---- raw sockets (the kernel's ceiling) ----------------------------------------------------

def _raw_listen(family):
    if family == socket.AF_UNIX:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(f"\0flinkbuf-netbench-{os.getpid()}-{monotonic_ns()}")   # abstract
    else:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    return srv


def _raw_tune(sock, spec):
    if sock.family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt, name in ((socket.SO_SNDBUF, "sndbuf"), (socket.SO_RCVBUF, "rcvbuf")):
        if spec.get(name):
            sock.setsockopt(socket.SOL_SOCKET, opt, spec[name])


# ---- TLS 1.3 through Python's ssl module (the usual way to encrypt a socket) ------------
#
# The raw TCP peers with each socket wrapped: a certificate made for the run
# (ECDSA P-256, by the openssl command, made once in the parent before the
# fork), TLS 1.3, the cipher suite OpenSSL picks (AES-256-GCM where the CPU
# has AES instructions).  The handshake happens before the clock starts.

_TLS_FILES = None


def tls_available():
    """Whether the TLS peer can run here (the openssl command makes its
    certificate)."""
    import shutil   # noqa: PLC0415
    return shutil.which("openssl") is not None


def _tls_files():
    global _TLS_FILES
    if _TLS_FILES is None:
        import subprocess   # noqa: PLC0415
        import tempfile   # noqa: PLC0415
        d = tempfile.mkdtemp(prefix="flinkbuf-netbench-tls-")
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost"], check=True,
                       capture_output=True)
        _TLS_FILES = (cert, key)
    return _TLS_FILES


def _tls_wrap(sock, server):
    import ssl   # noqa: PLC0415
    cert, key = _tls_files()
    if server:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cert)
        ctx.check_hostname = False
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    tls = ctx.wrap_socket(sock, server_side=server)
    tls.do_handshake()
    return tls


def _connected(family, link, spec, tls):
    sock = socket.socket(family, socket.SOCK_STREAM)
    _raw_tune(sock, spec)
    sock.connect(link.recv())
    return _tls_wrap(sock, server=False) if tls else sock


def _accepted(family, link, spec, tls):
    srv = _raw_listen(family)
    with srv:
        link.send(srv.getsockname())
        conn, _ = srv.accept()
    _raw_tune(conn, spec)
    return _tls_wrap(conn, server=True) if tls else conn


def _raw_producer(family, tls=False):
    def producer(link, spec):
        n, chunk = spec["n"], spec.get("chunk", SEGMENT)
        data = b"\xab" * chunk
        total = n * SEGMENT
        sock = _connected(family, link, spec, tls)
        with sock:
            link.wait()
            t0 = monotonic_ns()
            sendall = sock.sendall
            sent = 0
            while sent < total:
                sendall(data)
                sent += chunk
            t1 = monotonic_ns()
            link.wait()
        return {"t0": t0, "t_produced": t1}
    return producer


def _raw_consumer(family, tls=False):
    def consumer(link, spec):
        n, chunk = spec["n"], spec.get("chunk", SEGMENT)
        total = n * SEGMENT
        conn = _accepted(family, link, spec, tls)
        with conn:
            buf = bytearray(chunk)
            recv_into = conn.recv_into
            link.wait()
            got = 0
            while got < total:
                r = recv_into(buf, chunk)
                if not r:
                    break
                got += r
            t_end = monotonic_ns()
            link.wait()
        return {"t_end": t_end, "count": got // SEGMENT}
    return consumer


def _raw_pinger(family, tls=False):
    def pinger(link, spec):
        pack, unpack = struct.Struct("<q").pack, struct.Struct("<q").unpack
        rtt = []
        sock = _connected(family, link, spec, tls)
        with sock:
            link.wait()
            send, recv = sock.sendall, sock.recv
            for i in range(spec["warmup"] + spec["n"]):
                t = monotonic_ns()
                send(pack(i))
                m = recv(8)
                while len(m) < 8:
                    m += recv(8 - len(m))
                rtt.append(monotonic_ns() - t)
                assert unpack(m)[0] == i
            link.wait()
        return {"rtt_ns": rtt}
    return pinger


def _raw_ponger(family, tls=False):
    def ponger(link, spec):
        conn = _accepted(family, link, spec, tls)
        with conn:
            link.wait()
            send, recv = conn.sendall, conn.recv
            for _ in range(spec["warmup"] + spec["n"]):
                m = recv(8)
                while len(m) < 8:
                    m += recv(8 - len(m))
                send(m)
            link.wait()
        return {}
    return ponger


# ---- pyzmq PUSH/PULL ---------------------------------------------------------------------
#
# One PUSH socket per channel in the producer (bound), one PULL per channel in
# the consumer (connected); records go round robin, and are read in the same
# order.  An empty message ends each channel.  Per record: a message of the
# record's bytes (struct-packed ints, the bytes record as it is).  Batched:
# ``batch`` records per message, packed with struct, unpacked to Python
# objects in the consumer.

_Q = struct.Struct("<q")
_QQ = struct.Struct("<qq")


def _zmq_endpoints(ctx, n, kind):
    socks = []
    for _ in range(n):
        s = ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        socks.append(s)
    return socks


def zmq_producer(link, spec):
    kind, n, ch, batch = spec["kind"], spec["n"], spec["channels"], spec.get("batch", 1)
    ctx = zmq.Context()
    socks = _zmq_endpoints(ctx, ch, zmq.PUSH)
    try:
        eps = []
        for s in socks:
            s.bind("tcp://127.0.0.1:*")
            eps.append(s.getsockopt_string(zmq.LAST_ENDPOINT))
        link.send(eps)
        sends = [s.send for s in socks]
        link.recv()                       # the consumer connected
        link.wait()
        t0 = monotonic_ns()
        if batch == 1:
            send = sends[0]
            if kind == "int64":
                pack = _Q.pack
                if ch == 1:
                    for i in range(n):
                        send(pack(i))
                else:
                    for i in range(n):
                        sends[i % ch](pack(i))
            elif kind == "int_int":
                pack = _QQ.pack
                if ch == 1:
                    for i in range(n):
                        send(pack(*(i, i)))
                else:
                    for i in range(n):
                        sends[i % ch](pack(*(i, i)))
            else:
                if ch == 1:
                    for _ in range(n):
                        send(BYTES_RECORD)
                else:
                    for i in range(n):
                        sends[i % ch](BYTES_RECORD)
        else:
            # records collected in a list per channel, packed when it has `batch`
            # (bytes records are not batched)
            if kind == "int64":
                def packer(k):
                    return struct.Struct(f"<{k}q").pack
            else:
                def packer(k):
                    p = struct.Struct(f"<{2 * k}q").pack
                    return lambda *recs: p(*chain.from_iterable(recs))
            full = packer(batch)
            pending = [[] for _ in range(ch)]
            for i in range(n):
                lst = pending[i % ch]
                lst.append(i if kind == "int64" else (i, i))
                if len(lst) == batch:
                    sends[i % ch](full(*lst))
                    lst.clear()
            for k, lst in enumerate(pending):
                if lst:
                    sends[k](packer(len(lst))(*lst))
        for send in sends:
            send(b"")
        t1 = monotonic_ns()
        link.wait()
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return {"t0": t0, "t_produced": t1}


def zmq_consumer(link, spec):
    kind, ch, batch = spec["kind"], spec["channels"], spec.get("batch", 1)
    ctx = zmq.Context()
    socks = _zmq_endpoints(ctx, ch, zmq.PULL)
    try:
        for s, ep in zip(socks, link.recv()):
            s.connect(ep)
        link.send("connected")
        recvs = [s.recv for s in socks]
        link.wait()
        n = 0
        live = list(range(ch))
        k = 0
        if batch == 1 and ch == 1:
            recv = recvs[0]
            if kind == "int64":
                unpack = _Q.unpack
                while m := recv():
                    unpack(m)[0]
                    n += 1
            elif kind == "int_int":
                unpack = _QQ.unpack
                while m := recv():
                    unpack(m)
                    n += 1
            else:
                while recv():
                    n += 1
        elif batch == 1:
            # one record: its value (ints), its tuple, or the bytes as received
            unpack = {"int64": lambda m: _Q.unpack(m)[0], "int_int": _QQ.unpack}.get(kind)
            while live:
                m = recvs[live[k]]()
                if not m:
                    del live[k]
                    k = k % len(live) if live else 0
                    continue
                if unpack is not None:
                    unpack(m)
                n += 1
                k = k + 1 if k + 1 < len(live) else 0
        else:
            while live:
                m = recvs[live[k]]()
                if not m:
                    del live[k]
                    k = k % len(live) if live else 0
                    continue
                if kind == "int64":
                    for _ in struct.unpack(f"<{len(m) // 8}q", m):
                        n += 1
                else:
                    for _ in _QQ.iter_unpack(m):
                        n += 1
                k = k + 1 if k + 1 < len(live) else 0
        t_end = monotonic_ns()
        link.wait()
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    return {"t_end": t_end, "count": n}


def zmq_pinger(link, spec):
    ctx = zmq.Context()
    out, inp = _zmq_endpoints(ctx, 1, zmq.PUSH)[0], _zmq_endpoints(ctx, 1, zmq.PULL)[0]
    rtt = []
    try:
        out.bind("tcp://127.0.0.1:*")
        link.send(out.getsockopt_string(zmq.LAST_ENDPOINT))
        inp.connect(link.recv())
        link.wait()
        send, recv, pack, unpack = out.send, inp.recv, _Q.pack, _Q.unpack
        for i in range(spec["warmup"] + spec["n"]):
            t = monotonic_ns()
            send(pack(i))
            r = unpack(recv())[0]
            rtt.append(monotonic_ns() - t)
            assert r == i
        link.wait()
    finally:
        out.close(0)
        inp.close(0)
        ctx.term()
    return {"rtt_ns": rtt}


def zmq_ponger(link, spec):
    ctx = zmq.Context()
    out, inp = _zmq_endpoints(ctx, 1, zmq.PUSH)[0], _zmq_endpoints(ctx, 1, zmq.PULL)[0]
    try:
        out.bind("tcp://127.0.0.1:*")
        link.send(out.getsockopt_string(zmq.LAST_ENDPOINT))
        inp.connect(link.recv())
        link.wait()
        send, recv, pack, unpack = out.send, inp.recv, _Q.pack, _Q.unpack
        for _ in range(spec["warmup"] + spec["n"]):
            send(pack(unpack(recv())[0]))
        link.wait()
    finally:
        out.close(0)
        inp.close(0)
        ctx.term()
    return {}


# ---- multiprocessing.Queue ----------------------------------------------------------------
#
# One queue per channel, made by the parent (a multiprocessing.Queue is
# shared by inheritance), bounded like flinkbuf's buffers are (maxsize 1000
# items); None ends a channel.  Per record: one put per record.  Batched: a
# list of ``batch`` records per put.

MPQ_MAXSIZE = 1000


def mpq_shared(mpc, spec):
    return [mpc.Queue(MPQ_MAXSIZE) for _ in range(spec["channels"])]


def mpq_producer(link, spec):
    kind, n, ch, batch = spec["kind"], spec["n"], spec["channels"], spec.get("batch", 1)
    puts = [q.put for q in link.shared]
    put = puts[0]
    link.wait()
    t0 = monotonic_ns()
    if batch == 1:
        if kind == "int64":
            if ch == 1:
                for i in range(n):
                    put(i)
            else:
                for i in range(n):
                    puts[i % ch](i)
        elif kind == "int_int":
            if ch == 1:
                for i in range(n):
                    put((i, i))
            else:
                for i in range(n):
                    puts[i % ch]((i, i))
        else:
            for i in range(n):
                puts[i % ch](BYTES_RECORD)
    else:
        pending = [[] for _ in range(ch)]
        for i in range(n):
            lst = pending[i % ch]
            lst.append(i if kind == "int64" else (i, i) if kind == "int_int" else BYTES_RECORD)
            if len(lst) == batch:
                puts[i % ch](lst)
                pending[i % ch] = []
        for k, lst in enumerate(pending):
            if lst:
                puts[k](lst)
    for put in puts:
        put(None)
    t1 = monotonic_ns()
    link.wait()
    return {"t0": t0, "t_produced": t1}


def mpq_consumer(link, spec):
    ch, batch = spec["channels"], spec.get("batch", 1)
    gets = [q.get for q in link.shared]
    link.wait()
    n, k = 0, 0
    live = list(range(ch))
    while live:
        m = gets[live[k]]()
        if m is None:
            del live[k]
            k = k % len(live) if live else 0
            continue
        if batch == 1:
            n += 1
        else:
            for _ in m:
                n += 1
        k = k + 1 if k + 1 < len(live) else 0
    t_end = monotonic_ns()
    link.wait()
    return {"t_end": t_end, "count": n}


def mpq_pinger(link, spec):
    put, get = link.shared[0].put, link.shared[1].get
    rtt = []
    link.wait()
    for i in range(spec["warmup"] + spec["n"]):
        t = monotonic_ns()
        put(i)
        r = get()
        rtt.append(monotonic_ns() - t)
        assert r == i
    link.wait()
    return {"rtt_ns": rtt}


def mpq_ponger(link, spec):
    get, put = link.shared[0].get, link.shared[1].put
    link.wait()
    for _ in range(spec["warmup"] + spec["n"]):
        put(get())
    link.wait()
    return {}


# ---- the registry ---------------------------------------------------------------------------

IMPLS = {
    "flinkbuf": (fb_producer, fb_consumer, None),
    "raw_tcp": (_raw_producer(socket.AF_INET), _raw_consumer(socket.AF_INET), None),
    "raw_uds": (_raw_producer(socket.AF_UNIX), _raw_consumer(socket.AF_UNIX), None),
    "raw_tls": (_raw_producer(socket.AF_INET, tls=True), _raw_consumer(socket.AF_INET, tls=True),
                lambda mpc, spec: _tls_files()),
    "pyzmq": (zmq_producer, zmq_consumer, None),
    "mp_queue": (mpq_producer, mpq_consumer, mpq_shared),
}

PING_IMPLS = {
    "flinkbuf": (fb_pinger, fb_ponger, None),
    "raw_tcp": (_raw_pinger(socket.AF_INET), _raw_ponger(socket.AF_INET), None),
    "raw_uds": (_raw_pinger(socket.AF_UNIX), _raw_ponger(socket.AF_UNIX), None),
    "raw_tls": (_raw_pinger(socket.AF_INET, tls=True), _raw_ponger(socket.AF_INET, tls=True),
                lambda mpc, spec: _tls_files()),
    "pyzmq": (zmq_pinger, zmq_ponger, None),
    "mp_queue": (mpq_pinger, mpq_ponger, lambda mpc, spec: [mpc.Queue(), mpc.Queue()]),
}


def _opts(spec):
    for opt in os.environ.get("NETBENCH_OPTS", "").split():
        # experiments: pin=P,C (CPUs of producer/pinger, consumer/ponger), sndbuf=N,
        # rcvbuf=N (raw sockets), chunk=N (raw sockets' bytes per call),
        # transport=tcp|auto (flinkbuf: TCP only, or a Unix socket on one host)
        key, _, value = opt.partition("=")
        if key == "pin":
            p, c = value.split(",")
            spec["pin"] = {"producer": {int(p)}, "pinger": {int(p)},
                           "consumer": {int(c)}, "ponger": {int(c)}}
        elif key == "transport":
            spec[key] = value
        else:
            spec[key] = int(value)
    return spec


def main(argv):
    impl, kind, n = argv[0], argv[1], int(argv[2])
    ch = int(argv[3]) if len(argv) > 3 else 1
    bt = None if len(argv) <= 4 or argv[4] == "none" else float(argv[4])
    batch = int(argv[5]) if len(argv) > 5 else 1
    if kind == "ping":
        r = run_ping_pong(impl, _opts({"n": n, "warmup": min(1000, n // 10)}))
        rtt = sorted(r["rtt_ns"])
        print(f"{impl}: rtt p50 {rtt[len(rtt) // 2] / 1e3:.1f} us  "
              f"p99 {rtt[int(len(rtt) * 0.99)] / 1e3:.1f} us")
        return
    spec = _opts({"kind": kind, "n": n, "channels": ch, "buffer_timeout": bt, "batch": batch})
    r = run_pair(impl, spec)
    s = r["ns"] / 1e9
    extra = f"  {n * SEGMENT / s / 2**20:.0f} MiB/s" if kind == "bytes32k" else ""
    print(f"{impl} {spec}: {s:.3f} s, {n / s / 1e6:.3f} M records/s{extra}; cpu producer "
          f"{r['producer']['cpu_ns'] / 1e9:.2f} s, consumer {r['consumer']['cpu_ns'] / 1e9:.2f} s")
    p, c = r["producer"], r["consumer"]
    print(f"  producer done after {(p['t_produced'] - p['t0']) / 1e9:.3f} s"
          + (f", back-pressured {p['back_pressured_ns'] / 1e9:.3f} s"
             if "back_pressured_ns" in p else "")
          + (f"; consumer idle {c['idle_ns'] / 1e9:.3f} s" if "idle_ns" in c else ""))
    for side in ("producer", "consumer"):
        if "stats" in r[side]:
            print(f"  {side} connection stats: {r[side]['stats']}")


if __name__ == "__main__":
    main(sys.argv[1:])
