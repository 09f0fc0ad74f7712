"""Shared helpers for the serialization tests (no tests here): value
strategies, exact equality, and writing/reading record streams."""

import math
import struct

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import flinkbuf as fb

# -- values -------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.integers(min_value=-128, max_value=255)
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.text(alphabet=st.characters(max_codepoint=0x7F), min_size=300, max_size=1200)
    | st.binary()
    | st.binary(min_size=500, max_size=3000)
)

hashables = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)

ARRAY_DTYPES = [
    "?", "i1", "<i2", ">i2", "<i4", "<i8", ">i8", "u1", "<u2", "<u4", "<u8",
    "<f2", "<f4", ">f4", "<f8", ">f8", "<c8", "<c16", "<M8[ns]", "<m8[s]", "S3", "<U2", "V4",
]


@st.composite
def arrays(draw, max_side=6):
    dtype = np.dtype(draw(st.sampled_from(ARRAY_DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=max_side))
    if dtype.kind == "V":
        n = int(np.prod(shape)) * dtype.itemsize
        raw = draw(st.binary(min_size=n, max_size=n))
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    arr = draw(hnp.arrays(dtype, shape))
    if draw(st.booleans()) and arr.ndim >= 1 and arr.shape[-1] > 1:
        arr = arr[..., ::2]             # not C-contiguous
    return arr


values = st.recursive(
    scalars | arrays(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(hashables, inner, max_size=5)
        | st.lists(st.none(), min_size=256, max_size=300)   # 32-bit counts
    ),
    max_leaves=12,
)


def same(a, b):
    """Exact equality as the typed codec promises it: bytes-likes decode as
    bytes, floats bit for bit (NaN, -0.0), arrays by dtype, shape and bytes."""
    if isinstance(a, (bytearray, memoryview)):
        return type(b) is bytes and bytes(a) == b
    if isinstance(a, np.ndarray):
        return (type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape
                and np.ascontiguousarray(a).tobytes() == b.tobytes())
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return (len(a) == len(b) and list(a) == list(b)
                and all(same(a[k], b[k]) for k in a))
    return a == b


# -- streams ------------------------------------------------------------------

def write_stream(records, segment_size, codec="typed"):
    """Serialize ``records`` into buffers of ``segment_size`` bytes; returns
    the content of every buffer filled, in order (the last may be short)."""
    chunks = []
    with fb.NetworkBufferPool(2, segment_size) as nbp:
        pool = nbp.create_buffer_pool(1, 2)
        ser = fb.RecordSerializer(codec)
        buf = pool.request_buffer()
        try:
            for r in records:
                ser.serialize_record(r)
                while True:
                    res = ser.copy_to_buffer(buf)
                    if res.is_full_buffer:
                        assert buf.size == buf.capacity
                        chunks.append(buf.read())
                        buf.recycle()
                        buf = pool.request_buffer()
                    if res.is_full_record:
                        break
            assert not ser.has_serialized_data
            if buf.size:
                chunks.append(buf.read())
        finally:
            buf.recycle()
            ser.clear()
    return chunks


def read_stream(chunks, codec="typed", max_record_size=64 << 20):
    """Feed bytes-like chunks, collect every record, then finish()."""
    des = fb.RecordDeserializer(codec, max_record_size=max_record_size)
    out = []
    for c in chunks:
        des.feed(c)
        out.extend(des.records())
    des.finish()
    out.extend(des.records())
    return out


def rechunk(data, cuts):
    """Split ``data`` at the sorted, de-duplicated positions ``cuts``."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


def feed_as_buffers(des, pieces, segment_size=None):
    """Feed ``pieces`` as pool Buffers (each written into its own buffer),
    collecting records after every feed; the pool must end up complete."""
    segment_size = segment_size or max(1, max((len(p) for p in pieces), default=1))
    out = []
    with fb.NetworkBufferPool(2, segment_size) as nbp:
        pool = nbp.create_buffer_pool(1, 2)
        for p in pieces:
            buf = pool.request_buffer()
            assert buf is not None, "the deserializer kept a consumed buffer"
            buf.write(p)
            des.feed(buf)
            out.extend(des.records())
        des.finish()
        out.extend(des.records())
        assert pool.num_requested == pool.num_available, "a fed buffer was not recycled"
    return out
