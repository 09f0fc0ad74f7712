"""The typed codec: exact bytes (docs/FORMAT.md), types, and every kind of
malformed payload."""

import gc
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.serialization import MAX_DEPTH, decode, encode
from test_serialization_support import same

CRE = fb.CorruptRecordError


class SubArray(np.ndarray):
    pass


@pytest.mark.parametrize("value, wire", [
    (None, "00"),
    (False, "01"),
    (True, "02"),
    (0, "80"),
    (127, "ff"),
    (128, "04 8000"),
    (-1, "03 ff"),
    (-128, "03 80"),
    (-129, "04 7fff"),
    (32767, "04 ff7f"),
    (32768, "05 00800000"),
    (-(2**31), "05 00000080"),
    (2**31, "06 0000008000000000"),
    (-(2**63), "06 0000000000000080"),
    (2**63, "07 09000000 000000000000008000"),
    (-(2**63) - 1, "07 09000000 ffffffffffffff7fff"),
    (1.0, "08 000000000000f03f"),
    ("", "09 00"),
    ("hé", "09 03 68c3a9"),
    (b"\x00\x01", "0b 02 0001"),
    (bytearray(b"a"), "0b 01 61"),
    ((), "0d 00"),
    ((1, "a"), "0d 02 81 09 01 61"),
    ([None], "0f 01 00"),
    ({}, "11 00"),
    ({"a": [True]}, "11 01 0901 61 0f01 02"),
    ("x" * 256, "0a 00010000" + "78" * 256),
    (b"y" * 300, "0c 2c010000" + "79" * 300),
    (tuple([None] * 256), "0e 00010000" + "00" * 256),
    ([0] * 300, "10 2c010000" + "80" * 300),
])
def test_wire_bytes(value, wire):
    expected = bytes.fromhex(wire.replace(" ", ""))
    assert encode(value) == expected
    out = decode(expected)
    assert same(value, out)


def test_dict32():
    d = {i: None for i in range(256)}
    wire = encode(d)
    assert wire[:5] == b"\x12\x00\x01\x00\x00"
    assert decode(wire) == d


def test_ndarray_wire_layout():
    a = np.array([[1, 2, 3], [4, 5, 6]], dtype="<i2")
    wire = encode(a)
    # tag, dtype "<i2", ndim 2, dims 2 and 3, padding so the data starts at
    # a payload offset that is a multiple of 16, then the raw C-order data
    head = b"\x13\x03<i2\x02" + struct.pack("<QQ", 2, 3)
    assert wire[:len(head)] == head
    pad = wire[len(head)]
    assert (len(head) + 1 + pad) % 16 == 0
    assert wire[len(head) + 1:len(head) + 1 + pad] == bytes(pad)
    assert wire[len(head) + 1 + pad:] == a.tobytes()
    assert same(decode(wire), a)


def test_ndarray_alignment_is_relative_to_the_payload():
    for prefix in range(20):
        wire = encode(("x" * prefix, np.arange(3, dtype="<f8")))
        start = len(wire) - 24
        assert start % 16 == 0


@pytest.mark.parametrize("arr", [
    np.array(3.5),                                   # 0-d
    np.zeros((0, 5)),                                # empty
    np.zeros((2, 0, 3), dtype="<i4"),
    np.arange(24, dtype=">i8").reshape(2, 3, 4),      # big-endian stays big-endian
    np.arange(10)[::3],                              # strided: encoded contiguous
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.array([b"ab", b"c"]),
    np.array(["x", "yz"]),
    np.array([True, False]),
    np.array([1 + 2j], dtype="<c16"),
    np.array(["2020-01-01"], dtype="<M8[D]"),
    np.array([5], dtype="<m8[ms]"),
    np.zeros(3, dtype="V5"),
    np.arange(5.0).view(SubArray),                   # subclass -> ndarray
])
def test_ndarray_round_trip(arr):
    out = decode(encode(arr))
    assert type(out) is np.ndarray
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert np.ascontiguousarray(arr).tobytes() == out.tobytes()
    assert out.flags.writeable and out.flags.c_contiguous


@pytest.mark.parametrize("arr, match", [
    (np.array([object()]), "dtype"),
    (np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]), "structured"),
    (np.ma.array([1, 2], mask=[0, 1]), "masked"),
    (np.zeros((1,) * 33), "33 dimensions|more than 32"),
])
def test_ndarray_refused(arr, match):
    with pytest.raises((TypeError, ValueError), match=match):
        encode(arr)


