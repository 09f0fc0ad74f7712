"""How a BatchWriter cuts a batch's columns: _gather_by_channel (every
column grouped by channel in one C call) gives exactly what order_by_channel
and a numpy take per column give, for every item width and stride, and a
clear exception (never a crash, never a write) for a bad argument; how a
gate's deserializer assembles a record spanning buffers in a bytearray it
reuses only once no batch views it; and that a mapping's piece, emitted
with its columns' layout made once, encodes as the mapping would."""

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flinkbuf import RecordDeserializer
from flinkbuf.io import order_by_channel
from flinkbuf.io._io import _gather_by_channel
from flinkbuf.serialization.codecs.columns import NumpyLayout, NumpyValues, encode_parts

CHANNEL_DTYPES = [np.int8, np.int16, np.int32, np.int64]
# item widths 1, 2, 4, 8, 16 and others (the generic copy)
COLUMN_DTYPES = [np.dtype(t) for t in ("u1", "<i2", ">i4", "<f8", "<c16", "S3", "<U3",
                                       "V5", "?")]


@st.composite
def batches(draw):
    """(channels, num_channels, columns): columns of any width, some of
    them strided or reversed views."""
    dtype = draw(st.sampled_from(CHANNEL_DTYPES))
    num_channels = draw(st.one_of(st.integers(1, 3), st.integers(1, 127)))
    if draw(st.booleans()):
        channels = draw(hnp.arrays(dtype, st.integers(0, 60),
                                   elements=st.integers(0, num_channels - 1)))
    else:                       # long enough for the counting sort's lanes
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        channels = rng.integers(0, num_channels, draw(st.integers(1024, 5000))).astype(dtype)
    rows = len(channels)
    columns = []
    for t in draw(st.lists(st.sampled_from(COLUMN_DTYPES), max_size=4)):
        step = draw(st.sampled_from([1, 2, -1, -3]))
        base = np.frombuffer(np.random.default_rng(len(columns)).bytes(
            max(rows * abs(step), 1) * t.itemsize), dtype=t)
        columns.append(base[::step][:rows])
    return channels, num_channels, columns


def _as_gathered(channels, num_channels, columns, order_dtype=np.int32):
    order = np.full(len(channels), -1, dtype=order_dtype)
    counts = np.full(num_channels, -1, dtype=np.int64)
    outs = [np.zeros(len(channels), dtype=c.dtype) for c in columns]
    assert _gather_by_channel(channels, list(columns), outs, order, counts) is None
    return order, counts, outs


@given(batches(), st.sampled_from([np.int32, np.int64]))
def test_it_gathers_what_order_by_channel_and_take_give(batch, order_dtype):
    channels, num_channels, columns = batch
    order, counts, outs = _as_gathered(channels, num_channels, columns, order_dtype)
    want_order = np.empty(len(channels), dtype=np.int64)
    want_counts = np.empty(num_channels, dtype=np.int64)
    order_by_channel(channels, want_order, want_counts)
    assert order.tolist() == want_order.tolist()
    assert counts.tolist() == want_counts.tolist()
    for column, out in zip(columns, outs):
        assert out.tobytes() == np.take(column, want_order).tobytes()


@given(batches())
def test_each_channels_values_are_its_rows_in_input_order(batch):
    channels, num_channels, columns = batch
    _, counts, outs = _as_gathered(channels, num_channels, columns)
    start = 0
    for c in range(num_channels):
        rows = np.flatnonzero(channels == c)
        assert counts[c] == len(rows)
        for column, out in zip(columns, outs):
            assert out[start:start + len(rows)].tobytes() == column[rows].tobytes()
        start += len(rows)


@given(batches())
def test_without_an_order_the_columns_and_counts_are_the_same(batch):
    """order None (BatchWriter's call): the columns scattered straight to
    their channels' places (many rows) or gathered through an order of its
    own (few), identical to the ordered call."""
    channels, num_channels, columns = batch
    _, counts, outs = _as_gathered(channels, num_channels, columns)
    bare_counts = np.full(num_channels, -1, dtype=np.int64)
    bare_outs = [np.zeros(len(channels), dtype=c.dtype) for c in columns]
    assert _gather_by_channel(channels, list(columns), bare_outs, None, bare_counts) is None
    assert bare_counts.tolist() == counts.tolist()
    for out, bare in zip(outs, bare_outs):
        assert bare.tobytes() == out.tobytes()


def test_an_order_of_none_still_checks_everything_before_writing():
    channels = np.zeros(4096, np.int8)
    channels[3000] = 5
    counts = np.full(3, -1, np.int64)
    out = np.full(4096, -1, np.int64)
    with pytest.raises(ValueError, match=r"channel 5 of row 3000 is not in \[0, 3\)"):
        _gather_by_channel(channels, [np.arange(4096)], [out], None, counts)
    assert counts.tolist() == [-1] * 3 and (out == -1).all()
    with pytest.raises(TypeError, match="order must be an array of int32 or int64"):
        _gather_by_channel(channels, [], [], np.zeros(4096, np.float64), counts)


def test_other_columns_are_left_alone_and_an_empty_list_only_orders():
    channels = np.array([1, 0, 1, 0], dtype=np.int8)
    order, counts, outs = _as_gathered(channels, 2, [])
    assert (order.tolist(), counts.tolist(), outs) == ([1, 3, 0, 2], [2, 2], [])


CH = np.array([0, 1, 2, 1, 0, 2], dtype=np.int8)
COL = np.arange(6, dtype=np.int64)


