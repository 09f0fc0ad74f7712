"""The buffer core under misuse: objects made without ``__init__``, listener
errors, resizes that would eat into other pools' minimums, reference-count
overflow, and index arguments of any size.  Cases that crashed run in a
child process, where a segfault fails the test instead of the run."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import flinkbuf as fb
from flinkbuf._testing import set_ref_count
from helpers import run_in_thread


def run_child(code):
    """Run ``code`` in a fresh interpreter; it must print 'survived' last."""
    prelude = textwrap.dedent("""
        import gc, sys
        import flinkbuf as fb
        from flinkbuf.buffer._buffer import Buffer, LocalBufferPool, MemorySegment, NetworkBufferPool
        from flinkbuf._testing import redistribute_now
        def expect(exc, fn, *args):
            try:
                fn(*args)
            except exc:
                return
            raise SystemExit(f"{fn!r}{args!r}: expected {exc}")
    """)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c",
                           prelude + textwrap.dedent(code) + "\nprint('survived')\n"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().endswith("survived"), proc.stdout


# -- objects made without __init__ -----------------------------------------

def test_bare_local_buffer_pool_is_refused():
    """A LocalBufferPool has a C struct that only create_buffer_pool() fills
    in; made by __new__ alone, every member dereferenced a NULL network pool."""
    run_child("""
        for args in ((), (None,), (object(),), (1, 2)):
            expect(TypeError, LocalBufferPool.__new__, LocalBufferPool, *args)
            expect(TypeError, LocalBufferPool, *args)
        nbp = NetworkBufferPool(4, 64)
        pool = nbp.create_buffer_pool(1, 2)
        expect(TypeError, pool.__init__)
        pool.request_buffer().recycle()
        nbp.destroy()
    """)


def test_bare_buffer_behaves_as_recycled():
    run_child("""
        b = Buffer.__new__(Buffer)
        assert b.is_recycled and b.ref_count == 0 and b.capacity == 0
        assert repr(b) == "<flinkbuf.Buffer recycled>"
        for fn in (b.recycle, b.retain, b.__enter__, lambda: b.__exit__(None, None, None),
                   lambda: b.segment, lambda: b.size, lambda: b.reader_index,
                   lambda: b.readable_bytes, lambda: b.writable_bytes, lambda: b.data_type,
                   lambda: b.is_buffer, lambda: b.write(b"x"), b.read, lambda: memoryview(b),
                   lambda: setattr(b, "size", 0), lambda: setattr(b, "reader_index", 0),
                   lambda: setattr(b, "data_type", 0), lambda: b.pool):
            expect(fb.RecycledBufferError, fn)
        # ... and as an argument
        from flinkbuf._testing import set_ref_count
        expect(fb.RecycledBufferError, set_ref_count, b, 1)
        seg = MemorySegment.allocate(64)
        expect(fb.RecycledBufferError, seg.put_bytes, 0, b)
        seg.free()
        nbp = NetworkBufferPool(2, 64)
        real = nbp.create_buffer_pool(1, 1).request_buffer()
        expect(fb.RecycledBufferError, real.write, b)
        expect(fb.SegmentFreedError, real.write, MemorySegment.__new__(MemorySegment))
        real.recycle()
        nbp.destroy()
        del b; gc.collect()
    """)


def test_bare_network_buffer_pool_raises_until_initialised():
    run_child("""
        nbp = NetworkBufferPool.__new__(NetworkBufferPool)
        assert not nbp.is_destroyed and not nbp.is_arena_released
        assert "uninitialised" in repr(nbp)
        for fn in (lambda: nbp.create_buffer_pool(1, 1), lambda: nbp.request_unpooled_segments(1),
                   lambda: nbp.recycle_unpooled_segments([]), nbp.destroy, lambda: redistribute_now(nbp),
                   lambda: nbp.__exit__(None, None, None), lambda: nbp.num_available_segments,
                   lambda: nbp.num_total_required_buffers, lambda: nbp.num_unpooled_segments,
                   lambda: nbp.num_outstanding_segments):
            expect(RuntimeError, fn)
        nbp.__init__(2, 64)                 # a bare pool can still be initialised once
        nbp.create_buffer_pool(1, 2).request_buffer().recycle()
        expect(RuntimeError, nbp.__init__, 2, 64)
        nbp.destroy()
    """)


def test_bare_memory_segment_behaves_as_freed_also_as_an_argument():
    run_child("""
        bare = MemorySegment.__new__(MemorySegment)
        assert bare.is_freed and bare.size == len(bare) == 0
        for fn in (lambda: bare.address, bare.free, lambda: memoryview(bare),
                   lambda: bare.get_int8(0), lambda: bare.put_bytes(0, b""),
                   lambda: bare.get_bytes(0, 0)):
            expect(fb.SegmentFreedError, fn)
        with bare:
            pass
        real = MemorySegment.allocate(64)
        expect(fb.SegmentFreedError, real.copy_to, 0, bare, 0, 0)
        expect(fb.SegmentFreedError, real.compare, bare, 0, 0, 0)
        expect(fb.SegmentFreedError, bare.copy_to, 0, real, 0, 0)
        real.free()
        nbp = NetworkBufferPool(4, 64)
        expect(ValueError, nbp.recycle_unpooled_segments, [bare])
        segs = nbp.request_unpooled_segments(1)
        expect(ValueError, nbp.recycle_unpooled_segments, segs + [bare])
        nbp.recycle_unpooled_segments(segs)
        nbp.destroy()
        del bare; gc.collect()
    """)


# -- listener errors -------------------------------------------------------

@pytest.fixture
def unraisable(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def _trigger(kind, nbp, pool, held):
    """Make ``pool`` (whose one buffer is ``held``) available by ``kind``."""
    if kind == "recycle":
        held[0].recycle()
    elif kind == "garbage_collected_buffer":
        del held[:]
    elif kind == "destroy":
        pool.destroy()
        held[0].recycle()
    elif kind == "set_num_buffers":
        pool.set_num_buffers(2)
        held[0].recycle()
    elif kind == "recycle_unpooled":
        nbp.recycle_unpooled_segments(held.pop())
        held[0].recycle()
    elif kind == "garbage_collected_unpooled":
        held.pop()
        held[0].recycle()


TRIGGERS = ["recycle", "garbage_collected_buffer", "destroy", "set_num_buffers",
            "recycle_unpooled", "garbage_collected_unpooled"]


@pytest.mark.parametrize("kind", TRIGGERS)
def test_listener_error_is_unraisable_in_the_dispatching_thread(unraisable, kind):
    """A producer's listener error came out of whichever call made the pool
    available: a consumer's recycle() (and so its next(gate)) raised it."""
    with fb.NetworkBufferPool(3, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 2)
        held = [pool.request_buffer()]
        if kind.endswith("unpooled"):
            held.append(nbp.request_unpooled_segments(2))    # pool size 1: unavailable
        else:
            pool.set_num_buffers(1)
        assert not pool.is_available
        calls = []

        def bad(p):
            calls.append("bad")
            raise KeyError("listener bug")

        pool.add_availability_listener(bad)
        pool.add_availability_listener(lambda p: calls.append("good"))
        t, res = run_in_thread(_trigger, kind, nbp, pool, held)
        t.join(10)
        assert res.get("error") is None and "value" in res
        assert calls == ["bad", "good"]
        assert [(type(u.exc_value), u.object) for u in unraisable] == [(KeyError, bad)]
        assert pool.is_available or pool.is_destroyed


