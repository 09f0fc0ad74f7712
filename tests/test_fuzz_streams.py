"""Mutation fuzzing of valid record streams: bit flips, truncations,
insertions, deletions, huge prefixes.  Whatever the bytes, the deserializer
returns records or raises CorruptRecordError (a ValueError): no crash, hang,
other exception or large allocation, and every fed Buffer is recycled."""

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.serialization import decode, encode
from test_serialization_support import rechunk, values, write_stream

HERE = os.path.dirname(os.path.abspath(__file__))

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 8)),
    st.tuples(st.just("prefix"), st.integers(0, 1 << 20),
              st.sampled_from([0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 64 << 20, (64 << 20) + 1,
                               1 << 24, 0])),
)


def mutate(data, mutations):
    b = bytearray(data)
    for kind, pos, arg in mutations:
        if not b and kind != "insert":
            continue
        pos = pos % (len(b) + (1 if kind == "insert" else 0))
        if kind == "flip":
            b[pos] ^= 1 << arg
        elif kind == "set":
            b[pos] = arg
        elif kind == "truncate":
            del b[pos:]
        elif kind == "insert":
            b[pos:pos] = arg
        elif kind == "delete":
            del b[pos:pos + arg]
        else:
            b[pos:pos + 4] = arg.to_bytes(4, "big")
    return bytes(b)


def consume(pieces, max_record_size=1 << 20):
    """Feed pieces as pooled Buffers; returns ('ok', records) or ('corrupt', msg)."""
    des = fb.RecordDeserializer(max_record_size=max_record_size)
    size = max(1, max((len(p) for p in pieces), default=1))
    with fb.NetworkBufferPool(len(pieces) + 1, size) as nbp:
        pool = nbp.create_buffer_pool(1, len(pieces) + 1)
        bufs = []
        try:
            for p in pieces:
                buf = pool.request_buffer()
                buf.write(p)
                bufs.append(buf)
                des.feed(buf)
            out = list(des.records())
            des.finish()
            result = ("ok", out)
        except fb.CorruptRecordError as e:
            assert "offset" in str(e)
            result = ("corrupt", str(e))
        assert all(b.is_recycled for b in bufs), "a fed buffer was not recycled"
    return result


@given(st.lists(values, min_size=1, max_size=4), st.lists(mutation, min_size=1, max_size=4),
       st.lists(st.integers(0, 1 << 16), max_size=6))
def test_mutated_streams_decode_or_raise_corrupt(records, mutations, cuts):
    stream = b"".join(write_stream(records, 4096))
    bad = mutate(stream, mutations)
    consume(rechunk(bad, cuts))


@given(st.lists(values, min_size=1, max_size=3), st.lists(mutation, min_size=1, max_size=3))
def test_mutated_payloads_decode_or_raise_corrupt(records, mutations):
    payload = mutate(encode(records), mutations)
    try:
        decode(payload)
    except fb.CorruptRecordError as e:
        assert "offset" in str(e)


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=5))
def test_random_bytes(data, cuts):
    consume(rechunk(data, cuts))


@pytest.mark.parametrize("prefix", [0x7FFFFFFF, 0xFFFFFFFF, (64 << 20) + 1])
def test_huge_prefix_allocates_nothing(prefix):
    tracemalloc.start()
    try:
        des = fb.RecordDeserializer()
        des.feed(prefix.to_bytes(4, "big") + b"\x0c\xff\xff\xff\x7f")
        with pytest.raises(fb.CorruptRecordError, match="exceeds max_record_size"):
            list(des.records())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_huge_counts_allocate_nothing():
    tracemalloc.start()
    try:
        for payload in [b"\x10\xff\xff\xff\x7f", b"\x0c\xff\xff\xff\x7f", b"\x0a\xff\xff\xff\x7f",
                        b"\x12\xff\xff\xff\x7f", b"\x07\xff\xff\xff\x7f"]:
            with pytest.raises(fb.CorruptRecordError):
                decode(payload + bytes(64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("name", ["deserializer", "wire", "frame_reader", "columns"])
def test_atheris_target_runs_a_few_inputs(name):
    """The coverage-guided targets under fuzz/ (CI runs each for >= 100,000
    inputs through fuzz/run.sh); here only a short smoke run."""
    pytest.importorskip("atheris")
    target = os.path.join(HERE, "..", "fuzz", f"fuzz_{name}.py")
    proc = subprocess.run([sys.executable, target, "-runs=300", "-seed=1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done 300 runs" in proc.stderr


@pytest.mark.parametrize("codec, payload_head", [
    ("typed", b"\x0c" + (60 << 20).to_bytes(4, "little")),   # one large bytes value
    ("typed", b"\x0f\x02\x00"),                                  # a list
    ("bytes", b"abc"),
])
def test_a_length_prefix_alone_allocates_little(codec, payload_head):
    """A record announced at 60 MiB (under max_record_size) whose bytes do
    not come costs a bounded amount of memory (16 MiB) until they do."""
    n = (60 << 20) + (5 if payload_head[:1] == b"\x0c" else 0)
    tracemalloc.start()
    try:
        des = fb.RecordDeserializer(codec)
        des.feed(n.to_bytes(4, "big") + payload_head)
        assert list(des.records()) == []
        assert des.has_partial_record
        _, peak = tracemalloc.get_traced_memory()
        des.close()
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20, peak


@pytest.mark.parametrize("codec", ["typed", "bytes"])
def test_growing_assembly_of_large_records(codec):
    """Records over 16 MiB are assembled in memory that grows as they arrive."""
    from test_serialization_support import read_stream
    big = bytes(range(256)) * (81 * 1024)                         # 20.25 MiB
    records = [big, b"tail"]
    if codec == "typed":
        records.insert(1, ("k", big, np.arange(3 << 20, dtype="<f8")))
    chunks = write_stream(records, 1 << 20, codec)
    from test_serialization_support import same
    assert same(records, read_stream(chunks, codec))
    # all at once: allocated in one go
    assert same(records, read_stream([b"".join(chunks)], codec))


REGRESSIONS = os.path.join(HERE, "..", "fuzz", "regressions", "deserializer")


@pytest.mark.parametrize("name", sorted(os.listdir(REGRESSIONS)))
def test_fuzz_regressions_decode_or_raise_corrupt(name):
    """The inputs under fuzz/regressions/deserializer, as fuzz/fuzz_deserializer.py reads
    them (a mode byte, then the bytes: one payload, and a stream fed in
    chunks), without atheris."""
    with open(os.path.join(REGRESSIONS, name), "rb") as f:
        data = f.read()
    mode, body = data[0], data[1:]
    try:
        decode(body)
    except fb.CorruptRecordError:
        pass
    step = 1 + (mode >> 2)
    assert consume([body[i:i + step] for i in range(0, len(body), step)])[0] in ("ok", "corrupt")