def _call(columns=None, outs=None, channels=CH):
    order, counts = np.full(6, -1, np.int32), np.full(3, -1, np.int64)
    columns = [COL] if columns is None else columns
    outs = [np.full(6, -1, np.int64)] if outs is None else outs
    try:
        _gather_by_channel(channels, columns, outs, order, counts)
    except Exception:
        # a refused call writes nothing
        assert order.tolist() == [-1] * 6 and counts.tolist() == [-1] * 3
        assert all(o.tolist() == [-1] * len(o) for o in outs
                   if isinstance(o, np.ndarray) and o.dtype == np.int64)
        raise


@pytest.mark.parametrize("kwargs, error, message", [
    ({"columns": (COL,)}, TypeError, "lists of arrays"),
    ({"columns": [COL, COL]}, TypeError, "lists of arrays of one length"),
    ({"columns": [list(COL)]}, TypeError, "column 0 must be an array"),
    ({"columns": [COL[:5]]}, ValueError, "column 0 must be a one-dimensional array of 6"),
    ({"columns": [COL.reshape(2, 3)]}, ValueError, "one-dimensional array of 6"),
    ({"columns": [np.array([None] * 6, dtype=object)]}, TypeError, "Python objects"),
    ({"outs": [np.full(6, -1, np.int32)]}, ValueError, "out 0 must be contiguous, of items "
                                                       "of 8 bytes"),
    ({"outs": [np.full(12, -1, np.int64)[::2]]}, ValueError, "out 0 must be contiguous"),
    ({"outs": [np.full(7, -1, np.int64)]}, ValueError, "out 0 must be a one-dimensional"),
    ({"outs": [bytes(48)]}, ValueError, "out 0 cannot be read"),
    ({"channels": np.array([0, 1, 3, 1, 0, 2], np.int8)}, ValueError,
     r"channel 3 of row 2 is not in \[0, 3\)"),
    ({"channels": CH.astype(np.uint8)}, TypeError, "channels must be an array of signed"),
])
def test_bad_arguments_raise_clear_errors_and_write_nothing(kwargs, error, message):
    with pytest.raises(error, match=message):
        _call(**kwargs)


def test_a_datetime_column_is_gathered_as_its_items_bytes():
    """numpy exports no buffer of datetimes: a BatchWriter passes their
    items as unsigned integers of their width."""
    values = np.arange(6).astype("M8[s]")
    with pytest.raises(ValueError, match="column 0 cannot be read"):
        _call(columns=[values], outs=[np.empty(6, "M8[s]")])
    out = np.empty(6, "M8[s]")
    _call(columns=[values.view(np.uint64)], outs=[out.view(np.uint64)])
    assert out.tolist() == values[[0, 4, 1, 3, 2, 5]].tolist()


# ---- the receiving side's bytearrays -----------------------------------------------------

def _record(batch):
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in encode_parts(batch))
    return struct.pack(">I", len(payload)) + payload


def _spanning(des, batch, chunk=20000):
    """``batch`` fed to ``des`` in chunks (so assembled), and decoded."""
    data = _record(batch)
    for at in range(0, len(data), chunk):
        des.feed(data[at:at + chunk])
    [got] = list(des.records())
    return got


def _address(array):
    return array.__array_interface__["data"][0]


def test_a_dropped_batchs_memory_is_reused_and_a_held_ones_never():
    des = RecordDeserializer(codec="arrow")
    rng = np.random.default_rng(1)
    held = []
    for i in range(4):          # every batch held: none reused, none overwritten
        sent = {"k": rng.integers(0, 1 << 60, 40000 + i)}
        held.append((sent, _spanning(des, sent)))
    for sent, got in held:
        assert got["k"].tolist() == sent["k"].tolist()
    assert len({_address(got["k"]) for _, got in held}) == 4
    # the last two kept as spares: once dropped, the next records reuse them
    addresses = {_address(got["k"]) for _, got in held[-2:]}
    held.clear()
    for i in range(6):
        sent = {"k": rng.integers(0, 1 << 60, 40000 - i)}
        got = _spanning(des, sent)
        assert got["k"].tolist() == sent["k"].tolist()
        assert _address(got["k"]) in addresses
        del got


def test_a_view_of_a_batch_keeps_its_memory_from_reuse():
    des = RecordDeserializer(codec="arrow")
    first = {"k": np.arange(50000)}
    view = _spanning(des, first)["k"][10:20]     # the batch dropped, a view kept
    for i in range(4):
        sent = {"k": np.arange(50000) * (i + 2)}
        assert _spanning(des, sent)["k"].tolist() == sent["k"].tolist()
    assert view.tolist() == list(range(10, 20))


# ---- a mapping piece's encoding ----------------------------------------------------------

NUMPY_DTYPES = ["<i8", ">u2", "<f4", "?", "S4", "<U2", "<M8[ms]", ">m8[s]", "<c8"]


@given(st.lists(st.sampled_from(NUMPY_DTYPES), min_size=1, max_size=4),
       st.integers(0, 40), st.sampled_from(["k", "é" * 3, "a b"]))
def test_a_piece_with_its_layout_encodes_as_its_mapping(dtypes, rows, name):
    """NumpyValues (what a BatchWriter emits) writes the bytes that the
    mapping of its names to its arrays would."""
    rng = np.random.default_rng(rows)
    names = [f"{name}{i}" for i in range(len(dtypes))]
    arrays = [np.frombuffer(rng.bytes(2 * rows * np.dtype(d).itemsize), dtype=d)[::2]
              for d in dtypes]
    layout = NumpyLayout(names, [a.dtype for a in arrays])
    want = b"".join(bytes(memoryview(p).cast("B"))
                    for p in encode_parts(dict(zip(names, arrays))))
    got = b"".join(bytes(memoryview(p).cast("B"))
                   for p in encode_parts(NumpyValues(layout, rows, arrays)))
    assert got == want
