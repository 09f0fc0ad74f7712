"""The keyed batch exchange (flinkbuf.io.BatchWriter and the arrow codec's
gates): every row of random batches (Arrow batches of every column type the
Spark exchange carries, with nulls, slices and empty batches; numpy column
mappings of every dtype, strided included) reaches the consumer that the
hash selector gives its key, exactly once and in input order, as a batch of
the kind written; over local channels and TCP and shared memory."""

import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flinkbuf import (
    BatchWriter,
    HashSelector,
    InputGate,
    NetworkBufferPool,
    RecordWriter,
)
from flinkbuf.io import create_partition, default_max_parallelism
from flinkbuf.network import NetworkEnvironment

SECRET = b"flinkbuf-batch-exchange-secret-0123"


def hash_selector_channels(keys, n, mp):
    """The channel a HashSelector gives each key: found by writing
    ``(index, key)`` records through a RecordWriter with one."""
    out = [None] * len(keys)
    with NetworkBufferPool(num_segments=n + 64, segment_size=32768) as nbp:
        part = create_partition(nbp, n, min_buffers=n + 64)
        gates = [InputGate([(part, j)]) for j in range(n)]
        with RecordWriter(part, HashSelector(1, max_parallelism=mp), buffer_timeout=None) as w:
            for i, k in enumerate(keys):
                w.emit((i, k))
        for j, gate in enumerate(gates):
            for i, _ in gate:
                out[i] = j
    return out


def read_all(gates, timeout=60.0):
    """Read every gate in a thread of its own: what each yielded."""
    got, errors = [[] for _ in gates], []

    def read(j):
        try:
            for batch in gates[j]:
                got[j].append(batch)
        except BaseException as exc:     # noqa: BLE001 - raised below
            errors.append(exc)
            gates[j].close()             # the writer fails instead of waiting for it

    threads = [threading.Thread(target=read, args=(j,), daemon=True) for j in range(len(gates))]
    for t in threads:
        t.start()
    return got, errors, threads


def join(threads, timeout=60.0):
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a reader did not finish"


def local_exchange(batches, n, *, key="k", selector=None, segment_size=4096, buffers=8,
                   max_parallelism=None, max_record_size=64 << 20):
    """What each of ``n`` consumers reads (a list of batches) when one
    BatchWriter writes ``batches`` over local channels."""
    with NetworkBufferPool(num_segments=n + buffers + 2, segment_size=segment_size) as nbp:
        part = create_partition(nbp, n, min_buffers=n + buffers)
        gates = [InputGate([(part, j)], codec="arrow", max_record_size=max_record_size)
                 for j in range(n)]
        got, errors, threads = read_all(gates)
        try:
            with BatchWriter(part, key, selector=selector,
                             max_parallelism=max_parallelism) as w:
                for batch in batches:
                    w.emit(batch)
        finally:
            join(threads)
            assert not errors, errors
        return got


# ---- Arrow batches -------------------------------------------------------------------

_KEY_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(),
              pa.uint64(), pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.binary(),
              pa.large_string()]
_VALUE_TYPES = [pa.int8(), pa.uint16(), pa.int32(), pa.int64(), pa.uint64(), pa.float32(),
                pa.float64(), pa.date32(), pa.date64(), pa.timestamp("us"),
                pa.timestamp("ns", tz="UTC"), pa.time64("ns"), pa.duration("s"), pa.binary(8),
                pa.float16(), pa.bool_(), pa.string(), pa.binary(), pa.decimal128(10, 2),
                pa.list_(pa.int32())]


