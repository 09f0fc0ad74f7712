"""The keyed batch exchange under misuse and hostile input: clear errors
for bad batches and arguments; a malformed piece from a peer is a
CorruptRecordError naming its channel (never a crash, a hang or a large
allocation); backpressure as for records; one thread at a time; numpy
batches without pyarrow."""

import os
import struct
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkbuf import (
    BatchWriter,
    CorruptRecordError,
    InputGate,
    NetworkBufferPool,
    ProducerFailedError,
    RecordWriter,
)
from flinkbuf.io import create_partition
from flinkbuf.serialization.codecs.columns import decode_piece, encode_parts


def payload(record):
    return bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in encode_parts(record)))


@pytest.fixture
def pool():
    with NetworkBufferPool(num_segments=40, segment_size=4096) as nbp:
        yield nbp


# ---- the writer's errors -------------------------------------------------------------

@pytest.mark.parametrize("batch, error, message", [
    ({"v": np.arange(3)}, ValueError,
     "key 'k' names no single column of the batches to exchange \\(v\\)"),
    ({"k": np.arange(3), "v": np.arange(4)}, ValueError,
     "ragged columns: column 'v' has 4 rows, column 'k' 3"),
    ({"k": np.zeros((2, 2))}, ValueError, "column 'k' must be one-dimensional"),
    ({"k": [1, 2]}, TypeError, "column 'k' must be a numpy array, got list"),
    ({"k": np.arange(2).astype("M8[s]")}, TypeError,
     "cannot hash key column 'k' of type datetime64\\[s\\]"),
    ({"k": np.array([(1, 2)], dtype="i4,i4")}, TypeError, "column 'k' has dtype"),
    ({1: np.arange(2)}, TypeError, "column names must be str"),
    ({"k": np.array([object()], dtype=object)}, TypeError, "key column 'k'"),
    (pa.record_batch({"v": [1]}), ValueError, "key 'k' names no single column"),
    (pa.record_batch({"k": pa.array([1], pa.timestamp("s"))}), TypeError,
     "cannot hash key column 'k' of type timestamp\\[s\\]"),
    (pa.record_batch({"k": [1], "d": pa.array(["a"]).dictionary_encode()}), TypeError,
     "column 'd' is dictionary-encoded"),
    ([1, 2], TypeError, "a batch is a pyarrow.RecordBatch or a mapping"),
    ("k", TypeError, "a batch is a pyarrow.RecordBatch or a mapping"),
])
def test_a_bad_batch_is_a_clear_error_and_writes_nothing(pool, batch, error, message):
    part = create_partition(pool, 2)
    gates = [InputGate([(part, j)], codec="arrow") for j in range(2)]
    with BatchWriter(part, "k") as writer:
        with pytest.raises(error, match=message):
            writer.emit(batch)
        assert writer.num_pieces_out == 0
        writer.emit({"k": np.arange(4)})                 # still usable
    assert sum(len(b["k"]) for g in gates for b in g) == 4


def test_batches_of_one_kind_per_writer(pool):
    part = create_partition(pool, 1)
    with BatchWriter(part, "k") as writer:
        writer.emit({"k": np.arange(2)})
        with pytest.raises(TypeError, match="one kind: a pyarrow.RecordBatch after a mapping"):
            writer.emit(pa.record_batch({"k": [1]}))
    assert [len(b["k"]) for b in InputGate([(part, 0)], codec="arrow")] == [2]


@pytest.mark.parametrize("kwargs, error, message", [
    ({}, ValueError, "needs key=COLUMN"),
    ({"key": "k", "selector": "round_robin"}, ValueError, "not both"),
    ({"key": 0}, TypeError, "key must be a column name"),
    ({"selector": "hash"}, ValueError, "does not route whole batches"),
    ({"selector": "global"}, ValueError, "does not route whole batches"),
    ({"selector": lambda r, n: 0}, TypeError, "must route whole batches"),
    ({"key": "k", "max_parallelism": 2}, ValueError, "max_parallelism must be >= 3"),
    ({"key": "k", "max_parallelism": 40000}, ValueError, "max_parallelism must be <= 32768"),
])
def test_bad_arguments_leave_the_partition_free(pool, kwargs, error, message):
    part = create_partition(pool, 3)
    with pytest.raises(error, match=message):
        BatchWriter(part, **kwargs)
    BatchWriter(part, "k").close()                       # no writer was left on it


def test_not_a_partition(pool):
    with pytest.raises(TypeError, match="partition must be a ResultPartition"):
        BatchWriter(pool, "k")


# ---- hostile pieces ------------------------------------------------------------------

