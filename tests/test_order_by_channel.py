"""flinkbuf.io.order_by_channel, the stable counting sort that groups a
batch's rows by channel: the same order as numpy's stable argsort, the
counts of each channel, every channel width and order width, and a clear
exception (never a crash, never a write) for every bad argument."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flinkbuf.io import assign_keys_to_operators, order_by_channel
from helpers import ticks_during

CHANNEL_DTYPES = [np.int8, np.int16, np.int32, np.int64]
ORDER_DTYPES = [np.int32, np.int64]


@st.composite
def channel_arrays(draw):
    """(channels, num_channels): each channel in [0, num_channels)."""
    dtype = draw(st.sampled_from(CHANNEL_DTYPES))
    high = {np.int8: 128, np.int16: 300}.get(dtype, 5000)
    num_channels = draw(st.one_of(st.integers(1, 4), st.integers(1, high)))
    channels = draw(hnp.arrays(dtype, st.integers(0, 200),
                               elements=st.integers(0, num_channels - 1)))
    return channels, num_channels


def _order(channels, num_channels, order_dtype=np.int64):
    order = np.full(len(channels), -1, dtype=order_dtype)
    counts = np.full(num_channels, -1, dtype=np.int64)
    assert order_by_channel(channels, order, counts) is None
    return order, counts


def _assert_as_numpy(channels, num_channels, order_dtype):
    """The order is numpy's stable argsort, the counts its bincount."""
    order, counts = _order(channels, num_channels, order_dtype)
    assert order.tolist() == np.argsort(channels, kind="stable").tolist()
    assert counts.tolist() == np.bincount(channels.astype(np.int64),
                                          minlength=num_channels).tolist()


@given(channel_arrays(), st.sampled_from(ORDER_DTYPES))
def test_the_order_is_numpys_stable_argsort_and_counts_its_bincount(ca, order_dtype):
    _assert_as_numpy(*ca, order_dtype)


@given(channel_arrays())
def test_each_channels_rows_are_its_slice_of_the_order_in_input_order(ca):
    channels, num_channels = ca
    order, counts = _order(channels, num_channels)
    start = 0
    for c in range(num_channels):
        rows = order[start:start + counts[c]].tolist()
        assert rows == [i for i, x in enumerate(channels.tolist()) if x == c]
        start += counts[c]
    assert start == len(channels)
    assert sorted(order.tolist()) == list(range(len(channels)))     # each row once


@given(hnp.arrays(np.int64, st.integers(0, 100)), st.integers(1, 200))
def test_it_groups_what_assign_keys_to_operators_writes(keys, parallelism):
    channels = np.empty(len(keys), dtype=np.int16)
    assign_keys_to_operators(keys, channels, parallelism, 256)
    order, counts = _order(channels, parallelism)
    assert channels[order].tolist() == sorted(channels.tolist())
    assert counts.sum() == len(keys)


@st.composite
def long_channel_arrays(draw):
    """(channels, num_channels) long enough for the four-lane path (from
    1024 rows and four rows per channel), every length mod 4, runs of one
    channel or mixed."""
    dtype = draw(st.sampled_from(CHANNEL_DTYPES))
    num_channels = draw(st.one_of(st.integers(1, 4), st.integers(1, 120)))
    n = draw(st.integers(max(1024, 4 * num_channels) - 3, 6000))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        channels = rng.integers(0, num_channels, n)
    else:                               # long runs: one channel per lane, or sorted
        channels = np.sort(rng.integers(0, num_channels, n))
    return channels.astype(dtype), num_channels


@settings(max_examples=60)
@given(long_channel_arrays(), st.sampled_from(ORDER_DTYPES))
def test_long_batches_order_as_numpys_stable_argsort(ca, order_dtype):
    _assert_as_numpy(*ca, order_dtype)


