"""NetworkBufferPool: arena layout, admission control, unpooled segments, destroy."""

import threading
import time

import numpy as np
import pytest

import flinkbuf as fb
from helpers import run_in_thread, wait_until


@pytest.mark.parametrize("kwargs,exc", [
    (dict(num_segments=0, segment_size=64), ValueError),
    (dict(num_segments=-1, segment_size=64), ValueError),
    (dict(num_segments=4, segment_size=0), ValueError),
    (dict(num_segments=4, segment_size=-64), ValueError),
    (dict(num_segments=2 ** 31, segment_size=64), ValueError),
    (dict(num_segments=4, segment_size=64, alignment=32), ValueError),
    (dict(num_segments=4, segment_size=64, alignment=100), ValueError),
    (dict(num_segments=4, segment_size=64, alignment=0), ValueError),
    (dict(num_segments=True, segment_size=64), TypeError),
    (dict(num_segments=4.0, segment_size=64), TypeError),
    (dict(num_segments="4", segment_size=64), TypeError),
])
def test_constructor_rejects_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        fb.NetworkBufferPool(**kwargs)


def test_huge_arena_is_a_memory_error_not_a_crash():
    with pytest.raises(MemoryError):
        fb.NetworkBufferPool(num_segments=2 ** 31 - 1, segment_size=2 ** 31 - 1)


@pytest.mark.parametrize("segment_size,alignment", [
    (1, 64), (63, 64), (64, 64), (65, 128), (100, 4096), (4096, 4096), (5000, 1 << 16)])