def test_subclasses_and_numpy_scalars_encode_as_base_types():
    import collections
    import enum

    class Color(enum.IntEnum):
        RED = 1

    P = collections.namedtuple("P", "x y")
    od = collections.OrderedDict(a=1)

    class S(str):
        pass

    class L(list):
        def __iter__(self):
            raise AssertionError("not used")

    assert decode(encode(Color.RED)) == 1 and type(decode(encode(Color.RED))) is int
    assert type(decode(encode(P(1, 2)))) is tuple
    assert decode(encode(od)) == {"a": 1}
    assert type(decode(encode(S("s")))) is str
    assert decode(encode(L([1, 2]))) == [1, 2]
    assert decode(encode(np.float64(1.5))) == 1.5
    assert decode(encode(np.int32(-7))) == -7 and type(decode(encode(np.int32(-7)))) is int
    assert decode(encode(np.bool_(True))) is True
    assert decode(encode(np.uint64(2**64 - 1))) == 2**64 - 1
    assert decode(encode(np.str_("u"))) == "u"
    assert decode(encode(np.bytes_(b"b"))) == b"b"


@pytest.mark.parametrize("value", [object(), {1, 2}, frozenset(), 1j, np.complex128(1j),
                                   np.datetime64("2020"), Ellipsis, len])
def test_unsupported_types_name_the_type_and_suggest_pickle(value):
    with pytest.raises(TypeError) as ei:
        encode(value)
    msg = str(ei.value)
    assert type(value).__qualname__ in msg and "pickle" in msg


def test_lone_surrogate_is_refused():
    with pytest.raises(UnicodeEncodeError):
        encode("\ud800")


def test_strided_memoryview_is_encoded_contiguous():
    assert decode(encode(memoryview(b"abcdef")[::2])) == b"ace"


def nest(depth, kind=list):
    v = 0
    for _ in range(depth):
        v = kind([v]) if kind is not dict else {0: v}
    return v


@pytest.mark.parametrize("kind", [list, tuple, dict])
def test_nesting_cap_on_encode(kind):
    assert same(decode(encode(nest(MAX_DEPTH, kind))), nest(MAX_DEPTH, kind))
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH}"):
        encode(nest(MAX_DEPTH + 1, kind))
    with pytest.raises(ValueError, match="nested deeper"):
        encode(nest(100000, kind))


def test_self_referencing_structures_are_refused():
    a = []
    a.append(a)
    with pytest.raises(ValueError, match="self-referencing.*list contains itself"):
        encode(a)
    d = {}
    d["me"] = [1, (2, d)]
    with pytest.raises(ValueError, match="self-referencing"):
        encode(d)
    # shared (not cyclic) references are fine
    shared = [1, 2]
    assert decode(encode([shared, shared, (shared,)])) == [[1, 2], [1, 2], ([1, 2],)]


def test_nesting_cap_on_decode():
    v = decode(b"\x0f\x01" * MAX_DEPTH + b"\x00")
    for _ in range(MAX_DEPTH):
        assert type(v) is list and len(v) == 1
        v = v[0]
    assert v is None
    bad = b"\x0f\x01" * (MAX_DEPTH + 1) + b"\x00"
    with pytest.raises(CRE, match=f"offset {2 * MAX_DEPTH}: containers nested deeper"):
        decode(bad)
    with pytest.raises(CRE, match="nested deeper"):
        decode(b"\x0d\x01" * 1_000_000 + b"\x00")


