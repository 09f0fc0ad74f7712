"""Helpers for the network tests: child processes that produce and consume
over flinkbuf.network, and a raw protocol client.

Run as a script, this file is the child: ``python network_helpers.py ROLE
JSON``.  A child prints JSON lines on stdout (its address first), reads
JSON commands on stdin, and is killed by its own watchdog
(faulthandler.dump_traceback_later) if it outlives ``life`` seconds, so a
hang fails the test instead of hanging the run.  Records are made by
``record_bytes`` from (tag, index, size), so a consumer's report can be
checked against the plan the producer was given.

Imported by the tests, it gives ``Child`` (a child process with timeouts on
everything), ``expected_streams`` and ``RawPeer`` (handshake + frames on a
raw socket).
"""

import json
import os
import queue
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = b"flinkbuf-nettest-secret-0123456789"

# ---- records ----------------------------------------------------------------------


def record_bytes(tag, index, size):
    """A deterministic record of ``size`` bytes (0 allowed) for producer
    ``tag``'s ``index``-th record."""
    head = struct.pack(">HI", tag & 0xFFFF, index & 0xFFFFFFFF)
    if size <= len(head):
        return head[:size]
    fill = bytes(((tag * 131 + index * 7 + k) & 0xFF) for k in range(251))
    body = head + fill * ((size - len(head)) // 251 + 1)
    return body[:size]


def digest(data):
    """What a consumer reports for one record."""
    return [len(data), zlib.crc32(data)]


def expected_streams(tag, plan, num_subpartitions):
    """Per subpartition, the digests (records) and ["E", payload] (events)
    a consumer must see for a producer with this plan: ops ``["r", size,
    target]``, ``["e", payload]`` (a broadcast event) and ``["E", n]`` (a
    broadcast event of "x" * n)."""
    streams = [[] for _ in range(num_subpartitions)]
    i = 0
    for op in plan:
        if op[0] == "r":
            streams[op[2]].append(digest(record_bytes(tag, i, op[1])))
            i += 1
        else:
            payload = op[1] if op[0] == "e" else "x" * op[1]
            for s in streams:
                s.append(["E", payload])
    return streams


# ---- process introspection --------------------------------------------------------


def rss_bytes(pid="self"):
    """The resident set of a process; 0 if it cannot be read now (a
    process out of descriptors: tests that flood one)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def num_fds(pid="self"):
    return len(os.listdir(f"/proc/{pid}/fd"))


def num_os_threads(pid="self"):
    return len(os.listdir(f"/proc/{pid}/task"))


def flinkbuf_threads():
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("flinkbuf-") and t.is_alive())


# ---- the parent's side: a child process ------------------------------------------------


class ChildFailed(AssertionError):
    pass


class Child:
    """A child process running ``role`` of this file with ``cfg``.  Every
    wait has a timeout; ``stop()`` kills it if it is still there."""

    def __init__(self, role, cfg=None, *, life=60.0):
        cfg = dict(cfg or {})
        cfg.setdefault("life", life)
        self.role = role
        self._err = tempfile.TemporaryFile(mode="w+b")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("HYPOTHESIS_PROFILE", None)
        if "asan" in env.get("LD_PRELOAD", ""):
            # Tests bound the children's RSS; AddressSanitizer's quarantine
            # keeps up to 256 MB of freed memory by default (not a leak).
            # A small one still catches a use soon after a free.
            opts = env.get("ASAN_OPTIONS", "")
            env["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=4"
        self._cfg = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(cfg, self._cfg)
        self._cfg.close()
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), role,
             "@" + self._cfg.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, cwd=ROOT,
            env=env)
        self.pid = self.proc.pid
        self._q = queue.Queue()
        self.messages = []
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"nettest-read-{role}")
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {"_raw": line.decode("utf-8", "replace")}
            self._q.put(msg)
        self._q.put(None)

    def stderr(self):
        if self._err.closed:
            return self._stderr_text
        # pread: the child writes through the same open file (the same
        # offset), so moving it here would make the child overwrite its log.
        fd = self._err.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    def _fail(self, what):
        code = self.proc.poll()
        raise ChildFailed(f"{self.role} child (pid {self.pid}, exit {code}): {what}\n"
                          f"--- messages: {self.messages[-5:]!r}\n--- stderr:\n"
                          f"{self.stderr()[-6000:]}")

    def expect(self, key, timeout=30.0):
        """The next message that has ``key`` (messages without it are kept
        in ``messages``); fails on timeout, on the child's exit, and on a
        message with "fatal"."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(f"no message with {key!r} within {timeout} s")
            try:
                msg = self._q.get(timeout=remaining)
            except queue.Empty:
                continue
            if msg is None:
                self._q.put(None)
                self._fail(f"exited before a message with {key!r}")
            self.messages.append(msg)
            if "fatal" in msg and key != "fatal":
                self._fail(f"reported {msg['fatal']}")
            if key in msg:
                return msg

    def poll_messages(self):
        """Messages that arrived so far (without waiting)."""
        out = []
        while True:
            try:
                msg = self._q.get_nowait()
            except queue.Empty:
                return out
            if msg is None:
                self._q.put(None)
                return out
            self.messages.append(msg)
            out.append(msg)

    def address(self, timeout=20.0):
        return self.expect("addr", timeout)["addr"]

    def send(self, **cmd):
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._fail(f"cannot send {cmd!r}")

    def kill9(self):
        self.proc.kill()
        self.proc.wait(10)

    def rss(self):
        try:
            return rss_bytes(self.pid)
        except OSError:
            return 0

    def wait_exit(self, timeout=30.0):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"did not exit within {timeout} s")

    def stop(self):
        if self._err.closed:
            return
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self._stderr_text = self.stderr()
        self._err.close()
        try:
            os.unlink(self._cfg.name)
        except OSError:
            pass


