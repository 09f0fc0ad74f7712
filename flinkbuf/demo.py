"""A two-thread backpressure demo on the buffer core alone.

A producer fills buffers from a pool of 2 (Flink's 2015 experiment: 2
buffers of 4096 bytes) and hands them to a consumer through a plain queue;
the consumer recycles them.  When the consumer slows down the producer's
blocking buffer request waits (without the GIL): the producer's rate drops
to the consumer's.  Nothing else throttles it.
"""

import collections
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments._args import check_int, check_pool_fits, check_seconds

NUM_SEGMENTS = 4
_PHASES = (("consumer at full speed", 0.0), ("consumer slowed", 200e-6),
           ("consumer released", 0.0))


def check_arguments(phase_seconds=1.0, segment_size=4096, *, names=None):
    """Raise :class:`~flinkbuf.experiments.ExperimentArgumentError` (a
    ``ValueError``) unless the arguments of :func:`run_demo` are in range."""
    check_seconds("phase_seconds", phase_seconds, names=names)
    check_int("segment_size", segment_size, ge=1, names=names)
    check_pool_fits(NUM_SEGMENTS, segment_size, count_param="num_segments",
                    size_param="segment_size", names=names)


def run_demo(phase_seconds=1.0, segment_size=4096, out=print):
    """Run the three phases, ``phase_seconds`` each, printing a line per
    phase with ``out``."""
    check_arguments(phase_seconds, segment_size)
    nbp = fb.NetworkBufferPool(num_segments=NUM_SEGMENTS, segment_size=segment_size)
    pool = nbp.create_buffer_pool(min_buffers=2, max_buffers=2)
    handoff = collections.deque()
    ready = threading.Semaphore(0)
    stop = threading.Event()
    consumer_delay = [0.0]
    produced = [0]
    consumed = [0]
    blocked_ns = [0]

    def producer():
        payload = b"x" * segment_size
        while not stop.is_set():
            t0 = time.perf_counter_ns()
            try:
                buf = pool.request_buffer_blocking(timeout=0.5)
            except fb.BufferRequestTimeoutError:
                continue
            blocked_ns[0] += time.perf_counter_ns() - t0
            buf.write(payload)
            handoff.append(buf)
            produced[0] += 1
            ready.release()
        ready.release()

    def consumer():
        while True:
            ready.acquire()
            if not handoff:
                if stop.is_set():
                    return
                continue
            buf = handoff.popleft()
            if consumer_delay[0]:
                time.sleep(consumer_delay[0])
            consumed[0] += buf.readable_bytes // segment_size
            buf.recycle()

    threads = [threading.Thread(target=producer, name="producer"),
               threading.Thread(target=consumer, name="consumer")]
    for t in threads:
        t.start()
    out(f"pool: {pool.num_buffers} buffers of {segment_size} bytes")
    out(f"{'phase':<24} {'produced/s':>12} {'consumed/s':>12} {'producer blocked':>17}")
    try:
        for name, delay in _PHASES:
            consumer_delay[0] = delay
            p0, c0, b0, t0 = produced[0], consumed[0], blocked_ns[0], time.perf_counter()
            time.sleep(phase_seconds)
            dt = time.perf_counter() - t0
            out(f"{name:<24} {(produced[0] - p0) / dt:12,.0f} {(consumed[0] - c0) / dt:12,.0f} "
                f"{(blocked_ns[0] - b0) / 1e9 / dt:16.0%}")
    finally:
        stop.set()
        for t in threads:
            t.join()
        while handoff:
            handoff.popleft().recycle()
        nbp.destroy()
    out("the producer never outruns the consumer: its buffer requests block instead")
