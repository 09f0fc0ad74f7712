"""Records through 32 KiB buffers and back, per record, against pickle,
msgpack, struct and memcpy (conventions: bench/run.py).

Every row serializes and deserializes the same batch of records one at a
time and drops each record once read (a consumer that processes records).
flinkbuf rows:
  * ``flinkbuf_api``: the Python API, as a user writes the loop
    (serialize_record, copy_to_buffer, feed, records()); the subject;
  * ``flinkbuf_cdef``: the cdef contract that flinkbuf.io's RecordWriter and
    InputGate call (no Python call per record).
"""

import os
import pickle
import struct

import msgpack
import numpy as np
import pytest

import flinkbuf as fb
from flinkbuf._testing import c_round_trip as _c_round_trip

SMOKE = os.environ.get("FLINKBUF_BENCH_SMOKE") == "1"
SEGMENT = 32 * 1024


def n(full, smoke):
    return smoke if SMOKE else full


CASES = {
    "int_int": [(i, i * 7) for i in range(n(10_000, 500))],
    "str20_float": [(f"record-{i:013d}", i * 0.5) for i in range(n(10_000, 500))],
    "bytes_100B": [bytes([i % 256]) * 100 for i in range(n(10_000, 500))],
    "bytes_1KiB": [bytes([i % 256]) * 1024 for i in range(n(10_000, 200))],
    "bytes_64KiB": [bytes([i % 256]) * 65536 for i in range(n(200, 4))],
    "ndarray_1M_f8": [np.random.default_rng(1).random(n(1 << 20, 1 << 14))],
}
PAYLOAD = {
    "bytes_1KiB": 1024, "bytes_64KiB": 65536,
    "ndarray_1M_f8": CASES["ndarray_1M_f8"][0].nbytes,
}
TARGETS = {
    "int_int": ">= 2x msgpack, >= 3x pickle",
    "bytes_1KiB": ">= 50% of memcpy MB/s",
    "bytes_64KiB": ">= 50% of memcpy MB/s",
    "ndarray_1M_f8": ">= 50% of memcpy MB/s",
}
STRUCTS = {
    "int_int": (struct.Struct("<qq"), lambda r: r, lambda t: t),
    "str20_float": (struct.Struct("<20sd"), lambda r: (r[0].encode(), r[1]),
                    lambda t: (t[0].decode(), t[1])),
    "bytes_100B": (struct.Struct("<100s"), lambda r: (r,), lambda t: t[0]),
}


@pytest.fixture(scope="module")
def pool():
    nbp = fb.NetworkBufferPool(8, SEGMENT)
    yield nbp.create_buffer_pool(2, 8)
    nbp.destroy()


def info(benchmark, case, records, subject=False):
    benchmark.group = f"serialization round trip: {case}"
    benchmark.extra_info["ops"] = len(records)
    if case in PAYLOAD:
        benchmark.extra_info["bytes"] = PAYLOAD[case]
    if subject:
        benchmark.extra_info["subject"] = True
        if case in TARGETS:
            benchmark.extra_info["target"] = TARGETS[case]


def same_records(out, records):
    if isinstance(records[0], np.ndarray):
        return len(out) == len(records) and all(np.array_equal(a, b) for a, b in zip(out, records))
    return out == records


def api_round_trip(pool, records, out=None):
    ser = fb.RecordSerializer()
    des = fb.RecordDeserializer()
    serialize, copy, feed, read = ser.serialize_record, ser.copy_to_buffer, des.feed, des.records
    buf = pool.request_buffer()
    for r in records:
        serialize(r)
        res = copy(buf)
        while res.is_full_buffer:
            feed(buf)
            if out is None:
                for rec in read():
                    pass
            else:
                out.extend(read())
            buf = pool.request_buffer()
            if res.is_full_record:
                break
            res = copy(buf)
    feed(buf)
    if out is None:
        for rec in read():
            pass
    else:
        out.extend(read())
    des.finish()


@pytest.mark.parametrize("case", list(CASES))
def test_flinkbuf_api(benchmark, pool, case):
    records = CASES[case]
    out = []
    api_round_trip(pool, records, out)
    assert same_records(out, records)
    info(benchmark, case, records, subject=True)
    benchmark(api_round_trip, pool, records)