def arrow_column(t, rows, rng, nulls):
    """``rows`` values of Arrow type ``t`` drawn from ``rng``, some null
    when ``nulls``."""
    raw = rng.integers(-2**62, 2**62, rows)
    mask = (rng.random(rows) < 0.2) if nulls else None
    if pa.types.is_fixed_size_binary(t):
        values = [int(v).to_bytes(8, "little", signed=True)[:t.byte_width] for v in raw]
    elif pa.types.is_boolean(t):
        values = (raw % 2 == 0).tolist()
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        values = [str(v % 50) for v in raw]
    elif pa.types.is_binary(t):
        values = [bytes([v % 7]) * int(v % 3) for v in raw]
    elif pa.types.is_decimal(t):
        import decimal
        values = [decimal.Decimal(int(v % 10**8)) / 100 for v in raw]
    elif pa.types.is_list(t):
        values = [[int(v % 7)] * int(v % 3) for v in raw]
    elif t == pa.float16():
        return pa.array((raw % 1000).astype(np.float16), t, mask=mask)
    elif pa.types.is_floating(t):
        return pa.array((raw % 97).astype(np.float64) / 7, pa.float64(), mask=mask).cast(t)
    elif pa.types.is_integer(t):
        return pa.array((raw % 50).astype(t.to_pandas_dtype()), t, mask=mask)
    else:
        bits = np.dtype(f"i{t.bit_width // 8}")
        within_a_day = np.abs(raw) % 86_400_000_000_000      # valid for every time unit
        if t == pa.date64():                                   # whole days
            column = pa.array((within_a_day % 30000).astype(np.int32)).view(pa.date32())
            column = column.cast(t)
        else:
            column = pa.array(within_a_day.astype(bits), pa.from_numpy_dtype(bits)).view(t)
        return column if mask is None else pa.compute.if_else(pa.array(mask), None, column)
    return pa.array([None if mask is not None and m else v
                     for v, m in zip(values, mask if mask is not None else [False] * rows)], t)


def arrow_batches(key_type, types, sizes, seed, offset, nulls):
    rng = np.random.default_rng(seed)
    batches = []
    for b, rows in enumerate(sizes):
        total = rows + offset
        cols = {"k": arrow_column(key_type, total, rng, nulls),
                "batch": pa.array(np.full(total, b)), "row": pa.array(np.arange(total))}
        cols.update({f"c{i}": arrow_column(t, total, rng, nulls and i % 2 == 0)
                     for i, t in enumerate(types)})
        batches.append(pa.RecordBatch.from_pydict(cols).slice(offset))
    return batches


def check_arrow(batches, got, n, mp):
    """Each consumer got exactly the rows of its keys, in input order, with
    their values and types, as non-empty batches of the input's schema."""
    whole = pa.Table.from_batches(batches)
    channels = np.array(hash_selector_channels(whole.column("k").to_pylist(), n, mp))
    for j in range(n):
        assert all(isinstance(b, pa.RecordBatch) and b.num_rows > 0
                   and b.schema == whole.schema for b in got[j])
        for b in got[j]:
            b.validate(full=True)
        want = whole.filter(pa.array(channels == j)) if len(whole) else whole
        have = pa.Table.from_batches(got[j], schema=whole.schema)
        assert have.equals(want), j


@settings(deadline=None, max_examples=40)
@example(key_type=pa.int64(), types=[pa.int64()], n=3, sizes=[0, 5, 0], seed=0, offset=0,
         nulls=False, segment_size=128)
@given(st.sampled_from(_KEY_TYPES), st.lists(st.sampled_from(_VALUE_TYPES), max_size=3),
       st.integers(1, 5), st.lists(st.integers(0, 300), min_size=1, max_size=3),
       st.integers(0, 2**32 - 1), st.integers(0, 20), st.booleans(),
       st.sampled_from([128, 4096, 65536]))
def test_arrow_rows_reach_their_keys_consumer_once_in_order(key_type, types, n, sizes, seed,
                                                            offset, nulls, segment_size):
    batches = arrow_batches(key_type, types, sizes, seed, offset, nulls)
    got = local_exchange(batches, n, segment_size=segment_size)
    check_arrow(batches, got, n, default_max_parallelism(n))


def test_max_parallelism_is_the_hash_selectors():
    batch = pa.record_batch({"k": np.arange(-300, 300), "v": np.arange(600) * 0.5})
    for n, mp in ((3, 3), (5, 7), (4, 32768)):
        check_arrow([batch], local_exchange([batch], n, max_parallelism=mp), n, mp)


# ---- numpy columns -------------------------------------------------------------------

_NUMPY_KEYS = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8", "?", "U3", "S3",
               "O"]
