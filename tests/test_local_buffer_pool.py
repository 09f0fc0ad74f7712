"""LocalBufferPool: requests, lazy shrink, destroy, per-channel cap, overdraft, availability."""

import threading
import time

import pytest

import flinkbuf as fb
from helpers import run_in_thread, wait_until


@pytest.fixture
def nbp():
    pool = fb.NetworkBufferPool(num_segments=16, segment_size=128)
    yield pool
    pool.destroy()


def test_request_until_exhausted_then_none(nbp):
    pool = nbp.create_buffer_pool(2, 4)
    assert pool.num_buffers == 4
    bufs = [pool.request_buffer() for _ in range(4)]
    assert all(isinstance(b, fb.Buffer) for b in bufs)
    assert pool.request_buffer() is None
    assert pool.num_requested == 4 and pool.num_available == 0
    assert nbp.num_available_segments == 12
    assert len({b.segment.address for b in bufs}) == 4
    bufs.pop().recycle()
    assert pool.num_available == 1 and pool.num_requested == 4
    again = pool.request_buffer()
    assert again is not None and pool.request_buffer() is None
    for b in bufs + [again]:
        b.recycle()
    assert pool.num_available == 4


def test_segments_are_taken_lazily(nbp):
    pool = nbp.create_buffer_pool(1, 8)
    assert pool.num_requested == 0 and nbp.num_available_segments == 16
    b = pool.request_buffer()
    assert pool.num_requested == 1 and nbp.num_available_segments == 15
    b.recycle()


def test_set_num_buffers_grows_shrinks_lazily_and_validates(nbp):
    pool = nbp.create_buffer_pool(2, 6)
    bufs = [pool.request_buffer() for _ in range(6)]
    pool.set_num_buffers(3)
    assert pool.num_buffers == 3 and pool.num_requested == 6  # lazy: nothing idle to return
    assert pool.request_buffer() is None
    for b in bufs[:3]:
        b.recycle()  # beyond the size: straight back to the global pool
    assert pool.num_requested == 3 and pool.num_available == 0
    assert nbp.num_available_segments == 13
    for b in bufs[3:]:
        b.recycle()  # within the size: kept idle
    assert pool.num_available == 3 and pool.num_requested == 3
    pool.set_num_buffers(100)
    assert pool.num_buffers == 6  # capped at max
    pool.set_num_buffers(2)  # idle excess goes back at once
    assert pool.num_requested == 2 and nbp.num_available_segments == 14
    with pytest.raises(ValueError, match="at least 2"):
        pool.set_num_buffers(1)
    with pytest.raises(ValueError):
        pool.set_num_buffers(-1)
    with pytest.raises(TypeError):
        pool.set_num_buffers("3")


def test_destroy_is_lazy_and_refuses_requests(nbp):
    pool = nbp.create_buffer_pool(2, 4)
    out = pool.request_buffer()
    idle = pool.request_buffer()
    idle.recycle()
    pool.destroy()
    pool.destroy()  # idempotent
    assert pool.is_destroyed and nbp.num_total_required_buffers == 0
    assert pool.num_available == 0 and nbp.num_available_segments == 15
    with pytest.raises(fb.PoolDestroyedError):
        pool.request_buffer()
    with pytest.raises(fb.PoolDestroyedError):
        pool.request_buffer_blocking(timeout=0)
    with pytest.raises(fb.PoolDestroyedError):
        pool.set_num_buffers(3)
    with pytest.raises(fb.PoolDestroyedError):
        pool.wait_available(0)
    out.write(b"in flight")  # still valid until recycled
    out.recycle()
    assert nbp.num_available_segments == 16 and pool.num_requested == 0


def test_destroying_a_pool_redistributes_to_the_others(nbp):
    a = nbp.create_buffer_pool(2, None)
    b = nbp.create_buffer_pool(2, None)
    assert (a.num_buffers, b.num_buffers) == tuple(fb.redistribute(12, [(2, None), (2, None)]))
    b.destroy()
    assert a.num_buffers == 16


