#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the decoder of the
``arrow`` codec's records, pieces of column batches
(flinkbuf/serialization/codecs/columns.py), without I/O.

An input is a record's payload from a peer.  The only acceptable outcomes
are a batch (a dict of one-dimensional numpy arrays of one length, or a
pyarrow RecordBatch that passes its own full validation) or a
CorruptRecordError with a reason; anything else (another exception, a
crash, a hang, a sanitizer report, a large allocation) is a finding.

Loading, seeding and coverage: fuzz/harness.py.

Usage: python fuzz/fuzz_columns.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import atheris

import harness

import numpy as np
import pyarrow as pa

decode_piece = CorruptRecordError = None


@atheris.instrument_func
def one_input(data: bytes):
    global decode_piece, CorruptRecordError
    if decode_piece is None:
        fb = harness.import_flinkbuf()
        from flinkbuf.serialization.codecs.columns import decode_piece
        CorruptRecordError = fb.CorruptRecordError
    try:
        batch = decode_piece(bytearray(data))
    except CorruptRecordError as e:
        if not str(e):
            raise AssertionError("a refusal without a reason") from None
        return
    if isinstance(batch, dict):
        lengths = {len(a) for a in batch.values()}
        if len(lengths) > 1 or any(a.ndim != 1 for a in batch.values()):
            raise AssertionError(f"ragged or not 1-D columns: {lengths}")
        for a in batch.values():
            if a.dtype.kind != "O" and a.nbytes > len(data):
                raise AssertionError("a column larger than its record")
    elif isinstance(batch, pa.RecordBatch):
        batch.validate(full=True)
        if batch.nbytes > 2 * len(data) + 4096:
            raise AssertionError(f"a batch of {batch.nbytes} bytes from {len(data)}")
    else:
        raise AssertionError(f"decoded a {type(batch).__name__}")


def seeds():
    harness.import_flinkbuf()
    from flinkbuf.serialization.codecs.columns import encode_parts

    def payload(record):
        return b"".join(bytes(memoryview(p).cast("B")) for p in encode_parts(record))

    ints = np.arange(5, dtype=np.int64)
    records = [
        {"k": ints, "v": ints * 1.5},
        {"s": np.array(["a", "bc", ""]), "b": np.array([b"x", b"", b"yz"]),
         "o": np.array([None, "a", b"b"], dtype=object)},
        {"t": ints.astype("M8[ns]"), "f": np.array([True, False, True, True, False])},
        {},
        pa.record_batch({"k": ints, "t": pa.array(ints, pa.timestamp("us"))}),
        pa.record_batch({"k": pa.array([1, None, 3]), "s": pa.array(["x", None, "zz"])}),
        pa.record_batch({"l": pa.array([[1], [], [2, 3]])}),
    ]
    return [payload(r) for r in records]


if __name__ == "__main__":
    harness.main(one_input, seeds)
