"""Local exchange between threads: RecordWriter -> partitions -> InputGate,
against queue.Queue(maxsize=1000) carrying one record per item, same topology,
same run (conventions: bench/run.py).  ops = records delivered."""

import queue
import threading

import numpy as np
import pytest

import flinkbuf as fb
from conftest import scale

N = scale(200_000, 2_000)        # records per producer
SEGMENT = 32 * 1024
RECORDS = {
    "int_int": [(i, i * 7) for i in range(N)],
    "bytes_1KiB": [bytes([i % 256]) * 1024 for i in range(scale(20_000, 200))],
}
TOPOLOGIES = {"1to1": (1, 1), "1to4": (1, 4), "4to1": (4, 1)}
TARGETS = {("1to1", "int_int"): ">= 10x queue.Queue"}


def _run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def flinkbuf_exchange(num_producers, num_consumers, records, counts):
    nbp = fb.NetworkBufferPool(num_segments=16 * num_producers * (num_consumers + 1),
                               segment_size=SEGMENT)
    parts = [fb.create_partition(nbp, num_consumers, min_buffers=8 * (num_consumers + 1))
             for _ in range(num_producers)]
    gates = [fb.InputGate([(p, c) for p in parts]) for c in range(num_consumers)]

    def produce(part):
        with fb.RecordWriter(part, "round_robin") as writer:
            emit = writer.emit
            for r in records:
                emit(r)

    def consume(k, gate):
        n = 0
        for _ in gate:
            n += 1
        counts[k] = n

    _run([threading.Thread(target=produce, args=(p,)) for p in parts] +
         [threading.Thread(target=consume, args=(k, g)) for k, g in enumerate(gates)])
    for g in gates:
        g.close()
    nbp.destroy()


def queue_exchange(num_producers, num_consumers, records, counts):
    queues = [queue.Queue(maxsize=1000) for _ in range(num_consumers)]

    def produce():
        puts = [q.put for q in queues]
        k = len(puts)
        for i, r in enumerate(records):
            puts[i % k](r)
        for put in puts:
            put(None)

    def consume(k, q):
        n, ends, get = 0, 0, q.get
        while True:
            r = get()
            if r is None:
                ends += 1
                if ends == num_producers:
                    break
                continue
            n += 1
        counts[k] = n

    _run([threading.Thread(target=produce) for _ in range(num_producers)] +
         [threading.Thread(target=consume, args=(k, q)) for k, q in enumerate(queues)])


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
@pytest.mark.parametrize("case", list(RECORDS))
@pytest.mark.parametrize("impl", ["flinkbuf", "queue_Queue_1000"])
def test_local_exchange(benchmark, impl, topology, case):
    producers, consumers = TOPOLOGIES[topology]
    records = RECORDS[case]
    total = producers * len(records)
    benchmark.group = f"local exchange {topology}: {case}"
    benchmark.extra_info.update(ops=total, subject=impl == "flinkbuf")
    if impl == "flinkbuf" and (topology, case) in TARGETS:
        benchmark.extra_info["target"] = TARGETS[(topology, case)]
    if case.startswith("bytes"):
        benchmark.extra_info["bytes"] = len(records[0])
    fn = flinkbuf_exchange if impl == "flinkbuf" else queue_exchange
    counts = [0] * consumers
    benchmark.pedantic(fn, args=(producers, consumers, records, counts),
                       rounds=scale(7, 1), iterations=1)
    assert sum(counts) == total  # every record delivered


BATCH = 4096     # (int, int) records per numpy array


@pytest.mark.parametrize("impl", ["flinkbuf", "queue_Queue_1000-records", "queue_Queue_1000-arrays"])
def test_numpy_batch_1to1(benchmark, impl):
    """Arrays of records as single records: records/s counts the rows.  The
    peer compared with is queue.Queue carrying one record per item (the int_int
    records); the same queue passing whole arrays by reference is shown too."""
    rows = np.zeros((BATCH, 2), dtype=np.int64)   # one (int, int) record per row
    rows[:, 0] = np.arange(BATCH)
    batches = [rows] * scale(500, 10)
    items, per_item = (RECORDS["int_int"], 1) if impl.endswith("records") else (batches, BATCH)
    benchmark.group = "local exchange 1to1: numpy batches of (int, int) rows"
    benchmark.extra_info.update(ops=len(items) * per_item, subject=impl == "flinkbuf", bytes=16)
    if impl == "flinkbuf":
        benchmark.extra_info["target"] = ">= 8M records/s"
    fn = flinkbuf_exchange if impl == "flinkbuf" else queue_exchange
    counts = [0]
    benchmark.pedantic(fn, args=(1, 1, items, counts), rounds=scale(7, 1), iterations=1)
    assert counts[0] == len(items)


def single_thread_1to1(n, case="int_int"):
    """The 1->1 record path without threads, for instruction counts
    (callgrind is exact where timings on a shared machine are not): emit a
    batch of ``case`` records that fits the pool, read it back, repeat."""
    from itertools import islice

    nbp = fb.NetworkBufferPool(num_segments=64, segment_size=SEGMENT)
    part = fb.create_partition(nbp, 1, min_buffers=40)
    gate = fb.InputGate([(part, 0)])
    writer = fb.RecordWriter(part, "round_robin", buffer_timeout=None)
    batch = 1_000 if case == "bytes_1KiB" else 20_000
    records = RECORDS[case][:batch]
    emit = writer.emit
    done = 0
    while done < n:
        for r in records:
            emit(r)
        writer.flush()
        for _ in islice(gate, batch):
            pass
        done += batch
    writer.close()
    assert list(gate) == []
    gate.close()
    nbp.destroy()


if __name__ == "__main__":
    # Instructions per record of the whole process, from the repository root:
    #   for n in 100000 200000; do PYTHONHASHSEED=0 PYTHONPATH=. OPENBLAS_NUM_THREADS=1 \
    #     valgrind --tool=callgrind --callgrind-out-file=cg.$n \
    #     python bench/bench_io.py $n [int_int|bytes_1KiB]; done
    # then (Ir(200000) - Ir(100000)) / 100000; callgrind_annotate --inclusive=yes
    # splits it by function (RecordWriter.emit, InputGate.__next__, ...).
    import sys

    single_thread_1to1(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000,
                       sys.argv[2] if len(sys.argv) > 2 else "int_int")