_NUMPY_VALUES = ["i1", "u2", "i4", "i8", "u8", "f4", "f8", "?", "U4", "S2", "M8[us]",
                 "m8[s]", "c16", ">i4", "O"]


def numpy_column(dtype, rows, rng):
    raw = rng.integers(-2**40, 2**40, rows)
    if dtype == "O":
        pool = [None, "a", "bc", b"x", b"", 3, -7, 2**40, 1.5, True]
        return np.array([pool[v % len(pool)] for v in raw] + [None], dtype=object)[:rows]
    kind = np.dtype(dtype).kind
    if kind in "US":
        return np.array([str(v % 30) for v in raw], dtype=dtype)
    if kind == "f":
        return (raw % 31).astype(dtype) / 3
    if kind == "c":
        return (raw % 31).astype(dtype) * (1 + 2j)
    if kind == "b":
        return raw % 2 == 0
    if kind in "mM":
        return raw.astype(np.dtype(dtype).newbyteorder("="))
    return (raw % 40).astype(dtype)


def numpy_batches(key_dtype, dtypes, sizes, seed, strided):
    rng = np.random.default_rng(seed)
    batches = []
    for b, rows in enumerate(sizes):
        step = 2 if strided else 1
        cols = {"k": numpy_column(key_dtype, rows * step, rng)[::step],
                "batch": np.full(rows, b), "row": np.arange(rows)}
        cols.update({f"c{i}": numpy_column(d, rows * step, rng)[::step]
                     for i, d in enumerate(dtypes)})
        batches.append(cols)
    return batches


def check_numpy(batches, got, n, mp):
    names = list(batches[0])
    whole = {name: np.concatenate([b[name] for b in batches]) for name in names}
    channels = np.array(hash_selector_channels(whole["k"].tolist(), n, mp))
    for j in range(n):
        assert all(type(b) is dict and list(b) == names and len(b["k"]) > 0 for b in got[j])
        for name in names:
            have = [b[name] for b in got[j]]
            # the dtype as written (concatenate may make a byte order native)
            assert all(a.dtype == batches[0][name].dtype and a.ndim == 1 for a in have)
            have = np.concatenate(have) if have else whole[name][:0]
            want = whole[name][channels == j]
            if want.dtype.kind == "O":
                assert [(type(x), x) for x in have.tolist()] == \
                    [(type(x), x) for x in want.tolist()], (j, name)
            else:
                np.testing.assert_array_equal(have, want, err_msg=f"{j} {name}")


@settings(deadline=None, max_examples=40)
@example(key_dtype="i1", dtypes=[">i4"], n=1, sizes=[1], seed=0, strided=False,
         segment_size=128)                               # a big-endian column, whole
@given(st.sampled_from(_NUMPY_KEYS), st.lists(st.sampled_from(_NUMPY_VALUES), max_size=3),
       st.integers(1, 5), st.lists(st.integers(0, 300), min_size=1, max_size=3),
       st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([128, 4096, 65536]))
def test_numpy_rows_reach_their_keys_consumer_once_in_order(key_dtype, dtypes, n, sizes, seed,
                                                            strided, segment_size):
    batches = numpy_batches(key_dtype, dtypes, sizes, seed, strided)
    got = local_exchange(batches, n, segment_size=segment_size)
    check_numpy(batches, got, n, default_max_parallelism(n))


def test_received_columns_are_views_of_the_record():
    """A piece that spans buffers is assembled once and its arrays view
    that memory (writable, kept alive by the arrays); a small piece is
    copied once out of its buffer."""
    big = {"k": np.zeros(50_000, dtype=np.int64), "v": np.arange(50_000.0)}
    small = {"k": np.zeros(3, dtype=np.int64), "v": np.arange(3.0)}
    (pieces,) = local_exchange([big, small], 1, segment_size=4096)
    for piece in pieces:
        k, v = piece["k"], piece["v"]
        owner = k.base
        while isinstance(owner, (np.ndarray, memoryview)):
            owner = owner.base if isinstance(owner, np.ndarray) else owner.obj
        assert type(owner) is bytearray
        assert v.base is k.base or np.shares_memory(v, v)
        assert k.flags.writeable
    np.testing.assert_array_equal(pieces[0]["v"], big["v"])