CRASH_MARKS = ("ERROR: AddressSanitizer", "Fatal Python error", "runtime error:")


class Children:
    """Children started by one test, all stopped at its end; a child whose
    stderr shows a sanitizer report or a fatal error fails the test then
    (unless it was started with ``may_crash``)."""

    def __init__(self):
        self.all = []
        self._may_crash = set()

    def start(self, role, cfg=None, *, may_crash=False, **kw):
        c = Child(role, cfg, **kw)
        self.all.append(c)
        if may_crash:
            self._may_crash.add(c.pid)
        return c

    def stop_all(self):
        crashed = []
        for c in self.all:
            if c.proc.poll() is None:
                c.proc.kill()
                try:
                    c.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            err = c.stderr()
            if c.pid not in self._may_crash and any(m in err for m in CRASH_MARKS):
                crashed.append(f"{c.role} child (pid {c.pid}):\n{err[-4000:]}")
            c.stop()
        self.all = []
        if crashed:
            raise AssertionError("a child process crashed:\n" + "\n".join(crashed))


# ---- a raw protocol peer (docs/PROTOCOL.md) ----------------------------------------------

MAGIC = 0x46425546
MSG_BUFFER, MSG_ERROR, MSG_REQUEST, MSG_CANCEL, MSG_CLOSE, MSG_CREDIT = 0, 1, 2, 4, 5, 6
MSG_EVENT_CREDIT = 7
MSG_LENT, MSG_RELEASE, MSG_HEARTBEAT, MSG_HEARTBEAT_RESPONSE = 8, 9, 12, 13
MSG_NEW_BUFFER_SIZE = 10
EVENT_WINDOW = 16      # events a reader may have outstanding per channel
ALL = 0xFFFFFFFF       # the receiver id of what is about the whole connection


def frame(msg_id, body=b"", *, length=None, magic=MAGIC):
    if length is None:
        length = 9 + len(body)
    return struct.pack(">IIB", length & 0xFFFFFFFF, magic & 0xFFFFFFFF, msg_id & 0xFF) + body


def buffer_frame(receiver, seq, backlog, data_type, data, *, size=None, **kw):
    size = len(data) if size is None else size
    return frame(MSG_BUFFER, struct.pack(">IIIBI", receiver, seq, backlog, data_type, size)
                 + data, **kw)


def error_frame(receiver, code, type_name, message, **kw):
    t = type_name.encode()
    m = message.encode()
    return frame(MSG_ERROR, struct.pack(">IBH", receiver, code, len(t)) + t
                 + struct.pack(">I", len(m)) + m, **kw)


def request_frame(receiver, subpartition, credit, partition_id, **kw):
    p = partition_id.encode() if isinstance(partition_id, str) else partition_id
    return frame(MSG_REQUEST, struct.pack(">IIIH", receiver, subpartition, credit, len(p)) + p,
                 **kw)


def credit_frame(receiver, credit, **kw):
    return frame(MSG_CREDIT, struct.pack(">II", receiver, credit), **kw)


def buffer_size_frame(receiver, size, **kw):
    """A NEW_BUFFER_SIZE (buffer debloating) for ``receiver``."""
    return frame(MSG_NEW_BUFFER_SIZE, struct.pack(">II", receiver, size & 0xFFFFFFFF), **kw)


def cancel_frame(receiver, **kw):
    return frame(MSG_CANCEL, struct.pack(">I", receiver), **kw)


def heartbeat_frame(token, *, response=False, **kw):
    """A HEARTBEAT_REQUEST, or (``response``) the HEARTBEAT_RESPONSE that
    answers the request of that token: what a peer's connection threads
    answer, so that a peer spoken by hand answers it too."""
    return frame(MSG_HEARTBEAT_RESPONSE if response else MSG_HEARTBEAT,
                 struct.pack(">II", ALL, token), **kw)