def test_a_malformed_piece_is_a_corrupt_record_error_naming_its_channel(pool):
    part = create_partition(pool, 3)
    gate = InputGate([(part, j) for j in range(3)], codec="arrow")
    good = payload({"k": np.arange(3)})
    with RecordWriter(part, lambda record, n: 2 if len(record) < len(good) else 0,
                      codec="bytes") as w:
        w.emit(bytes(good))
        w.emit(bytes(good[:-1]))                         # one byte short
    with pytest.raises(CorruptRecordError, match="input channel 2: corrupt record at stream "
                                                 "offset 0: a malformed column batch"):
        for _ in gate:
            pass


def test_a_piece_over_the_gates_max_record_size_names_its_channel(pool):
    """max_record_size bounds a piece: 200 int64 keys (1600 bytes of
    values) through a gate that takes 1000 bytes a record; 10 pass."""
    part = create_partition(pool, 2)
    gate = InputGate([(part, 0), (part, 1)], codec="arrow", max_record_size=1000)
    keys = np.zeros(200, dtype=np.int64)                  # all to one channel
    with BatchWriter(part, "k") as writer:
        writer.emit({"k": keys[:10]})
        writer.emit({"k": keys})
    assert len(next(gate)["k"]) == 10
    with pytest.raises(CorruptRecordError, match=r"input channel \d: .*exceeds max_record_size"):
        next(gate)


def _head(kind, rows, header, *sections):
    """A payload: its head, ``header`` and each section after its padding."""
    data = bytearray(b"FBC" + bytes([kind]) + struct.pack("<II", rows, len(header)) + header)
    for section in sections:
        data += bytes(-len(data) % 16) + section
    return data


