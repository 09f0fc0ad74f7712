#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the record
deserializer and the typed codec.

Each input is a byte stream fed to a RecordDeserializer in chunks whose
sizes come from the input's first bytes, and also decoded whole as one
typed payload.  The only acceptable outcomes are records or
CorruptRecordError; anything else (another exception, a crash, a hang, a
sanitizer report) is a finding.  Every value decoded is re-encoded and must
decode to the same bytes again.

Loading, seeding and coverage: fuzz/harness.py.

Usage: python fuzz/fuzz_deserializer.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import atheris

import harness

fb = decode = encode = None


def import_flinkbuf():
    global fb, decode, encode
    fb = harness.import_flinkbuf()
    decode, encode = fb.serialization.decode, fb.serialization.encode


MAX_RECORD = 1 << 16


@atheris.instrument_func
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


@atheris.instrument_func
def one_input(data: bytes):
    if fb is None:
        import_flinkbuf()
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


def flood_payloads():
    """Dicts whose keys collide in CPython's hash table (the hashes of int,
    float and tuple keys are not salted): of one hash value beyond the limit,
    at it, and distinct hashes whose probe sequences keep meeting."""
    p = 2**61 - 1                                   # hash(i * p) == 0

    def dict_of(keys):
        return b"\x11" + bytes([len(keys)]) + b"".join(encode(k) + b"\x00" for k in keys)
    return [dict_of([i * p for i in range(12)]),
            dict_of([2.0 ** (5 - 61 * j) for j in range(10)] + [32 + p]),
            dict_of([(i * p, "t") for i in range(10)]),
            dict_of([-1, -2] + [i * p for i in range(1, 8)] + [True, None, 1.0]),
            encode(dict.fromkeys([i << 24 for i in range(300)], 0))]


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
    for payload in flood_payloads():
        out.append(b"\x00" + payload)
        out.append(bytes([4]) + len(payload).to_bytes(4, "big") + payload)
    stream = b"".join(len(encode(v)).to_bytes(4, "big") + encode(v) for v in samples)
    out.append(b"\x08" + stream)
    return out


def seeds_with_flinkbuf():
    import_flinkbuf()
    return seeds()


if __name__ == "__main__":
    harness.main(one_input, seeds_with_flinkbuf)