# ---- whole batches by the other selectors -----------------------------------------------

@pytest.mark.parametrize("selector, n, want", [
    ("round_robin", 3, None), ("rebalance", 2, None), ("broadcast", 3, "all"),
    ("forward", 1, "all"), ("rescale", 2, None)])
def test_other_selectors_route_whole_batches(selector, n, want):
    batches = [{"k": np.arange(i, i + 4)} for i in range(6)] + [{"k": np.arange(0)}]
    got = local_exchange(batches, n, key=None, selector=selector)
    rows = sorted(int(x) for pieces in got for b in pieces for x in b["k"])
    assert all(len(b["k"]) == 4 for pieces in got for b in pieces)   # whole, none empty
    if want == "all":
        for pieces in got:
            assert [b["k"].tolist() for b in pieces] == [b["k"].tolist() for b in batches[:6]]
    else:
        assert rows == sorted(int(x) for b in batches for x in b["k"])
        if selector in ("round_robin", "rebalance"):
            assert sorted(len(p) for p in got) == sorted([6 // n + (j < 6 % n) for j in range(n)])


def test_a_broadcast_of_arrow_batches_reaches_every_consumer():
    batch = pa.record_batch({"s": pa.array(["a", None, "c"]), "v": [1, 2, 3]})
    got = local_exchange([batch, batch.slice(1)], 3, key=None, selector="broadcast")
    for pieces in got:
        assert [p.to_pylist() for p in pieces] == [batch.to_pylist(), batch.slice(1).to_pylist()]


# ---- across processes' transports --------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("arrow", [True, False])
def test_remote_gates_rebuild_the_batches(transport, arrow):
    n = 3
    rng = np.random.default_rng(7)
    if arrow:
        batches = arrow_batches(pa.string(), [pa.int64(), pa.string(), pa.timestamp("us")],
                                [2000, 0, 700], 5, 3, True)
    else:
        batches = numpy_batches("i8", ["f8", "U4", "O"], [2000, 0, 700], 5, True)
    producer = NetworkEnvironment(64, 4096, secret=SECRET, transport=transport)
    consumer = NetworkEnvironment(64, 4096, secret=SECRET, transport=transport)
    try:
        part = create_partition(producer.network_buffer_pool, n, min_buffers=n + 8)
        producer.register_partition("p", part)
        gates = [consumer.create_input_gate([(producer.address, "p", j)], codec="arrow")
                 for j in range(n)]
        assert [s["transport"] for s in consumer.connection_stats()] == [transport]
        got, errors, threads = read_all(gates)
        with BatchWriter(part, "k") as writer:
            for batch in batches:
                writer.emit(batch)
        join(threads)
        assert not errors, errors
        (check_arrow if arrow else check_numpy)(batches, got, n, default_max_parallelism(n))
        assert rng is not None
    finally:
        consumer.close()
        producer.close()


def test_the_first_batch_goes_out_at_once_later_ones_fill_buffers():
    """Without an output flusher, the first batch with rows still reaches its
    consumer at once; a later small one waits in its buffer until flushed."""
    with NetworkBufferPool(num_segments=16, segment_size=32768) as nbp:
        part = create_partition(nbp, 1, min_buffers=8)
        gate = InputGate([(part, 0)], codec="arrow")
        got, arrived = [], threading.Semaphore(0)

        def read():
            for batch in gate:
                got.append(batch)
                arrived.release()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        w = BatchWriter(part, "k", buffer_timeout=None)
        w.emit({"k": np.arange(0, dtype=np.int64)})          # no rows: nothing flushed
        w.emit({"k": np.arange(10, dtype=np.int64)})
        assert arrived.acquire(timeout=10), "the first batch was held back"
        w.emit({"k": np.arange(10, 20, dtype=np.int64)})
        assert not arrived.acquire(timeout=0.3), "a later batch was flushed without a flush"
        w.flush()
        assert arrived.acquire(timeout=10), "flush() did not hand over the second batch"
        w.close()
        reader.join(10)
        assert not reader.is_alive()
        assert [b["k"].tolist() for b in got] == [list(range(10)), list(range(10, 20))]