def heartbeat_answer(msg_id, body):
    """The answer a hand-spoken peer owes for a frame it read (a
    HEARTBEAT_RESPONSE for a HEARTBEAT_REQUEST), or None."""
    if msg_id != MSG_HEARTBEAT:
        return None
    return heartbeat_frame(struct.unpack(">II", body)[1], response=True)


def event_bytes(payload):
    """A user event's bytes (kind 1 + the typed codec's encoding)."""
    from flinkbuf._testing import serialize_event   # noqa: PLC0415
    from flinkbuf.io import UserEvent   # noqa: PLC0415
    return serialize_event(UserEvent(payload))


def recv_exact(sock, n, timeout):
    deadline = time.monotonic() + timeout
    data = bytearray()
    while len(data) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(data)} of {n} bytes within {timeout} s")
        sock.settimeout(remaining)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def read_frame(sock, timeout=5.0):
    """(msg_id, body) of the next frame."""
    length, magic, msg_id = struct.unpack(">IIB", recv_exact(sock, 9, timeout))
    assert magic == MAGIC, hex(magic)
    assert 9 <= length <= (1 << 20), length
    return msg_id, recv_exact(sock, length - 9, timeout)


def parse_error(body):
    receiver, code, tl = struct.unpack_from(">IBH", body)
    t = body[7:7 + tl].decode()
    (ml,) = struct.unpack_from(">I", body, 7 + tl)
    return receiver, code, t, body[11 + tl:11 + tl + ml].decode()


def parse_buffer(body):
    receiver, seq, backlog, data_type, size = struct.unpack_from(">IIIBI", body)
    return receiver, seq, backlog, data_type, body[17:17 + size]


def wait_closed(sock, timeout):
    """Read (and return) everything until the peer closes: TimeoutError if
    it does not within ``timeout``."""
    deadline = time.monotonic() + timeout
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the peer did not close the connection within {timeout} s "
                               f"(got {len(data)} bytes)")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except ConnectionResetError:
            return bytes(data)
        if not chunk:
            return bytes(data)
        data += chunk


def split_frames(data):
    frames = []
    while len(data) >= 9:
        length, magic, msg_id = struct.unpack_from(">IIB", data)
        if length < 9 or len(data) < length:
            break
        frames.append((msg_id, data[9:length]))
        data = data[length:]
    return frames


def connect_raw(address, secret=SECRET, segment_size=32768, *, own_address="127.0.0.1:1",
                timeout=5.0, rcvbuf=None):
    """A socket to ``address`` ("host:port") past the handshake (with a
    receive buffer of ``rcvbuf`` bytes if given: a peer that reads little)."""
    from flinkbuf.network import handshake   # noqa: PLC0415
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    try:
        sock.connect((host, int(port)))
    except BaseException:
        sock.close()
        raise
    try:
        handshake.client(sock, secret, own_address, segment_size, timeout)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(timeout)
    return sock


# ---- the child's side -----------------------------------------------------------------


