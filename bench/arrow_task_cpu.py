"""What ``arrow_exchange``'s tasks cost in CPU, without Spark.

Two processes run the exchange's task (``run_task``, as each Spark task
does, with the driver's rendezvous in this process) over N rows of two
int64 columns (``k``: 4096 keys, ``v``), in Arrow batches of 65,536 rows
made before the clock starts, each counting its rows per key with numpy as
``bench_spark.py``'s consumer does.  The floor is the same count over each
process's own batches with no exchange.  Per round it prints both
processes' CPU seconds, what the exchange adds per row, and their context
switches::

    python bench/arrow_task_cpu.py --rows 10000000 --rounds 4
    python bench/arrow_task_cpu.py --transport tcp --encryption   # as between hosts

By default the tasks reach each other over TCP (``--transport``), as tasks
on two hosts do, without sealing (``--encryption`` seals, as
``arrow_exchange`` does between hosts by default).  Run it from a checkout
(``PYTHONPATH=<checkout>``) to compare builds.
"""

import argparse
import collections
import multiprocessing
import os
import queue
import resource
import time

import numpy as np

KEYS = 4096
BATCH_ROWS = 65536
TASKS = 2


def _batches(index, rows):
    import pyarrow as pa

    out = []
    start = index * rows
    for first in range(start, start + rows, BATCH_ROWS):
        ids = np.arange(first, min(first + BATCH_ROWS, start + rows), dtype=np.int64)
        out.append(pa.RecordBatch.from_arrays([pa.array(ids % KEYS), pa.array(ids)],
                                              names=["k", "v"]))
    return out


def _count(batches):
    counts = np.zeros(KEYS, dtype=np.int64)
    for batch in batches:
        counts += np.bincount(batch.column(0).to_numpy(zero_copy_only=False),
                              minlength=KEYS)[:KEYS]
    yield int(counts.sum())


class _Context:
    """What run_task asks of Spark's BarrierTaskContext."""

    def __init__(self, index):
        self.index = index

    def partitionId(self):
        return self.index

    def taskAttemptId(self):
        return 100 + self.index

    def stageId(self):
        return 1

    def getTaskInfos(self):
        return [collections.namedtuple("Info", "address")("127.0.0.1:0")] * TASKS


def _one_task(index, rows, exchange, spec, results):
    from pyspark import BarrierTaskContext

    from flinkbuf.spark import _task

    batches = _batches(index, rows)
    BarrierTaskContext.get = staticmethod(lambda: _Context(index))
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu = time.process_time()
    counted = list(_task.run_task(spec, iter(batches)) if exchange else _count(iter(batches)))
    cpu = time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
    results.put((counted, cpu, after.ru_nvcsw - before.ru_nvcsw,
                 after.ru_nivcsw - before.ru_nivcsw))


def run(rows, exchange, segment_size, encryption):
    """Both tasks' CPU seconds and context switches (voluntary,
    involuntary) for ``rows`` rows, with or without the exchange."""
    from flinkbuf.io import default_max_parallelism
    from flinkbuf.spark import _rendezvous, _spec, arrow

    parallelism = default_max_parallelism(TASKS)
    options = _spec.check_options(
        TASKS, _count, num_partitions=None, key="k", selector="hash",
        codec="arrow", segment_size=segment_size, buffers_per_channel=2, floating_buffers=8,
        buffer_timeout=0.1, max_record_size=256 << 20, max_parallelism=parallelism,
        host="127.0.0.1", timeout=60.0, monitor=None,
        produce=arrow._route(), encryption=encryption)
    secret = _spec.new_secret()
    server = _rendezvous.RendezvousServer(secret, TASKS, timeout=60.0)
    spec = _spec.make_spec(options, secret=secret, rendezvous=server.address)
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_one_task,
                                     args=(i, rows // TASKS, exchange, spec, results))
             for i in range(TASKS)]
    try:
        for p in procs:
            p.start()
        got = []
        deadline = time.monotonic() + 300
        while len(got) < len(procs):
            try:
                got.append(results.get(timeout=0.5))
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"a task process failed (exit codes {failed}) or "
                                       f"took more than 300 s") from None
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        server.close()
    counted = sum(c[0] for c, _, _, _ in got)
    if counted != rows // TASKS * TASKS:
        raise AssertionError(f"{counted} rows counted, expected {rows}")
    return (sum(g[1] for g in got), sum(g[2] for g in got), sum(g[3] for g in got))


def main(argv=None):
    ap = argparse.ArgumentParser(description="arrow_exchange's task CPU per row, without "
                                 "Spark: two processes against the count alone")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--segment-size", type=int, default=None,
                    help="network buffer size (default: arrow_exchange's default)")
    ap.add_argument("--transport", choices=("tcp", "unix", "shm", "auto"), default="tcp")
    ap.add_argument("--encryption", action="store_true", help="seal the frames")
    args = ap.parse_args(argv)
    os.environ["FLINKBUF_NET_TRANSPORT"] = args.transport
    segment_size = args.segment_size
    if segment_size is None:
        from flinkbuf.spark.arrow import default_segment_size
        segment_size = default_segment_size(TASKS)
    multiprocessing.set_start_method("fork")
    print(f"{args.rows:,} rows, {TASKS} tasks over {args.transport}, segment_size "
          f"{segment_size}, {'sealed' if args.encryption else 'unsealed'}", flush=True)
    added = []
    for k in range(args.rounds):
        floor, _, _ = run(args.rows, False, segment_size, args.encryption)
        cpu, voluntary, involuntary = run(args.rows, True, segment_size, args.encryption)
        added.append((cpu - floor) * 1e9 / args.rows)
        print(f"round {k + 1}: count alone {floor:.3f} CPU s, with the exchange {cpu:.3f}: "
              f"+{added[-1]:.1f} ns a row; context switches {voluntary} voluntary, "
              f"{involuntary} involuntary", flush=True)
    print(f"added ns a row: median {sorted(added)[len(added) // 2]:.1f} "
          f"(min {min(added):.1f}, max {max(added):.1f})", flush=True)


if __name__ == "__main__":
    main()