def test_listener_error_on_registration_is_unraisable_too(unraisable):
    with fb.NetworkBufferPool(2, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 2)

        def bad(p):
            raise ValueError("at once")

        pool.add_availability_listener(bad)           # available: called at once
        assert [(type(u.exc_value), u.object) for u in unraisable] == [(ValueError, bad)]


def test_keyboard_interrupt_in_a_listener_propagates_after_the_others(unraisable):
    with fb.NetworkBufferPool(2, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 1)
        held = pool.request_buffer()
        calls = []

        def interrupted(p):
            calls.append("interrupted")
            raise KeyboardInterrupt

        pool.add_availability_listener(interrupted)
        pool.add_availability_listener(lambda p: calls.append("after"))
        with pytest.raises(KeyboardInterrupt):
            held.recycle()
        assert held.is_recycled and calls == ["interrupted", "after"] and unraisable == []


# -- set_num_buffers and other pools' minimums ----------------------------

def test_resize_leaves_the_other_pool_its_minimum():
    """a.set_num_buffers(100) on a 6-segment arena made a's size 100, and a
    then took all six segments from b (min 2) until the next redistribution."""
    with fb.NetworkBufferPool(6, 64) as nbp:
        a = nbp.create_buffer_pool(2, None)
        b = nbp.create_buffer_pool(2, None)
        assert (a.num_buffers, b.num_buffers) == (3, 3)
        a.set_num_buffers(100)
        assert a.num_buffers == 4                    # min 2 + the 2 not required
        held = [a.request_buffer() for _ in range(4)]
        assert all(held) and a.request_buffer() is None
        got = [b.request_buffer() for _ in range(2)]
        assert all(got)
        for buf in held + got:
            buf.recycle()