def _out(**msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


class _Stdin:
    """Commands from the parent, read by a thread."""

    def __init__(self):
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in sys.stdin:
            line = line.strip()
            if line:
                self.q.put(json.loads(line))
        self.q.put({"cmd": "eof"})

    def get(self, timeout=None):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def wait_for(self, name, timeout):
        return self.wait_for_any((name,), timeout)

    def wait_for_any(self, names, timeout):
        deadline = time.monotonic() + timeout
        while True:
            cmd = self.get(max(0.0, deadline - time.monotonic()))
            if cmd is None:
                raise TimeoutError(f"no {' or '.join(map(repr, names))} command within "
                                   f"{timeout} s")
            if cmd["cmd"] in names or cmd["cmd"] == "eof":
                return cmd


def _env(cfg):
    from flinkbuf.network import NetworkEnvironment   # noqa: PLC0415
    return NetworkEnvironment(
        cfg.get("num_segments", 256), cfg.get("segment_size", 32768),
        secret=bytes.fromhex(cfg["secret"]) if "secret" in cfg else SECRET,
        exclusive_buffers_per_channel=cfg.get("exclusive", 2),
        floating_buffers_per_gate=cfg.get("floating", 8),
        connect_timeout=cfg.get("connect_timeout", 10.0),
        request_timeout=cfg.get("request_timeout", 30.0),
        io_timeout=cfg.get("io_timeout", 60.0),
        # consumers' threads read sockets themselves (default on)
        direct_reads=cfg.get("direct_reads"),
        max_connections=cfg.get("max_connections", 256))


def _addr(env):
    return f"{env.address[0]}:{env.address[1]}"


# What transport="auto" uses between processes on this host (NetworkEnvironment).
AUTO_SAME_HOST = "shm" if len(os.sched_getaffinity(0)) > 1 else "unix"


class RingSocket:
    """One side of a shared-memory connection, spoken by hand (a test's
    hostile or scripted peer): what a socket's send, sendall, recv,
    settimeout and close do, over the region's rings (docs/PROTOCOL.md,
    section 2.1).  ``sendall`` writes all of its bytes or nothing."""

    HEADER, CTL, CTL_SIZE = 4096, 64, 192

    def __init__(self, sock, memfd, data_fd, room_fd, side):
        import mmap   # noqa: PLC0415
        self.sock, self.data_fd, self.room_fd, self.side = sock, data_fd, room_fd, side
        self.map = mmap.mmap(memfd, os.fstat(memfd).st_size)
        os.close(memfd)
        self.size = struct.unpack_from("<I", self.map, 8)[0]
        self.tx, self.rx = self.CTL + side * self.CTL_SIZE, self.CTL + (1 - side) * self.CTL_SIZE
        self.tx_buf = self.HEADER + side * self.size
        self.rx_buf = self.HEADER + (1 - side) * self.size
        self.timeout = None

    def _u64(self, at):
        return struct.unpack_from("<Q", self.map, at)[0]

    def _wait(self, fd, ready):
        """Until ready(), polling the doorbell fd (drained) and the socket
        (its end: BrokenPipeError), within the timeout."""
        import select   # noqa: PLC0415
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise socket.timeout("timed out")
            r, _, _ = select.select([fd, self.sock], [], [], 0.05 if left is None
                                    else min(left, 0.05))
            if self.sock in r and self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                raise BrokenPipeError("the peer closed the connection")
            if fd in r:
                try:
                    os.read(fd, 64)
                except BlockingIOError:
                    pass

    @staticmethod
    def _ring(fd):
        try:
            os.write(fd, b"!")          # the peer's doorbell, asleep or not
        except (BlockingIOError, BrokenPipeError):
            pass

    def settimeout(self, seconds):
        self.timeout = seconds

    def sendall(self, data):
        data = bytes(data)
        if len(data) > self.size:
            raise ValueError("more than the ring holds")
        head = self._u64(self.tx)
        self._wait(self.room_fd,
                   lambda: self.size - (head - self._u64(self.tx + 64)) >= len(data))
        off = head % self.size
        first = min(len(data), self.size - off)
        self.map[self.tx_buf + off:self.tx_buf + off + first] = data[:first]
        self.map[self.tx_buf:self.tx_buf + len(data) - first] = data[first:]
        struct.pack_into("<Q", self.map, self.tx, head + len(data))
        self._ring(self.data_fd)

    def send(self, data):
        self.sendall(data)
        return len(data)

    def recv(self, n):
        tail = self._u64(self.rx + 64)
        self._wait(self.data_fd, lambda: self._u64(self.rx) != tail)
        take = min(n, self._u64(self.rx) - tail)
        off = tail % self.size
        first = min(take, self.size - off)
        out = (self.map[self.rx_buf + off:self.rx_buf + off + first]
               + self.map[self.rx_buf:self.rx_buf + take - first])
        struct.pack_into("<Q", self.map, self.rx + 64, tail + take)
        self._ring(self.room_fd)
        return out

    def close(self):
        for fd in (self.data_fd, self.room_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.data_fd = self.room_fd = -1
        self.sock.close()
        self.map.close()


def shared_memory_held():
    """This process's mappings and descriptors of shared-memory regions
    (memfds of the shared-memory transport) and its read-only mappings of
    peers' buffer arenas (an environment's own arena, mapped read-write
    with its descriptor, lives as long as its pool and is not listed)."""
    held = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "memfd:flinkbuf-shm" in line or ("memfd:flinkbuf-pool" in line
                                                and line.split()[1] == "r--s"):
                held.append(line.split(None, 5)[-1].strip())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd:flinkbuf-shm" in target:
            held.append(f"fd {fd}: {target}")
    return held


def pool_arenas_held():
    """Mappings of shared buffer arenas (this process's and peers')."""
    with open("/proc/self/maps") as maps:
        return [line.split()[1] for line in maps if "memfd:flinkbuf-pool" in line]


def _hygiene():
    """What the child still holds after closing everything."""
    import gc   # noqa: PLC0415
    import flinkbuf.buffer as core   # noqa: PLC0415
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        gc.collect()
        counters = core.debug_counters()
        if not counters or not any(counters.values()):
            break
        time.sleep(0.05)
    return {"counters": core.debug_counters(), "threads": flinkbuf_threads(),
            "fds": num_fds(), "shared_memory": shared_memory_held()}


def _err(exc):
    cause = exc.__cause__
    info = {"type": type(exc).__name__, "msg": str(exc)[:2000]}
    if cause is not None:
        info["cause"] = {"type": type(cause).__name__, "msg": str(cause)[:2000],
                         "type_name": getattr(cause, "type_name", None),
                         "message": getattr(cause, "message", None)}
    return info


def _plan_writer(part, tag, plan, codec, buffer_timeout, released=None):
    """Write ``plan`` (see expected_streams).  Records for a subpartition
    whose consumer released it are skipped once a write raised
    PartitionReleasedError for it (``released`` collects those)."""
    from flinkbuf.io import PartitionReleasedError, RecordWriter, UserEvent   # noqa: PLC0415
    targets = []
    w = RecordWriter(part, lambda rec, n: targets.pop(), codec=codec,
                     buffer_timeout=buffer_timeout)
    i = 0
    for op in plan:
        if op[0] == "r":
            data = record_bytes(tag, i, op[1])
            i += 1
            if released is not None and op[2] in released:
                continue
            targets.append(op[2])
            try:
                w.emit(data)
            except PartitionReleasedError:
                if released is None:
                    raise
                released.add(op[2])
        else:
            w.broadcast_event(UserEvent(op[1] if op[0] == "e" else "x" * op[1]))
    return w


def role_producer(cfg, cmds):
    """Partitions written from threads, as ``cfg["partitions"]`` says:
    ``{"id", "n", "tag", "plan", "min_buffers"?, "mode"?}``.  mode "plan"
    (default) writes the plan and finishes; "fail" writes it and then fails
    with ValueError("boom"); "endless" writes records of ``size`` to
    subpartition 0..n-1 round robin (or as ``selector`` says) until a write raises (progress is
    reported every 50 ms); "tolerant" writes the plan, skipping
    subpartitions whose consumers left; "idle" writes nothing (and does
    not finish).  Holds the environment until "close"; meanwhile
    "buffer_sizes" reports the buffer size each subpartition's consumer
    announced (None: none yet)."""
    from flinkbuf.io import create_partition   # noqa: PLC0415
    if cfg.get("start_delay"):
        time.sleep(cfg["start_delay"])
    env = _env(cfg)
    parts = []
    for p in cfg["partitions"]:
        part = create_partition(env.network_buffer_pool, p["n"],
                                min_buffers=p.get("min_buffers"))
        parts.append((p, part))
    if not cfg.get("register_late"):
        for p, part in parts:
            if not p.get("never_register"):
                env.register_partition(p["id"], part)
    _out(addr=_addr(env), rss=rss_bytes(), pool_bytes=cfg.get("num_segments", 256)
         * cfg.get("segment_size", 32768))
    if cfg.get("register_late"):
        cmds.wait_for("register", 30)
        for p, part in parts:
            env.register_partition(p["id"], part)

    def write(p, part):
        mode = p.get("mode", "plan")
        codec = p.get("codec", "bytes")
        bt = p.get("buffer_timeout")
        t0 = time.monotonic()
        try:
            if mode == "endless":
                from flinkbuf.io import RecordWriter   # noqa: PLC0415
                w = RecordWriter(part, p.get("selector", "round_robin"), codec=codec,
                                 buffer_timeout=bt)
                stop = threading.Event()
                count = [0]

                def progress():
                    while not stop.wait(0.05):
                        _out(progress=p["id"], emitted=count[0],
                             back_pressured_ns=w.back_pressured_time_ns, rss=rss_bytes())
                threading.Thread(target=progress, daemon=True).start()
                data = bytearray(record_bytes(p["tag"], 0, max(6, p.get("size", 1024))))
                limit = p.get("limit", 1 << 62)
                pace = p.get("pace", 0)
                t_err = None
                try:
                    while count[0] < limit:
                        struct.pack_into(">I", data, 2, count[0] & 0xFFFFFFFF)
                        w.emit(data)
                        count[0] += 1
                        if pace and count[0] % 10 == 0:
                            time.sleep(pace)
                    w.close()
                except BaseException as exc:
                    t_err = time.monotonic()
                    stop.set()
                    _out(written=p["id"], error=_err(exc), emitted=count[0],
                         t_error=t_err)
                    try:
                        w.close()
                    except BaseException:   # noqa: BLE001 - failing anyway
                        pass
                    return
                stop.set()
                _out(written=p["id"], emitted=count[0],
                     back_pressured_ns=w.back_pressured_time_ns)
                return
            released = set() if mode == "tolerant" else None
            w = _plan_writer(part, p["tag"], p["plan"], codec, bt, released)
            if mode == "fail":
                w.fail(ValueError("boom"))
            else:
                w.close()
            _out(written=p["id"], released=sorted(released or ()),
                 back_pressured_ns=w.back_pressured_time_ns,
                 seconds=time.monotonic() - t0)
        except BaseException as exc:   # noqa: BLE001 - reported
            _out(written=p["id"], error=_err(exc))

    threads = [threading.Thread(target=write, args=pp, daemon=True) for pp in parts
               if pp[0].get("mode") != "idle"]
    for t in threads:
        t.start()
    cmd = _until_close(cmds, parts, cfg["life"])
    for t, pp in zip(threads, [pp for pp in parts if pp[0].get("mode") != "idle"]):
        if pp[0].get("mode") != "endless":    # endless writers end with the environment
            t.join(cmd.get("join", 10))
    stats = env.connection_stats()
    env.close()
    for t in threads:
        t.join(5)
    parts = None
    _out(closed=True, stats=stats, **_hygiene())


def _until_close(cmds, parts, life):
    """The "close" command, answering "buffer_sizes" until it comes."""
    deadline = time.monotonic() + life
    while True:
        cmd = cmds.wait_for_any(("close", "buffer_sizes"), max(0.0, deadline - time.monotonic()))
        if cmd["cmd"] != "buffer_sizes":
            return cmd
        _out(buffer_sizes={p["id"]: [part.subpartition(k).buffer_size for k in range(p["n"])]
                           for p, part in parts})


def _paused(env, cmds, life):
    """Until "resume": "drop_connections" closes this environment's
    connections (its gates keep what they hold)."""
    deadline = time.monotonic() + life
    while True:
        cmd = cmds.get(max(0.0, deadline - time.monotonic()))
        if cmd is None or cmd["cmd"] in ("resume", "eof"):
            return
        if cmd["cmd"] == "drop_connections":
            for conn in env.connections():
                conn.close()
            _out(dropped=True)


def role_consumer(cfg, cmds):
    """Gates (``cfg["gates"]``: lists of [address, partition_id,
    subpartition]) read from one thread each; reports per gate and
    channel what arrived (digests, ["E", payload] for events), or the
    error.  ``pause_after``: report "paused" after that many records of
    gate 0 and wait for "resume"; ``close_after``: close gate 0 after that
    many records; ``progress``: report counts every 50 ms."""
    from flinkbuf.io import UserEvent   # noqa: PLC0415
    env = _env(cfg)
    _out(addr=_addr(env), rss=rss_bytes(), pool_bytes=cfg.get("num_segments", 256)
         * cfg.get("segment_size", 32768))
    if cfg.get("wait_go"):
        cmds.wait_for("go", 30)
    codec = cfg.get("codec", "bytes")
    full = cfg.get("report", "full")
    results = {}
    counts = [0] * len(cfg["gates"])

    def read(k, specs):
        t0 = time.monotonic()
        streams = [[] for _ in specs]
        gate = None
        try:
            gate = env.create_input_gate([tuple(s) for s in specs], codec=codec)
            n = 0
            while True:
                try:
                    ch, item = gate.next_with_channel()
                except StopIteration:
                    break
                if isinstance(item, UserEvent):
                    streams[ch].append(["E", item.payload])
                    continue
                n += 1
                counts[k] = n
                if full == "full":
                    streams[ch].append(digest(bytes(item)))
                elif full == "count":
                    # [count, last index, order violations] (endless producers
                    # number their records)
                    if not streams[ch]:
                        streams[ch][:] = [0, -1, 0]
                    st_ = streams[ch]
                    st_[0] += 1
                    idx = struct.unpack_from(">I", item, 2)[0] if len(item) >= 6 else -1
                    if idx <= st_[1]:
                        st_[2] += 1
                    st_[1] = idx
                if k == 0 and cfg.get("pause_after") == n:
                    _out(paused=n)
                    _paused(env, cmds, cfg["life"])
                if k == 0 and cfg.get("close_after") == n:
                    gate.close()
                    results[k] = {"closed_early": n, "streams": streams}
                    _out(gate_closed=k)
                    return
            results[k] = {"streams": streams, "seconds": time.monotonic() - t0}
        except BaseException as exc:   # noqa: BLE001 - reported
            results[k] = {"error": _err(exc), "t_error": time.monotonic(),
                          "elapsed": time.monotonic() - t0, "streams": streams,
                          "count": counts[k]}
            _out(gate_error=k, error=_err(exc), t_error=time.monotonic())
            # The connection's reader thread may still be giving buffers back
            # into this gate's pools (engine bug, see
            # test_dropping_a_gate_as_soon_as_its_connection_fails).
            time.sleep(0.05)
        finally:
            if gate is not None:
                gate.close()

    threads = [threading.Thread(target=read, args=(k, specs), daemon=True)
               for k, specs in enumerate(cfg["gates"])]
    for t in threads:
        t.start()
    if cfg.get("progress"):
        while any(t.is_alive() for t in threads):
            _out(progress=list(counts), rss=rss_bytes())
            time.sleep(0.05)
    for t in threads:
        t.join(cfg["life"])
    stats = env.connection_stats()
    _out(results=[results.get(k) for k in range(len(cfg["gates"]))], stats=stats)
    if cfg.get("hold"):
        cmds.wait_for("close", cfg["life"])
    env.close()
    _out(closed=True, **_hygiene())


def role_peer(cfg, cmds):
    """Produces ``cfg["partition"]`` (as role_producer's plan mode) and,
    after "go" with ``specs``, reads a gate over them: both directions
    between two peers can share one connection."""
    from flinkbuf.io import UserEvent, create_partition   # noqa: PLC0415
    env = _env(cfg)
    p = cfg["partition"]
    part = create_partition(env.network_buffer_pool, p["n"], min_buffers=p.get("min_buffers"))
    env.register_partition(p["id"], part)
    _out(addr=_addr(env))

    def write():
        try:
            w = _plan_writer(part, p["tag"], p["plan"], "bytes", p.get("buffer_timeout"))
            w.close()
            _out(written=p["id"])
        except BaseException as exc:   # noqa: BLE001 - reported
            _out(written=p["id"], error=_err(exc))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    go = cmds.wait_for("go", 30)
    streams = [[] for _ in go["specs"]]
    result = {"streams": streams}
    try:
        with env.create_input_gate([tuple(s) for s in go["specs"]], codec="bytes") as gate:
            while True:
                try:
                    ch, item = gate.next_with_channel()
                except StopIteration:
                    break
                streams[ch].append(["E", item.payload] if isinstance(item, UserEvent)
                                   else digest(bytes(item)))
    except BaseException as exc:   # noqa: BLE001 - reported
        result["error"] = _err(exc)
    writer.join(10)
    # Counted before the test lets either side close (a peer's close ends
    # the connection on this side too).
    stats, conns = env.connection_stats(), len(env.connections())
    _out(results=[result])
    cmds.wait_for("close", cfg["life"])
    env.close()
    _out(closed=True, stats=stats, connections=conns, **_hygiene())


class _RawBorrower:
    """A peer spoken by hand over shared memory, connected to ``addr``:
    ``start`` asks for subpartition ``sub`` of "p" with ``credit`` and
    reads frames in a thread of its own, each to ``on_frame(msg_id,
    body)``, answering heartbeats until it stalls; it never releases a lent
    buffer.  ``lender_fds``: the lender's arena and ledger (the caller's
    to close)."""

    def __init__(self, cfg):
        from flinkbuf.network import handshake   # noqa: PLC0415
        self.cfg = cfg
        port = cfg["addr"].rpartition(":")[2]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"\0flinkbuf-tcp-{port}")
        _, _, fds, _ = handshake.client(sock, SECRET, "127.0.0.1:1", cfg["segment_size"], 5.0,
                                        shared_memory=True)
        self.ring = RingSocket(sock, *fds[:3], side=1)
        self.ring.settimeout(None)
        self.lender_fds = fds[3:]
        self._send_mu = threading.Lock()
        self._stalled = False

    def start(self, on_frame):
        self.ring.sendall(request_frame(1, self.cfg["sub"], self.cfg["credit"], "p"))
        threading.Thread(target=self._read, args=(on_frame,), daemon=True).start()

    def _read(self, on_frame):
        data = b""
        try:
            while True:
                data += self.ring.recv(65536)
                while len(data) >= 9 and len(data) >= struct.unpack_from(">I", data)[0]:
                    length, _, msg_id = struct.unpack_from(">IIB", data)
                    body, data = data[9:length], data[length:]
                    on_frame(msg_id, body)
                    answer = heartbeat_answer(msg_id, body)
                    with self._send_mu:
                        if answer is not None and not self._stalled:
                            self.ring.sendall(answer)
        except (OSError, ValueError):
            pass

    def stall(self, data):
        """Send ``data`` (the first bytes of a frame) and nothing more."""
        with self._send_mu:
            self._stalled = True
            self.ring.sendall(data)

    def close(self):
        self.ring.close()


def _raw_hoard(cfg, cmds):
    """A _RawBorrower that counts the buffers lent to it; on "close" its
    end of the connection."""
    peer = _RawBorrower(cfg)       # (the lender's arena and ledger left untouched)
    lent = [0]

    def count(msg_id, body):
        if msg_id == MSG_LENT:
            lent[0] += 1
            _out(lent=lent[0])

    peer.start(count)
    _out(addr="127.0.0.1:1")
    cmds.wait_for("close", cfg["life"])
    peer.close()
    return peer.lender_fds


LEDGER_HEADER, LEDGER_HELD, LEDGER_LET_GO = 64, 2, 2     # csrc/network/lease.h


def role_borrower(cfg, cmds):
    """An honest borrower spoken by hand (_RawBorrower): it reads each
    segment lent to it in place (the lender's arena mapped read-only) and
    marks it held in the lender's ledger, as a flinkbuf consumer does.
    Commands: "stall" (it sends the first bytes of a frame and nothing
    more: the lender waits for the rest), "check" (whether every segment
    it holds has the bytes it had when lent), "let_go" (the ledger says it
    reads none of them any more), "close" (its end of the connection)."""
    import mmap   # noqa: PLC0415
    peer = _RawBorrower(cfg)
    arena_fd, ledger_fd = peer.lender_fds
    arena = mmap.mmap(arena_fd, os.fstat(arena_fd).st_size, prot=mmap.PROT_READ)
    ledger = mmap.mmap(ledger_fd, os.fstat(ledger_fd).st_size)
    os.close(arena_fd)
    os.close(ledger_fd)
    held = {}                      # segment -> (offset, size, digest when lent)

    def take(msg_id, body):
        if msg_id == MSG_LENT:
            size, segment = struct.unpack_from(">II", body, 13)
            ledger[LEDGER_HEADER + segment] = LEDGER_HELD
            at = segment * cfg["segment_size"]      # (a multiple of 64: the stride)
            held[segment] = (at, size, digest(arena[at:at + size]))
            _out(lent=len(held))

    peer.start(take)
    _out(addr="127.0.0.1:1")
    while True:
        cmd = cmds.wait_for_any(("stall", "check", "let_go", "close"), cfg["life"])
        if cmd["cmd"] == "stall":
            stall = credit_frame(1, 1)[:5]
            peer.stall(stall)
            _out(stalled=len(stall))
        elif cmd["cmd"] == "check":
            _out(intact=all(digest(arena[at:at + n]) == d for at, n, d in held.values()),
                 held=len(held))
        elif cmd["cmd"] == "let_go":
            struct.pack_into("<I", ledger, 0, LEDGER_LET_GO)
            _out(let_go=True)
        else:
            break
    peer.close()
    _out(closed=True)


def role_hoarder(cfg, cmds):
    """Reads subpartition ``sub`` of "p" at ``addr`` and never gives back
    what it holds: ``mode`` "raw", a peer spoken by hand (_raw_hoard);
    "flinkbuf", a gate that reads ``reads`` records and keeps the rest.  On
    "close" it ends its connection (raw: its socket; flinkbuf: its
    environment, with the gate unread) and lives on until stdin ends."""
    if cfg["mode"] == "raw":
        kept = _raw_hoard(cfg, cmds)
    else:
        env = _env(cfg)
        gate = env.create_input_gate([(cfg["addr"], "p", cfg["sub"])], codec="bytes")
        for _ in range(cfg.get("reads", 0)):
            next(gate)
        _out(addr=_addr(env))
        cmds.wait_for("close", cfg["life"])
        env.close()
        kept = [gate]
    _out(closed=True)
    cmds.wait_for("eof", cfg["life"])
    del kept


def role_race_fail_then_drop(cfg, cmds):
    """Up to ``iterations`` times: a gate of many remote channels (each
    holding several buffers) whose connection drops (the producer's
    environment closes in another thread); the consumer closes and drops
    the gate as soon as it raises.  Prints "survived" at the end."""
    import gc   # noqa: PLC0415
    from flinkbuf.errors import RemoteConnectionError   # noqa: PLC0415
    from flinkbuf.io import RecordWriter, create_partition   # noqa: PLC0415
    from flinkbuf.network import NetworkEnvironment   # noqa: PLC0415
    n = cfg.get("channels", 40)
    deadline = time.monotonic() + cfg.get("seconds", 30)
    for it in range(cfg.get("iterations", 60)):
        if time.monotonic() > deadline:
            break
        prod = NetworkEnvironment(n * 3 + 10, 256, secret=SECRET)
        cons = NetworkEnvironment(n * 8 + 40, 256, secret=SECRET,
                                  exclusive_buffers_per_channel=6, floating_buffers_per_gate=16)
        part = create_partition(prod.network_buffer_pool, n, min_buffers=n * 3)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", s) for s in range(n)],
                                      codec="bytes")
        w = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0)
        for _ in range(n * 2):
            w.emit(b"x" * 10)
        next(gate)
        threading.Thread(target=prod.close).start()
        try:
            for _ in gate:
                pass
        except RemoteConnectionError:
            pass
        gate.close()
        del gate
        gc.collect()
        cons.close()
        try:
            w.close()
        except BaseException:   # noqa: BLE001 - released
            pass
        part.release()
        _out(iteration=it)
    _out(survived=True, **_hygiene())


def main():
    import faulthandler   # noqa: PLC0415
    import logging   # noqa: PLC0415
    role, arg = sys.argv[1], sys.argv[2]
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            cfg = json.load(f)
    else:
        cfg = json.loads(arg)
    faulthandler.dump_traceback_later(cfg.get("life", 60), exit=True)
    if "rlimit_nofile" in cfg:           # a process with few descriptors to spare
        import resource   # noqa: PLC0415
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (cfg["rlimit_nofile"], resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(name)s %(levelname)s %(message)s")
    cmds = _Stdin()
    try:
        globals()["role_" + role](cfg, cmds)
    except BaseException as exc:   # noqa: BLE001 - reported
        import traceback   # noqa: PLC0415
        traceback.print_exc()
        _out(fatal=_err(exc))
        sys.exit(3)


if __name__ == "__main__":
    main()
