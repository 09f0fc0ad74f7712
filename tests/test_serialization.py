"""RecordSerializer / RecordDeserializer: framing, copy_to_buffer results,
broadcast, buffer ownership, the three codecs, end of stream."""

import gc
import pickle
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.serialization import _serialization as S
from test_serialization_support import read_stream, same, write_stream

SR = fb.SerializationResult


@pytest.fixture
def pool():
    with fb.NetworkBufferPool(8, 16) as nbp:
        yield nbp.create_buffer_pool(1, 8)


def test_exports_and_results():
    assert fb.RecordSerializer is S.RecordSerializer
    assert fb.RecordDeserializer is S.RecordDeserializer
    assert fb.SerializationResult is S.SerializationResult
    assert (SR.FULL_RECORD.is_full_record, SR.FULL_RECORD.is_full_buffer) == (True, False)
    r = SR.FULL_RECORD_MEMORY_SEGMENT_FULL
    assert (r.is_full_record, r.is_full_buffer) == (True, True)
    r = SR.PARTIAL_RECORD_MEMORY_SEGMENT_FULL
    assert (r.is_full_record, r.is_full_buffer) == (False, True)
    assert repr(SR.FULL_RECORD) == "<SerializationResult.FULL_RECORD>"
    assert pickle.loads(pickle.dumps(SR.FULL_RECORD)) is SR.FULL_RECORD
    with pytest.raises(TypeError):
        SR()
    with pytest.raises(TypeError, match="cannot be subclassed"):
        type("Mine", (SR,), {})
    with pytest.raises(AttributeError, match="immutable"):
        SR.FULL_RECORD.is_full_buffer = True
    assert repr(S.NO_RECORD) == "NO_RECORD"


def test_wire_format_is_big_endian_length_then_payload(pool):
    ser = fb.RecordSerializer("bytes")
    ser.serialize_record(b"hello")
    assert ser.record_size == 9
    buf = pool.request_buffer()
    assert ser.copy_to_buffer(buf) is SR.FULL_RECORD
    assert buf.read() == b"\x00\x00\x00\x05hello"
    buf.recycle()


def test_copy_results_and_writer_index(pool):
    ser = fb.RecordSerializer("bytes")
    ser.serialize_record(b"x" * 20)          # 24 bytes over 16-byte buffers
    b1, b2 = pool.request_buffer(), pool.request_buffer()
    b1.write(b"abc")
    assert ser.has_serialized_data
    assert ser.copy_to_buffer(b1) is SR.PARTIAL_RECORD_MEMORY_SEGMENT_FULL
    assert b1.size == 16
    assert ser.copy_to_buffer(b1) is SR.PARTIAL_RECORD_MEMORY_SEGMENT_FULL   # full: no-op
    assert ser.copy_to_buffer(b2) is SR.FULL_RECORD
    assert b2.size == 24 - 13
    assert not ser.has_serialized_data
    ser.serialize_record(b"y")               # 5 bytes: fits exactly in 16 - 11
    assert ser.copy_to_buffer(b2) is SR.FULL_RECORD_MEMORY_SEGMENT_FULL
    assert b1.read()[3:] + b2.read() == b"\0\0\0\x14" + b"x" * 20 + b"\0\0\0\x01y"
    # nothing staged: a no-op FULL_RECORD
    ser.clear()
    assert not ser.has_serialized_data and ser.record_size == 0
    assert ser.copy_to_buffer(b2) is SR.FULL_RECORD_MEMORY_SEGMENT_FULL
    b1.recycle()
    b2.recycle()


def test_one_byte_buffers():
    records = [(1, "a"), b"", None, [1.5] * 3]
    chunks = write_stream(records, 1)
    assert all(len(c) == 1 for c in chunks)
    assert same(read_stream(chunks), records)


def test_copy_into_recycled_buffer_raises(pool):
    ser = fb.RecordSerializer()
    ser.serialize_record(1)
    buf = pool.request_buffer()
    buf.recycle()
    with pytest.raises(fb.RecycledBufferError):
        ser.copy_to_buffer(buf)
    with pytest.raises(TypeError):
        ser.copy_to_buffer(None)


