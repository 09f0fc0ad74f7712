"""Buffer debloating gives memory back: a debloated channel keeps only the
buffers its in-flight data takes (a channel limit in its producer's pool,
credit held back by a remote consumer), a pool sized to what its channels
need returns the rest to the NetworkBufferPool, where another pool takes
it, and a consumer that speeds up takes it back."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.io import InputGate, RecordWriter, create_partition
from helpers import wait_until
from test_debloat_gate import FAST, _read_slowly, _writer_thread

SEG = 32768


@pytest.fixture
def nbp():
    pool = NetworkBufferPool(64, SEG)
    yield pool
    pool.destroy()


# ---- the pool's channel limit ----------------------------------------------------------

def test_a_channel_at_its_limit_gets_nothing_and_the_others_go_on(nbp):
    pool = nbp.create_buffer_pool(4, 10, num_subpartitions=2)
    pool._set_channel_limit(0, 1)
    first = pool.request_buffer(channel=0)
    assert first is not None and pool.request_buffer(channel=0) is None
    others = [pool.request_buffer(channel=1) for _ in range(3)]
    assert all(b is not None for b in others)
    assert pool.is_available                  # a limit is no per-channel cap
    first.recycle()
    again = pool.request_buffer(channel=0)
    assert again is not None
    pool._set_channel_limit(0, None)
    more = pool.request_buffer(channel=0)
    assert more is not None
    for b in [again, more, *others]:
        b.recycle()
    pool.destroy()


def test_a_channel_limit_takes_only_a_channel_and_a_positive_count(nbp):
    pool = nbp.create_buffer_pool(2, 4, num_subpartitions=1)
    with pytest.raises(ValueError):
        pool._set_channel_limit(1, 1)
    with pytest.raises(ValueError):
        pool._set_channel_limit(0, 0)
    with pytest.raises(TypeError):
        pool._set_channel_limit("0", 1)
    with pytest.raises(ValueError):
        pool._set_demand(-1)
    plain = nbp.create_buffer_pool(2, 4)
    with pytest.raises(ValueError):            # a pool that counts no channels
        plain._set_channel_limit(None, 1)
    pool.destroy()
    plain.destroy()


def test_a_request_blocked_by_its_channels_limit_goes_on_when_a_buffer_comes_back(nbp):
    pool = nbp.create_buffer_pool(4, 4, num_subpartitions=1)
    pool._set_channel_limit(0, 1)
    held = pool.request_buffer(channel=0)
    got = []
    t = threading.Thread(target=lambda: got.append(
        pool.request_buffer_blocking(timeout=10, channel=0)))
    t.start()
    time.sleep(0.1)
    assert not got                             # waits although the pool has buffers
    held.recycle()
    t.join(10)
    assert got and got[0] is not None
    # ... or when the limit rises
    t = threading.Thread(target=lambda: got.append(
        pool.request_buffer_blocking(timeout=10, channel=0)))
    t.start()
    time.sleep(0.1)
    assert len(got) == 1
    pool._set_channel_limit(0, 2)
    t.join(10)
    assert len(got) == 2
    for b in got:
        b.recycle()
    pool.destroy()


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["req", "rec", "limit", "demand"]),
                              st.integers(0, 2), st.integers(0, 6)), max_size=60))
def test_limits_and_demands_racing_requests_and_recycles_lose_no_segment(ops):
    """A thread requests and recycles while this one changes the channels'
    limits and the pool's demand: every segment is accounted for, and no
    channel ever holds more than its limit when the limit was set first."""
    nbp = NetworkBufferPool(24, 256)
    pool = nbp.create_buffer_pool(3, 16, num_subpartitions=3)
    other = nbp.create_buffer_pool(1, None)
    out = {c: [] for c in range(3)}
    stop = threading.Event()
    errors = []

    def churn():
        k = 0
        try:
            while not stop.is_set():
                c = k % 3
                b = pool.request_buffer(channel=c)
                if b is not None:
                    out[c].append(b)
                if len(out[c]) > 2 or (b is None and out[c]):
                    out[c].pop(0).recycle()
                k += 1
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=churn)
    t.start()
    try:
        for op, c, n in ops:
            if op == "limit":
                pool._set_channel_limit(c, n or None)
            elif op == "demand":
                pool._set_demand(None if n == 6 else n)
            elif op == "req":
                b = other.request_buffer()
                if b is not None:
                    b.recycle()
    finally:
        stop.set()
        t.join(10)
    assert not errors, errors
    for bufs in out.values():
        for b in bufs:
            b.recycle()
    assert pool.num_requested == pool.num_available
    assert nbp.num_available_segments + pool.num_requested + other.num_requested == 24
    pool.destroy()
    other.destroy()
    assert nbp.num_available_segments == 24
    nbp.destroy()


# ---- a partition and its local consumer -------------------------------------------------

def test_a_slow_local_consumer_keeps_few_buffers_and_another_pool_takes_the_rest(nbp):
    """A partition whose pool may grow to 40 buffers, read slowly: its
    channel keeps the few buffers the target needs, the pool gives the rest
    back (the gate's metrics and the partition say how many), and a pool
    made meanwhile gets them; a fast reader takes them back."""
    part = create_partition(nbp, 1, min_buffers=2, max_buffers=40, buffer_debloat=True)
    assert part._debloat_given_back() == 0
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.01)
    stop = threading.Event()
    t = _writer_thread(writer, stop, size=100)
    gate = InputGate([(part, 0)], codec="bytes", **FAST)
    try:
        seen = _read_slowly(gate, 1.0, 500)
        assert seen == list(range(len(seen)))
        assert 0 < part.subpartition(0).buffer_size < SEG
        assert wait_until(lambda: part._debloat_given_back() >= 30, 5), \
            part._debloat_given_back()
        second = nbp.create_buffer_pool(1, None)
        assert second.num_buffers >= 30        # what the partition gave back
        more = _read_slowly(gate, 0.3, 500)
        assert more[0] == seen[-1] + 1
        second.destroy()
        # released: a fast reader makes the size whole again and the limit goes
        end = time.monotonic() + 3
        for _ in gate:
            if time.monotonic() > end or part.subpartition(0).buffer_size == SEG:
                break
        assert part.subpartition(0).buffer_size == SEG
        for _ in range(2000):
            next(gate)
        assert part._debloat_given_back() == 0
    finally:
        stop.set()
        gate.close()
        t.join(10)
