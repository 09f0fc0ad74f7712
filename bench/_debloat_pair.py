"""What the debloating benchmarks share: an unthrottled producer and one
consumer's gate, in one process (``local``) or two (a NetworkEnvironment
each), with buffer debloating off or on."""

import contextlib
import multiprocessing as mp
import threading
import time

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.io import InputGate, RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment

SECRET = b"debloat-sojourn-benchmark-secret"


def _produce(writer, record, stop):
    """Emit ``record(seq)`` until ``stop`` or the consumer lets go."""
    seq = 0
    try:
        while not stop.is_set():
            writer.emit(record(seq))
            seq += 1
    except Exception:               # noqa: BLE001 - the consumer released the partition
        pass


def _environment(transport, **options):
    """A NetworkEnvironment over ``transport`` (``sealed``: TCP, every
    frame sealed)."""
    if transport == "sealed":
        return NetworkEnvironment(256, secret=SECRET, transport="tcp", encryption=True,
                                  **options)
    return NetworkEnvironment(256, secret=SECRET, transport=transport, **options)


def _producer_process(pipe, transport, debloat, record):
    with _environment(transport) as env:
        part = create_partition(env.network_buffer_pool, 1, buffer_debloat=debloat)
        env.register_partition("p", part)
        writer = RecordWriter(part, "round_robin")
        stop = threading.Event()
        t = threading.Thread(target=_produce, args=(writer, record, stop), daemon=True)
        t.start()
        pipe.send("%s:%d" % env.address)
        pipe.recv()                  # the consumer is done
        stop.set()
        t.join(10)


def run_pair(transport, debloat, target, record, consume):
    """``consume(gate)`` for a gate that reads what a producer emits as
    fast as it can (``record(seq)``, seq = 0, 1, ...) over ``transport``
    (``"sealed"``: TCP with every frame sealed; ``"local"``: a partition of
    this process), with debloating
    ``debloat`` at ``target`` seconds; what ``consume`` returns."""
    options = {"buffer_debloat": debloat, "buffer_debloat_target": target}
    if transport == "local":
        nbp = NetworkBufferPool(256, 32768)
        part = create_partition(nbp, 1, buffer_debloat=debloat)
        writer = RecordWriter(part, "round_robin")
        stop = threading.Event()
        t = threading.Thread(target=_produce, args=(writer, record, stop), daemon=True)
        t.start()
        gate = InputGate([(part, 0)], **options)
        try:
            return consume(gate)
        finally:
            stop.set()
            gate.close()
            t.join(10)
            nbp.destroy()
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_producer_process, args=(there, transport, debloat, record),
                       daemon=True)
    proc.start()
    try:
        address = here.recv()
        with _environment(transport, **options) as env:
            gate = env.create_input_gate([(address, "p", 0)])
            try:
                return consume(gate)
            finally:
                here.send("done")
                gate.close()
    finally:
        proc.join(20)
        if proc.is_alive():
            proc.kill()


def paced(records, rate, seconds):
    """``(record, clock ns at its read)`` of ``records`` read at ``rate``
    a second for ``seconds`` (the record read at the end is the last)."""
    t0 = time.monotonic_ns()
    end = t0 + int(seconds * 1e9)
    period = 1e9 / rate
    n = 0
    for record in records:
        now = time.monotonic_ns()
        yield record, now
        n += 1
        if now >= end:
            return
        ahead = t0 + n * period - now
        if ahead > 5e5:              # sleep in slices of at least half a millisecond
            time.sleep(ahead / 1e9)


def debloated_size(gate):
    """The buffer size ``gate`` announced last (None: it does not debloat)."""
    metrics = gate._debloat_metrics()
    return metrics["buffer_size"] if metrics else None


@contextlib.contextmanager
def busy(n):
    """``n`` busy-loop processes beside what runs inside."""
    procs = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def _spin():
    while True:
        pass