def test_blocked_request_wakes_on_recycle_without_holding_the_gil(nbp):
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    t, res = run_in_thread(pool.request_buffer_blocking, timeout=10)
    # While the request waits, this thread runs Python code freely.
    ticks, deadline = 0, time.monotonic() + 0.3
    while time.monotonic() < deadline:
        ticks += 1
    assert ticks > 10_000
    assert "value" not in res
    held.recycle()
    t.join(5)
    buf = res["value"]
    assert isinstance(buf, fb.Buffer) and res["elapsed"] >= 0.25
    buf.recycle()


def test_blocked_request_wakes_on_pool_growth(nbp):
    pool = nbp.create_buffer_pool(1, 4)
    pool.set_num_buffers(1)
    held = pool.request_buffer()
    t, res = run_in_thread(pool.request_buffer_blocking, timeout=10)
    time.sleep(0.1)
    assert "value" not in res
    pool.set_num_buffers(2)
    t.join(5)
    assert isinstance(res["value"], fb.Buffer)
    res["value"].recycle()
    held.recycle()


def test_blocked_request_wakes_when_segments_return_to_the_global_pool():
    with fb.NetworkBufferPool(num_segments=4, segment_size=64) as nbp:
        hog = nbp.create_buffer_pool(1, None)
        held = [hog.request_buffer() for _ in range(4)]
        waiter = nbp.create_buffer_pool(1, 1)  # size 1, but the global pool is empty
        t, res = run_in_thread(waiter.request_buffer_blocking, timeout=10)
        time.sleep(0.1)
        assert "value" not in res
        held.pop().recycle()  # hog is over its size (3): this one goes global
        t.join(5)
        assert isinstance(res["value"], fb.Buffer)
        res["value"].recycle()
        for b in held:
            b.recycle()


def test_blocked_request_fails_when_its_pool_is_destroyed(nbp):
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    t, res = run_in_thread(pool.request_buffer_blocking, timeout=10)
    time.sleep(0.05)
    pool.destroy()
    t.join(5)
    assert isinstance(res["error"], fb.PoolDestroyedError) and res["elapsed"] < 5
    held.recycle()


@pytest.mark.parametrize("timeout", [0.0, 0.05, 0.2])
def test_timeout_precision(nbp, timeout):
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    t0 = time.monotonic()
    with pytest.raises(fb.BufferRequestTimeoutError):
        pool.request_buffer_blocking(timeout=timeout)
    elapsed = time.monotonic() - t0
    assert timeout <= elapsed < timeout + 0.25
    held.recycle()


def test_bad_timeouts_and_channels(nbp):
    pool = nbp.create_buffer_pool(1, 2, num_subpartitions=2)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            pool.request_buffer_blocking(timeout=bad)
    with pytest.raises(TypeError):
        pool.request_buffer_blocking(timeout="1")
    for bad in (-1, 2, 10 ** 30):
        with pytest.raises(ValueError):
            pool.request_buffer(channel=bad)
    with pytest.raises(TypeError):
        pool.request_buffer(channel=1.0)


def test_blocked_request_is_interruptible(nbp):
    """A wait without timeout still sees signals (KeyboardInterrupt)."""
    import signal
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    main = threading.get_ident()
    timer = threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pool.request_buffer_blocking()
    assert time.monotonic() - t0 < 5
    held.recycle()


def test_per_channel_cap_makes_the_pool_unavailable_not_refusing(nbp):
    pool = nbp.create_buffer_pool(4, 8, num_subpartitions=2, max_buffers_per_channel=2)
    assert pool.max_buffers_per_channel == 2 and pool.num_subpartitions == 2
    a = [pool.request_buffer(channel=0) for _ in range(2)]
    assert pool.channel_count(0) == 2 and not pool.is_available
    assert not pool.wait_available(timeout=0.05)
    extra = pool.request_buffer(channel=0)  # still served: the cap only signals
    assert extra is not None and pool.channel_count(0) == 3
    b = pool.request_buffer(channel=1)
    assert pool.channel_count(1) == 1
    extra.recycle()
    assert not pool.is_available  # channel 0 still at its cap
    t, res = run_in_thread(pool.wait_available, timeout=5)
    time.sleep(0.05)
    a.pop().recycle()
    t.join(5)
    assert res["value"] is True and pool.is_available and pool.channel_count(0) == 1
    for x in a + [b]:
        x.recycle()
    assert pool.channel_count(0) == pool.channel_count(1) == 0


