"""Flink's proportional redistribution, as a pure function and on live pools."""

from fractions import Fraction

import pytest
from hypothesis import given, strategies as st

import flinkbuf as fb

UNBOUNDED = 2 ** 31 - 1


@st.composite
def pool_specs(draw, max_pools=30, max_min=50):
    n = draw(st.integers(0, max_pools))
    specs = []
    for _ in range(n):
        mn = draw(st.integers(1, max_min))
        kind = draw(st.sampled_from(["fixed", "bounded", "unbounded"]))
        mx = mn if kind == "fixed" else None if kind == "unbounded" else mn + draw(st.integers(0, 10 ** 6))
        specs.append((mn, mx))
    return specs


def expected_properties(avail, specs, sizes):
    caps = [min(avail, (UNBOUNDED if mx is None else mx) - mn) for mn, mx in specs]
    total_cap = sum(caps)
    to_distribute = min(avail, total_cap)
    assert len(sizes) == len(specs)
    for (mn, mx), size, cap in zip(specs, sizes, caps):
        assert mn <= size <= (UNBOUNDED if mx is None else mx)
        if mx == mn:
            assert size == mn  # fixed pools untouched
        if total_cap:
            exact = Fraction(to_distribute * cap, total_cap)
            assert abs((size - mn) - exact) < 1  # within 1 of the exact share
    # all excess distributed, none invented
    assert sum(s - mn for s, (mn, _) in zip(sizes, specs)) == (to_distribute if avail > 0 else 0)


@given(avail=st.integers(0, 10 ** 6), specs=pool_specs())
def test_pure_redistribution_properties(avail, specs):
    expected_properties(avail, specs, fb.redistribute(avail, specs))


@given(n=st.integers(1, 10_000), avail=st.integers(0, 2 ** 31 - 1))
def test_no_overflow_with_many_unbounded_pools(n, avail):
    specs = [(1, None)] * n
    sizes = fb.redistribute(avail, specs)
    expected_properties(avail, specs, sizes)


def test_no_overflow_with_a_million_segments():
    total = 10 ** 6
    specs = [(1, None)] * 9_999 + [(10, 20)]
    avail = total - sum(mn for mn, _ in specs)
    sizes = fb.redistribute(avail, specs)
    expected_properties(avail, specs, sizes)
    assert sum(sizes) == total


def test_cumulative_floor_example():
    # avail 10 over caps 1,1,1: shares 3,3,4 (cumulative floors 3,6,10)
    assert fb.redistribute(10, [(1, 2), (1, 2), (1, 2)]) == [2, 2, 2]
    assert fb.redistribute(10, [(1, None), (1, None), (1, None)]) == [4, 4, 5]
    assert fb.redistribute(0, [(3, None), (2, 9)]) == [3, 2]
    assert fb.redistribute(5, [(3, 3)]) == [3]


def test_pure_function_rejects_bad_input():
    with pytest.raises(ValueError):
        fb.redistribute(-1, [])
    with pytest.raises(ValueError):
        fb.redistribute(5, [(3, 2)])
    with pytest.raises(ValueError):
        fb.redistribute(5, [(-1, 2)])
    with pytest.raises(TypeError):
        fb.redistribute(5, [(1.5, 2)])


@given(specs=pool_specs(max_pools=12, max_min=6), extra=st.integers(0, 300))
def test_live_pools_get_the_pure_functions_sizes(specs, extra):
    total = sum(mn for mn, _ in specs) + extra
    if total == 0:
        return
    with fb.NetworkBufferPool(num_segments=total, segment_size=1) as nbp:
        pools = [nbp.create_buffer_pool(mn, mx) for mn, mx in specs]
        assert [p.num_buffers for p in pools] == fb.redistribute(extra, specs)
        assert nbp.num_total_required_buffers == total - extra


@given(base=pool_specs(max_pools=6, max_min=5), more=pool_specs(max_pools=6, max_min=5),
       extra=st.integers(0, 100), data=st.data())
def test_create_then_destroy_restores_the_sizes(base, more, extra, data):
    total = sum(mn for mn, _ in base + more) + extra
    if total == 0:
        return
    with fb.NetworkBufferPool(num_segments=total, segment_size=1) as nbp:
        kept = [nbp.create_buffer_pool(mn, mx) for mn, mx in base]
        before = [p.num_buffers for p in kept]
        added = [nbp.create_buffer_pool(mn, mx) for mn, mx in more]
        for p in data.draw(st.permutations(added)):
            p.destroy()
        assert [p.num_buffers for p in kept] == before


def test_too_many_pools_for_the_arena():
    with fb.NetworkBufferPool(num_segments=100, segment_size=1) as nbp:
        pools = [nbp.create_buffer_pool(1, None) for _ in range(100)]
        assert all(p.num_buffers == 1 for p in pools)
        with pytest.raises(fb.InsufficientBuffersError):
            nbp.create_buffer_pool(1, None)
