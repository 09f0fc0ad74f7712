"""Buffer core benchmarks: request+recycle against Python's queues and allocators,
a two-thread ping-pong through 2 buffers, a nogil C loop, redistribution."""

import collections
import queue
import threading

import numpy as np
import pytest

import flinkbuf as fb
from flinkbuf import _testing
from conftest import scale

SEGMENT = 32768
N = scale(20_000, 500)
TARGET_PAIR = ">= 10x queue.Queue put+get"


@pytest.fixture(scope="module")
def pool():
    nbp = fb.NetworkBufferPool(num_segments=64, segment_size=SEGMENT)
    yield nbp.create_buffer_pool(2, 8)
    nbp.destroy()


def _info(benchmark, group, ops, subject=False, target=""):
    benchmark.group = group
    benchmark.extra_info.update(ops=ops, subject=subject, target=target)


# -- single-thread request + recycle pairs ------------------------------------

PAIR = "pair: request+recycle (Python, 1 thread)"


def test_pair_flinkbuf_request_buffer(benchmark, pool):
    _info(benchmark, PAIR, N, subject=True, target=TARGET_PAIR)
    request = pool.request_buffer

    def run():
        for _ in range(N):
            request().recycle()
    benchmark(run)


def test_pair_flinkbuf_request_buffer_blocking(benchmark, pool):
    _info(benchmark, PAIR, N)
    request = pool.request_buffer_blocking

    def run():
        for _ in range(N):
            request().recycle()
    benchmark(run)


def test_pair_queue_Queue_put_get(benchmark):
    _info(benchmark, PAIR, N)
    q = queue.Queue()
    item = bytearray(SEGMENT)

    def run():
        for _ in range(N):
            q.put(item)
            q.get()
    benchmark(run)


def test_pair_deque_Condition(benchmark):
    _info(benchmark, PAIR, N)
    dq = collections.deque()
    cond = threading.Condition()
    item = bytearray(SEGMENT)

    def run():
        for _ in range(N):
            with cond:
                dq.append(item)
                cond.notify()
            with cond:
                while not dq:
                    cond.wait()
                dq.popleft()
    benchmark(run)


def test_pair_pyarrow_allocate_buffer(benchmark):
    pa = pytest.importorskip("pyarrow")
    _info(benchmark, PAIR, N)

    def run():
        for _ in range(N):
            pa.allocate_buffer(SEGMENT)
    benchmark(run)


def test_pair_bytearray(benchmark):
    _info(benchmark, PAIR, N)

    def run():
        for _ in range(N):
            bytearray(SEGMENT)
    benchmark(run)


def test_pair_numpy_empty(benchmark):
    _info(benchmark, PAIR, N)

    def run():
        for _ in range(N):
            np.empty(SEGMENT, np.uint8)
    benchmark(run)


# -- two threads, 2 buffers in flight ------------------------------------------

PING = "ping-pong: 2 threads, 2 buffers in flight"


def _two_threads(produce, consume):
    t = threading.Thread(target=consume)
    t.start()
    produce()
    t.join()


def test_pingpong_flinkbuf_pool_of_2(benchmark):
    """Producer blocks (without the GIL) on a pool of 2; buffers travel to the
    consumer through a SimpleQueue and come back by recycle."""
    _info(benchmark, PING, N, subject=True)
    nbp = fb.NetworkBufferPool(num_segments=2, segment_size=SEGMENT)
    pool = nbp.create_buffer_pool(2, 2)
    handoff = queue.SimpleQueue()

    def produce():
        request, put = pool.request_buffer_blocking, handoff.put
        for _ in range(N):
            put(request())
        put(None)

    def consume():
        get = handoff.get
        while (buf := get()) is not None:
            buf.recycle()

    benchmark(_two_threads, produce, consume)
    nbp.destroy()


def test_pingpong_queue_Queue_maxsize_2(benchmark):
    _info(benchmark, PING, N)
    q = queue.Queue(maxsize=2)
    item = bytearray(SEGMENT)

    def produce():
        for _ in range(N):
            q.put(item)
        q.put(None)

    def consume():
        while q.get() is not None:
            pass

    benchmark(_two_threads, produce, consume)


def test_pingpong_deque_Condition_bound_2(benchmark):
    _info(benchmark, PING, N)
    dq = collections.deque()
    cond = threading.Condition()
    item = bytearray(SEGMENT)

    def produce():
        for i in range(N + 1):
            with cond:
                while len(dq) >= 2:
                    cond.wait()
                dq.append(item if i < N else None)
                cond.notify_all()

    def consume():
        while True:
            with cond:
                while not dq:
                    cond.wait()
                x = dq.popleft()
                cond.notify_all()
            if x is None:
                return

    benchmark(_two_threads, produce, consume)


# -- the C-level loop ------------------------------------------------------------

C_LOOP = "C-level request+recycle (nogil loop)"


def test_c_loop_request_recycle(benchmark, pool):
    iterations = scale(2_000_000, 50_000)
    _info(benchmark, C_LOOP, iterations, subject=True, target="<= 30 ns/op")
    results = []
    benchmark.pedantic(lambda: results.append(_testing.c_request_recycle_loop(pool, iterations)),
                       rounds=scale(5, 1), iterations=1)
    benchmark.extra_info["ns_per_op"] = min(results)


# -- redistribution ----------------------------------------------------------------

@pytest.mark.parametrize("num_pools", [10, 1000, 10_000])
def test_redistribution(benchmark, num_pools):
    benchmark.group = "redistribution (one pass over all pools)"
    benchmark.extra_info.update(ops=1, target="<= 10 ms at 10,000 pools" if num_pools == 10_000 else "")
    nbp = fb.NetworkBufferPool(num_segments=4 * num_pools, segment_size=1)
    pools = [nbp.create_buffer_pool(1, None if i % 2 else 1 + i % 7) for i in range(num_pools)]
    benchmark(_testing.redistribute_now, nbp)
    assert sum(p.num_buffers for p in pools) <= nbp.num_segments
    nbp.destroy()
