"""MemorySegment: allocation, typed and bulk access, bounds, free, buffer protocol."""

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, strategies as st

import flinkbuf as fb

TYPED = [
    # name, struct code, size, signed range
    ("int8", "b", 1), ("uint8", "B", 1),
    ("int16", "h", 2), ("uint16", "H", 2),
    ("int32", "i", 4), ("uint32", "I", 4),
    ("int64", "q", 8), ("uint64", "Q", 8),
]


def int_range(code):
    bits = struct.calcsize(code) * 8
    if code.isupper():
        return 0, 2 ** bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


@pytest.fixture
def seg():
    s = fb.MemorySegment.allocate(64)
    yield s
    if not s.is_freed:
        s.free()


def test_allocate_validates_arguments():
    with pytest.raises(ValueError):
        fb.MemorySegment.allocate(0)
    with pytest.raises(ValueError):
        fb.MemorySegment.allocate(-5)
    for bad in (0, 1, 32, 63, 96, 100):
        with pytest.raises(ValueError, match="alignment"):
            fb.MemorySegment.allocate(16, alignment=bad)
    with pytest.raises(TypeError):
        fb.MemorySegment()


@pytest.mark.parametrize("alignment", [64, 128, 4096, 65536])
def test_allocate_is_aligned_and_zeroed(alignment):
    with fb.MemorySegment.allocate(1000, alignment=alignment) as s:
        assert s.address % alignment == 0
        assert s.size == len(s) == 1000
        assert s.get_bytes(0, 1000) == bytes(1000)
    assert s.is_freed


@pytest.mark.parametrize("name,code,size", TYPED)
@pytest.mark.parametrize("big", [False, True])
def test_typed_round_trip_matches_struct(seg, name, code, size, big):
    lo, hi = int_range(code)
    order = ">" if big else "<"
    for value in (lo, hi, 0, 1, lo // 3, hi // 7):
        offset = 64 - size
        getattr(seg, f"put_{name}")(offset, value, *(() if size == 1 else (big,)))
        assert seg.get_bytes(offset, size) == struct.pack(order + code, value)
        assert getattr(seg, f"get_{name}")(offset, *(() if size == 1 else (big,))) == value


@given(offset=st.integers(0, 56), value=st.integers(-(2 ** 63), 2 ** 63 - 1), big=st.booleans())
def test_int64_any_offset(offset, value, big):
    with fb.MemorySegment.allocate(64) as s:
        s.put_int64(offset, value, big)
        assert s.get_int64(offset, big) == value
        assert s.get_bytes(offset, 8) == struct.pack(">q" if big else "<q", value)
        assert s.get_uint64(offset, not big) == struct.unpack(
            "<Q" if big else ">Q", struct.pack(">q" if big else "<q", value))[0]


@given(value=st.floats(allow_nan=False), big=st.booleans())
def test_floats(value, big):
    with fb.MemorySegment.allocate(16) as s:
        s.put_float64(3, value, big)
        assert s.get_float64(3, big) == value
        assert s.get_bytes(3, 8) == struct.pack(">d" if big else "<d", value)
        f32 = struct.unpack("<f", struct.pack("<f", value))[0] if abs(value) < 3e38 else None
        if f32 is not None:
            s.put_float32(0, value, big)
            assert s.get_float32(0, big) == f32


@pytest.mark.parametrize("name,code,size", TYPED)
def test_out_of_range_values_raise_overflow(seg, name, code, size):
    lo, hi = int_range(code)
    put = getattr(seg, f"put_{name}")
    with pytest.raises(OverflowError):
        put(0, hi + 1)
    with pytest.raises(OverflowError):
        put(0, lo - 1)


@pytest.mark.parametrize("name,code,size", TYPED + [("float32", "f", 4), ("float64", "d", 8)])
def test_every_accessor_is_bounds_checked(seg, name, code, size):
    get, put = getattr(seg, f"get_{name}"), getattr(seg, f"put_{name}")
    get(64 - size)
    for bad in (64 - size + 1, 64, -1, -size, 2 ** 62, -(2 ** 62)):
        with pytest.raises(IndexError):
            get(bad)
        with pytest.raises(IndexError):
            put(bad, 0)


def test_bulk_access_bounds(seg):
    with pytest.raises(IndexError):
        seg.get_bytes(60, 5)
    with pytest.raises(IndexError):
        seg.get_bytes(0, -1)
    with pytest.raises(IndexError):
        seg.put_bytes(60, b"12345")
    with pytest.raises(IndexError):
        seg.put_bytes(-1, b"1")
    other = fb.MemorySegment.allocate(8)
    try:
        with pytest.raises(IndexError):
            seg.copy_to(0, other, 4, 5)
        with pytest.raises(IndexError):
            seg.compare(other, 0, 0, 9)
    finally:
        other.free()


def test_bulk_copy_compare(seg):
    seg.put_bytes(0, b"hello world")
    seg.put_bytes(20, bytearray(b"abc"))
    seg.put_bytes(30, memoryview(b"xyz"))
    assert seg.get_bytes(0, 11) == b"hello world"
    assert seg.get_bytes(20, 3) == b"abc" and seg.get_bytes(30, 3) == b"xyz"
    with fb.MemorySegment.allocate(32) as other:
        seg.copy_to(0, other, 5, 11)
        assert other.get_bytes(5, 11) == b"hello world"
        assert seg.compare(other, 0, 5, 11) == 0
        other.put_uint8(5, ord("i"))
        assert seg.compare(other, 0, 5, 11) == -1
        assert other.compare(seg, 5, 0, 11) == 1
        other.put_uint8(5, 0xFF)  # compared unsigned
        assert seg.compare(other, 0, 5, 1) == -1
    # overlapping copy within one segment behaves like memmove
    seg.put_bytes(0, b"0123456789")
    seg.copy_to(0, seg, 2, 8)
    assert seg.get_bytes(0, 10) == b"0101234567"


def test_buffer_protocol_is_zero_copy_and_writable(seg):
    mv = memoryview(seg)
    assert mv.nbytes == 64 and not mv.readonly
    mv[3] = 7
    assert seg.get_uint8(3) == 7
    arr = np.frombuffer(seg, dtype=np.uint8)
    arr[10:12] = [1, 2]
    assert seg.get_uint16(10) == 0x0201
    assert arr.ctypes.data == seg.address
    mv.release()
    del arr


def test_free_refused_while_exported_then_access_after_free():
    s = fb.MemorySegment.allocate(16)
    mv = memoryview(s)
    with pytest.raises(fb.ExportedBufferError):
        s.free()
    with pytest.raises(BufferError):  # the builtin it derives from
        s.free()
    assert s.get_uint8(0) == 0  # still valid
    mv.release()
    s.free()
    assert s.is_freed
    for call in (lambda: s.get_int32(0), lambda: s.put_bytes(0, b"x"),
                 lambda: s.address, lambda: memoryview(s), lambda: s.get_bytes(0, 1)):
        with pytest.raises(fb.SegmentFreedError):
            call()
    with pytest.raises(fb.SegmentFreedError):
        s.free()
    assert "freed" in repr(s)


def test_segments_cannot_be_pickled(seg):
    with pytest.raises(TypeError):
        pickle.dumps(seg)
