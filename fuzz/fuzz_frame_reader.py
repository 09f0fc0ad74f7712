#!/usr/bin/env python
"""Coverage-guided fuzz target (atheris / libFuzzer) for the frame reader of
connections (csrc/network/frame_reader.c), without sockets.

An input chooses the segment size the reader checks buffers against (two
bytes), the points where the byte stream is cut (a count byte, then two
bytes each: the reader gets the stream in those chunks, as a socket gives
what has arrived, and must resume anywhere), and a receiver id whose
buffers' bodies are dropped as they come (a byte: a channel that ended);
the rest is the byte stream from a peer.  The reader must read exactly
what the wire decoder reads from the whole stream at once: the same whole
frames (a dropped body has no payload), the same refusal with the same
reason, and a stream that stops inside a frame said to stop inside one.
Anything else (another exception, a crash, a hang, a sanitizer report) is
a finding.

Loading, seeding and coverage: fuzz/harness.py.

Usage: python fuzz/fuzz_frame_reader.py [CORPUS_DIR...] [-runs=N] [libFuzzer flags]
(fuzz/run.sh seeds a corpus and runs the CI budget.)
"""

import atheris

import harness

testing = None


def split(data):
    """(segment_size, cuts, skip, stream) of an input, or None."""
    if len(data) < 4:
        return None
    segment_size = 1 + int.from_bytes(data[:2], "big") * 16
    ncuts = data[2] % 8
    head = 3 + 2 * ncuts
    if len(data) < head + 1:
        return None
    cuts = [int.from_bytes(data[3 + 2 * k:5 + 2 * k], "big") for k in range(ncuts)]
    return segment_size, cuts, data[head], data[head + 1:]


def expected(frames, skip):
    """The wire decoder's frames as the reader gives them (a dropped body:
    payload None)."""
    return [(*f[:5], None) if f[0] == "buffer" and f[1] == skip else f for f in frames]


@atheris.instrument_func
def one_input(data: bytes):
    global testing
    if testing is None:
        testing = harness.import_flinkbuf()._testing
    parts = split(data)
    if parts is None:
        return
    segment_size, cuts, skip, stream = parts
    try:
        frames, used = testing.wire_decode(stream, segment_size)
    except ValueError as e:
        try:
            testing.frame_read(stream, segment_size, cuts, [skip])
        except ValueError as got:
            if str(got) != str(e):
                raise AssertionError(f"refused for {got!r}, the decoder for {e!r}") from None
            return
        raise AssertionError(f"the reader took what the decoder refused: {e}") from None
    got, mid = testing.frame_read(stream, segment_size, cuts, [skip])
    if got != expected(frames, skip):
        raise AssertionError("the reader read other frames than the decoder")
    if mid != (used < len(stream)):
        raise AssertionError(f"mid-frame {mid}, but {len(stream) - used} bytes of a frame")


def seeds():
    encode = harness.import_flinkbuf()._testing.wire_encode
    samples = [("buffer", 3, 7, 2, 0, b"payload" * 40), ("buffer", 3, 8, 0, 1, b"\x00"),
               ("error", 4, 2, b"PartitionNotFoundError", b"no such partition"),
               ("request", 5, 1, 2, b"part-1"), ("cancel", 6), ("close",),
               ("credit", 7, 3), ("event_credit", 8, 16), ("lent", 9, 10, 3, 16, 42),
               ("release", [42]), ("heartbeat", 1), ("heartbeat_response", 1),
               ("buffer_size", 9, 64), ("buffer_size", 9, 513)]
    stream = b"".join(encode(s) for s in samples)
    out = []
    for cuts in ([], [1], [9, 10, 26], [len(stream) // 2]):
        head = b"\x00\x20" + bytes([len(cuts)]) + b"".join(c.to_bytes(2, "big") for c in cuts)
        out.append(head + b"\x03" + stream)
    out.append(b"\x00\x20\x01\x00\x05\x00" + stream[:40])
    return out


if __name__ == "__main__":
    harness.main(one_input, seeds)