@pytest.mark.parametrize("payload, offset, reason", [
    (b"", 0, "truncated value: no type tag"),
    (b"\x14", 0, "unknown type tag 0x14"),
    (b"\x7f", 0, "unknown type tag 0x7f"),
    (b"\x03", 1, "truncated int8"),
    (b"\x04\x00", 1, "truncated int16"),
    (b"\x05\x00\x00\x00", 1, "truncated int32"),
    (b"\x06" + bytes(7), 1, "truncated int64"),
    (b"\x07\x00\x00\x00\x00", 1, "big int of zero bytes"),
    (b"\x07\x05\x00\x00\x00\x01", 5, "truncated big int: needs 5 bytes, 1 left"),
    (b"\x08" + bytes(7), 1, "truncated float64"),
    (b"\x09\x05abc", 2, "truncated str: needs 5 bytes, 3 left"),
    (b"\x0a\xff\xff\xff\xff", 5, "truncated str: needs 4294967295 bytes, 0 left"),
    (b"\x09\x02\xc3\x28", 0, "invalid UTF-8"),
    (b"\x09\x01\xff", 0, "invalid UTF-8"),
    (b"\x09\x03\xed\xa0\x80", 0, "invalid UTF-8"),          # encoded surrogate
    (b"\x0b", 1, "truncated bytes"),
    (b"\x0c\x00\x00\x00\x80", 5, "truncated bytes"),
    (b"\x0d\x03\x00\x00", 0, "tuple of 3 items in 2 bytes"),
    (b"\x0e\xff\xff\xff\x7f\x00", 0, "tuple of 2147483647 items in 1 bytes"),
    (b"\x10\xff\xff\xff\xff", 0, "list of 4294967295 items in 0 bytes"),
    (b"\x11\x02\x80\x80\x81", 0, "dict of 2 items in 3 bytes"),
    (b"\x12\x00\x00\x00\x40", 0, "dict of 1073741824 items in 0 bytes"),
    (b"\x11\x01\x0f\x00\x00", 2, "unhashable dict key of type list"),
    (b"\x11\x01\x0d\x01\x0f\x00\x00", 2, "unhashable dict key of type tuple"),
    (b"\x0d\x02\x09\x00", 4, "truncated value: no type tag"),
    (b"\x80\x80", 1, "1 trailing bytes after the value"),
    (b"\x0f\x00\x00\x00\x00", 2, "3 trailing bytes"),
])
def test_corrupt_payloads(payload, offset, reason):
    with pytest.raises(CRE) as ei:
        decode(payload)
    msg = str(ei.value)
    assert f"offset {offset}:" in msg and reason in msg, msg
    assert ei.value.stream_offset == offset
    assert isinstance(ei.value, ValueError)


def arr_head(dtype=b"<f8", ndim=1, dims=(2,), pad=None):
    body = b"\x13" + bytes([len(dtype)]) + dtype + bytes([ndim]) + b"".join(
        struct.pack("<Q", d) for d in dims)
    if pad is None:
        pad = (-(len(body) + 1)) % 16
    return body + bytes([pad]) + bytes(pad)


@pytest.mark.parametrize("payload, reason", [
    (b"\x13", "truncated numpy dtype"),
    (b"\x13\x00", "numpy dtype descriptor of 0 bytes"),
    (b"\x13\x21" + b"<" * 33, "numpy dtype descriptor of 33 bytes"),
    (b"\x13\x05<f8", "truncated numpy dtype"),
    (arr_head(b"|O8"), "unsupported numpy dtype descriptor b'|O8'"),
    (arr_head(b"<O8"), "unsupported numpy dtype"),
    (arr_head(b"<f3"), "unsupported numpy dtype"),
    (arr_head(b"<b1"), "unsupported numpy dtype"),       # not canonical ('|b1')
    (arr_head(b"<V8"), "unsupported numpy dtype"),
    (arr_head(b"|S0"), "unsupported numpy dtype"),
    (arr_head(b"<f8,<i4"), "unsupported numpy dtype"),
    (arr_head(b"(2,)<f8"), "unsupported numpy dtype"),
    (arr_head(b"|T16"), "unsupported numpy dtype"),
    (arr_head(b"<M8[xx]"), "unsupported numpy dtype"),
    (b"\x13\x03<f8", "truncated numpy shape"),
    (b"\x13\x03<f8\x21", "numpy array of 33 dimensions"),
    (b"\x13\x03<f8\x02" + bytes(8), "truncated numpy shape"),
    (arr_head(ndim=1, dims=(2**40,)), "numpy dimension of 1099511627776"),
    (arr_head(ndim=3, dims=(2**31 - 1, 2**31 - 1, 4)), "numpy array larger than a record"),
    (arr_head(pad=16), "numpy data padding of 16 bytes"),
    (arr_head(pad=7)[:-3], "truncated numpy padding"),
    (arr_head(dims=(2,)) + bytes(15), "numpy array of 2 x 8-byte items in 15 bytes"),
    (arr_head(b"<U9", dims=(1,)) + bytes(35), "numpy array of 1 x 36-byte items in 35 bytes"),
    (arr_head(dims=(1,)) + bytes(9), "1 trailing bytes"),
])
def test_corrupt_arrays(payload, reason):
    with pytest.raises(CRE) as ei:
        decode(payload)
    assert reason in str(ei.value), str(ei.value)