def test_resizes_of_two_pools_leave_a_third_its_minimum():
    """Capping each pool at min + (total - required) alone is not enough: two
    resized pools could then hold everything a third was guaranteed."""
    with fb.NetworkBufferPool(10, 64) as nbp:
        a, b, c = (nbp.create_buffer_pool(2, None) for _ in range(3))
        assert [p.num_buffers for p in (a, b, c)] == fb.redistribute(4, [(2, None)] * 3)
        a.set_num_buffers(100)
        b.set_num_buffers(100)
        assert a.num_buffers + b.num_buffers + c.min_buffers <= 10
        held = []
        for p in (a, b):
            while (buf := p.request_buffer()) is not None:
                held.append(buf)
        got = [c.request_buffer() for _ in range(c.min_buffers)]
        assert all(got)
        for buf in held + got:
            buf.recycle()
        a.set_num_buffers(2)                          # what a gives up, b may take
        b.set_num_buffers(100)
        assert (a.num_buffers, b.num_buffers) == (2, 10 - 2 - c.num_buffers)


@given(data=st.data())
def test_after_any_resizes_every_pool_can_get_its_minimum(data):
    total = data.draw(st.integers(2, 24), label="total")
    with fb.NetworkBufferPool(total, 64) as nbp:
        pools = []
        for mn in data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=5), label="mins"):
            extra = data.draw(st.none() | st.integers(0, 8), label="max - min")
            try:
                pools.append(nbp.create_buffer_pool(mn, None if extra is None else mn + extra))
            except fb.InsufficientBuffersError:
                pass
        assume(pools)
        spare = total - nbp.num_total_required_buffers
        unpooled = nbp.request_unpooled_segments(data.draw(st.integers(1, spare)), timeout=0) \
            if spare and data.draw(st.booleans(), label="unpooled") else []
        for _ in range(data.draw(st.integers(0, 12), label="resizes")):
            pool = data.draw(st.sampled_from(pools))
            pool.set_num_buffers(data.draw(st.integers(pool.min_buffers, 40)))
            assert pool.min_buffers <= pool.num_buffers
        for target in pools:
            held = []
            for pool in pools:
                if pool is not target:
                    while (buf := pool.request_buffer()) is not None:
                        held.append(buf)
            got = [target.request_buffer() for _ in range(target.min_buffers)]
            assert all(got), f"pool {pools.index(target)} starved below its minimum"
            for buf in held + got:
                buf.recycle()
        if unpooled:
            nbp.recycle_unpooled_segments(unpooled)


# -- counters that could wrap ----------------------------------------------

def test_retain_never_wraps_the_reference_count():
    """The count was a C int: retain() past INT_MAX wrapped it negative."""
    with fb.NetworkBufferPool(2, 64) as nbp:
        buf = nbp.create_buffer_pool(1, 1).request_buffer()
        set_ref_count(buf, 2 ** 31 - 1)
        assert buf.retain() is buf and buf.ref_count == 2 ** 31
        buf.recycle()
        assert buf.ref_count == 2 ** 31 - 1 and not buf.is_recycled
        set_ref_count(buf, sys.maxsize)
        with pytest.raises(OverflowError, match="reference count"):
            buf.retain()
        assert buf.ref_count == sys.maxsize and not buf.is_recycled
        with pytest.raises(ValueError):
            set_ref_count(buf, 0)
        set_ref_count(buf, 1)
        buf.recycle()
        assert buf.is_recycled
        with pytest.raises(fb.RecycledBufferError):
            set_ref_count(buf, 1)


def test_recycling_more_unpooled_segments_than_exist_is_refused_up_front():
    """The list length goes to C as an int32_t; a list longer than the pool
    (which must repeat a segment) is refused before that.  (A length that
    truncated, past 2**31, would take a list of 16 GiB to test.)"""
    with fb.NetworkBufferPool(4, 64) as nbp:
        segs = nbp.request_unpooled_segments(2)
        with pytest.raises(ValueError, match="twice"):
            nbp.recycle_unpooled_segments(segs * 3)
        assert nbp.num_unpooled_segments == 2
        nbp.recycle_unpooled_segments(segs)


