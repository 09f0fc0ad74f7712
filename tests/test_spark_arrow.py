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