@settings(max_examples=60)
@given(long_channel_arrays(), st.data())
def test_long_batches_name_the_first_channel_out_of_range_and_write_nothing(ca, data):
    """Out-of-range channels anywhere (in any lane, on a lane's first or
    last row, in the tail): the error names the first in input order, and
    neither order nor counts is touched."""
    channels, num_channels = ca
    n = len(channels)
    info = np.iinfo(channels.dtype)
    rows = data.draw(st.lists(st.one_of(st.integers(0, n - 1),
                                        st.sampled_from([0, n // 4, n // 4 - 1, n // 2,
                                                         3 * (n // 4), 4 * (n // 4) - 1,
                                                         n - 1])),
                              min_size=1, max_size=4))
    values = data.draw(st.lists(st.one_of(st.integers(num_channels, info.max),
                                          st.integers(info.min, -1)),
                                min_size=len(rows), max_size=len(rows)))
    for row, value in zip(rows, values):
        channels[row] = value
    first = min(rows)
    order = np.full(n, -7, dtype=np.int64)
    counts = np.full(num_channels, -7, dtype=np.int64)
    with pytest.raises(ValueError, match=rf"channel {channels[first]} of row {first} is not"):
        order_by_channel(channels, order, counts)
    assert (order == -7).all() and (counts == -7).all()


def test_views_of_larger_arrays_are_read_and_written_in_place():
    base = np.array([9, 1, 0, 1, 0, 9], dtype=np.int8)
    order = np.full(8, -1, dtype=np.int32)
    counts = np.full(4, -1, dtype=np.int64)
    order_by_channel(base[1:5], order[2:6], counts[1:3])
    assert order.tolist() == [-1, -1, 1, 3, 0, 2, -1, -1]
    assert counts.tolist() == [-1, 2, 2, -1]


def test_an_empty_batch_counts_zero_everywhere():
    order, counts = _order(np.empty(0, dtype=np.int8), 3)
    assert order.tolist() == [] and counts.tolist() == [0, 0, 0]


def test_other_threads_run_while_a_large_batch_is_ordered():
    channels = (np.arange(20_000_000, dtype=np.int64) % 7).astype(np.int8)
    order = np.empty(len(channels), dtype=np.int64)
    counts = np.empty(7, dtype=np.int64)

    def order_thrice():
        for _ in range(3):
            order_by_channel(channels, order, counts)

    assert ticks_during(order_thrice) > 5          # the GIL was released during the calls
    assert counts.tolist() == np.bincount(channels, minlength=7).tolist()


CH = np.array([0, 1, 2, 1, 0, 2], dtype=np.int8)
ORDER = np.empty(6, dtype=np.int64)
COUNTS = np.empty(3, dtype=np.int64)


@pytest.mark.parametrize("call, error, message", [
    # channels
    (lambda: order_by_channel(CH.astype(np.uint8), ORDER, COUNTS), TypeError,
     "channels must be an array of signed integers"),
    (lambda: order_by_channel(CH.astype(np.float64), ORDER, COUNTS), TypeError,
     "signed integers"),
    (lambda: order_by_channel(CH.astype(object), ORDER, COUNTS), TypeError, "format 'O'"),
    (lambda: order_by_channel(list(CH), ORDER, COUNTS), TypeError,
     "channels must be a one-dimensional array"),
    (lambda: order_by_channel(np.zeros(12, np.int8)[::2], ORDER, COUNTS), ValueError,
     "strided"),
    (lambda: order_by_channel(CH.reshape(2, 3), ORDER, COUNTS), ValueError, "2-dimensional"),
    (lambda: order_by_channel(CH.astype(">i8"), ORDER, COUNTS), ValueError, "byte order"),
    # channels out of range
    (lambda: order_by_channel(np.array([0, 1, 3, 1, 0, 2], np.int8), ORDER, COUNTS),
     ValueError, r"channel 3 of row 2 is not in \[0, 3\)"),
    (lambda: order_by_channel(np.array([0, -1, 2, 1, 0, 2], np.int64), ORDER, COUNTS),
     ValueError, r"channel -1 of row 1 is not in \[0, 3\)"),
    (lambda: order_by_channel(np.array([0, 1, 2, 1, 0, -2**63], np.int64), ORDER, COUNTS),
     ValueError, "of row 5"),
    (lambda: order_by_channel(np.array([0, 1, 2, 1, 0, 2**31 - 1], np.int32), ORDER,
                              COUNTS), ValueError, "channel 2147483647 of row 5"),
    # order
    (lambda: order_by_channel(CH, np.empty(5, np.int64), COUNTS), ValueError,
     "6 channels, 5 items in order"),
    (lambda: order_by_channel(CH, np.empty(7, np.int64), COUNTS), ValueError,
     "6 channels, 7 items in order"),
    (lambda: order_by_channel(CH, np.empty(6, np.int16), COUNTS), TypeError,
     "order must be an array of int32 or int64"),
    (lambda: order_by_channel(CH, np.empty(6, np.uint64), COUNTS), TypeError,
     "int32 or int64"),
    (lambda: order_by_channel(CH, np.empty(6, np.float64), COUNTS), TypeError,
     "int32 or int64"),
    (lambda: order_by_channel(CH, bytes(48), COUNTS), ValueError, "order must be a writable"),
    (lambda: order_by_channel(CH, np.empty(12, np.int64)[::2], COUNTS), ValueError,
     "order must be a contiguous"),
    # counts
    (lambda: order_by_channel(CH, ORDER, np.empty(0, np.int64)), ValueError,
     "counts must hold one item per channel"),
    (lambda: order_by_channel(CH, ORDER, np.empty(3, np.int32)), TypeError,
     "counts must be an array of int64"),
    (lambda: order_by_channel(CH, ORDER, np.empty(3, np.uint64)), TypeError, "int64"),
    (lambda: order_by_channel(CH, ORDER, bytes(24)), ValueError, "counts must be a writable"),
    (lambda: order_by_channel(CH, ORDER, [0, 0, 0]), TypeError,
     "counts must be a one-dimensional array"),
])
def test_bad_arguments_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_refused_call_writes_nothing():
    order = np.full(6, -7, dtype=np.int64)
    counts = np.full(3, -7, dtype=np.int64)
    bad = np.array([0, 1, 2, 1, 0, 3], dtype=np.int8)     # the last row out of range
    with pytest.raises(ValueError, match="row 5"):
        order_by_channel(bad, order, counts)
    with pytest.raises(ValueError):
        order_by_channel(CH, order[:5], counts)
    assert order.tolist() == [-7] * 6 and counts.tolist() == [-7] * 3
