"""flinkbuf.spark.key_partitions: the vectorized key hash that routes the
rows of arrow_exchange agrees with the hash selector, key by key (no Spark
needed; arrow_exchange itself is tested in test_spark.py)."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.io import assign_key_to_operator, default_max_parallelism
from flinkbuf.spark import key_partitions


@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=200), st.integers(1, 300))
def test_integer_keys_as_the_hash_selector(keys, n):
    got = key_partitions(pa.array(keys, pa.int64()), n)
    mp = default_max_parallelism(n)
    assert got.tolist() == [assign_key_to_operator(k, n, mp) for k in keys]


@given(st.lists(st.one_of(st.none(), st.text(max_size=8)), max_size=100), st.integers(1, 9))
def test_string_keys_and_nulls(keys, n):
    got = key_partitions(pa.array(keys, pa.string()), n)
    assert got.tolist() == [0 if k is None else assign_key_to_operator(k, n) for k in keys]


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint16])
def test_numpy_arrays_of_any_integer_width(dtype):
    keys = np.arange(-50, 200).astype(dtype)
    got = key_partitions(keys, 4)
    assert got.tolist() == [assign_key_to_operator(int(k), 4) for k in keys]
    assert got.dtype == np.int64


def test_chunked_and_null_integer_keys():
    keys = pa.chunked_array([[1, None, 3], [4, 5]])
    assert key_partitions(keys, 3).tolist() == [
        assign_key_to_operator(1, 3), 0, assign_key_to_operator(3, 3),
        assign_key_to_operator(4, 3), assign_key_to_operator(5, 3)]


def test_every_partition_in_range():
    got = key_partitions(pa.array(np.arange(100_000)), 7)
    assert got.min() == 0 and got.max() == 6
    counts = np.bincount(got)
    assert counts.min() > 100_000 / 7 * 0.5           # keys spread over all of them


@given(st.integers(-2**63, 2**63 - 1), st.lists(st.integers(0, 40), min_size=2, max_size=300),
       st.integers(1, 300))
def test_keys_of_a_narrow_range_as_the_hash_selector(base, offsets, n):
    # Keys that span fewer values than there are keys are hashed once per
    # value of their range: the same partitions, also where the range
    # crosses the int32 boundary or touches either end of the int64 range.
    keys = [min(max(base + o, -2**63), 2**63 - 1) for o in offsets]
    got = key_partitions(pa.array(keys, pa.int64()), n)
    mp = default_max_parallelism(n)
    assert got.tolist() == [assign_key_to_operator(k, n, mp) for k in keys]


@pytest.mark.parametrize("base", [-2**63, -2**31 - 20, -20, 2**31 - 20, 2**63 - 41])
def test_dense_and_sparse_keys_agree(base):
    keys = np.array([base + (i * 7) % 41 for i in range(1000)], dtype=np.int64)
    dense = key_partitions(keys, 5)
    sparse = key_partitions(np.concatenate([keys, [0, 2**62, -2**62]]), 5)[:len(keys)]
    assert dense.tolist() == sparse.tolist() == [assign_key_to_operator(int(k), 5) for k in keys]


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=200), st.integers(2, 9),
       st.sampled_from(["int8", "int32", "int64", "uint8"]))
def test_null_integer_keys_of_any_width(keys, n, type_name):
    if type_name == "uint8":
        keys = [None if k is None else k + 5 for k in keys]
    got = key_partitions(pa.array(keys, getattr(pa, type_name)()), n)
    assert got.tolist() == [0 if k is None else assign_key_to_operator(k, n) for k in keys]


def test_max_parallelism_not_a_power_of_two():
    # Key groups modulo a max parallelism that is not a power of two.
    keys = np.array([-2**31, -2**31 + 1, 2**31 - 1, 0, 1, 12345] * 3, dtype=np.int64)
    for mp in (7, 100, 129, 32768):
        got = key_partitions(keys, 5, mp)
        assert got.tolist() == [assign_key_to_operator(int(k), 5, mp) for k in keys]