# -- index, offset and length arguments of any size ------------------------

TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
         "float32", "float64"]
EXTREMES = [2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 1000,
            -2 ** 31, -2 ** 63, -2 ** 63 - 1, -2 ** 1000]
# Never a valid offset or length of a 64-byte segment (nor of a Buffer).
OUT_OF_BOUNDS = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=65), st.sampled_from(EXTREMES),
    st.sampled_from([np.int64(-1), np.int64(2 ** 63 - 1), np.uint64(2 ** 64 - 1), np.int32(65)]))
NOT_INTS = st.sampled_from([0.5, 1.0, "1", b"\x00", [0], 1j, np.float64(1.0)])


def _typed(kind, name):
    if kind == "get":
        return lambda s, t, v: getattr(s, f"get_{name}")(v)
    return lambda s, t, v: getattr(s, f"put_{name}")(v, 0)


SEGMENT_INDEX_ARGS = {
    **{f"get_{n}": _typed("get", n) for n in TYPES},
    **{f"put_{n}": _typed("put", n) for n in TYPES},
    "get_bytes(offset)": lambda s, t, v: s.get_bytes(v, 1),
    "get_bytes(length)": lambda s, t, v: s.get_bytes(0, v),
    "put_bytes(offset)": lambda s, t, v: s.put_bytes(v, b"x"),
    "copy_to(offset)": lambda s, t, v: s.copy_to(v, t, 0, 1),
    "copy_to(target_offset)": lambda s, t, v: s.copy_to(0, t, v, 1),
    "copy_to(length)": lambda s, t, v: s.copy_to(0, t, 0, v),
    "compare(offset)": lambda s, t, v: s.compare(t, v, 0, 1),
    "compare(other_offset)": lambda s, t, v: s.compare(t, 0, v, 1),
    "compare(length)": lambda s, t, v: s.compare(t, 0, 0, v),
}


@pytest.mark.parametrize("segment_kind", ["standalone", "buffer"])
@pytest.mark.parametrize("method", sorted(SEGMENT_INDEX_ARGS))
@given(value=OUT_OF_BOUNDS, other=NOT_INTS)
def test_segment_index_arguments_of_any_size(method, segment_kind, value, other):
    """Offsets past 2**63 raised OverflowError; the README promises IndexError."""
    call = SEGMENT_INDEX_ARGS[method]
    nbp = fb.NetworkBufferPool(2, 64)
    buf = nbp.create_buffer_pool(1, 1).request_buffer()
    seg = buf.segment if segment_kind == "buffer" else fb.MemorySegment.allocate(64)
    target = fb.MemorySegment.allocate(64)
    try:
        with pytest.raises(IndexError, match="out of bounds"):
            call(seg, target, value)
        with pytest.raises(TypeError):
            call(seg, target, other)
        call(seg, target, 0)                       # still usable
    finally:
        target.free()
        if segment_kind == "standalone":
            seg.free()
        buf.recycle()
        nbp.destroy()


BUFFER_INDEX_ARGS = {
    "size": lambda b, v: setattr(b, "size", v),
    "reader_index": lambda b, v: setattr(b, "reader_index", v),
}


@pytest.mark.parametrize("attr", sorted(BUFFER_INDEX_ARGS))
@given(value=OUT_OF_BOUNDS, other=NOT_INTS)
def test_buffer_indices_of_any_size_are_value_errors(attr, value, other):
    with fb.NetworkBufferPool(1, 64) as nbp:
        with nbp.create_buffer_pool(1, 1).request_buffer() as buf:
            buf.write(b"abc")
            with pytest.raises(ValueError, match=attr):
                BUFFER_INDEX_ARGS[attr](buf, value)
            with pytest.raises(TypeError):
                BUFFER_INDEX_ARGS[attr](buf, other)
            assert (buf.size, buf.reader_index) == (3, 0)


@given(n=st.one_of(st.integers(), st.sampled_from(EXTREMES)), other=NOT_INTS)
def test_buffer_read_takes_any_count(n, other):
    """read(n): up to n bytes, all of them for a negative n, for any int."""
    with fb.NetworkBufferPool(1, 64) as nbp:
        with nbp.create_buffer_pool(1, 1).request_buffer() as buf:
            buf.write(b"abcdef")
            with pytest.raises(TypeError):
                buf.read(other)
            assert buf.read(n) == b"abcdef"[:n if 0 <= n < 6 else 6]


