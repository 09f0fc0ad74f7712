#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the record
deserializer and the typed codec.

Each input is a byte stream fed to a RecordDeserializer in chunks whose
sizes come from the input's first bytes, and also decoded whole as one
typed payload.  The only acceptable outcomes are records or
CorruptRecordError; anything else (another exception, a crash, a hang, a
sanitizer report) is a finding.  Every value decoded is re-encoded and must
decode to the same bytes again.

Usage: python fuzz/fuzz_deserializer.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import os
import sys

import atheris

with atheris.instrument_imports(include=["flinkbuf"]):
    import flinkbuf as fb
    from flinkbuf._serialization import decode, encode

MAX_RECORD = 1 << 16


def check_round_trip(value):
    try:
        wire = encode(value)
    except (TypeError, ValueError):
        # a decoded dict key of a type that cannot be encoded cannot exist;
        # only values nested exactly at the cap may be refused
        return
    again = encode(decode(wire))
    if again != wire:
        raise AssertionError(f"re-encoding changed the bytes: {wire!r} -> {again!r}")


def one_input(data: bytes):
    if not data:
        return
    mode = data[0]
    body = data[1:]
    # 1. the whole input as one typed payload
    try:
        value = decode(body)
    except fb.CorruptRecordError:
        pass
    else:
        check_round_trip(value)
    # 2. the input as a record stream, re-chunked
    codec = ("typed", "typed", "typed", "bytes")[mode & 3]
    step = 1 + (mode >> 2)
    des = fb.RecordDeserializer(codec, max_record_size=MAX_RECORD)
    try:
        for i in range(0, len(body), step):
            des.feed(body[i:i + step])
            for rec in des.records():
                if codec == "typed":
                    check_round_trip(rec)
        des.finish()
        list(des.records())
    except fb.CorruptRecordError:
        pass


def seeds():
    """Valid streams and payloads to start from."""
    import numpy as np
    samples = [None, True, 0, -1, 300, 2**70, 1.5, "", "héllo", b"\x00\x01", (1, "a"), [None, [2.5]],
               {"k": (1, 2), 3: b"v"}, np.arange(6, dtype="<i4").reshape(2, 3),
               np.array(["ab"]), list(range(300)), "x" * 300]
    out = []
    for v in samples:
        payload = encode(v)
        out.append(b"\x00" + payload)
        out.append(bytes([4]) + len(payload).to_bytes(4, "big") + payload)
    stream = b"".join(len(encode(v)).to_bytes(4, "big") + encode(v) for v in samples)
    out.append(b"\x08" + stream)
    return out


def main():
    if "--write-seeds" in sys.argv:
        d = sys.argv[sys.argv.index("--write-seeds") + 1]
        os.makedirs(d, exist_ok=True)
        for i, s in enumerate(seeds()):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(s)
        return
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