def test_reset_broadcasts_identical_bytes(pool):
    ser = fb.RecordSerializer()
    rec = {"k": [1, 2, 3], "v": "x" * 40}
    ser.serialize_record(rec)
    streams = []
    for _ in range(3):
        data = b""
        while True:
            buf = pool.request_buffer()
            res = ser.copy_to_buffer(buf)
            data += buf.read()
            buf.recycle()
            if res.is_full_record:
                break
        streams.append(data)
        ser.reset()
        assert ser.has_serialized_data
    assert streams[0] == streams[1] == streams[2]
    assert read_stream([streams[0]]) == [rec]


def test_reset_mid_record_starts_over(pool):
    ser = fb.RecordSerializer("bytes")
    ser.serialize_record(bytes(range(30)))
    buf = pool.request_buffer()
    ser.copy_to_buffer(buf)
    ser.reset()
    buf2 = pool.request_buffer()
    ser.copy_to_buffer(buf2)
    assert buf.read() == buf2.read() == b"\0\0\0\x1e" + bytes(range(12))
    buf.recycle()
    buf2.recycle()


def test_large_values_are_referenced_not_copied_when_staged():
    ser = fb.RecordSerializer()
    data = bytearray(b"a" * 4096)
    ser.serialize_record((b"k", data))
    with pytest.raises(BufferError):         # pinned until the record is cleared
        data.extend(b"more")
    ser.serialize_record(None)                # replacing the record unpins it
    data.extend(b"more")


def test_serializer_errors_leave_nothing_staged():
    ser = fb.RecordSerializer()
    ser.serialize_record([1, 2])
    with pytest.raises(TypeError, match="builtins.object"):
        ser.serialize_record([1, object()])
    assert not ser.has_serialized_data and ser.record_size == 0
    with pytest.raises(ValueError, match="codec"):
        fb.RecordSerializer("json")
    with pytest.raises(ValueError, match="codec"):
        fb.RecordDeserializer(codec=3)


def test_bytes_codec_refuses_non_bytes():
    ser = fb.RecordSerializer("bytes")
    with pytest.raises(TypeError, match="bytes-like"):
        ser.serialize_record((1, 2))
    assert not ser.has_serialized_data


@pytest.mark.parametrize("size", [1, 3, 7, 16, 4096])
def test_bytes_codec_round_trip(size):
    records = [b"", b"a", bytearray(b"bc" * 300), memoryview(b"0123456789")[::3],
               np.arange(200, dtype=np.int16), b"z" * 5000]
    out = read_stream(write_stream(records, size, "bytes"), "bytes")
    assert all(type(r) is bytes for r in out)
    assert out == [b"", b"a", b"bc" * 300, b"0369", np.arange(200, dtype=np.int16).tobytes(),
                   b"z" * 5000]


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return isinstance(other, Point) and (self.x, self.y) == (other.x, other.y)


@pytest.mark.parametrize("size", [1, 5, 64, 32768])
def test_pickle_codec_round_trip(size):
    records = [Point(1, 2), {1, 2, 3}, complex(1, 2), b"x" * 3000, [Point(i, -i) for i in range(50)]]
    assert read_stream(write_stream(records, size, "pickle"), "pickle") == records


def test_pickle_codec_garbage_is_corrupt():
    des = fb.RecordDeserializer("pickle")
    des.feed(b"\0\0\0\x03abc")
    with pytest.raises(fb.CorruptRecordError, match="stream offset 4: cannot unpickle"):
        list(des.records())