# Counts and channels are values: ValueError out of range, however large.
OUT_OF_INT32 = st.one_of(st.integers(max_value=-1), st.integers(min_value=2 ** 31),
                         st.sampled_from(EXTREMES))
POOL_INT_ARGS = {
    "request_buffer(channel)": lambda nbp, p, v: p.request_buffer(v),
    "request_buffer_blocking(channel)": lambda nbp, p, v: p.request_buffer_blocking(0, v),
    "channel_count(channel)": lambda nbp, p, v: p.channel_count(v),
    "set_num_buffers": lambda nbp, p, v: p.set_num_buffers(v),
    "create_buffer_pool(min_buffers)": lambda nbp, p, v: nbp.create_buffer_pool(v, None),
    "create_buffer_pool(max_buffers)": lambda nbp, p, v: nbp.create_buffer_pool(1, v),
    "request_unpooled_segments": lambda nbp, p, v: nbp.request_unpooled_segments(v),
    "MemorySegment.allocate(alignment)": lambda nbp, p, v: fb.MemorySegment.allocate(64, v),
    "NetworkBufferPool(num_segments)": lambda nbp, p, v: fb.NetworkBufferPool(v, 64),
    "NetworkBufferPool(segment_size)": lambda nbp, p, v: fb.NetworkBufferPool(1, v),
    "NetworkBufferPool(alignment)": lambda nbp, p, v: fb.NetworkBufferPool(1, 64, v),
}


@pytest.mark.parametrize("method", sorted(POOL_INT_ARGS))
@given(value=OUT_OF_INT32, other=NOT_INTS)
def test_pool_counts_and_channels_of_any_size_are_value_errors(method, value, other):
    call = POOL_INT_ARGS[method]
    with fb.NetworkBufferPool(4, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 2, num_subpartitions=2)
        with pytest.raises(ValueError):
            call(nbp, pool, value)
        with pytest.raises(TypeError):
            call(nbp, pool, other)
        assert nbp.num_total_required_buffers == 1


@given(size=st.one_of(st.integers(2 ** 63, 2 ** 200), st.sampled_from([2 ** 63 - 1, 2 ** 64])),
       negative=st.one_of(st.integers(max_value=0), st.sampled_from([e for e in EXTREMES if e < 0])))
def test_allocate_sizes_of_any_size(size, negative):
    """allocate(2**64) raised OverflowError: MemoryError, as for any size
    that cannot be allocated (never asking malloc past the address space);
    a non-positive size stays ValueError."""
    with pytest.raises(MemoryError, match="cannot allocate"):
        fb.MemorySegment.allocate(size)
    with pytest.raises(ValueError, match="positive"):
        fb.MemorySegment.allocate(negative)
    with pytest.raises(TypeError):
        fb.MemorySegment.allocate(64.0)
    with fb.MemorySegment.allocate(np.int64(64), alignment=np.uint64(128)) as seg:
        assert seg.size == 64 and seg.address % 128 == 0


@given(extra=st.one_of(st.integers(0, 2 ** 200), st.sampled_from([e for e in EXTREMES if e > 0])))
def test_redistribute_takes_any_available_count(extra):
    """redistribute(2**64, ...) raised OverflowError; past the caps more
    available segments change nothing."""
    pools = [(1, 5), (2, None), (3, 3)]
    assert fb.redistribute(2 ** 62 + extra, pools) == fb.redistribute(2 ** 62, pools)
    with pytest.raises(ValueError, match=">= 0"):
        fb.redistribute(-1 - extra, pools)
    with pytest.raises(TypeError):
        fb.redistribute(1.0, pools)


@pytest.mark.parametrize("call", ["request_buffer_blocking", "wait_available",
                                  "request_unpooled_segments"])
def test_timeouts_past_the_double_range(call):
    """A timeout of 10**400 raised OverflowError from float(): it waits
    forever like inf; a negative one is a ValueError like -1."""
    with fb.NetworkBufferPool(2, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 1)
        fn = {"request_buffer_blocking": pool.request_buffer_blocking,
              "wait_available": pool.wait_available,
              "request_unpooled_segments": lambda t: nbp.request_unpooled_segments(1, t)}[call]
        for t in (-10 ** 400, -2 ** 64):
            with pytest.raises(ValueError, match="non-negative"):
                fn(t)
        got = fn(10 ** 400)
        if call == "request_buffer_blocking":
            got.recycle()
        elif call == "request_unpooled_segments":
            nbp.recycle_unpooled_segments(got)
        else:
            assert got is True
