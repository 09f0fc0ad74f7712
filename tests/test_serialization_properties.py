"""Hypothesis properties: arbitrary values x buffer sizes 1..65536 x arbitrary
re-chunking of the stream (splits inside the 4-byte prefix included), and
broadcast via reset()."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf._testing import stage as _stage, stage_general as _stage_general
from flinkbuf.serialization import decode, encode
from test_serialization_support import (
    feed_as_buffers, read_stream, rechunk, same, values, write_stream,
)

buffer_sizes = st.one_of(st.integers(1, 16), st.integers(17, 4096), st.integers(4097, 65536))
record_lists = st.lists(values, min_size=1, max_size=6)


@given(values)
def test_codec_round_trip(value):
    assert same(value, decode(encode(value)))


@given(record_lists, buffer_sizes)
def test_round_trip_through_buffers(records, size):
    chunks = write_stream(records, size)
    assert all(len(c) == size for c in chunks[:-1])
    assert same(read_stream(chunks), records)


@given(record_lists, buffer_sizes, st.lists(st.integers(0, 1 << 16), max_size=40), st.booleans())
def test_any_rechunking_of_the_stream(records, size, cuts, as_buffers):
    stream = b"".join(write_stream(records, size))
    pieces = rechunk(stream, cuts)
    if as_buffers:
        out = feed_as_buffers(fb.RecordDeserializer(), pieces)
    else:
        out = read_stream(pieces)
    assert same(out, records)


@given(st.lists(st.integers() | st.text(max_size=3) | st.binary(max_size=3), min_size=1,
                max_size=4), st.data())
def test_every_split_inside_small_records(records, data):
    """Two- and three-way splits at every position, so every split inside
    every length prefix is exercised."""
    stream = b"".join(write_stream(records, 64))
    for i in range(len(stream) + 1):
        assert read_stream([stream[:i], stream[i:]]) == records
    j = data.draw(st.integers(0, len(stream)))
    for i in range(j + 1):
        assert read_stream([stream[:i], stream[i:j], stream[j:]]) == records


@given(record_lists, buffer_sizes, st.integers(2, 4))
def test_broadcast_via_reset_yields_identical_streams(records, size, channels):
    reference = b"".join(write_stream(records, size))
    streams = [bytearray() for _ in range(channels)]
    ser = fb.RecordSerializer()
    with fb.NetworkBufferPool(channels, size) as nbp:
        pool = nbp.create_buffer_pool(channels, channels)
        bufs = [pool.request_buffer() for _ in range(channels)]
        for r in records:
            ser.serialize_record(r)
            for ch in range(channels):
                while True:
                    res = ser.copy_to_buffer(bufs[ch])
                    if res.is_full_buffer:
                        streams[ch] += bufs[ch].read()
                        bufs[ch].recycle()
                        bufs[ch] = pool.request_buffer()
                    if res.is_full_record:
                        break
                ser.reset()
        for ch in range(channels):
            streams[ch] += bufs[ch].read()
            bufs[ch].recycle()
    ser.clear()
    assert all(bytes(s) == reference for s in streams)
    assert same(read_stream([reference]), records)


@given(st.lists(st.binary(max_size=2000) | st.binary(min_size=5000, max_size=9000), max_size=5),
       buffer_sizes, st.sampled_from(["bytes", "pickle"]))
def test_other_codecs_round_trip(records, size, codec):
    assert read_stream(write_stream(records, size, codec), codec) == records


@settings(max_examples=10)
@given(st.integers(1, 4), st.sampled_from(["<f8", ">i4", "u1", "<c16"]), st.integers(1, 3))
def test_large_arrays_over_small_buffers(k, dtype, ndim):
    n = k * 50_000
    arr = (np.arange(n) % 251).astype(dtype)
    if ndim > 1:
        arr = arr.reshape((k, -1) if ndim == 2 else (k, 2, -1))
    out = read_stream(write_stream([arr, ("meta", arr)], 4096))
    assert same(out, [arr, ("meta", arr)])


# -- the fast paths of serialize_record -----------------------------------------

flat_scalars = (
    st.none() | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=300) | st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=300)
    | st.binary(max_size=300) | st.binary(min_size=240, max_size=1200)
)
flat_values = (flat_scalars | st.lists(flat_scalars, max_size=8)
               | st.lists(flat_scalars, max_size=8).map(tuple)
               | st.lists(st.booleans(), min_size=250, max_size=270))


@given(st.lists(flat_values | values, min_size=1, max_size=5))
def test_fast_paths_stage_exactly_what_the_general_encoder_stages(records):
    # one serializer reused, as a writer does: a fast record after a general
    # one (and the reverse) must not see the other's state
    ser = fb.RecordSerializer()
    for r in records:
        ser.serialize_record(r)
        assert _staged(ser) == _stage_general(r) == _stage(r)


@given(st.lists(st.binary(max_size=1100) | st.binary(min_size=250, max_size=600), max_size=12),
       buffer_sizes)
def test_bytes_codec_round_trip_over_every_size(records, size):
    # inline (< 512 bytes, also larger than the initial staging area) and
    # referenced (>= 512) records, both stages the general encoder's bytes
    for r in records:
        assert _stage(r, "bytes") == _stage_general(r, "bytes") == \
            len(r).to_bytes(4, "big") + r
    assert read_stream(write_stream(records, size, "bytes"), "bytes") == records


def _staged(ser):
    """The bytes ser.copy_to_buffer writes for its staged record."""
    with fb.NetworkBufferPool(1, 1 << 16) as nbp:
        buf = nbp.create_buffer_pool(1, 1).request_buffer()
        try:
            ser.reset()
            assert ser.copy_to_buffer(buf).is_full_record
            return bytes(memoryview(buf))
        finally:
            buf.recycle()
