"""flinkbuf.spark.key_partitions (flinkbuf.io's): the vectorized key hash
that routes the rows of arrow_exchange agrees with the hash selector, key by
key (null keys included); and arrow_exchange's buffer size (no Spark needed;
arrow_exchange itself is tested in test_spark.py, the batch writer it is
built on in test_batch_exchange.py)."""

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
    assert got.tolist() == [assign_key_to_operator(k, n) for k in keys]


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint16])
def test_numpy_arrays_of_any_integer_width(dtype):
    keys = np.arange(-50, 200).astype(dtype)
    got = key_partitions(keys, 4)
    assert got.tolist() == [assign_key_to_operator(int(k), 4) for k in keys]
    assert got.dtype == np.int64


def test_chunked_and_null_integer_keys():
    keys = pa.chunked_array([[1, None, 3], [4, 5]])
    assert key_partitions(keys, 3).tolist() == [
        assign_key_to_operator(1, 3), assign_key_to_operator(None, 3),
        assign_key_to_operator(3, 3),
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
    assert got.tolist() == [assign_key_to_operator(k, n) for k in keys]


def test_max_parallelism_not_a_power_of_two():
    # Key groups modulo a max parallelism that is not a power of two.
    keys = np.array([-2**31, -2**31 + 1, 2**31 - 1, 0, 1, 12345] * 3, dtype=np.int64)
    for mp in (7, 100, 129, 32768):
        got = key_partitions(keys, 5, mp)
        assert got.tolist() == [assign_key_to_operator(int(k), 5, mp) for k in keys]


_KEYS = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3),
                  st.binary(max_size=3), st.none(),
                  st.tuples(st.integers(-5, 5), st.text(max_size=2)))


def _expected(keys, n, mp=None):
    mp = default_max_parallelism(n) if mp is None else mp
    return [assign_key_to_operator(k, n, mp) for k in keys]


@given(st.lists(_KEYS, max_size=40), st.integers(1, 40))
def test_a_sequence_of_any_keys_as_the_hash_selector(keys, n):
    """A list keeps its Python values: ints beside floats, ints beyond
    int64, 1 beside 1.0 and True, 0.0 beside -0.0 each hash as Java
    would (numpy's coercion would merge or convert them)."""
    assert key_partitions(keys, n).tolist() == _expected(keys, n)
    assert key_partitions(tuple(keys), n).tolist() == _expected(keys, n)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int32, np.uint32, np.int64,
                                   np.uint64, np.float32, np.float64, np.str_, np.bytes_])
