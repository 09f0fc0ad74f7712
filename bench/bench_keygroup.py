"""The partition of every key of a batch, Flink's key groups: flinkbuf's C
function (flinkbuf.io.assign_keys_to_operators, what arrow_exchange and
key_partitions use) against the numpy version it replaced, kept here as the
peer, in the same run (conventions: bench/run.py).  ops = keys."""

import numpy as np
import pytest

from flinkbuf.io import assign_key_to_operator, assign_keys_to_operators
from conftest import scale

N = scale(1 << 20, 1 << 12)          # keys per call
PARALLELISM, MAX_PARALLELISM = 8, 128
_INT32_MIN = np.iinfo(np.int32).min


# ---- the peer: the numpy key-group hash arrow_exchange used before --------

def numpy_murmur(codes):
    """Flink's MathUtils.murmurHash over a uint32 array of int32 hash codes
    (hashed in place), as non-negative values in the uint32 array."""
    h = codes
    with np.errstate(over="ignore"):
        h *= np.uint32(0xCC9E2D51)
        h[:] = (h << np.uint32(15)) | (h >> np.uint32(17))
        h *= np.uint32(0x1B873593)
        h[:] = (h << np.uint32(13)) | (h >> np.uint32(19))
        h *= np.uint32(5)
        h += np.uint32(0xE6546B64)
        h ^= np.uint32(4)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    signed = h.view(np.int32)
    minimum = signed == _INT32_MIN        # Flink: murmurHash(MIN_VALUE) is 0
    np.abs(signed, out=signed)
    signed[minimum] = 0
    return h


def numpy_java_int_codes(values, lo, hi):
    """Java's hashCode() of int64 keys as a new uint32 array: Integer in
    the int32 range, Long beyond."""
    if lo >= -2**31 and hi < 2**31:
        return values.astype(np.uint32)
    u = values.view(np.uint64)
    folded = (u ^ (u >> np.uint64(32))).astype(np.uint32)
    small = (values >= -2**31) & (values < 2**31)
    return np.where(small, values.astype(np.uint32), folded)


def numpy_partitions(values, num_partitions, max_parallelism):
    """The partition (int8) of each int64 key: every key hashed, or, when
    the keys span fewer values than half their number, each value of
    their range once and the keys looked up."""
    groups = np.arange(max_parallelism, dtype=np.int64)
    table = (groups * num_partitions // max_parallelism).astype(np.int8)
    lo, hi = int(values.min()), int(values.max())

    def hashed(codes):
        return table[numpy_murmur(codes) % np.uint32(max_parallelism)]

    if hi - lo < len(values) // 2:
        span = np.arange(hi - lo + 1, dtype=np.int64) + np.int64(lo)
        return hashed(numpy_java_int_codes(span, lo, hi))[values - np.int64(lo)]
    return hashed(numpy_java_int_codes(values, lo, hi))


def c_partitions(values, num_partitions, max_parallelism):
    out = np.empty(len(values), dtype=np.int8)
    assign_keys_to_operators(values, out, num_partitions, max_parallelism)
    return out


KEYS = {
    # ids over the whole int64 range: Integer and Long hash codes
    "int64_spread": np.random.default_rng(1).integers(-2**63, 2**63 - 1, N, dtype=np.int64),
    # a few thousand distinct keys in a batch: both hash each value of their range once
    "int64_narrow": np.random.default_rng(2).integers(0, 4096, N, dtype=np.int64),
}
IMPLS = {"flinkbuf_c": c_partitions, "numpy": numpy_partitions}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("case", sorted(KEYS))
def test_key_partitions(benchmark, case, impl):
    keys = KEYS[case]
    benchmark.group = f"key partitions of {N} {case} keys among {PARALLELISM}"
    benchmark.extra_info.update(ops=len(keys), subject=impl == "flinkbuf_c", bytes=8)
    fn = IMPLS[impl]
    got = benchmark.pedantic(fn, args=(keys, PARALLELISM, MAX_PARALLELISM),
                             rounds=scale(15, 1), iterations=1, warmup_rounds=1)
    # both agree with the scalar assignment
    sample = keys[:: max(1, len(keys) // 500)]
    picked = got[:: max(1, len(keys) // 500)]
    assert picked.tolist() == [assign_key_to_operator(int(k), PARALLELISM, MAX_PARALLELISM)
                               for k in sample]


# ---- a batch's rows grouped by consumer (arrow_exchange's producer) --------

BATCH_ROWS = scale(65536, 4096)      # Spark's arrow.maxRecordsPerBatch in bench_spark
CONSUMERS = 2
_ROWS = np.arange(BATCH_ROWS, dtype=np.int64)
_CHANNELS = c_partitions(_ROWS % 1000, CONSUMERS, MAX_PARALLELISM)


def c_pieces(batch, channels, n):
    """BatchWriter's own cut (arrow_exchange's): order_by_channel, then
    Arrow's take without a bounds check."""
    from flinkbuf.io.batch_writer import _Cut

    return [piece for _, piece in _Cut().batch(batch, channels, n)]


def numpy_pieces(batch, channels, n):
    """What arrow_exchange did before: numpy's stable argsort (a radix sort
    of small ints) and bincount, and RecordBatch.take."""
    counts = np.bincount(channels, minlength=n)
    order = np.argsort(channels, kind="stable")
    bounds = np.cumsum(counts).tolist()
    return [batch.take(order[b - c:b]) for b, c in zip(bounds, counts.tolist())]


PIECES = {"flinkbuf_c": c_pieces, "numpy_argsort": numpy_pieces}


@pytest.mark.parametrize("impl", sorted(PIECES))
def test_batch_pieces_by_consumer(benchmark, impl):
    import pyarrow as pa
    batch = pa.RecordBatch.from_arrays([pa.array(_ROWS % 1000), pa.array(_ROWS)],
                                       names=["k", "v"])
    benchmark.group = (f"a batch of {BATCH_ROWS} rows (two int64 columns) cut into one "
                       f"piece per consumer, {CONSUMERS} consumers")
    benchmark.extra_info.update(ops=BATCH_ROWS, subject=impl == "flinkbuf_c", bytes=16)
    pieces = benchmark.pedantic(PIECES[impl], args=(batch, _CHANNELS, CONSUMERS),
                                rounds=scale(30, 2), iterations=1, warmup_rounds=1)
    # each consumer's rows, each once, in input order
    for j, piece in enumerate(pieces):
        assert piece.column("v").to_pylist() == _ROWS[_CHANNELS == j].tolist()
