#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the record
deserializer and the typed codec.

Each input is a byte stream fed to a RecordDeserializer in chunks whose
sizes come from the input's first bytes, and also decoded whole as one
typed payload.  The only acceptable outcomes are records or
CorruptRecordError; anything else (another exception, a crash, a hang, a
sanitizer report) is a finding.  Every value decoded is re-encoded and must
decode to the same bytes again.

Coverage: the harness and flinkbuf's Python code are instrumented by
atheris.  The Cython/C code gives coverage feedback only when it is compiled
with clang's ``-fsanitize-coverage``: fuzz/run.sh builds such a copy of
the extensions and points FLINKBUF_FUZZ_NATIVE at it (else it says so and
fuzzes with Python-level coverage only).

Usage: python fuzz/fuzz_deserializer.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import os
import sys

import atheris

NATIVE = os.environ.get("FLINKBUF_FUZZ_NATIVE")
SEEDING = "--write-seeds" in sys.argv
if NATIVE and not SEEDING:
    sys.path.insert(0, NATIVE)


fb = decode = encode = None


def export_libfuzzer():
    """atheris loads its libFuzzer (when fuzzing starts) with local symbols;
    make them global so that the instrumented extensions find its coverage
    hooks when they are imported."""
    import ctypes
    import glob
    for lib in glob.glob(os.path.join(os.path.dirname(atheris.__file__), "core_*libfuzzer*.so")):
        try:
            ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NOLOAD)
        except OSError:
            pass                                     # that one is not loaded


def import_flinkbuf():
    global fb, decode, encode
    with atheris.instrument_imports(include=["flinkbuf"]):
        import flinkbuf
        from flinkbuf import serialization as _serialization
    fb, decode, encode = flinkbuf, _serialization.decode, _serialization.encode
    if NATIVE and not SEEDING and not os.path.abspath(fb.__file__).startswith(
            os.path.abspath(NATIVE)):
        raise SystemExit(f"fuzz: expected the instrumented flinkbuf in {NATIVE}, "
                         f"got {fb.__file__}")

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
        export_libfuzzer()
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


def main():
    if SEEDING:
        import_flinkbuf()
        d = sys.argv[sys.argv.index("--write-seeds") + 1]
        os.makedirs(d, exist_ok=True)
        for i, s in enumerate(seeds()):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(s)
        return
    if not NATIVE:
        import_flinkbuf()
    # With native coverage, flinkbuf is imported by the first input: only then
    # is atheris' libFuzzer loaded, whose coverage hooks the instrumented
    # extensions link to.
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
