#!/usr/bin/env python
"""A keyed count through every way flinkbuf moves records between two
processes, beside what a Python user would write instead and beside Apache
Flink's own job, in one run.

The job: N ``(key, value)`` records (``key = i % 1000``, ``value = i``), two
processes, each producing its half, routing each record by its key to one
of the two and counting, per key, what it receives.  Every run checks the
counts: each key counted exactly as often as it occurs, and (where records
are exchanged) by one process only.  Rows:

  * ``floor``: the same Python loops with no exchange: each process makes
    its half of the records and counts them itself: what the Python loops
    alone cost, under any exchange that runs them.
  * ``per_record``: a :class:`~flinkbuf.RecordWriter` per process with a
    :class:`~flinkbuf.HashSelector` on the key, ``emit`` in a Python loop
    (in a thread of its own), the process's gate (one channel local, one
    over the network) read by a Python loop; TCP between the processes;
    ``per_record_shm`` the same over shared memory.
  * ``emit_all``: the same with ``writer.emit_all(records)`` (the loop, the
    key's hash and the serializer in C) and ``gate.read_many(4096)``.
  * ``batch``: numpy columns (``k``, ``v``; the keys a slice of a
    precomputed cycle of 0..999) in batches of 64 Ki rows through
    ``BatchWriter(partition, key="k")``, the gate made with
    ``codec="arrow"``, counted with ``np.bincount``; 256 KiB network buffers;
    TCP between the processes, ``batch_shm`` the same over shared memory.
    ``numpy_floor``: the same batches counted with no exchange.
  * ``mp_queue``: ``multiprocessing.Queue`` (one per process, at most 64
    items in it), records routed by a table of each key's process and put in
    lists of 1,000: the per-record way without flinkbuf.
  * ``zmq_numpy``: the batch way without flinkbuf: each 64 Ki batch split by
    the process of each key (flinkbuf's vectorized
    :func:`~flinkbuf.io.assign_keys_to_operators`, Flink's key groups, so
    every row routes alike) and each piece's two columns sent as raw
    buffers (pyzmq PUSH/PULL over TCP, ``send_multipart(copy=False)``, a
    high-water mark of 4 messages as the only backpressure), counted with
    ``np.bincount``.  ``mp_numpy``: the same pieces through
    multiprocessing pipes (``send_bytes`` of each column, a pipe from each
    process to each, its buffer the only backpressure).  ``zmq_numpy_ipc``:
    ``zmq_numpy`` over Unix domain sockets (``ipc://``), pyzmq's way between
    processes of one host, the peer of ``batch_shm`` (flinkbuf's default
    there) as ``zmq_numpy`` is of ``batch``.
  * ``flink_jvm``: Apache Flink's job (bench/flink/KeyedCount.java): a
    sequence source, ``keyBy`` and a counting ``flatMap``, parallelism 2 on
    a local MiniCluster of two TaskManagers (the records for the other one
    cross Netty over loopback), ``--flink-records`` records a job: one JVM,
    started before the first round, warmed up by two jobs, runs a job at
    its turn in each round.  It needs Java and javac and fetches Flink's
    jars once (bench/flink_jvm.py says where to); without them its row is
    skipped, as are the rows of a flinkbuf without ``emit_all`` or
    ``BatchWriter``.

The per-record rows move ``--records`` records, the batch rows ``--rows``.
A measurement runs from the first record made to the last one counted (the
processes' set-up and connections outside it).  Each round measures every
row once (every other round in the opposite order, so a slow spell of the
machine falls on all of them); the table shows the medians of
``--rounds`` rounds, each row's rate over ``per_record``'s, the ``floor``'s
and ``flink_jvm``'s, and the CPU time both processes spent per record
(``flink_jvm``: its JVM's over the job, the job's deployment included); on
a machine whose cores are busy with other work too, the CPU time is the
steadier figure::

    python bench/keyed_count.py --rounds 5
    python bench/keyed_count.py --busy --rounds 5      # a busy process beside it
    python bench/keyed_count.py per_record batch zmq_numpy --rows 40000000

``--busy [N]`` runs N (default 1) processes spinning in a Python loop
beside every measurement, as on a machine where other work shares the
cores.  Run it on a release build.
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from multiprocessing.connection import wait

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import flink_jvm  # noqa: E402
import network_peers  # noqa: E402
from _debloat_pair import busy  # noqa: E402

import flinkbuf  # noqa: E402
from flinkbuf import HashSelector, InputGate, RecordWriter, create_partition  # noqa: E402
from flinkbuf.io import assign_keys_to_operators  # noqa: E402
from flinkbuf.network import NetworkEnvironment  # noqa: E402

zmq = network_peers.zmq
monotonic_ns = time.monotonic_ns

KEYS = 1000
TASKS = 2
BATCH_ROWS = 64 * 1024
READ_MANY = 4096
MPQ_BATCH = 1000
MPQ_MAXSIZE = 64
ZMQ_HWM = 4
POOL_BYTES = 16 << 20
SECRET = b"flinkbuf-keyed-count-benchmark-secret"
JOIN_TIMEOUT = 600.0
# (row, peer, at least this many times the peer's rate); (row, rate)
# batch over TCP against the TCP peers, batch_shm (the default transport
# between processes on one host) against the ones of one host
TARGETS = (("batch", "per_record", 10.0), ("batch", "zmq_numpy", 1.5),
           ("batch", "mp_numpy", 1.5), ("batch_shm", "per_record", 10.0),
           ("batch_shm", "zmq_numpy_ipc", 1.5), ("batch_shm", "mp_numpy", 1.5),
           ("batch", "flink_jvm", 10.0), ("batch_shm", "flink_jvm", 10.0))
TARGET_RATES = (("batch", 63e6), ("batch_shm", 63e6))


def _route():
    """The process of each key 0..KEYS-1 (Flink's key groups)."""
    out = np.empty(KEYS, dtype=np.int8)
    assign_keys_to_operators(np.arange(KEYS, dtype=np.int64), out, TASKS)
    return out.tolist()


ROUTE = _route()


def _half(n, index):
    return n * index // TASKS, n * (index + 1) // TASKS


def _index(link):
    return int(link.role.removeprefix("task"))


# ---- making and counting -------------------------------------------------------------------

def _records(lo, hi):
    return ((i % KEYS, i) for i in range(lo, hi))


# The keys (i % KEYS) of the rows of a batch: a slice of this cycle, a view,
# so that making a batch costs a numpy row half what computing them would.
_KEY_CYCLE = np.tile(np.arange(KEYS, dtype=np.int64), BATCH_ROWS // KEYS + 2)


def _batches(lo, hi):
    for first in range(lo, hi, BATCH_ROWS):
        ids = np.arange(first, min(first + BATCH_ROWS, hi), dtype=np.int64)
        start = first % KEYS
        yield {"k": _KEY_CYCLE[start:start + len(ids)], "v": ids}


def _count_records(records):
    counts = [0] * KEYS
    for k, _ in records:
        counts[k] += 1
    return counts


def _count_read_many(gate):
    counts = [0] * KEYS
    read_many = gate.read_many
    while records := read_many(READ_MANY):
        for k, _ in records:
            counts[k] += 1
    return counts


def _count_batches(batches):
    counts = np.zeros(KEYS, dtype=np.int64)
    for batch in batches:
        counts += np.bincount(batch["k"], minlength=KEYS)
    return counts.tolist()


class _Producer(threading.Thread):
    """``fn(*args)`` in a thread; :meth:`result` re-raises what it raised."""

    def __init__(self, fn, *args):
        super().__init__(name="producer", daemon=True)
        self._fn, self._args, self.error = fn, args, None
        self.start()

    def run(self):
        try:
            self._fn(*self._args)
        except BaseException as exc:      # noqa: BLE001 - re-raised by result()
            self.error = exc

    def result(self):
        self.join(JOIN_TIMEOUT)
        if self.error is not None:
            raise self.error


def _timed(link, produce, consume):
    """Start the clock at the barrier, produce in a thread, consume here."""
    link.wait()
    t0 = monotonic_ns()
    producer = _Producer(produce)
    counts = consume()
    t_end = monotonic_ns()
    producer.result()
    link.wait()
    return {"t0": t0, "t_end": t_end, "counts": counts}


# ---- the rows: one function per row, run by both processes ----------------------------------

def _local(link, spec, make, count):
    """No exchange: this process counts the half it makes."""
    lo, hi = _half(spec["n"], _index(link))
    link.wait()
    t0 = monotonic_ns()
    counts = count(make(lo, hi))
    t_end = monotonic_ns()
    link.wait()
    return {"t0": t0, "t_end": t_end, "counts": counts}


def floor_task(link, spec):
    return _local(link, spec, _records, _count_records)


def numpy_floor_task(link, spec):
    return _local(link, spec, _batches, _count_batches)


def _emit_records(writer, lo, hi):
    with writer:
        emit = writer.emit
        for i in range(lo, hi):
            emit((i % KEYS, i))


def _emit_all(writer, lo, hi):
    with writer:
        writer.emit_all(_records(lo, hi))


def _emit_batches(writer, lo, hi):
    with writer:
        for batch in _batches(lo, hi):
            writer.emit(batch)


# row -> (how it writes, how it reads a gate, the gate's codec, network buffer size)
FLINKBUF_ROWS = {
    "per_record": (_emit_records, _count_records, "typed", 32 << 10),
    "emit_all": (_emit_all, _count_read_many, "typed", 32 << 10),
    "batch": (_emit_batches, _count_batches, "arrow", 256 << 10),
}


def _writer(row, partition):
    if row == "batch":
        return flinkbuf.BatchWriter(partition, key="k")
    return RecordWriter(partition, HashSelector(0))


def flinkbuf_task(link, spec):
    index = _index(link)
    lo, hi = _half(spec["n"], index)
    produce, consume, codec, segment = FLINKBUF_ROWS[spec["row"]]
    with NetworkEnvironment(POOL_BYTES // segment, segment, secret=SECRET,
                            transport=spec["transport"]) as env:
        partition = create_partition(env.network_buffer_pool, TASKS, min_buffers=16)
        env.register_partition("keyed", partition)
        link.send(env.address)
        other = link.recv()
        addresses = [env.address, other] if index == 0 else [other, env.address]
        gate = env.create_input_gate([(a, "keyed", index) for a in addresses], codec=codec)
        writer = _writer(spec["row"], partition)
        try:
            return _timed(link, lambda: produce(writer, lo, hi), lambda: consume(gate))
        finally:
            gate.close()


def mpq_shared(mpc, spec):
    return [mpc.Queue(MPQ_MAXSIZE) for _ in range(TASKS)]


def _put_batches(queues, lo, hi):
    puts = [q.put for q in queues]
    route = ROUTE
    pending = [[] for _ in range(TASKS)]
    try:
        for i in range(lo, hi):
            k = i % KEYS
            d = route[k]
            batch = pending[d]
            batch.append((k, i))
            if len(batch) == MPQ_BATCH:
                puts[d](batch)
                pending[d] = []
        for d, batch in enumerate(pending):
            if batch:
                puts[d](batch)
    finally:
        for put in puts:
            put(None)                     # this producer's end


def _get_batches(queue):
    get = queue.get
    ends = 0
    while ends < TASKS:
        batch = get()
        if batch is None:
            ends += 1
            continue
        yield from batch


def mp_queue_task(link, spec):
    index = _index(link)
    lo, hi = _half(spec["n"], index)
    queues = link.shared
    return _timed(link, lambda: _put_batches(queues, lo, hi),
                  lambda: _count_records(_get_batches(queues[index])))


def _pieces(lo, hi):
    """``(process, keys, values)``: each batch's rows split by their key's
    process, one piece per process that has rows in it."""
    for batch in _batches(lo, hi):
        keys, values = batch["k"], batch["v"]
        dest = np.empty(len(keys), dtype=np.int8)
        assign_keys_to_operators(keys, dest, TASKS)
        for d in range(TASKS):
            mask = dest == d
            if mask.any():
                yield d, keys[mask], values[mask]


def _send_pieces(pushes, lo, hi):
    try:
        for d, keys, values in _pieces(lo, hi):
            pushes[d].send_multipart([keys, values], copy=False)
    finally:
        for push in pushes:
            push.send(b"")                # this producer's end


def _count_pieces(pull):
    counts = np.zeros(KEYS, dtype=np.int64)
    ends = 0
    while ends < TASKS:
        frames = pull.recv_multipart(copy=False)
        if len(frames) == 1:
            ends += 1
            continue
        counts += np.bincount(np.frombuffer(frames[0].buffer, dtype=np.int64), minlength=KEYS)
    return counts.tolist()


def _zmq_socket(ctx, kind, hwm_option):
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(hwm_option, ZMQ_HWM)
    return sock


def zmq_numpy_task(link, spec):
    index = _index(link)
    lo, hi = _half(spec["n"], index)
    ctx = zmq.Context()
    pull = _zmq_socket(ctx, zmq.PULL, zmq.RCVHWM)
    pushes = []
    ipc = tempfile.TemporaryDirectory() if spec["row"] == "zmq_numpy_ipc" else None
    try:
        pull.bind(f"ipc://{ipc.name}/pull" if ipc else "tcp://127.0.0.1:*")
        mine = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        link.send(mine)
        other = link.recv()
        for endpoint in ([mine, other] if index == 0 else [other, mine]):
            pushes.append(_zmq_socket(ctx, zmq.PUSH, zmq.SNDHWM))
            pushes[-1].connect(endpoint)
        return _timed(link, lambda: _send_pieces(pushes, lo, hi), lambda: _count_pieces(pull))
    finally:
        for sock in [pull, *pushes]:
            sock.close(0)
        ctx.term()
        if ipc is not None:
            ipc.cleanup()


def mp_pipes(mpc, spec):
    """A one-way pipe from each process to each: ``[producer][consumer]``."""
    return [[mpc.Pipe(duplex=False) for _ in range(TASKS)] for _ in range(TASKS)]


def _write_pieces(conns, lo, hi):
    try:
        for d, keys, values in _pieces(lo, hi):
            conns[d].send_bytes(keys)
            conns[d].send_bytes(values)
    finally:
        for conn in conns:
            conn.send_bytes(b"")          # this producer's end


def _count_pipes(readers):
    counts = np.zeros(KEYS, dtype=np.int64)
    live = list(readers)
    while live:
        for reader in wait(live):
            keys = reader.recv_bytes()
            if not keys:
                live.remove(reader)
                continue
            reader.recv_bytes()           # the values
            counts += np.bincount(np.frombuffer(keys, dtype=np.int64), minlength=KEYS)
    return counts.tolist()


def mp_numpy_task(link, spec):
    index = _index(link)
    lo, hi = _half(spec["n"], index)
    pipes = link.shared
    writers = [pipes[index][d][1] for d in range(TASKS)]
    readers = [pipes[p][index][0] for p in range(TASKS)]
    return _timed(link, lambda: _write_pieces(writers, lo, hi), lambda: _count_pipes(readers))


# row -> (task, what the parent makes for both processes, records or rows, exchanges?)
ROWS = {
    "floor": (floor_task, None, "records", False),
    "per_record": (flinkbuf_task, None, "records", True),
    "per_record_shm": (flinkbuf_task, None, "records", True),
    "emit_all": (flinkbuf_task, None, "records", True),
    "mp_queue": (mp_queue_task, mpq_shared, "records", True),
    "numpy_floor": (numpy_floor_task, None, "rows", False),
    "batch": (flinkbuf_task, None, "rows", True),
    "batch_shm": (flinkbuf_task, None, "rows", True),
    "zmq_numpy": (zmq_numpy_task, None, "rows", True),
    "zmq_numpy_ipc": (zmq_numpy_task, None, "rows", True),
    "mp_numpy": (mp_numpy_task, mp_pipes, "rows", True),
    "flink_jvm": (None, None, "flink", True),
}


def unavailable(row):
    """Why ``row`` cannot run with this flinkbuf and these packages, or None."""
    if row == "emit_all" and not (hasattr(RecordWriter, "emit_all")
                                  and hasattr(InputGate, "read_many")):
        return "this flinkbuf has no RecordWriter.emit_all / InputGate.read_many"
    if row.startswith("batch") and not hasattr(flinkbuf, "BatchWriter"):
        return "this flinkbuf has no BatchWriter"
    if row.startswith("zmq_numpy") and zmq is None:
        return "pyzmq is not installed"
    return None


def expected_counts(n):
    """How often each key occurs among records 0..n-1."""
    return [n // KEYS + (k < n % KEYS) for k in range(KEYS)]


def check_counts(row, n, per_task, exchanged):
    """The processes' counts: each key exactly as often as it occurs, and
    where records were exchanged, counted by one process only."""
    want = expected_counts(n)
    total = [sum(c[k] for c in per_task) for k in range(KEYS)]
    wrong = [k for k in range(KEYS) if total[k] != want[k]]
    if wrong:
        k = wrong[0]
        raise RuntimeError(f"{row}: key {k} counted {total[k]} times, not {want[k]} "
                           f"({len(wrong)} keys wrong)")
    if exchanged:
        shared = [k for k in range(KEYS) if sum(1 for c in per_task if c[k]) > 1]
        if shared:
            raise RuntimeError(f"{row}: key {shared[0]} reached both processes")


def measure(row, n):
    """One run of ``row`` over ``n`` records: (records/s, CPU ns per record
    of both processes)."""
    task, shared, _, exchanged = ROWS[row]
    spec = {"n": n, "row": row.removesuffix("_shm"),
            "transport": "shm" if row.endswith("_shm") else "tcp"}
    out = network_peers._fork_pair(task, task, spec, shared, names=("task0", "task1"))
    sides = [out[f"task{i}"] for i in range(TASKS)]
    check_counts(row, n, [s["counts"] for s in sides], exchanged)
    ns = max(s["t_end"] for s in sides) - min(s["t0"] for s in sides)
    cpu = sum(s["cpu_ns"] or 0 for s in sides)
    return n / ns * 1e9, cpu / n


# ---- the run and its table -----------------------------------------------------------------

def _ratio(res, row, base):
    if row not in res or base not in res:
        return "-"
    return f"{statistics.median(res[row]['rate']) / statistics.median(res[base]['rate']):.2f}x"


def targets(res):
    """The targets' lines, met or not, from this run's medians."""
    def rate(row):
        return statistics.median(res[row]["rate"]) if row in res else None

    lines = []
    for row, peer, want in TARGETS:
        if rate(row) is None or rate(peer) is None:
            lines.append(f"target {row} >= {want:g}x {peer}: not measured in this run")
        else:
            r = rate(row) / rate(peer)
            lines.append(f"target {row} >= {want:g}x {peer}: "
                         f"{'met' if r >= want else 'NOT met'} ({r:.1f}x)")
    for row, want in TARGET_RATES:
        if rate(row) is None:
            lines.append(f"target {row} >= {want / 1e6:g} M rows/s: not measured in this run")
        else:
            lines.append(f"target {row} >= {want / 1e6:g} M rows/s: "
                         f"{'met' if rate(row) >= want else 'NOT met'} "
                         f"({rate(row) / 1e6:.1f} M)")
    return lines


def table(res, sizes):
    head = (f"{'row':<16} {'records':>11} {'M rec/s':>9} {'/per_record':>12} {'/floor':>8} "
            f"{'/flink_jvm':>11} {'cpu ns/rec':>11}  rounds (M rec/s)")
    lines = [head, "-" * len(head)]
    for row in res:
        m = statistics.median(res[row]["rate"])
        cpu = res[row]["cpu"]
        cpu_text = f"{statistics.median(cpu):11.0f}" if cpu else f"{'-':>11}"
        lines.append(f"{row:<16} {sizes[row]:>11,} {m / 1e6:9.2f} "
                     f"{_ratio(res, row, 'per_record'):>12} {_ratio(res, row, 'floor'):>8} "
                     f"{_ratio(res, row, 'flink_jvm'):>11} {cpu_text}  "
                     + " ".join(f"{r / 1e6:.2f}" for r in res[row]["rate"]))
    return lines


def _flink_job(rows, args, stack):
    """Flink's job, warmed up, if ``rows`` has it and it can run here."""
    if "flink_jvm" not in rows:
        return None
    try:
        with busy(args.busy):
            return stack.enter_context(flink_jvm.Job(args.flink_records))
    except flink_jvm.Unavailable as exc:
        print(f"flink_jvm: skipped: {exc}", flush=True)
        return None


def run(rows, args):
    """Every row's rates over ``args.rounds`` rounds, taking turns: {row:
    {"rate": [...], "cpu": [...]}}, and each row's records."""
    sizes = {"records": args.records, "rows": args.rows, "flink": args.flink_records}
    res = {}
    with contextlib.ExitStack() as stack:
        flink = _flink_job(rows, args, stack)
        rows = [row for row in rows if row != "flink_jvm" or flink is not None]
        for r in range(args.rounds):
            for row in rows if r % 2 == 0 else rows[::-1]:
                with busy(args.busy):
                    rate, cpu = flink.run() if row == "flink_jvm" else \
                        measure(row, sizes[ROWS[row][2]])
                entry = res.setdefault(row, {"rate": [], "cpu": []})
                entry["rate"].append(rate)
                entry["cpu"].append(cpu)
                print(f"round {r}: {row:<16} {rate / 1e6:8.2f} M records/s  "
                      f"cpu {cpu:6.0f} ns/record", flush=True)
    ordered = {row: res[row] for row in ROWS if row in res}
    return ordered, {row: sizes[ROWS[row][2]] for row in ordered}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("select", nargs="*", metavar="ROW",
                    help=f"the rows to run (default: all): {', '.join(ROWS)}")
    ap.add_argument("--records", type=int, default=8_000_000,
                    help="records of the per-record rows (default 8 M)")
    ap.add_argument("--rows", type=int, default=40_000_000,
                    help="rows of the batch rows (default 40 M)")
    ap.add_argument("--flink-records", type=int, default=40_000_000,
                    help="records of each Flink job (default 40 M)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy", type=int, nargs="?", const=1, default=0, metavar="N",
                    help="N processes (default 1) spinning beside every measurement")
    ap.add_argument("--no-flink", action="store_true", help="leave the flink_jvm row out")
    args = ap.parse_args(argv)
    unknown = [row for row in args.select if row not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}: choose from {', '.join(ROWS)}")
    if args.rounds < 1 or min(args.records, args.rows, args.flink_records) < KEYS:
        ap.error(f"--rounds must be at least 1, the sizes at least {KEYS}")
    rows = [row for row in (args.select or ROWS) if not (args.no_flink and row == "flink_jvm")]
    runnable = []
    for row in rows:
        why = unavailable(row)
        if why:
            print(f"{row}: skipped: {why}", flush=True)
        else:
            runnable.append(row)
    res, sizes = run(runnable, args)
    print()
    print("\n".join(table(res, sizes)))
    print()
    print("\n".join(targets(res)))
    if args.busy:
        print(f"({args.busy} busy process{'es' if args.busy > 1 else ''} beside every measurement)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
