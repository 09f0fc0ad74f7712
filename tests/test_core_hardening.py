"""The buffer core under misuse: objects made without ``__init__``, listener
errors, resizes that would eat into other pools' minimums, reference-count
overflow, and index arguments of any size.  Cases that crashed run in a
child process, where a segfault fails the test instead of the run."""

import os
import subprocess
import sys
import textwrap

import pytest

import flinkbuf as fb


def run_child(code):
    """Run ``code`` in a fresh interpreter; it must print 'survived' last."""
    prelude = textwrap.dedent("""
        import gc, sys
        import flinkbuf as fb
        from flinkbuf._core import Buffer, LocalBufferPool, MemorySegment, NetworkBufferPool
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


# -- 1. objects made without __init__ -----------------------------------------

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
        del b; gc.collect()
    """)


def test_bare_network_buffer_pool_raises_until_initialised():
    run_child("""
        nbp = NetworkBufferPool.__new__(NetworkBufferPool)
        assert not nbp.is_destroyed and not nbp.is_arena_released
        assert "uninitialised" in repr(nbp)
        for fn in (lambda: nbp.create_buffer_pool(1, 1), lambda: nbp.request_unpooled_segments(1),
                   lambda: nbp.recycle_unpooled_segments([]), nbp.destroy, nbp._redistribute,
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


# -- 3. listener errors -------------------------------------------------------

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
    from helpers import run_in_thread
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
