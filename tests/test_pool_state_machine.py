"""A stateful model of a NetworkBufferPool with its local pools.

Invariants after every step:
  * conservation: global available + sum of every pool's requested (destroyed
    pools with buffers in flight included) + unpooled outstanding = total;
  * per pool: requested = idle here + handed out (as the model counts them);
  * sizes are exactly Flink's redistribution of the live pools, in creation
    order, over total - (sum of mins + unpooled outstanding), each pool
    capped at its demand (buffer debloating; never under its minimum),
    unless a pool was resized by hand since the last redistribution; what a
    pool gives back is its size without demands minus its size;
  * every live pool keeps room for its minimum: the sizes of all other live
    pools plus its min_buffers fit in the segments not taken unpooled.
"""

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant, rule)

import flinkbuf as fb


class PoolModel(RuleBasedStateMachine):
    pools = Bundle("pools")

    def __init__(self):
        super().__init__()
        self.nbp = None

    @initialize(total=st.integers(1, 24), size=st.integers(1, 100))
    def start(self, total, size):
        self.total = total
        self.nbp = fb.NetworkBufferPool(total, size)
        self.all_pools = []        # every pool ever created, in creation order
        self.live = []             # live pools, creation order
        self.out = {}              # id(pool) -> list of handed-out buffers
        self.unpooled = []         # lists of unpooled segments
        self.resized = False       # set_num_buffers since the last redistribution
        self.demand = {}           # id(pool) -> its demand (absent: none)

    def teardown(self):
        if self.nbp is None:
            return
        for bufs in self.out.values():
            for b in bufs:
                b.recycle()
        for segs in self.unpooled:
            self.nbp.recycle_unpooled_segments(segs)
        self.nbp.destroy()
        assert self.nbp.is_arena_released

    def required(self):
        return sum(p.min_buffers for p in self.live) + sum(len(s) for s in self.unpooled)

    @rule(target=pools, mn=st.integers(1, 6), mx=st.one_of(st.none(), st.integers(0, 8)),
          overdraft=st.integers(0, 2))
    def create(self, mn, mx, overdraft):
        if mx is not None:
            mx = mn + mx
        if self.required() + mn > self.total:
            try:
                self.nbp.create_buffer_pool(mn, mx)
            except fb.InsufficientBuffersError:
                return None
            raise AssertionError("admission control let an impossible pool in")
        pool = self.nbp.create_buffer_pool(mn, mx, max_overdraft_buffers=overdraft)
        self.resized = False
        self.all_pools.append(pool)
        self.live.append(pool)
        self.out[id(pool)] = []
        return pool

    @rule(pool=pools)
    def destroy(self, pool):
        if pool is None:
            return
        pool.destroy()
        if pool in self.live:
            self.live.remove(pool)
            self.resized = False

    @rule(pool=pools, blocking=st.booleans())
    def request(self, pool, blocking):
        if pool is None:
            return
        if pool.is_destroyed:
            try:
                pool.request_buffer()
            except fb.PoolDestroyedError:
                return
            raise AssertionError("destroyed pool served a request")
        could = (pool.num_available > 0 or (self.nbp.num_available_segments > 0 and (
            pool.num_requested < pool.num_buffers or pool.num_overdraft < pool.max_overdraft_buffers)))
        if blocking:
            try:
                buf = pool.request_buffer_blocking(timeout=0)
            except fb.BufferRequestTimeoutError:
                buf = None
        else:
            buf = pool.request_buffer()
        assert (buf is not None) == could
        if buf is not None:
            self.out[id(pool)].append(buf)

    @rule(pool=pools, k=st.integers(0, 10), retain=st.booleans())
    def recycle(self, pool, k, retain):
        if pool is None or not self.out[id(pool)]:
            return
        bufs = self.out[id(pool)]
        buf = bufs.pop(k % len(bufs))
        if retain:
            buf.retain()
            buf.recycle()
            assert not buf.is_recycled
        buf.recycle()
        assert buf.is_recycled

    @rule(pool=pools, n=st.integers(1, 30))
    def set_num_buffers(self, pool, n):
        if pool is None or pool.is_destroyed:
            return
        if n < pool.min_buffers:
            try:
                pool.set_num_buffers(n)
            except ValueError:
                return
            raise AssertionError("size below min accepted")
        # At most what leaves every other live pool room for its minimum.
        unpooled = sum(len(s) for s in self.unpooled)
        others = [p for p in self.live if p is not pool]
        limit = self.total - unpooled - sum(p.num_buffers for p in others)
        if others:
            limit += min(p.num_buffers - p.min_buffers for p in others)
        assert limit <= pool.min_buffers + self.total - self.required()
        pool.set_num_buffers(n)
        cap = pool.max_buffers if pool.max_buffers is not None else 2 ** 31 - 1
        assert pool.num_buffers == min(n, cap, limit)
        self.resized = True        # until the next redistribution

    @rule(pool=pools, n=st.one_of(st.none(), st.integers(0, 12)))
    def set_demand(self, pool, n):
        if pool is None:
            return
        before = pool.num_requested
        pool._set_demand(n)
        if pool.is_destroyed:
            return
        if self.demand.get(id(pool)) != n:     # the same demand again changes nothing
            self.resized = False
        if n is None:
            self.demand.pop(id(pool), None)
        else:
            self.demand[id(pool)] = n
        # lazily: idle segments beyond the new size went back at once
        assert pool.num_requested <= max(pool.num_buffers, before)
        assert pool.num_available == 0 or pool.num_requested <= pool.num_buffers \
            or pool.num_overdraft > 0

    def capped(self, p):
        mx = p.max_buffers
        d = self.demand.get(id(p))
        if d is None:
            return mx
        d = max(d, p.min_buffers)
        return d if mx is None else min(d, mx)

    @rule(n=st.integers(1, 8))
    def request_unpooled(self, n):
        if self.required() + n > self.total:
            try:
                self.nbp.request_unpooled_segments(n, timeout=0)
            except fb.InsufficientBuffersError:
                return
            raise AssertionError("impossible unpooled request accepted")
        self.resized = False       # reserving (and a timeout's release) redistributes
        try:
            segs = self.nbp.request_unpooled_segments(n, timeout=0)
        except fb.BufferRequestTimeoutError:
            assert self.nbp.num_available_segments < n
            return
        assert len(segs) == n
        self.unpooled.append(segs)

    @rule(k=st.integers(0, 10))
    def recycle_unpooled(self, k):
        if not self.unpooled:
            return
        self.nbp.recycle_unpooled_segments(self.unpooled.pop(k % len(self.unpooled)))
        self.resized = False

    @invariant()
    def conservation(self):
        if self.nbp is None:
            return
        outstanding_unpooled = sum(len(s) for s in self.unpooled)
        assert self.nbp.num_unpooled_segments == outstanding_unpooled
        assert (self.nbp.num_available_segments + sum(p.num_requested for p in self.all_pools)
                + outstanding_unpooled) == self.total
        for p in self.all_pools:
            assert p.num_requested == p.num_available + len(self.out[id(p)])

    @invariant()
    def sizes_follow_redistribution(self):
        if self.nbp is None:
            return
        assert self.nbp.num_total_required_buffers == self.required()
        if self.resized:
            return
        specs = [(p.min_buffers, self.capped(p)) for p in self.live]
        expected = fb.redistribute(self.total - self.required(), specs)
        assert [p.num_buffers for p in self.live] == expected
        free = fb.redistribute(self.total - self.required(),
                               [(p.min_buffers, p.max_buffers) for p in self.live])
        assert [p._debloat_given_back() for p in self.live] == \
            [max(0, f - e) if self.demand else 0 for f, e in zip(free, expected)]

    @invariant()
    def every_pool_keeps_room_for_its_minimum(self):
        if self.nbp is None:
            return
        room = self.total - sum(len(s) for s in self.unpooled)
        sizes = sum(p.num_buffers for p in self.live)
        for p in self.live:
            assert p.min_buffers <= p.num_buffers
            assert sizes - p.num_buffers + p.min_buffers <= room


PoolModel.TestCase.settings = settings(
    settings(), stateful_step_count=40, max_examples=settings().max_examples * 2)
TestPoolModel = PoolModel.TestCase
