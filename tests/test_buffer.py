"""Buffer: indices, views, reference counting, exactly-once return, misuse."""

import io

import numpy as np
import pytest
from hypothesis import given, strategies as st

import flinkbuf as fb
from flinkbuf._testing import make_read_only


@pytest.fixture
def pool():
    nbp = fb.NetworkBufferPool(num_segments=8, segment_size=64)
    yield nbp.create_buffer_pool(2, 4)
    nbp.destroy()


def test_fresh_buffer_state(pool):
    with pool.request_buffer() as buf:
        assert (buf.size, buf.reader_index, buf.capacity) == (0, 0, 64)
        assert buf.readable_bytes == 0 and buf.writable_bytes == 64
        assert buf.ref_count == 1 and not buf.is_recycled and buf.pool is pool
        assert buf.data_type == fb.DataType.DATA_BUFFER and buf.is_buffer
        assert bytes(memoryview(buf)) == b""
    assert buf.is_recycled and buf.ref_count == 0


def test_write_read_and_indices(pool):
    with pool.request_buffer_blocking() as buf:
        assert buf.write(b"hello ") == 6
        buf.write(bytearray(b"world"))
        assert buf.size == 11 and bytes(memoryview(buf)) == b"hello world"
        assert buf.read(6) == b"hello " and buf.reader_index == 6
        assert bytes(memoryview(buf)) == b"world"
        assert buf.read() == b"world" and buf.read(5) == b""
        with pytest.raises(ValueError):
            buf.write(b"x" * 54)
        buf.size = 64
        with pytest.raises(ValueError):
            buf.size = 65
        with pytest.raises(ValueError):
            buf.size = 5  # below the reader index
        buf.reader_index = 0
        with pytest.raises(ValueError):
            buf.reader_index = 65
        with pytest.raises(ValueError):
            buf.reader_index = -1
        buf.data_type = fb.DataType.EVENT_BUFFER
        assert not buf.is_buffer
        with pytest.raises(ValueError):
            buf.data_type = 7


def test_segment_view_is_the_whole_writable_segment(pool):
    buf = pool.request_buffer()
    seg = buf.segment
    assert seg.size == 64 and buf.segment.address == seg.address
    arr = np.frombuffer(seg, dtype=np.float64)
    arr[:] = np.arange(8)
    buf.size = 64
    assert np.frombuffer(bytes(memoryview(buf)), dtype=np.float64).tolist() == list(range(8))
    with pytest.raises(fb.ExportedBufferError):
        buf.recycle()  # numpy still looks at the memory
    assert not buf.is_recycled
    del arr
    buf.recycle()
    with pytest.raises(fb.RecycledBufferError):
        seg.get_int8(0)
    with pytest.raises(fb.RecycledBufferError):
        memoryview(seg)
    assert seg.is_freed
    with pytest.raises(TypeError):
        seg.free()


def test_buffer_view_export_blocks_the_last_recycle_only(pool):
    buf = pool.request_buffer()
    buf.write(b"abc")
    buf.retain()
    mv = memoryview(buf)
    buf.recycle()  # not the last reference: fine
    with pytest.raises(fb.ExportedBufferError):
        buf.recycle()
    assert bytes(mv) == b"abc"
    mv.release()
    buf.recycle()
    assert buf.is_recycled


@given(retains=st.integers(0, 20))
def test_segment_returns_exactly_once(retains):
    with fb.NetworkBufferPool(num_segments=2, segment_size=16) as nbp:
        pool = nbp.create_buffer_pool(1, 1)
        buf = pool.request_buffer()
        for _ in range(retains):
            assert buf.retain() is buf
        for i in range(retains):
            buf.recycle()
            assert pool.num_available == 0 and buf.ref_count == retains - i
        buf.recycle()
        assert pool.num_available == 1 and pool.num_requested == 1
        with pytest.raises(fb.RecycledBufferError):
            buf.recycle()
        assert pool.num_available == 1  # the double recycle returned nothing
        again = pool.request_buffer()
        assert pool.request_buffer() is None  # still one segment in this pool
        again.recycle()


