"""Helpers for the layer-3 tests: pipelines of producer and consumer threads."""

import threading
import time

import flinkbuf as fb

JOIN_TIMEOUT = 60.0


class Task(threading.Thread):
    """A thread that keeps its result or its exception."""

    def __init__(self, fn, *args, name=None):
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.args = args
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def finish(self, timeout=JOIN_TIMEOUT):
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not finish within {timeout}s"
        if self.error is not None:
            raise self.error
        return self.result


def consume_all(gate):
    """Every (channel, item) of a gate until its end, then close it."""
    out = []
    with gate:
        while True:
            try:
                out.append(gate.next_with_channel())
            except StopIteration:
                return out


def run_exchange(*, num_producers, num_consumers, records, selector, segment_size=4096,
                 extra_buffers=2, buffer_timeout=None, codec="typed", cap=None):
    """Producers emit ``records(p)``; consumer c reads subpartition c of every
    producer.  Returns (received per consumer as (channel, item) lists,
    writers, the network pool)."""
    n = num_consumers
    per_pool = n + 1 + extra_buffers
    nbp = fb.NetworkBufferPool(num_producers * per_pool + 1, segment_size)
    partitions = [fb.create_partition(nbp, n, min_buffers=per_pool, max_buffers_per_channel=cap,
                                      name=f"p{p}")
                  for p in range(num_producers)]
    gates = [fb.InputGate([(part, c) for part in partitions], codec=codec, name=f"c{c}")
             for c in range(n)]
    writers = [fb.RecordWriter(part, selector(), codec=codec, buffer_timeout=buffer_timeout)
               for part in partitions]

    def produce(writer, items):
        with writer:
            for item in items:
                if isinstance(item, fb.UserEvent):
                    writer.broadcast_event(item)
                else:
                    writer.emit(item)

    producers = [Task(produce, w, list(records(p)), name=f"producer-{p}")
                 for p, w in enumerate(writers)]
    consumers = [Task(consume_all, g, name=f"consumer-{c}") for c, g in enumerate(gates)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.finish()
    received = [t.finish() for t in consumers]
    return received, writers, nbp


def assert_all_recycled(nbp, pools):
    """No buffer of ``pools`` is handed out, and once they are destroyed every
    segment is back on the network pool's free list."""
    for pool in pools:
        assert pool.num_requested == pool.num_available, (
            f"{pool.num_requested - pool.num_available} buffers still out of {pool!r}")
    for pool in pools:
        pool.destroy()
    assert nbp.num_available_segments == nbp.num_segments


def wait_until(predicate, timeout=10.0, interval=0.005):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True