@pytest.mark.parametrize("data, message", [
    (bytearray(b""), "less than its 12-byte head"),
    (bytearray(b"XYZ\x01" + bytes(8)), "wrong magic"),
    (_head(9, 0, b""), "unknown kind 9"),
    (bytearray(b"FBC\x01" + struct.pack("<II", 0, 1000)), "a header of 1000 bytes"),
    (_head(1, 2, struct.pack("<I", 1)), "truncated or garbled header"),
    (_head(1, 2, struct.pack("<IH", 1, 1) + b"k" + b"\x03<V8" + struct.pack("<Q", 16)),
     "dtype '<V8' is not one a batch carries"),
    (_head(1, 2, struct.pack("<IH", 1, 1) + b"k" + b"\x03<i8" + struct.pack("<Q", 2**63)),
     "column 'k' of 9223372036854775808 bytes"),
    (_head(1, 2, struct.pack("<IH", 1, 1) + b"k" + b"\x03<i8" + struct.pack("<Q", 8),
           bytes(8)), "column 'k' has 8 bytes, not 2 values"),
    (_head(1, 2**32 - 1, struct.pack("<IH", 1, 1) + b"o" + b"\x02|O" + struct.pack("<Q", 2),
           b"\x0f\x00"), "object column 'o' does not hold 4294967295 values"),
    (_head(1, 0, struct.pack("<I", 0)) + b"x", "1 bytes after the last column"),
    (_head(1, 0, struct.pack("<IH", 2, 1) + b"k\x03<i8" + bytes(8) + b"\x01\x00k\x03<i8"
           + bytes(8)), "column 'k' twice"),
    (_head(2, 1, b"not a schema"), "malformed Arrow IPC message"),
])
def test_malformed_payloads_are_refused_before_allocating(data, message):
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match=message):
            decode_piece(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def _ipc_piece(batch, *, compression=None, rows=None):
    """A piece of kind IPC holding ``batch``'s record batch message as an
    IPC stream writer makes it (``compression``: its body compressed)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as w:
        w.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()                                     # the schema
    message = reader.read_next_message().serialize().to_pybytes()
    schema = batch.schema.serialize().to_pybytes()
    return _head(3, batch.num_rows if rows is None else rows, schema, message)


def test_ipc_pieces_are_checked():
    batch = pa.record_batch({"s": pa.array(["x", None, "yz"] * 100)})
    assert decode_piece(_ipc_piece(batch)).equals(batch)
    with pytest.raises(CorruptRecordError, match="uncompressed record batch"):
        decode_piece(_ipc_piece(batch, compression="zstd"))
    with pytest.raises(CorruptRecordError, match="300 rows, its head says 7"):
        decode_piece(_ipc_piece(batch, rows=7))


_RECORDS = [
    {"k": np.arange(5), "s": np.array(["a", "bc", "", "d", "e"]),
     "o": np.array([None, "a", b"x", 1, 2.5], dtype=object)},
    pa.record_batch({"k": np.arange(5), "t": pa.array(np.arange(5), pa.timestamp("us"))}),
    pa.record_batch({"k": pa.array([1, None]), "s": pa.array(["x", None])}),
]


@settings(deadline=None, max_examples=300)
@given(st.sampled_from(range(len(_RECORDS))),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
       st.integers(0, 10**6), st.booleans())
def test_mutated_pieces_decode_or_are_refused(which, flips, cut, truncate):
    """Bytes changed, a piece cut short: a batch of one length that
    validates, or CorruptRecordError."""
    data = payload(_RECORDS[which])
    for at, value in flips:
        data[at % len(data)] = value
    if truncate:
        data = data[:cut % (len(data) + 1)]
    try:
        batch = decode_piece(data)
    except CorruptRecordError as exc:
        assert str(exc)
        return
    if isinstance(batch, dict):
        assert len({len(a) for a in batch.values()}) <= 1
    else:
        batch.validate(full=True)


# ---- backpressure and threads --------------------------------------------------------

def _wait_backpressured(writer):
    deadline = time.monotonic() + 30
    while writer.back_pressured_time_ns == 0 and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_slow_consumer_backpressures_the_writer_within_a_bounded_pool():
    """A batch larger than the partition's pool: the writer waits for
    buffers (its back-pressured time grows, every buffer of the pool is
    out) until the consumers read, then every row arrives; a piece spans
    many buffers."""
    with NetworkBufferPool(num_segments=8, segment_size=1024) as nbp:
        part = create_partition(nbp, 2)
        gates = [InputGate([(part, j)], codec="arrow") for j in range(2)]
        writer = BatchWriter(part, "k")
        batch = {"k": np.arange(20_000), "v": np.arange(20_000) * 2}
        done = threading.Event()

        def produce():
            writer.emit(batch)
            writer.close()
            done.set()

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        try:
            _wait_backpressured(writer)
            assert writer.back_pressured_time_ns > 0 and not done.is_set()
            assert part.pool.num_available == 0 and part.pool.num_buffers == 3
            got = [[], []]
            readers = [threading.Thread(target=lambda j=j: got[j].extend(gates[j]),
                                        daemon=True) for j in range(2)]
            for r in readers:
                r.start()
            for r in readers + [t]:
                r.join(60)
            assert done.is_set()
        finally:
            if not done.is_set():
                writer.fail(None)             # a failed check: unblock the producer
            t.join(30)
        rows = np.concatenate([b["k"] for pieces in got for b in pieces])
        assert sorted(rows.tolist()) == list(range(20_000))
        assert writer.record_writer.num_buffers_out > 100 * writer.num_pieces_out


def test_one_thread_at_a_time_and_fail_from_another():
    """A second thread's emit while the first waits for a buffer raises
    RuntimeError; fail() from a third aborts the waiting one."""
    with NetworkBufferPool(num_segments=4, segment_size=1024) as nbp:
        part = create_partition(nbp, 1)
        gate = InputGate([(part, 0)], codec="arrow")
        writer = BatchWriter(part, "k")
        errors = []

        def produce():
            try:
                writer.emit({"k": np.arange(10_000)})
            except BaseException as exc:      # noqa: BLE001 - checked below
                errors.append(exc)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        _wait_backpressured(writer)
        with pytest.raises(RuntimeError, match="in use by another thread"):
            writer.emit({"k": np.arange(3)})
        failer = threading.Thread(target=writer.fail, args=(ValueError("stop"),))
        failer.start()
        failer.join(30)
        t.join(30)
        assert not t.is_alive() and len(errors) == 1
        with pytest.raises(ProducerFailedError):
            list(gate)


def test_numpy_batches_need_no_pyarrow():
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "import threading, numpy as np\n"
        "from flinkbuf import BatchWriter, InputGate, NetworkBufferPool\n"
        "from flinkbuf.io import create_partition\n"
        "with NetworkBufferPool(num_segments=16, segment_size=4096) as nbp:\n"
        "    part = create_partition(nbp, 2)\n"
        "    gates = [InputGate([(part, j)], codec='arrow') for j in range(2)]\n"
        "    got = []\n"
        "    ts = [threading.Thread(target=lambda g=g: got.extend(g)) for g in gates]\n"
        "    [t.start() for t in ts]\n"
        "    with BatchWriter(part, 'k') as w:\n"
        "        w.emit({'k': np.array(['a', 'b', 'c'] * 100), 'v': np.arange(300)})\n"
        "    [t.join() for t in ts]\n"
        "    assert sorted(np.concatenate([b['v'] for b in got]).tolist()) == list(range(300))\n"
        "    assert 'pyarrow' not in sys.modules or sys.modules['pyarrow'] is None\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


REGRESSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz",
                           "regressions", "columns")


@pytest.mark.parametrize("name", sorted(os.listdir(REGRESSIONS)))
def test_fuzz_regressions_decode_or_are_refused(name):
    """The inputs under fuzz/regressions/columns, as fuzz/fuzz_columns.py
    reads them: CorruptRecordError (each was once another exception)."""
    with open(os.path.join(REGRESSIONS, name), "rb") as f:
        data = bytearray(f.read())
    with pytest.raises(CorruptRecordError):
        decode_piece(data)