def test_every_use_of_a_recycled_buffer_raises(pool):
    buf = pool.request_buffer()
    buf.recycle()
    uses = [
        lambda: buf.recycle(), lambda: buf.retain(), lambda: buf.segment, lambda: buf.size,
        lambda: buf.reader_index, lambda: buf.readable_bytes, lambda: buf.writable_bytes,
        lambda: buf.write(b"x"), lambda: buf.read(), lambda: memoryview(buf),
        lambda: buf.data_type, lambda: buf.is_buffer, lambda: buf.__enter__(),
        lambda: setattr(buf, "size", 0), lambda: setattr(buf, "reader_index", 0),
    ]
    for use in uses:
        with pytest.raises(fb.RecycledBufferError):
            use()
    assert buf.capacity == 64 and "recycled" in repr(buf)


def test_buffers_cannot_be_made_or_pickled_directly(pool):
    import pickle
    with pytest.raises(TypeError):
        fb.Buffer()
    with pytest.raises(TypeError):
        fb.LocalBufferPool()
    with pool.request_buffer() as buf:
        with pytest.raises(TypeError):
            pickle.dumps(buf)


def test_recycled_memory_is_not_visible_through_old_views(pool):
    """A stale view cannot exist: the last recycle is refused while one is alive,
    so no reader can see a later user's data."""
    first = pool.request_buffer()
    first.write(b"secret")
    view = memoryview(first)
    with pytest.raises(BufferError):
        first.recycle()
    view.release()
    first.recycle()
    second = pool.request_buffer()
    with pytest.raises(fb.RecycledBufferError):
        bytes(memoryview(first))
    second.recycle()


def test_dropped_buffer_is_recycled(pool):
    pool.request_buffer().write(b"x")  # dropped at once
    assert pool.num_available == 1 and pool.num_requested == 1


def _writes(buf, other):
    """Every way to write a buffer's memory: each must refuse a read-only one."""
    seg = buf.segment
    return {
        "write": lambda: buf.write(b"x"),
        "writable-view": lambda: io.BytesIO(b"x").readinto(buf),
        "segment-writable-view": lambda: io.BytesIO(b"x").readinto(seg),
        "put_int8": lambda: seg.put_int8(0, 1),
        "put_uint16": lambda: seg.put_uint16(0, 1, True),
        "put_int32": lambda: seg.put_int32(0, 1),
        "put_uint64": lambda: seg.put_uint64(0, 1),
        "put_float64": lambda: seg.put_float64(0, 1.0),
        "put_bytes": lambda: seg.put_bytes(0, b"xy"),
        "copy_to": lambda: other.segment.copy_to(0, seg, 0, 1),
    }


WRITES = ["write", "writable-view", "segment-writable-view", "put_int8", "put_uint16",
          "put_int32", "put_uint64", "put_float64", "put_bytes", "copy_to"]


@given(data=st.binary(min_size=1, max_size=4096),
       tries=st.lists(st.sampled_from(WRITES), min_size=1, max_size=6))
def test_a_read_only_buffer_refuses_every_write_and_reads_as_before(data, tries):
    """A read-only buffer (one lent by another process): every write of its
    memory raises ReadOnlyBufferError (a FlinkbufError and a BufferError),
    its bytes stay what they were, and it reads and recycles as any other."""
    nbp = fb.NetworkBufferPool(4, 4096)
    lp = nbp.create_buffer_pool(2, 2)
    other = lp.request_buffer()
    buf = lp.request_buffer()
    try:
        other.write(b"\xee" * 8)
        buf.write(data)
        make_read_only(buf)
        assert buf.is_read_only
        writes = _writes(buf, other)
        assert memoryview(buf).readonly and memoryview(buf.segment).readonly
        for name in tries:
            # (CPython's own functions turn a refused writable view into TypeError)
            with pytest.raises(TypeError if "view" in name else fb.ReadOnlyBufferError,
                               match="read-write|read-only"):
                writes[name]()
            assert bytes(buf) == data, name
        assert buf.read(len(data)) == data
        assert np.frombuffer(memoryview(other), dtype=np.uint8)[0] == 0xEE
    finally:
        buf.recycle()
        other.recycle()
        lp.destroy()
        nbp.destroy()
    assert issubclass(fb.ReadOnlyBufferError, fb.FlinkbufError)
    assert issubclass(fb.ReadOnlyBufferError, BufferError)
