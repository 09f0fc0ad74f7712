"""flinkbuf.spark.key_partitions: the vectorized key hash that routes the
rows of arrow_exchange agrees with the hash selector, key by key; and
arrow_exchange's producer sends each row once, to its key's consumer, in
order (no Spark needed; arrow_exchange itself is tested in test_spark.py)."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flinkbuf.io import assign_key_to_operator, default_max_parallelism
from flinkbuf.serialization import decode, encode
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


_KEYS = st.one_of(st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=3),
                  st.binary(max_size=3), st.none(),
                  st.tuples(st.integers(-5, 5), st.text(max_size=2)))


def _expected(keys, n, mp=None):
    mp = default_max_parallelism(n) if mp is None else mp
    return [0 if k is None else assign_key_to_operator(k, n, mp) for k in keys]


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


class _Collect:
    """A writer that keeps what the producer emits, each record encoded
    and decoded as it travels (the typed codec), at the moment it is
    emitted."""

    def __init__(self, num_channels):
        self.num_channels = num_channels
        self.records = []

    def emit(self, record):
        self.records.append((record[0], decode(encode(record[1:]))))


class _Gate:
    """What the consumer reads: the records a _Collect kept, by channel."""

    def __init__(self, records):
        self._records = iter(records)

    def next_with_channel(self):
        return next(self._records)


class _Task:
    def __init__(self, records):
        self.gate = _Gate(records)
        self.started = 0.0
        self.first_record_seconds = None


def _exchange(batches, n, key="k"):
    """What each of ``n`` consumers reads when one producer routes
    ``batches`` by ``key``: {consumer: [RecordBatch]}, and the kinds of
    the records that carried them."""
    from flinkbuf.spark.arrow import _SCHEMA, _batches, _route

    writer = _Collect(n)
    _route(key, default_max_parallelism(n))(writer, iter(batches))
    got, kinds, schemas = {j: [] for j in range(n)}, set(), set()
    for j, (kind, _payload) in writer.records:
        if kind == _SCHEMA:
            assert j not in schemas and not got[j]        # once per channel, first
            schemas.add(j)
        else:
            assert j in schemas
            kinds.add(kind)
    for j in range(n):
        records = [(c, (c,) + rest) for c, rest in writer.records if c == j]
        got[j] = list(_batches(_Task(records)))
        assert all(b.num_rows > 0 and b.schema == batches[0].schema for b in got[j])
    return got, kinds


@settings(deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), max_size=80),
                max_size=4),
       st.integers(1, 9), st.booleans())
def test_the_producer_sends_each_row_once_to_its_keys_consumer_in_order(batches, n, nulls):
    """Each row reaches its key's consumer once, in input order: batches
    with nulls travel as IPC messages, the others as their columns'
    values."""
    from flinkbuf.spark.arrow import _BATCH, _VALUES

    if not nulls:
        batches = [[0 if k is None else k for k in b] for b in batches]
    batches = [pa.RecordBatch.from_pydict({"k": pa.array(b, pa.int64()),
                                           "row": pa.array(range(len(b)), pa.int64()),
                                           "batch": pa.array([i] * len(b), pa.int64())})
               for i, b in enumerate(batches)]
    got, kinds = _exchange(batches, n)
    has_nulls = [b.column("k").null_count > 0 for b in batches if b.num_rows]
    assert kinds == ({_BATCH} if any(has_nulls) else set()) | \
        ({_VALUES} if not all(has_nulls) else set())
    for j in range(n):
        pieces = [zip(p.column("batch").to_pylist(), p.column("row").to_pylist(),
                      p.column("k").to_pylist()) for p in got[j]]
        want = [(b, r, k) for b, batch in enumerate(batches)
                for r, k in enumerate(batch.column("k").to_pylist())
                if key_partitions([k], n).tolist() == [j]]
        assert [row for p in pieces for row in p] == want    # its rows, once, in order


_TYPES = [pa.int8(), pa.uint16(), pa.int32(), pa.int64(), pa.uint64(), pa.float32(),
          pa.float64(), pa.date32(), pa.date64(), pa.timestamp("us"),
          pa.timestamp("ns", tz="UTC"), pa.time32("ms"), pa.time64("ns"), pa.duration("s"),
          pa.binary(8), pa.binary(2), pa.float16(), pa.bool_(), pa.string(), pa.decimal128(10, 2),
          pa.list_(pa.int32())]


def _column(t, rows, rng):
    """``rows`` values of Arrow type ``t``, drawn from ``rng``."""
    raw = rng.integers(-2**62, 2**62, rows)
    if pa.types.is_fixed_size_binary(t):
        return pa.array([int(v).to_bytes(8, "little", signed=True)[:t.byte_width] for v in raw], t)
    if pa.types.is_boolean(t):
        return pa.array(raw % 2 == 0)
    if pa.types.is_string(t):
        return pa.array([str(v % 1000) for v in raw], pa.string())
    if pa.types.is_decimal(t):
        import decimal
        return pa.array([decimal.Decimal(int(v % 10**8)) / 100 for v in raw], t)
    if pa.types.is_list(t):
        return pa.array([[int(v % 7)] * int(v % 3) for v in raw], t)
    if pa.types.is_floating(t):
        return pa.array(raw.astype(np.float64) / 7, pa.float64()).cast(t) \
            if t != pa.float16() else pa.array((raw % 1000).astype(np.float16), t)
    width = t.bit_width
    bits = np.dtype(f"i{width // 8}")
    return pa.array(raw.astype(bits), pa.from_numpy_dtype(bits)).view(t) \
        if not pa.types.is_integer(t) else pa.array(raw.astype(t.to_pandas_dtype()), t)


@settings(deadline=None, max_examples=60)
@example(types=[pa.string()], n=1, sizes=[1, 0], seed=0, offset=0)   # an empty batch
@given(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=4), st.integers(1, 4),
       st.lists(st.integers(0, 300), min_size=1, max_size=3), st.integers(0, 2**32 - 1),
       st.integers(0, 20))
def test_batches_of_any_column_types_arrive_whole_and_equal(types, n, sizes, seed, offset):
    """Columns of every fixed width (and of other types, which travel as
    IPC messages), sliced batches (a column offset) included: each
    consumer gets exactly the rows of its keys, values and types equal."""
    rng = np.random.default_rng(seed)
    batches = []
    for rows in sizes:
        cols = {"k": pa.array(rng.integers(0, 50, rows + offset))}
        cols.update({f"c{i}": _column(t, rows + offset, rng) for i, t in enumerate(types)})
        batches.append(pa.RecordBatch.from_pydict(cols).slice(offset))
    from flinkbuf.spark.arrow import _BATCH, _VALUES, _value_type

    got, kinds = _exchange(batches, n)
    if sum(sizes):
        plain = all(_value_type(t) is not None for t in types)
        assert kinds == {_VALUES if plain else _BATCH}
        assert plain == all(pa.types.is_integer(t) or pa.types.is_floating(t)
                            or pa.types.is_temporal(t) or pa.types.is_fixed_size_binary(t)
                            for t in types)
    whole = pa.Table.from_batches(batches)
    keys = whole.column("k").to_numpy()
    for j in range(n):
        want = whole.filter(pa.array(key_partitions(keys, n) == j))
        have = pa.Table.from_batches(got[j], schema=whole.schema)
        assert have.equals(want)


def test_a_malformed_piece_of_values_is_a_clear_error():
    from flinkbuf.errors import CorruptRecordError
    from flinkbuf.spark.arrow import _from_values, _value_type

    def from_values(arrays, schema):
        return _from_values(arrays, schema, [_value_type(f.type) for f in schema])

    schema = pa.schema([("k", pa.int64()), ("t", pa.timestamp("us"))])
    good = np.arange(3, dtype=np.uint64)
    assert from_values((good, good), schema).num_rows == 3
    for bad in [(good,), (), [good, good], (good, good[:2]), (good, good.astype(np.uint32)),
                (good, good.reshape(3, 1)), (good, b"x" * 24), ("x", good),
                (good, good, good)]:
        with pytest.raises(CorruptRecordError, match="malformed piece of an Arrow batch"):
            from_values(bad, schema)
    with pytest.raises(CorruptRecordError):
        from_values((good,), pa.schema([("s", pa.string())]))


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


def test_malformed_records_reach_the_reader_as_clear_errors():
    """Whatever a channel delivers, the reader raises CorruptRecordError
    naming the channel, never another exception, a crash or a wrong batch."""
    from flinkbuf.errors import CorruptRecordError
    from flinkbuf.spark.arrow import _BATCH, _SCHEMA, _VALUES, _batches

    schema = pa.schema([("k", pa.int64())])
    schema_record = (0, _SCHEMA, schema.serialize().to_pybytes())
    values = np.arange(4, dtype=np.uint64)
    cases = [
        ([(1, (1, _VALUES, (values,)))], "before its schema"),
        ([(1, (1, _BATCH, b"x"))], "before its schema"),
        ([(0, (0, _SCHEMA))], "malformed record"),
        ([(0, [0, _SCHEMA, b""])], "malformed record"),
        ([(0, "text")], "malformed record"),
        ([(0, (0, 7, b""))], "malformed record"),
        ([(0, (0, _SCHEMA, b"not a schema"))], "malformed Arrow IPC message from channel 0"),
        ([(0, (0, _SCHEMA, 12))], "malformed Arrow IPC"),
        ([(0, schema_record), (0, (0, _BATCH, b"\xff" * 64))], "malformed Arrow IPC"),
        ([(0, schema_record), (0, (0, _VALUES, (values[:2], values)))], "malformed piece"),
        ([(0, schema_record), (0, (0, _VALUES, (values.astype(np.int8),)))], "malformed piece"),
    ]
    for records, message in cases:
        with pytest.raises(CorruptRecordError, match=message):
            list(_batches(_Task(records)))
    got = list(_batches(_Task([(0, schema_record), (0, (0, _VALUES, (values,)))])))
    assert got[0].column(0).to_pylist() == [0, 1, 2, 3]


@settings(deadline=None, max_examples=200)
@given(st.sampled_from([0, 1, 2, 3, -1]),
       st.one_of(st.binary(max_size=300),
                 st.lists(st.tuples(st.sampled_from(["u1", "u2", "u4", "u8", "i8", "f8"]),
                                    st.integers(0, 20)), max_size=3)),
       st.booleans())
def test_any_record_is_read_or_refused_clearly(kind, payload, schema_first):
    """Random payloads of every kind: a batch or a CorruptRecordError."""
    from flinkbuf.errors import CorruptRecordError
    from flinkbuf.spark.arrow import _SCHEMA, _batches

    if isinstance(payload, list):
        payload = tuple(np.zeros(n, dtype=d) for d, n in payload)
    schema = pa.schema([("k", pa.int64()), ("t", pa.timestamp("ms"))])
    records = [(0, (0, _SCHEMA, schema.serialize().to_pybytes()))] if schema_first else []
    records.append((0, (0, kind, payload)))
    try:
        for batch in _batches(_Task(records)):
            assert batch.schema == schema
            batch.validate(full=True)
    except CorruptRecordError:
        pass