def test_layout_aligned_arena_and_cache_line_stride(segment_size, alignment):
    n = 6
    with fb.NetworkBufferPool(n, segment_size, alignment=alignment) as nbp:
        stride = -(-segment_size // 64) * 64
        assert nbp.segment_stride == stride and nbp.alignment == alignment
        pool = nbp.create_buffer_pool(n, n)
        bufs = [pool.request_buffer() for _ in range(n)]
        addrs = sorted(b.segment.address for b in bufs)
        assert addrs[0] % alignment == 0
        assert all(a % 64 == 0 for a in addrs)
        assert [b - a for a, b in zip(addrs, addrs[1:])] == [stride] * (n - 1)
        for b in bufs:
            assert b.capacity == segment_size
            seg = b.segment
            assert len(seg) == segment_size
            seg.put_bytes(0, b"\xab" * segment_size)  # the whole segment is usable
            with pytest.raises(IndexError):
                seg.put_uint8(segment_size, 1)
        # neighbours are untouched by a full write: strides never overlap
        assert all(b.segment.get_bytes(0, segment_size) == b"\xab" * segment_size for b in bufs)
        for b in bufs:
            b.recycle()


def test_default_alignment_is_page_size():
    import resource
    with fb.NetworkBufferPool(2, 10) as nbp:
        assert nbp.alignment == resource.getpagesize()


def test_accounting_properties():
    with fb.NetworkBufferPool(num_segments=32, segment_size=128) as nbp:
        assert (nbp.num_segments, nbp.segment_size) == (32, 128)
        assert nbp.num_available_segments == 32
        assert nbp.num_total_required_buffers == 0
        a = nbp.create_buffer_pool(min_buffers=4, max_buffers=10)
        b = nbp.create_buffer_pool(min_buffers=2, max_buffers=None)
        assert nbp.num_total_required_buffers == 6
        assert nbp.num_available_segments == 32  # pools take segments lazily
        assert (a.num_buffers, b.num_buffers) == tuple(fb.redistribute(26, [(4, 10), (2, None)]))
        assert a.max_buffers == 10 and b.max_buffers is None
        bufs = [a.request_buffer() for _ in range(3)]
        assert nbp.num_available_segments == 29 and nbp.num_outstanding_segments == 3
        for x in bufs:
            x.recycle()
        assert nbp.num_available_segments == 29  # kept idle by the pool
        assert a.num_available == 3 and a.num_requested == 3


def test_admission_control_refuses_pools_beyond_the_total():
    with fb.NetworkBufferPool(num_segments=10, segment_size=64) as nbp:
        first = nbp.create_buffer_pool(6, 6)
        with pytest.raises(fb.InsufficientBuffersError, match="requires 5.*only 4 of 10") as ei:
            nbp.create_buffer_pool(5, 8)
        assert isinstance(ei.value, MemoryError)
        assert nbp.num_total_required_buffers == 6  # the refused pool left no trace
        p = nbp.create_buffer_pool(4, 4)
        assert p.num_buffers == 4 and first.num_buffers == 6
        del first  # dropping a pool object destroys the pool
        assert nbp.num_total_required_buffers == 4


def test_a_pool_lives_while_its_buffers_do():
    with fb.NetworkBufferPool(num_segments=4, segment_size=64) as nbp:
        buf = nbp.create_buffer_pool(2, 4).request_buffer()  # the buffer holds the pool
        assert nbp.num_total_required_buffers == 2 and not buf.pool.is_destroyed
        buf.recycle()
        del buf
        assert nbp.num_total_required_buffers == 0 and nbp.num_available_segments == 4


@pytest.mark.parametrize("kwargs,exc", [
    (dict(min_buffers=0, max_buffers=2), ValueError),
    (dict(min_buffers=-1, max_buffers=2), ValueError),
    (dict(min_buffers=3, max_buffers=2), ValueError),
    (dict(min_buffers=1, max_buffers=0), ValueError),
    (dict(min_buffers=1, max_buffers=2, num_subpartitions=-1), ValueError),
    (dict(min_buffers=1, max_buffers=2, max_buffers_per_channel=2), ValueError),
    (dict(min_buffers=1, max_buffers=2, num_subpartitions=2, max_buffers_per_channel=0), ValueError),
    (dict(min_buffers=1, max_buffers=2, max_overdraft_buffers=-1), ValueError),
    (dict(min_buffers=1.5, max_buffers=2), TypeError),
    (dict(min_buffers=None, max_buffers=2), TypeError),
])
def test_create_buffer_pool_rejects_bad_arguments(kwargs, exc):
    with fb.NetworkBufferPool(8, 64) as nbp:
        with pytest.raises(exc):
            nbp.create_buffer_pool(**kwargs)
        assert nbp.num_total_required_buffers == 0


def test_unpooled_segments_count_as_required_and_redistribute():
    with fb.NetworkBufferPool(num_segments=20, segment_size=256) as nbp:
        pool = nbp.create_buffer_pool(2, None)
        assert pool.num_buffers == 20
        segs = nbp.request_unpooled_segments(5)
        assert len(segs) == 5 and nbp.num_unpooled_segments == 5
        assert nbp.num_total_required_buffers == 7
        assert pool.num_buffers == 15
        assert len({s.address for s in segs}) == 5
        for i, s in enumerate(segs):
            assert s.size == 256
            s.put_int32(0, i)
        arr = np.frombuffer(segs[0], dtype=np.int32)
        assert arr[0] == 0
        with pytest.raises(fb.ExportedBufferError):
            nbp.recycle_unpooled_segments(segs)
        assert nbp.num_unpooled_segments == 5  # nothing was returned
        del arr
        nbp.recycle_unpooled_segments(segs)
        assert nbp.num_unpooled_segments == 0 and nbp.num_total_required_buffers == 2
        assert pool.num_buffers == 20 and nbp.num_available_segments == 20
        with pytest.raises(fb.SegmentFreedError):
            segs[1].get_int32(0)
        with pytest.raises(fb.SegmentFreedError):
            nbp.recycle_unpooled_segments(segs[:1])


def test_unpooled_request_that_can_never_be_met_fails_at_once():
    with fb.NetworkBufferPool(num_segments=10, segment_size=64) as nbp:
        pool = nbp.create_buffer_pool(4, 4)
        t0 = time.monotonic()
        with pytest.raises(fb.InsufficientBuffersError):
            nbp.request_unpooled_segments(7, timeout=30)
        with pytest.raises(fb.InsufficientBuffersError):
            nbp.request_unpooled_segments(11, timeout=None)
        assert time.monotonic() - t0 < 5  # refused, not waited for
        assert nbp.num_total_required_buffers == 4 and pool.num_buffers == 4


def test_unpooled_request_waits_for_segments_without_the_gil():
    with fb.NetworkBufferPool(num_segments=8, segment_size=64) as nbp:
        pool = nbp.create_buffer_pool(2, None)
        held = [pool.request_buffer() for _ in range(8)]
        assert nbp.num_available_segments == 0
        t, res = run_in_thread(nbp.request_unpooled_segments, 3, timeout=10)
        # The pool shrank to 5 at once; the segments come back as buffers are recycled.
        assert wait_until(lambda: pool.num_buffers == 5)
        ticks = 0
        while ticks < 1000:  # the waiting thread does not hold the GIL
            ticks += 1
        for b in held[:2]:
            b.recycle()
        time.sleep(0.05)
        assert "value" not in res  # only 2 free: still waiting
        held[2].recycle()
        t.join(5)
        segs = res["value"]
        assert len(segs) == 3
        assert pool.num_requested == 5
        for b in held[3:]:
            b.recycle()
        nbp.recycle_unpooled_segments(segs)


def test_unpooled_request_times_out_and_restores_the_reservation():
    with fb.NetworkBufferPool(num_segments=4, segment_size=64) as nbp:
        pool = nbp.create_buffer_pool(1, None)
        held = [pool.request_buffer() for _ in range(4)]
        t0 = time.monotonic()
        with pytest.raises(fb.BufferRequestTimeoutError) as ei:
            nbp.request_unpooled_segments(2, timeout=0.2)
        assert isinstance(ei.value, TimeoutError)
        assert 0.19 <= time.monotonic() - t0 < 2
        assert nbp.num_total_required_buffers == 1 and pool.num_buffers == 4
        for b in held:
            b.recycle()
        assert nbp.num_available_segments == 0 and pool.num_available == 4


def test_recycle_unpooled_validates_the_whole_batch_first():
    with fb.NetworkBufferPool(8, 64) as nbp, fb.NetworkBufferPool(8, 64) as other:
        a = nbp.request_unpooled_segments(2)
        b = other.request_unpooled_segments(1)
        with pytest.raises(ValueError, match="twice"):
            nbp.recycle_unpooled_segments([a[0], a[0]])
        with pytest.raises(ValueError, match="not an unpooled segment of this pool"):
            nbp.recycle_unpooled_segments([a[0], b[0]])
        with pytest.raises(TypeError):
            nbp.recycle_unpooled_segments([a[0], b"x"])
        standalone = fb.MemorySegment.allocate(64)
        with pytest.raises(ValueError):
            nbp.recycle_unpooled_segments([standalone])
        with pytest.raises(TypeError):
            a[0].free()
        standalone.free()
        assert nbp.num_unpooled_segments == 2 and not a[0].is_freed
        nbp.recycle_unpooled_segments(a)
        other.recycle_unpooled_segments(b)
        nbp.recycle_unpooled_segments([])


def test_dropped_unpooled_segments_return_to_the_pool():
    with fb.NetworkBufferPool(8, 64) as nbp:
        segs = nbp.request_unpooled_segments(3)
        assert nbp.num_available_segments == 5
        del segs
        assert nbp.num_available_segments == 8


def test_destroy_with_buffers_outstanding():
    """Destroying the network pool with buffers out: every local pool is
    destroyed, new work is refused, the outstanding buffers stay valid until
    recycled, and the arena is unmapped when the last one comes back."""
    nbp = fb.NetworkBufferPool(num_segments=8, segment_size=64)
    pool = nbp.create_buffer_pool(2, 4)
    buf = pool.request_buffer()
    buf.write(b"still here")
    segs = nbp.request_unpooled_segments(1)
    idle = pool.request_buffer()
    idle.recycle()
    assert nbp.destroy() == 2
    assert nbp.is_destroyed and pool.is_destroyed and not nbp.is_arena_released
    assert nbp.num_outstanding_segments == 2
    with pytest.raises(fb.PoolDestroyedError):
        pool.request_buffer()
    with pytest.raises(fb.PoolDestroyedError):
        pool.request_buffer_blocking(timeout=1)
    with pytest.raises(fb.PoolDestroyedError):
        nbp.create_buffer_pool(1, 1)
    with pytest.raises(fb.PoolDestroyedError):
        nbp.request_unpooled_segments(1)
    assert bytes(memoryview(buf)) == b"still here"
    segs[0].put_int64(0, 42)
    buf.recycle()
    assert not nbp.is_arena_released
    nbp.recycle_unpooled_segments(segs)
    assert nbp.is_arena_released and nbp.num_outstanding_segments == 0
    assert nbp.destroy() == 0  # idempotent


def test_destroy_wakes_blocked_requests_with_an_error():
    nbp = fb.NetworkBufferPool(num_segments=6, segment_size=64)
    pool = nbp.create_buffer_pool(1, 1)
    other = nbp.create_buffer_pool(1, None)
    held = [pool.request_buffer()] + [other.request_buffer() for _ in range(5)]
    assert nbp.num_available_segments == 0
    t1, r1 = run_in_thread(pool.request_buffer_blocking, timeout=30)
    t2, r2 = run_in_thread(nbp.request_unpooled_segments, 1, timeout=30)
    assert wait_until(lambda: nbp.num_total_required_buffers == 3)
    time.sleep(0.05)
    assert not r1 and not r2
    nbp.destroy()
    t1.join(5), t2.join(5)
    assert isinstance(r1["error"], fb.PoolDestroyedError) and r1["elapsed"] < 5
    assert isinstance(r2["error"], fb.PoolDestroyedError) and r2["elapsed"] < 5
    for b in held:
        b.recycle()
    assert nbp.is_arena_released


def test_buffers_keep_the_arena_alive_after_the_pool_objects_are_gone():
    nbp = fb.NetworkBufferPool(4, 64)
    buf = nbp.create_buffer_pool(1, 2).request_buffer()
    del nbp
    buf.write(b"abc")
    assert bytes(memoryview(buf)) == b"abc"
    buf.recycle()


def test_concurrent_unpooled_and_pooled_requests_do_not_deadlock():
    with fb.NetworkBufferPool(num_segments=16, segment_size=64) as nbp:
        pool = nbp.create_buffer_pool(1, None)
        errors = []

        def unpooled():
            try:
                for _ in range(200):
                    segs = nbp.request_unpooled_segments(5, timeout=10)
                    nbp.recycle_unpooled_segments(segs)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def pooled():
            try:
                for i in range(500):
                    held = [pool.request_buffer_blocking(timeout=10) for _ in range(1 + i % 4)]
                    for b in held:
                        b.recycle()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=f) for f in (unpooled, unpooled, pooled, pooled)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert nbp.num_total_required_buffers == 1 and pool.num_buffers == 16
        assert nbp.num_available_segments + pool.num_available == 16
