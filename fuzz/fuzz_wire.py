#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the wire decoder of
connections (csrc/network/wire.c), without sockets.

An input's first two bytes choose the segment size the decoder checks
buffers against; the rest is a byte stream from a peer.  The only acceptable
outcomes are whole frames (and a count of the bytes they took) or a
ValueError with a reason; anything else (another exception, a crash, a hang,
a sanitizer report) is a finding.  The stream is also decoded cut at every
frame boundary and at a point the input chooses: the frames before the cut
must come out the same.  Decoded frames are re-encoded, and the bytes must
decode to the same frames.

Loading, seeding and coverage: fuzz/harness.py.

Usage: python fuzz/fuzz_wire.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import atheris

import harness

wire_decode = wire_encode = None


@atheris.instrument_func
def one_input(data: bytes):
    global wire_decode, wire_encode
    if wire_decode is None:
        testing = harness.import_flinkbuf()._testing
        wire_decode, wire_encode = testing.wire_decode, testing.wire_encode
    if len(data) < 3:
        return
    segment_size = 1 + int.from_bytes(data[:2], "big") * 16
    cut = data[2]
    stream = data[3:]
    try:
        frames, used = wire_decode(stream, segment_size)
    except ValueError as e:
        if not str(e):
            raise AssertionError("a refusal without a reason") from None
        return
    if not 0 <= used <= len(stream):
        raise AssertionError(f"used {used} of {len(stream)} bytes")
    # a prefix of the stream: the frames that fit in it, and waits for more
    prefix = stream[:len(stream) * cut // 255]
    head, head_used = wire_decode(prefix, segment_size)
    if head != frames[:len(head)] or head_used > len(prefix):
        raise AssertionError("a cut stream decoded differently")
    again = b"".join(wire_encode(f) for f in frames)
    if wire_decode(again, segment_size) != (frames, len(again)):
        raise AssertionError("re-encoded frames decoded differently")


def seeds():
    encode = harness.import_flinkbuf()._testing.wire_encode
    samples = [("buffer", 3, 7, 2, 0, b"payload"), ("buffer", 3, 8, 0, 1, b"\x00"),
               ("error", 4, 2, b"PartitionNotFoundError", b"no such partition"),
               ("error", 0xFFFFFFFF, 4, b"ProtocolError", b"bad"),
               ("request", 5, 1, 2, b"part-1"), ("cancel", 6), ("close",),
               ("credit", 7, 3), ("event_credit", 8, 16), ("lent", 9, 10, 3, 16, 42),
               ("release", [42]), ("release", [0, 7, 0xFFFFFFFF]),
               ("buffer_size", 7, 64), ("buffer_size", 7, 257)]
    out = []
    for s in samples:
        out.append(b"\x00\x10\xff" + encode(s))
    # the smallest and largest buffer sizes of other segment sizes, and the
    # sizes just outside them
    for head, size in ((b"\x00\x00", 1), (b"\x00\x00", 2), (b"\x00\x03", 49),
                       (b"\x00\x03", 48), (b"\x00\x04", 64), (b"\x00\x04", 63),
                       (b"\x08\x00", 32769), (b"\x08\x00", 32770)):
        out.append(head + b"\xff" + encode(("buffer_size", 7, size)))
    out.append(b"\x00\x10\x80" + b"".join(encode(s) for s in samples))
    return out


if __name__ == "__main__":
    harness.main(one_input, seeds)