def test_overdraft_buffers_beyond_the_pool_size(nbp):
    pool = nbp.create_buffer_pool(2, 2, max_overdraft_buffers=2)
    normal = [pool.request_buffer() for _ in range(2)]
    assert not pool.is_available
    over = [pool.request_buffer(), pool.request_buffer()]
    assert all(over) and pool.num_overdraft == 2 and pool.num_requested == 4
    assert pool.request_buffer() is None  # overdraft exhausted
    over.pop().recycle()  # overdraft goes straight back to the global pool
    assert pool.num_overdraft == 1 and nbp.num_available_segments == 13
    for b in over + normal:
        b.recycle()
    assert pool.num_overdraft == 0 and pool.num_requested == 2 and pool.num_available == 2


def test_availability_listeners_fire_once_outside_the_lock(nbp):
    pool = nbp.create_buffer_pool(1, 1)
    calls = []
    pool.add_availability_listener(lambda p: calls.append("now"))
    assert calls == ["now"]  # available: called at once
    held = pool.request_buffer()
    got = []

    def listener(p):
        # Runs outside the pool lock: may use the pool freely.
        calls.append("later")
        got.append(p.request_buffer())

    pool.add_availability_listener(listener)
    assert calls == ["now"]
    held.recycle()
    assert calls == ["now", "later"] and isinstance(got[0], fb.Buffer)
    got[0].recycle()
    assert calls == ["now", "later"]  # one-shot
    with pytest.raises(TypeError):
        pool.add_availability_listener(42)


def test_availability_listener_fires_on_destroy_and_errors_are_reported(nbp):
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    seen = []
    pool.add_availability_listener(lambda p: seen.append(p.is_destroyed))
    pool.destroy()
    assert seen == [True]
    held.recycle()


def test_wait_available_blocks_without_gil_until_recycle(nbp):
    pool = nbp.create_buffer_pool(1, 1)
    held = pool.request_buffer()
    assert pool.wait_available(timeout=0.01) is False
    threading.Timer(0.1, held.recycle).start()
    assert pool.wait_available(timeout=5) is True


def test_hammering_one_pool_from_many_threads():
    """8 threads request and recycle through a pool of 4: no buffer is lost,
    none is handed out twice, nobody deadlocks."""
    with fb.NetworkBufferPool(num_segments=8, segment_size=64) as nbp:
        pool = nbp.create_buffer_pool(4, 4)
        owners = {}
        lock = threading.Lock()
        errors = []
        counts = [0] * 8

        def worker(k):
            try:
                for i in range(1500):
                    held = []
                    for _ in range(1 + (i + k) % 3):
                        b = pool.request_buffer_blocking(timeout=20) if not held else pool.request_buffer()
                        if b is None:
                            break
                        addr = b.segment.address
                        with lock:
                            assert addr not in owners, "segment handed out twice"
                            owners[addr] = k
                        b.segment.put_int64(0, k)
                        held.append((addr, b))
                    for addr, b in held:
                        assert b.segment.get_int64(0) == k  # nobody else wrote here
                        with lock:
                            del owners[addr]
                        b.recycle()
                        counts[k] += 1
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "deadlock"
        assert errors == []
        assert all(c >= 1500 for c in counts)
        # segments are taken lazily: the pool holds what it needed, all idle now
        assert 1 <= pool.num_requested <= 4 and pool.num_available == pool.num_requested
        assert nbp.num_available_segments == 8 - pool.num_requested