def test_numpy_arrays_of_every_key_dtype(dtype):
    if dtype is np.bool_:
        values = [True, False, True]
    elif dtype in (np.str_, np.bytes_):
        values = [dtype(x) for x in ("a", "bc", "a", "")]
    elif np.dtype(dtype).kind == "f":
        values = [1.5, -0.0, 0.0, float("nan"), float("inf"), 2.0]
    else:
        info = np.iinfo(dtype)
        values = [info.min, info.max, 0, 1, info.max // 2 + 1]
    arr = np.array(values, dtype=dtype)
    python = arr.tolist()
    for n, mp in ((3, None), (8, 16), (5, 5)):
        assert key_partitions(arr, n, mp).tolist() == _expected(python, n, mp), (dtype, n)
    if np.dtype(dtype).kind not in "US":
        assert key_partitions(pa.array(arr), 8, 16).tolist() == _expected(python, 8, 16)


def test_boolean_keys_hash_as_java_booleans():
    keys = [True, False, None]
    for form in (keys, np.array(keys[:2]), pa.array(keys)):
        got = key_partitions(form, 8, 16).tolist()
        assert got == _expected(keys[:len(got)], 8, 16)
    assert assign_key_to_operator(True, 8, 16) != assign_key_to_operator(1, 8, 16)


@pytest.mark.parametrize("args, error, message", [
    ((np.arange(3), 0), ValueError, "num_partitions must be >= 1, got 0"),
    ((np.arange(3), -1), ValueError, "num_partitions"),
    ((np.arange(3), 2.0), TypeError, "num_partitions must be an int"),
    ((np.arange(3), True), TypeError, "num_partitions must be an int"),
    ((np.arange(3), 4, 0), ValueError, "max_parallelism must be >= 4, got 0"),
    ((np.arange(3), 4, 2), ValueError, "max_parallelism must be >= 4, got 2"),
    ((np.arange(3), 4, 40000), ValueError, "max_parallelism must be <= 32768, got 40000"),
    ((np.arange(3), 40000), ValueError, "num_partitions must be <= 32768, got 40000"),
    ((np.zeros((2, 2)), 2), ValueError, "one-dimensional"),
    (("abc", 2), TypeError, "keys must be"),
    ((7, 2), TypeError, "keys must be"),
    ((np.array(["2020-01-01"], dtype="datetime64[D]"), 2), TypeError, "datetime64"),
    (([object()], 2), TypeError, "cannot hash a key of type object"),
])
def test_key_partitions_refuses_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        key_partitions(*args)


def test_key_partitions_needs_no_pyarrow_for_numpy_and_sequences():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pyarrow'] = None\n"   # import pyarrow fails
        "import numpy as np\n"
        "from flinkbuf.spark import key_partitions\n"
        "from flinkbuf.io import assign_key_to_operator as a\n"
        "keys = ['x', 'y', 'z']\n"
        "assert key_partitions(keys, 3).tolist() == [a(k, 3) for k in keys]\n"
        "assert key_partitions(np.arange(5), 2).tolist() == [a(k, 2) for k in range(5)]\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


@given(st.integers(1, 5000), st.integers(1, 64), st.integers(0, 64))
def test_the_default_segment_size_is_the_largest_within_the_task_budget(n, per_channel,
                                                                         floating):
    """A power of two from 32 KiB to 256 KiB: the largest whose task
    buffers fit 8 MiB, or 32 KiB when none does; never larger for more
    tasks."""
    from flinkbuf.io import partition_buffers, task_segments
    from flinkbuf.spark.arrow import default_segment_size

    size = default_segment_size(n, per_channel, floating)
    assert size in (32 << 10, 64 << 10, 128 << 10, 256 << 10)
    segments = task_segments([partition_buffers(n, per_channel)], [n - 1],
                             exclusive_buffers_per_channel=per_channel,
                             floating_buffers_per_gate=floating)
    assert size == 32 << 10 or size * segments <= 8 << 20
    assert size == 256 << 10 or 2 * size * segments > 8 << 20
    assert default_segment_size(n + 1, per_channel, floating) <= size


@pytest.mark.parametrize("args, error", [
    ((0,), ValueError), ((-1,), ValueError), ((2.0,), TypeError), (("2",), TypeError),
    ((2, 0), ValueError), ((2, 2, -1), ValueError), ((True,), TypeError)])
def test_the_default_segment_size_refuses_bad_arguments(args, error):
    from flinkbuf.spark.arrow import default_segment_size

    with pytest.raises(error):
        default_segment_size(*args)


def test_the_arrow_codec_is_arrow_exchange_s():
    """pipelined_exchange's records are not column batches: its options
    refuse the arrow codec, which arrow_exchange takes with a column key."""
    from flinkbuf.spark._spec import check_options

    common = dict(num_partitions=None, selector="hash", segment_size=32768,
                  buffers_per_channel=2, floating_buffers=8, buffer_timeout=0.1,
                  max_record_size=1 << 20, max_parallelism=None, host=None, timeout=10.0,
                  monitor=None)
    with pytest.raises(ValueError, match="use arrow_exchange"):
        check_options(2, None, key=None, codec="arrow", **common)
    options = check_options(2, None, key="k", codec="arrow", produce=print, **common)
    assert (options.key, options.codec) == ("k", "arrow")
    with pytest.raises(TypeError, match="key must be a column name"):
        check_options(2, None, key=0, codec="arrow", produce=print, **common)


_SPARK_TYPES = ["ByteType()", "ShortType()", "IntegerType()", "LongType()", "FloatType()",
                "DoubleType()", "BooleanType()", "StringType()", "BinaryType()", "NullType()",
                "DecimalType(10, 2)", "DateType()", "TimestampType()",
                "ArrayType(IntegerType())", "MapType(StringType(), LongType())",
                "StructType([StructField('x', LongType())])", "DayTimeIntervalType()"]


@pytest.mark.parametrize("spark_type", _SPARK_TYPES)
def test_a_spark_key_column_is_refused_up_front_exactly_when_a_task_would_refuse_it(spark_type):
    """arrow_exchange checks a DataFrame's key column before the job by
    the rule BatchWriter applies to the task's Arrow batches: one rule."""
    import types

    import pyspark.sql.types as T
    from pyspark.sql.pandas.types import to_arrow_type

    from flinkbuf.io.batch_keys import check_key_type
    from flinkbuf.spark.arrow import _check_key_column

    data_type = eval(spark_type, vars(T))      # noqa: S307 - the names above
    df = types.SimpleNamespace(columns=["k"], schema=T.StructType([T.StructField("k", data_type)]))
    column = pa.nulls(3, to_arrow_type(data_type, timezone="UTC"))
    task_refuses = up_front_refuses = None
    try:
        check_key_type("k", column)
    except TypeError as exc:
        task_refuses = str(exc)
    try:
        _check_key_column(df, "k")
    except TypeError as exc:
        up_front_refuses = str(exc)
    assert (task_refuses is None) == (up_front_refuses is None), (task_refuses, up_front_refuses)
    if up_front_refuses:
        assert up_front_refuses.startswith(
            f"cannot hash key column 'k' of type {data_type.simpleString()} as Java would")
    assert (up_front_refuses is None) == (spark_type.split("(")[0] in {
        "ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType",
        "BooleanType", "StringType", "BinaryType", "NullType"})
