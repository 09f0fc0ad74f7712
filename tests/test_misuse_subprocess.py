"""Misuse in a child process: a crash (segfault, abort) fails the test,
where in-process it would take the whole test run down."""

import os
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import gc, numpy as np, flinkbuf as fb
def expect(exc, fn):
    try:
        fn()
    except exc:
        return
    raise SystemExit(f"expected {exc.__name__}")
"""

CASES = {
    "use_after_recycle": """
        nbp = fb.NetworkBufferPool(4, 4096)
        pool = nbp.create_buffer_pool(1, 4)
        buf = pool.request_buffer(); seg = buf.segment; buf.recycle()
        for i in range(1000):
            expect(fb.RecycledBufferError, lambda: seg.get_int64(8 * (i % 512)))
            expect(fb.RecycledBufferError, lambda: seg.put_bytes(0, b"x" * 4096))
            expect(fb.RecycledBufferError, lambda: buf.read())
            expect(fb.RecycledBufferError, lambda: np.frombuffer(seg, dtype=np.uint8))
    """,
    "double_recycle": """
        nbp = fb.NetworkBufferPool(2, 64)
        pool = nbp.create_buffer_pool(1, 2)
        for _ in range(1000):
            buf = pool.request_buffer(); buf.recycle()
            expect(fb.RecycledBufferError, buf.recycle)
        assert pool.num_available == 1 and nbp.num_available_segments == 1
    """,
    "after_free": """
        for _ in range(1000):
            seg = fb.MemorySegment.allocate(1 << 16)
            seg.free()
            expect(fb.SegmentFreedError, lambda: seg.get_bytes(0, 1 << 16))
            expect(fb.SegmentFreedError, lambda: seg.put_int32(0, 1))
            expect(fb.SegmentFreedError, seg.free)
            expect(fb.SegmentFreedError, lambda: memoryview(seg))
    """,
    "destroyed_pool_outstanding": """
        nbp = fb.NetworkBufferPool(8, 1 << 20)
        pool = nbp.create_buffer_pool(1, 8)
        bufs = [pool.request_buffer() for _ in range(8)]
        nbp.destroy(); del nbp, pool; gc.collect()
        for b in bufs:
            b.segment.put_bytes(0, b"z" * (1 << 20))
            b.recycle()
            expect(fb.RecycledBufferError, lambda: b.segment)
    """,
    "views_outlive_everything": """
        nbp = fb.NetworkBufferPool(2, 1 << 16)
        buf = nbp.create_buffer_pool(1, 1).request_buffer()
        arr = np.frombuffer(buf.segment, dtype=np.uint8)
        del buf, nbp; gc.collect()
        arr[:] = 7  # the view keeps segment, buffer, pool and arena alive
        assert int(arr.sum()) == 7 * (1 << 16)
        del arr; gc.collect()
    """,
    "out_of_bounds": """
        seg = fb.MemorySegment.allocate(16)
        for off in (16, 17, -1, 2**62, -2**62, 2**31):
            expect(IndexError, lambda: seg.get_int64(off))
            expect(IndexError, lambda: seg.get_bytes(off, 1))
        expect((IndexError, OverflowError), lambda: seg.get_bytes(0, 2**63))
        expect(IndexError, lambda: seg.get_bytes(8, 2**62))
        seg.free()
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_misuse_raises_and_never_crashes(case):
    code = PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('survived')\n"
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().endswith("survived")