@pytest.mark.parametrize("case", list(CASES))
def test_flinkbuf_cdef(benchmark, pool, case):
    records = CASES[case]
    ser, des = fb.RecordSerializer(), fb.RecordDeserializer()
    assert same_records(_c_round_trip(ser, des, pool, records), records)
    info(benchmark, case, records)
    benchmark(_c_round_trip, ser, des, pool, records, False)


def msgpack_round_trip(records, out=None):
    pack = msgpack.Packer(use_bin_type=True).pack
    unpacker = msgpack.Unpacker(use_list=False, raw=False, max_buffer_size=1 << 30)
    chunk = bytearray()
    for r in records:
        chunk += pack(r)
        if len(chunk) >= SEGMENT:
            unpacker.feed(chunk)
            chunk = bytearray()
            if out is None:
                for rec in unpacker:
                    pass
            else:
                out.extend(unpacker)
    unpacker.feed(chunk)
    if out is None:
        for rec in unpacker:
            pass
    else:
        out.extend(unpacker)


def msgpack_array_round_trip(records, out=None):
    # msgpack has no array type: a (dtype, shape) header, then the raw bytes
    # as a second object (packing them inside the tuple is ~10x slower)
    packb, unpackb = msgpack.packb, msgpack.unpackb
    for a in records:
        dt, shape = unpackb(packb((a.dtype.str, a.shape)))
        data = unpackb(packb(memoryview(a).cast("B")))
        rec = np.frombuffer(data, dtype=dt).reshape(shape)
        if out is not None:
            out.append(rec)


@pytest.mark.parametrize("case", list(CASES))
def test_msgpack(benchmark, case):
    records = CASES[case]
    fn = msgpack_array_round_trip if case.startswith("ndarray") else msgpack_round_trip
    out = []
    fn(records, out)
    assert same_records(out, records)
    info(benchmark, case, records)
    benchmark(fn, records)


def pickle_round_trip(records, out=None):
    dumps, loads = pickle.dumps, pickle.loads
    if out is None:
        for r in records:
            loads(dumps(r, 5))
    else:
        out.extend(loads(dumps(r, 5)) for r in records)


@pytest.mark.parametrize("case", list(CASES))
def test_pickle(benchmark, case):
    records = CASES[case]
    out = []
    pickle_round_trip(records, out)
    assert same_records(out, records)
    info(benchmark, case, records)
    benchmark(pickle_round_trip, records)


def struct_round_trip(st, to_fields, from_fields, records, out=None):
    chunk = bytearray(SEGMENT)
    size = st.size
    per_chunk = SEGMENT // size
    pack_into, unpack_from = st.pack_into, st.unpack_from
    for start in range(0, len(records), per_chunk):
        batch = records[start:start + per_chunk]
        off = 0
        for r in batch:
            pack_into(chunk, off, *to_fields(r))
            off += size
        for off in range(0, len(batch) * size, size):
            rec = from_fields(unpack_from(chunk, off))
            if out is not None:
                out.append(rec)


@pytest.mark.parametrize("case", list(STRUCTS))
def test_struct(benchmark, case):
    records = CASES[case]
    st, to_fields, from_fields = STRUCTS[case]
    out = []
    struct_round_trip(st, to_fields, from_fields, records, out)
    assert out == records
    info(benchmark, case, records)
    benchmark(struct_round_trip, st, to_fields, from_fields, records)


@pytest.mark.parametrize("case", list(PAYLOAD))
def test_memcpy_numpy_copy(benchmark, case):
    """The bandwidth reference: one numpy copy of the batch's bytes into
    preallocated memory (no per-record work at all)."""
    records = CASES[case]
    total = sum(memoryview(r).nbytes for r in records)
    src = np.empty(total, dtype=np.uint8)
    off = 0
    for r in records:
        b = memoryview(r).cast("B")
        src[off:off + len(b)] = b
        off += len(b)
    dst = np.empty_like(src)
    info(benchmark, case, records)
    benchmark(np.copyto, dst, src)


@pytest.mark.parametrize("case", [c for c in PAYLOAD if c.startswith("bytes")])
def test_memcpy_join(benchmark, case):
    """A second reference: b"".join copies each record once, from the
    records themselves, in a C loop."""
    records = CASES[case]
    info(benchmark, case, records)
    benchmark(b"".join, records)