def test_three_mib_records_over_4k_buffers():
    big = bytes(range(256)) * (3 * 4096)                  # 3 MiB
    arr = np.arange(3 * 2**20 // 8, dtype=np.float64)     # 3 MiB
    text = "é" * (3 * 2**19)                              # 3 MiB of UTF-8
    records = [1, big, (arr, "tail"), text, arr.reshape(64, -1), "end"]
    chunks = write_stream(records, 4096)
    assert len(chunks) > 4 * 3 * 256
    out = read_stream(chunks)
    assert same(out, records)
    assert out[2][0].flags.writeable and out[2][0].flags.aligned


def test_spanning_array_is_zero_copy_view_of_the_assembled_record():
    arr = np.arange(10000, dtype="<f8")
    out = read_stream(write_stream([arr], 4096))[0]
    assert out.base is not None                     # a view, no second copy
    assert out.flags.writeable and out.flags.aligned and out.flags.c_contiguous
    assert np.array_equal(out, arr)


def test_streaming_with_a_single_pooled_buffer():
    """Records larger than the whole pool stream through one buffer at a
    time: the deserializer recycles each buffer as soon as it is consumed."""
    records = [b"q" * 10000, ("k", list(range(300))), b"", "s" * 999]
    ser = fb.RecordSerializer()
    des = fb.RecordDeserializer()
    out = []
    with fb.NetworkBufferPool(1, 64) as nbp:
        pool = nbp.create_buffer_pool(1, 1)
        for r in records:
            ser.serialize_record(r)
            while ser.has_serialized_data:
                buf = pool.request_buffer()
                assert buf is not None
                ser.copy_to_buffer(buf)
                des.feed(buf)
                out.extend(des.records())
        des.finish()
    assert same(out, records)


def test_feed_takes_over_one_reference_and_recycles_exactly_once(pool):
    data = write_stream([1, 2, 3], 64)[0]
    buf = pool.request_buffer()
    buf.write(data)
    buf.retain()                                   # someone else holds it too
    des = fb.RecordDeserializer()
    des.feed(buf)
    assert list(des.records()) == [1, 2, 3]
    assert buf.ref_count == 1 and not buf.is_recycled
    assert buf.reader_index == 0                   # the other holder's view is untouched
    buf.recycle()
    assert buf.is_recycled


def test_buffers_are_recycled_when_decoding_fails(pool):
    good = write_stream([1], 16)[0]
    b1, b2, b3 = pool.request_buffer(), pool.request_buffer(), pool.request_buffer()
    b1.write(good + b"\0\0")
    b2.write(b"\0\x02\x7f\x00")                    # a record with unknown tag 0x7f
    b3.write(good)
    des = fb.RecordDeserializer()
    for b in (b1, b2, b3):
        des.feed(b)
    it = des.records()
    assert next(it) == 1
    with pytest.raises(fb.CorruptRecordError, match=r"stream offset 9: unknown type tag 0x7f"):
        next(it)
    assert b1.is_recycled and b2.is_recycled and b3.is_recycled
    with pytest.raises(fb.RecycledBufferError):
        b3.recycle()                               # recycled once, by the deserializer
    # the stream is broken from now on; a fed buffer is still taken over
    b4 = pool.request_buffer()
    b4.write(good)
    with pytest.raises(fb.CorruptRecordError, match="broken"):
        des.feed(b4)
    assert b4.is_recycled
    with pytest.raises(fb.CorruptRecordError, match="broken"):
        list(des.records())
    assert pool.num_requested == pool.num_available


def test_feeding_a_recycled_buffer_raises(pool):
    buf = pool.request_buffer()
    buf.recycle()
    with pytest.raises(fb.RecycledBufferError):
        fb.RecordDeserializer().feed(buf)


def test_empty_buffer_is_recycled_at_once(pool):
    buf = pool.request_buffer()
    des = fb.RecordDeserializer()
    des.feed(buf)
    assert buf.is_recycled
    des.feed(b"")
    assert des.buffered_bytes == 0 and list(des.records()) == []


def test_buffer_recycled_behind_the_deserializers_back(pool):
    data = write_stream([1, 2], 64)[0]
    b1 = pool.request_buffer()
    b1.write(data[:3])
    b2 = pool.request_buffer()
    b2.write(data[3:])
    des = fb.RecordDeserializer()
    des.feed(b1)
    des.feed(b2)
    b2.recycle()                                  # a bug elsewhere: never read stale memory
    with pytest.raises(RuntimeError, match="recycled by someone else"):
        list(des.records())
    des.close()
    assert b1.is_recycled


def test_close_recycles_held_buffers_and_refuses_input(pool):
    des = fb.RecordDeserializer()
    bufs = [pool.request_buffer() for _ in range(3)]
    for b in bufs:
        b.write(b"\0\0\0\x10abc")
        des.feed(b)
    assert des.buffered_bytes == 21
    des.close()
    des.close()
    assert all(b.is_recycled for b in bufs)
    with pytest.raises(ValueError, match="after finish"):
        des.feed(b"x")


def test_dropping_a_deserializer_recycles_its_buffers(pool):
    des = fb.RecordDeserializer()
    buf = pool.request_buffer()
    buf.write(b"\0\0\0\x10a")
    des.feed(buf)
    des.feed(bytearray(b"pinned"))
    del des
    gc.collect()
    assert buf.is_recycled


def test_feed_rejects_non_bytes():
    with pytest.raises(TypeError, match="Buffer or a bytes-like"):
        fb.RecordDeserializer().feed(42)


def test_bytes_like_input_is_pinned_until_consumed():
    des = fb.RecordDeserializer("bytes")
    data = bytearray(b"\0\0\0\x05hel")
    des.feed(data)
    assert list(des.records()) == []
    # the partial record was copied out: the input is released
    data.extend(b"!")
    des.feed(b"lo")
    assert list(des.records()) == [b"hello"]


def test_partial_record_waits_then_completes():
    stream = b"".join(write_stream([("abc", 1.5), 7], 1000))
    des = fb.RecordDeserializer()
    for i in range(len(stream)):
        des.feed(stream[i:i + 1])
        got = list(des.records())
        if i == 4 + stream[3] - 1 + 0:
            assert got == [("abc", 1.5)]
        elif i == len(stream) - 1:
            assert got == [7]
        else:
            assert got == []
            assert des.has_partial_record
    des.finish()
    assert des.stream_offset == len(stream)


def test_finish_keeps_complete_records_and_refuses_partial():
    stream = b"".join(write_stream([1, 2], 64))
    des = fb.RecordDeserializer()
    des.feed(stream)
    des.finish()                                  # records not read yet: fine
    assert list(des.records()) == [1, 2]
    with pytest.raises(ValueError):
        des.feed(stream)

    for cut, at, what in [(2, 0, "2 of the 4 length-prefix bytes"),
                          (4, 0, "0 of its 1 payload bytes"),
                          (len(stream) - 1, 5, "0 of its 1 payload bytes")]:
        des = fb.RecordDeserializer()
        des.feed(stream[:cut])
        with pytest.raises(fb.CorruptRecordError,
                           match=f"stream offset {at}: the stream ended inside a record \\({what}\\)"):
            des.finish()
        with pytest.raises(fb.CorruptRecordError, match="broken"):
            des.next_record()


def test_finish_reports_offset_and_progress_of_partial_record():
    stream = b"".join(write_stream([b"x" * 100, b"y" * 2000], 4096))
    des = fb.RecordDeserializer()
    des.feed(stream[:-10])
    assert list(des.records()) == [b"x" * 100]
    with pytest.raises(fb.CorruptRecordError) as ei:
        des.finish()
    msg = str(ei.value)
    assert "stream offset 106" in msg and "1995 of its 2005 payload bytes" in msg, msg
    assert ei.value.stream_offset == 106


def test_max_record_size_refused_before_the_payload_arrives():
    des = fb.RecordDeserializer(max_record_size=100)
    des.feed(struct.pack(">I", 101))
    with pytest.raises(fb.CorruptRecordError,
                       match="stream offset 0: length prefix 101 exceeds max_record_size 100"):
        list(des.records())
    # split prefix, after a good record
    des = fb.RecordDeserializer("bytes", max_record_size=100)
    des.feed(b"\0\0\0\x01a\xff")
    assert list(des.records()) == [b"a"]
    des.feed(b"\xff\xff\xff")
    with pytest.raises(fb.CorruptRecordError, match="stream offset 5: length prefix 4294967295"):
        list(des.records())


def test_max_record_size_bounds():
    assert fb.RecordDeserializer().max_record_size == 64 << 20
    with pytest.raises(ValueError):
        fb.RecordDeserializer(max_record_size=-1)
    with pytest.raises(ValueError):
        fb.RecordDeserializer(max_record_size=2**31)
    with pytest.raises(TypeError):
        fb.RecordDeserializer(max_record_size=1.5)
    des = fb.RecordDeserializer("bytes", max_record_size=0)
    des.feed(b"\0\0\0\0")
    assert list(des.records()) == [b""]


def test_next_record_and_no_record():
    des = fb.RecordDeserializer()
    assert des.next_record() is S.NO_RECORD
    des.feed(b"".join(write_stream([None], 8)))
    assert des.next_record() is None
    assert des.next_record() is S.NO_RECORD


def test_typed_empty_payload_is_corrupt():
    des = fb.RecordDeserializer()
    des.feed(b"\0\0\0\0")
    with pytest.raises(fb.CorruptRecordError, match="stream offset 0: empty payload"):
        list(des.records())


def test_context_manager_and_repr(pool):
    with fb.RecordDeserializer() as des:
        buf = pool.request_buffer()
        buf.write(b"\0\0")
        des.feed(buf)
        assert "buffered=2" in repr(des)
    assert buf.is_recycled
    ser = fb.RecordSerializer("pickle")
    assert ser.codec == "pickle" and "pickle" in repr(ser)


class Reentrant:
    """Pickles by running `action` (re-entrant use of a (de)serializer)."""
    action = None

    def __reduce__(self):
        return (_call_action, ())


def _call_action():
    Reentrant.action()
    return "unpickled"


def test_reentrant_serializer_use_is_refused():
    ser = fb.RecordSerializer("pickle")
    Reentrant.action = None

    def reduce_ex(self, proto):
        ser.serialize_record("inner")
        return (str, ("x",))

    class Evil:
        __reduce_ex__ = reduce_ex

    with pytest.raises(RuntimeError, match="re-entrantly"):
        ser.serialize_record([1, Evil()])
    assert not ser.has_serialized_data
    ser.serialize_record("fine")                 # usable again
    assert ser.has_serialized_data


@pytest.mark.parametrize("action", ["next_record", "close", "finish"])
def test_reentrant_deserializer_use_is_refused(action, pool):
    des = fb.RecordDeserializer("pickle")
    Reentrant.action = getattr(des, action)
    data = b"".join(write_stream([Reentrant(), 2], 4096, "pickle"))
    buf = pool.request_buffer() if len(data) <= 16 else None
    des.feed(data)
    with pytest.raises(fb.CorruptRecordError, match="RuntimeError: RecordDeserializer used re-entrantly"):
        list(des.records())
    assert buf is None
    Reentrant.action = None


def test_record_is_not_lost_when_its_buffer_cannot_be_recycled(pool):
    buf = pool.request_buffer()
    buf.write(b"".join(write_stream([7], 16)))
    view = memoryview(buf.segment)                # misuse: a view still exported
    des = fb.RecordDeserializer()
    des.feed(buf)
    assert des.next_record() == 7                 # the record comes first
    with pytest.raises(fb.ExportedBufferError):
        des.next_record()                         # then the error
    view.release()
    buf.recycle()
    assert des.next_record() is S.NO_RECORD


# -- bytes records refilled in place once the consumer dropped them ------------

def _bytes_stream(records, codec):
    return b"".join(write_stream(records, 1 << 16, codec))


@pytest.mark.parametrize("codec", ["typed", "bytes"])
def test_a_dropped_bytes_record_is_refilled_in_place(codec):
    records = [bytes([i]) * 1000 for i in range(6)]
    des = fb.RecordDeserializer(codec)
    des.feed(_bytes_stream(records, codec))
    it = des.records()
    first = next(it)
    assert first == records[0]
    where = id(first)
    del first                                    # the consumer is done with it
    second = next(it)
    assert second == records[1] and id(second) == where   # no free + malloc
    kept = [second]                              # still referenced: never refilled
    view = memoryview(next(it))                  # a view keeps its object too
    rest = list(it)
    assert kept == [records[1]] and view == records[2] and rest == records[3:]
    assert id(rest[0]) != where


@pytest.mark.parametrize("codec", ["typed", "bytes"])
def test_a_refilled_record_forgets_its_cached_hash(codec):
    a, b = b"a" * 800, b"b" * 800
    des = fb.RecordDeserializer(codec)
    des.feed(_bytes_stream([a, b], codec))
    it = des.records()
    first = next(it)
    table = {first: "a"}                         # caches first's hash
    del table, first
    second = next(it)
    assert second == b and hash(second) == hash(b)
    assert {b: "b"}[second] == "b"


@given(st.lists(st.integers(600, 602).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
                min_size=1, max_size=30),
       st.lists(st.booleans(), min_size=30, max_size=30), st.sampled_from(["typed", "bytes"]))
def test_records_kept_by_the_consumer_never_change(records, keep, codec):
    des = fb.RecordDeserializer(codec)
    des.feed(_bytes_stream(records, codec))
    it = des.records()
    kept = {}
    for i in range(len(records)):
        r = next(it)                 # the previous one is dropped unless kept
        assert r == records[i]
        if keep[i]:
            kept[i] = r
        del r
    assert all(v == records[i] for i, v in kept.items())


@pytest.mark.parametrize("codec", ["typed", "bytes"])
def test_a_loop_that_drops_each_record_reuses_two_objects(codec):
    # the loop variable still holds the previous record while the next one
    # is made: the one before that is refilled
    records = [bytes([i]) * 2000 for i in range(50)]
    des = fb.RecordDeserializer(codec)
    des.feed(_bytes_stream(records, codec))
    ids, got = set(), []
    for rec in des.records():
        ids.add(id(rec))
        got.append(bytes(bytearray(rec)))        # a copy: the record itself is dropped
    assert got == records
    assert len(ids) == 2