def test_array_with_zero_dimension_and_huge_other_dimension():
    out = decode(arr_head(ndim=2, dims=(0, 2**31 - 1)))
    assert out.shape == (0, 2**31 - 1)


def test_non_minimal_encodings_are_accepted():
    assert decode(b"\x06" + struct.pack("<q", 5)) == 5
    assert decode(b"\x0a\x01\x00\x00\x00a") == "a"
    assert decode(b"\x10\x01\x00\x00\x00\x80") == [0]
    assert decode(b"\x07\x01\x00\x00\x00\xff") == -1


def test_duplicate_dict_keys_last_wins():
    assert decode(b"\x11\x02\x80\x81\x80\x82") == {0: 2}


def test_decode_accepts_any_bytes_like():
    wire = encode([1, "a"])
    assert decode(bytearray(wire)) == [1, "a"]
    assert decode(memoryview(wire)) == [1, "a"]
    assert decode(np.frombuffer(wire, dtype=np.uint8)) == [1, "a"]


def test_bigints():
    for v in [2**63, -(2**63) - 1, 2**64, 10**100, -(10**100), 2**1000 - 1]:
        assert decode(encode(v)) == v


def test_format_md_example():
    """The worked example of docs/FORMAT.md section 2.4, framing included."""
    from test_serialization_support import write_stream
    wire = bytes.fromhex("00000014 0d03 81 0903 68c3a9 0f02 00 08 0000000000000440")
    assert b"".join(write_stream([(1, "hé", [None, 2.5])], 64)) == wire
    assert decode(wire[4:]) == (1, "hé", [None, 2.5])


def test_empty_array_whose_other_dimensions_overflow():
    """A fuzzer finding: numpy refuses even an empty array whose non-zero
    dimensions multiply beyond its maximum size."""
    head = arr_head(b"<i4", ndim=4, dims=(0, 2**31 - 1, 2**31 - 1, 8))
    with pytest.raises(CRE, match="numpy array larger than a record"):
        decode(head)
    with pytest.raises(ValueError, match="non-zero dimensions"):
        encode(np.empty((0, 2**20, 2**20)))


# ---- the garbage collector ---------------------------------------------------------

def _expect_tracked(value):
    """Whether a decoded tuple or list is tracked by the garbage collector: a
    list always; a tuple only if an item is a list, a dict or a tracked
    tuple (what CPython's collector concludes of a tuple, at once)."""
    if isinstance(value, tuple):
        return any(isinstance(v, (list, dict)) or (isinstance(v, tuple) and _expect_tracked(v))
                   for v in value)
    return True


def _containers(value):
    yield value
    items = value.values() if isinstance(value, dict) else \
        value if isinstance(value, (tuple, list)) else ()
    for v in items:
        if isinstance(v, (tuple, list, dict)):
            yield from _containers(v)


scalars = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.text(max_size=8),
                    st.binary(max_size=8), st.none(), st.booleans())
nested = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4).map(tuple), st.lists(inner, max_size=4),
    st.dictionaries(st.text(max_size=3), inner, max_size=3)), max_leaves=12)


@given(nested.filter(lambda v: isinstance(v, (tuple, list, dict))))
def test_decoded_tuples_of_untracked_values_are_not_tracked(value):
    """Decoding leaves a tuple whose items the collector never tracks
    (scalars, untracked tuples) untracked, so that thousands of decoded
    records alive at once are not traversed by every collection; lists,
    dicts and the tuples holding them are tracked.  Values unchanged."""
    got = decode(encode(value))
    assert got == value
    for c in _containers(got):
        if not isinstance(c, dict):         # CPython's own rule for dicts
            assert gc.is_tracked(c) == _expect_tracked(c), c


def test_decoded_records_read_through_a_gate_are_not_tracked():
    k = 7
    recs = [(k % 10, k, "v"), ((k, 1.5), None), (k, [k]), (k, {"a": k})]
    nbp = fb.NetworkBufferPool(8, 256)
    part = fb.create_partition(nbp, 1)
    gate = fb.InputGate([(part, 0)])
    with fb.RecordWriter(part, buffer_timeout=None) as w:
        w.emit_all(recs)
    got = gate.read_many(10)
    gate.close()
    part.pool.destroy()
    nbp.destroy()
    assert got == recs
    assert [gc.is_tracked(r) for r in got] == [False, False, True, True]
    assert not gc.is_tracked(got[1][0])
