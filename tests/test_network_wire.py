"""The wire format's decoder and encoders on their own, without sockets
(docs/PROTOCOL.md): every message, every class of malformed input, and
round trips of arbitrary frames and byte streams."""

import struct

import pytest
from hypothesis import given, strategies as st

from flinkbuf import _testing as t

MAGIC = 0x46425546
SEGMENT = 256
U32 = st.integers(0, 2**32 - 1)
ID = st.integers(0, 2**32 - 2)            # 0xFFFFFFFF is the connection-wide id
POSITIVE = st.integers(1, 2**31 - 1)


def frame(msg, body, length=None, magic=MAGIC):
    """A frame built by hand (not by the encoders under test)."""
    return struct.pack(">IIB", 9 + len(body) if length is None else length, magic, msg) + body


def buffer_body(rid, seq, backlog, kind, payload, size=None):
    return struct.pack(">IIIBI", rid, seq, backlog, kind,
                       len(payload) if size is None else size) + payload


def error_body(rid, code, type_name, message):
    return (struct.pack(">IBH", rid, code, len(type_name)) + type_name
            + struct.pack(">I", len(message)) + message)


def request_body(rid, sub, credit, pid):
    return struct.pack(">IIIH", rid, sub, credit, len(pid)) + pid


def lent_body(rid, seq, backlog, kind, size, segment):
    return struct.pack(">IIIBII", rid, seq, backlog, kind, size, segment)


def release_body(segments, count=None, rid=0xFFFFFFFF):
    return struct.pack(">II", rid, len(segments) if count is None else count) + b"".join(
        struct.pack(">I", s) for s in segments)


# Each message as a tuple, and its bytes built by hand.
MESSAGES = [
    (("buffer", 3, 7, 2, 0, b"payload"), frame(0, buffer_body(3, 7, 2, 0, b"payload"))),
    (("buffer", 3, 8, 0, 1, b"\x00"), frame(0, buffer_body(3, 8, 0, 1, b"\x00"))),
    (("buffer", 3, 9, 0, 1, b""), frame(0, buffer_body(3, 9, 0, 1, b""))),
    (("error", 4, 2, b"PartitionNotFoundError", b"no such partition"),
     frame(1, error_body(4, 2, b"PartitionNotFoundError", b"no such partition"))),
    (("error", 0xFFFFFFFF, 4, b"", b""), frame(1, error_body(0xFFFFFFFF, 4, b"", b""))),
    (("request", 5, 1, 2, b"part-1"), frame(2, request_body(5, 1, 2, b"part-1"))),
    (("request", 0, 0, 0, b""), frame(2, request_body(0, 0, 0, b""))),
    (("cancel", 6), frame(4, struct.pack(">I", 6))),
    (("close",), frame(5, b"")),
    (("credit", 7, 3), frame(6, struct.pack(">II", 7, 3))),
    (("event_credit", 8, 16), frame(7, struct.pack(">II", 8, 16))),
    (("lent", 9, 10, 3, 100, 42), frame(8, lent_body(9, 10, 3, 0, 100, 42))),
    (("release", [42, 0, 0xFFFFFFFF]), frame(9, release_body([42, 0, 0xFFFFFFFF]))),
    (("buffer_size", 11, 200), frame(10, struct.pack(">II", 11, 200))),
]


def test_a_lent_buffer_and_a_release_byte_by_byte():
    """The bytes of one BUFFER_LENT and one RELEASE, written out rather than
    packed: the field order and widths of docs/PROTOCOL.md."""
    assert t.wire_encode(("lent", 9, 10, 3, 100, 42)) == bytes.fromhex(
        "0000001e" "46425546" "08"            # length 30, magic, id 8
        "00000009" "0000000a" "00000003"      # receiver, sequence, backlog
        "00" "00000064" "0000002a")           # data type, size, segment
    assert t.wire_encode(("release", [42, 7])) == bytes.fromhex(
        "00000019" "46425546" "09"            # length 25, magic, id 9
        "ffffffff" "00000002"                 # the connection-wide id, count
        "0000002a" "00000007")                # the segments


def test_a_new_buffer_size_byte_by_byte():
    assert t.wire_encode(("buffer_size", 9, 4096)) == bytes.fromhex(
        "00000011" "46425546" "0a"            # length 17, magic, id 10
        "00000009" "00001000")                # receiver, size


@pytest.mark.parametrize("segment, smallest", [(SEGMENT, 64), (32768, 64), (64, 64), (63, 63),
                                               (16, 16), (1, 1)])
def test_a_buffer_size_from_64_or_a_smaller_segment_to_the_segment_passes(segment, smallest):
    """The smallest size a consumer may announce is 64 bytes, or the
    segment size when segments are smaller; the largest, a segment."""
    for size in (smallest, segment):
        wire = frame(10, struct.pack(">II", 3, size))
        assert t.wire_decode(wire, segment) == ([("buffer_size", 3, size)], 17)
    for size in (smallest - 1, segment + 1):
        with pytest.raises(ValueError, match=rf"^buffer size {size} outside "
                                             rf"{smallest}\.\.{segment}$"):
            t.wire_decode(frame(10, struct.pack(">II", 3, size)), segment)
    assert t.MIN_BUFFER_SIZE == 64


@pytest.mark.parametrize("message, wire", MESSAGES, ids=[m[0] for m, _ in MESSAGES])
def test_every_message_encodes_to_its_bytes_and_decodes_back(message, wire):
    assert t.wire_encode(message) == wire
    assert t.wire_decode(wire, SEGMENT) == ([message], len(wire))


def test_a_stream_of_every_message_decodes_in_order():
    stream = b"".join(w for _, w in MESSAGES)
    assert t.wire_decode(stream, SEGMENT) == ([m for m, _ in MESSAGES], len(stream))


def test_a_lent_buffer_as_large_as_a_segment_passes_and_one_byte_more_does_not():
    full = frame(8, lent_body(1, 0, 0, 0, SEGMENT, 5))
    assert t.wire_decode(full, SEGMENT) == ([("lent", 1, 0, 0, SEGMENT, 5)], len(full))
    with pytest.raises(ValueError, match=r"^a lent buffer of 257 bytes \(segment size 256\)"):
        t.wire_decode(frame(8, lent_body(1, 0, 0, 0, SEGMENT + 1, 5)), SEGMENT)
    with pytest.raises(ValueError, match=r"^a lent buffer of 1 bytes \(segment size 0\)"):
        t.wire_decode(frame(8, lent_body(1, 0, 0, 0, 1, 5)), 0)


def test_a_release_of_the_most_segments_passes_and_one_more_does_not():
    segments = list(range(1024))
    full = frame(9, release_body(segments))
    assert len(full) == 9 + 8 + 4 * 1024
    assert t.wire_encode(("release", segments)) == full
    assert t.wire_decode(full, SEGMENT) == ([("release", segments)], len(full))
    with pytest.raises(ValueError, match=r"^release frame of 4117 bytes"):
        t.wire_decode(frame(9, release_body(segments + [1024])), SEGMENT)
    with pytest.raises(ValueError, match="segments"):
        t.wire_encode(("release", segments + [1024]))
    with pytest.raises(ValueError, match="segments"):
        t.wire_encode(("release", []))


@pytest.mark.parametrize("msg, body, fields", [
    (0, buffer_body(1, 2, 0x80000005, 0, b"x"), ("buffer", 1, 2, 5, 0, b"x")),
    (8, lent_body(1, 2, 0x80000005, 0, 1, 3), ("lent", 1, 2, 5, 1, 3)),
    (8, lent_body(1, 2, 0xFFFFFFFF, 0, 1, 3), ("lent", 1, 2, 2**31 - 1, 1, 3)),
])
def test_a_backlog_past_2_31_loses_its_top_bit_in_a_lent_buffer_as_in_a_buffer(msg, body,
                                                                              fields):
    """A backlog is a signed count on this side: its top bit is dropped, not
    refused, the same for BUFFER_LENT as for BUFFER_RESPONSE."""
    assert t.wire_decode(frame(msg, body), SEGMENT) == ([fields], 9 + len(body))


def test_a_buffer_as_large_as_a_segment_passes_and_one_byte_more_does_not():
    full = frame(0, buffer_body(1, 0, 0, 0, b"x" * SEGMENT))
    assert t.wire_decode(full, SEGMENT)[1] == len(full)
    with pytest.raises(ValueError, match=r"buffer response frame of 283 bytes \(segment size 256\)"):
        t.wire_decode(frame(0, buffer_body(1, 0, 0, 0, b"x" * (SEGMENT + 1))), SEGMENT)


# Every class of malformed input, with the reason a connection gives.
MALFORMED = {
    "wrong magic": (frame(6, struct.pack(">II", 1, 1), magic=0x46425547),
                    "wrong magic number 0x46425547"),
    "length below the header": (frame(5, b"", length=8), "frame length 8"),
    "length zero": (frame(5, b"", length=0), "frame length 0"),
    "unknown message id": (frame(3, b""), "unknown message id 3"),
    "message id 255": (frame(255, b"abcd"), "unknown message id 255"),
    "buffer shorter than its fields": (frame(0, b"\x00" * 16),
                                      "buffer response frame of 25 bytes"),
    "buffer size field too large": (frame(0, buffer_body(1, 0, 0, 0, b"ab", size=3)),
                                    "buffer response of 3 bytes in a frame for 2"),
    "buffer size field too small": (frame(0, buffer_body(1, 0, 0, 0, b"ab", size=1)),
                                    "buffer response of 1 bytes in a frame for 2"),
    "buffer of unknown data type": (frame(0, buffer_body(1, 0, 0, 2, b"ab")),
                                    "unknown buffer data type 2"),
    "empty data buffer": (frame(0, buffer_body(1, 0, 0, 0, b"")), "an empty data buffer"),
    "error shorter than its fields": (frame(1, b"\x00" * 10), "error response frame of 19 bytes"),
    "error frame over 64 KiB": (frame(1, error_body(1, 1, b"", b"m" * 65517)),
                                "error response frame of 65537 bytes"),
    "error type name past the frame": (frame(1, struct.pack(">IBH", 1, 1, 200) + b"\x00" * 4),
                                       "malformed error response"),
    "error message past the frame": (frame(1, struct.pack(">IBH", 1, 1, 0)
                                           + struct.pack(">I", 5) + b"abc"),
                                     "malformed error response"),
    "error with bytes after the message": (frame(1, error_body(1, 1, b"T", b"m") + b"x"),
                                           "malformed error response"),
    "request shorter than its fields": (frame(2, b"\x00" * 13),
                                        "partition request frame of 22 bytes"),
    "request id over the cap": (frame(2, request_body(1, 0, 1, b"p" * 1025)),
                                "partition request frame of 1048 bytes"),
    "request id length past the frame": (frame(2, struct.pack(">IIIH", 1, 0, 1, 5) + b"abc"),
                                         "malformed partition request"),
    "request with the connection-wide id": (frame(2, request_body(0xFFFFFFFF, 0, 1, b"p")),
                                            "receiver id 0xffffffff is reserved"),
    "request with credit over 2**31-1": (frame(2, request_body(1, 0, 2**31, b"p")),
                                         "initial credit 2147483648"),
    "cancel of 8 bytes": (frame(4, b"\x00" * 8), "frame of 17 bytes for message 4"),
    "credit of 4 bytes": (frame(6, b"\x00" * 4), "frame of 13 bytes for message 6"),
    "event credit of 9 bytes": (frame(7, b"\x00" * 9), "frame of 18 bytes for message 7"),
    "credit of zero": (frame(6, struct.pack(">II", 1, 0)), "credit of 0"),
    "credit over 2**31-1": (frame(6, struct.pack(">II", 1, 2**31)), "credit of 2147483648"),
    "event credit of zero": (frame(7, struct.pack(">II", 1, 0)), "credit of 0"),
    "close with a body": (frame(5, b"x"), "close request of 10 bytes"),
    "lent event": (frame(8, lent_body(1, 0, 0, 1, 10, 5)),
                   "a lent buffer of data type 1 (only data buffers are lent)"),
    "lent of unknown data type": (frame(8, lent_body(1, 0, 0, 7, 10, 5)),
                                  "a lent buffer of data type 7"),
    "lent larger than a segment": (frame(8, lent_body(1, 0, 0, 0, SEGMENT + 1, 5)),
                                   "a lent buffer of 257 bytes (segment size 256)"),
    "lent of 2**32-1 bytes": (frame(8, lent_body(1, 0, 0, 0, 2**32 - 1, 5)),
                              "a lent buffer of 4294967295 bytes"),
    "lent empty": (frame(8, lent_body(1, 0, 0, 0, 0, 5)), "an empty data buffer"),
    "lent shorter than its fields": (frame(8, lent_body(1, 0, 0, 0, 10, 5)[:20]),
                                     "buffer lent frame of 29 bytes"),
    "lent with a byte more": (frame(8, lent_body(1, 0, 0, 0, 10, 5) + b"x"),
                              "buffer lent frame of 31 bytes"),
    "lent with its payload": (frame(8, lent_body(1, 0, 0, 0, 3, 5) + b"abc"),
                              "buffer lent frame of 33 bytes"),
    "release of no segment": (frame(9, release_body([])), "a release of 0 segments"),
    "release of 1025 segments": (frame(9, release_body([1], count=1025)),
                                 "a release of 1025 segments"),
    "release of 2**32-1 segments": (frame(9, release_body([1], count=2**32 - 1)),
                                    "a release of 4294967295 segments"),
    "release over the cap": (frame(9, release_body(list(range(1025)))),
                             "release frame of 4117 bytes"),
    "release shorter than its fields": (frame(9, struct.pack(">IH", 0xFFFFFFFF, 1)),
                                        "release frame of 15 bytes"),
    "release with a segment more": (frame(9, release_body([1, 2, 3], count=2)),
                                    "a release of 2 segments in a body of 20 bytes"),
    "release with a segment less": (frame(9, release_body([1, 2], count=3)),
                                    "a release of 3 segments in a body of 16 bytes"),
    "release with a partial segment": (frame(9, release_body([1]) + b"\x00\x00"),
                                       "a release of 1 segments in a body of 14 bytes"),
    "release for a channel": (frame(9, release_body([1], rid=5)),
                              "a release for receiver id 0x00000005"),
    "release for receiver id 0": (frame(9, release_body([1], rid=0)),
                                  "a release for receiver id 0x00000000"),
    "buffer size 0": (frame(10, struct.pack(">II", 1, 0)), "buffer size 0 outside 64..256"),
    "buffer size 1": (frame(10, struct.pack(">II", 1, 1)), "buffer size 1 outside 64..256"),
    "buffer size 63": (frame(10, struct.pack(">II", 1, 63)), "buffer size 63 outside 64..256"),
    "buffer size past a segment": (frame(10, struct.pack(">II", 1, SEGMENT + 1)),
                                   "buffer size 257 outside 64..256"),
    "buffer size 2**31": (frame(10, struct.pack(">II", 1, 2**31)),
                          "buffer size 2147483648 outside 64..256"),
    "buffer size 2**32-1": (frame(10, struct.pack(">II", 1, 2**32 - 1)),
                            "buffer size 4294967295 outside 64..256"),
    "buffer size without its size": (frame(10, struct.pack(">I", 1)),
                                     "new buffer size frame of 13 bytes"),
    "buffer size with a byte more": (frame(10, struct.pack(">II", 1, 100) + b"x"),
                                     "new buffer size frame of 18 bytes"),
    "buffer size empty": (frame(10, b""), "new buffer size frame of 9 bytes"),
    "buffer size huge length": (frame(10, struct.pack(">II", 1, 100), length=0xFFFFFFFF),
                                "new buffer size frame of 4294967295 bytes"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_malformed_frame_is_refused_with_its_reason(case):
    wire, reason = MALFORMED[case]
    with pytest.raises(ValueError) as info:
        t.wire_decode(wire, SEGMENT)
    assert str(info.value).startswith(reason)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_frame_after_good_ones_is_refused_too(case):
    wire, reason = MALFORMED[case]
    with pytest.raises(ValueError, match="^" + reason.replace("(", r"\(").replace(")", r"\)")):
        t.wire_decode(MESSAGES[0][1] + MESSAGES[-1][1] + wire, SEGMENT)


def test_a_header_is_judged_before_its_body_arrives():
    """A frame too long for its message is refused from its header alone: a
    peer cannot make the receiver wait for (or stage) a body it would refuse."""
    for wire, _ in (MALFORMED["error frame over 64 KiB"], MALFORMED["request id over the cap"],
                    MALFORMED["wrong magic"], MALFORMED["unknown message id"],
                    MALFORMED["release over the cap"], MALFORMED["lent with a byte more"],
                    MALFORMED["lent shorter than its fields"],
                    MALFORMED["buffer size with a byte more"],
                    MALFORMED["buffer size huge length"]):
        with pytest.raises(ValueError):
            t.wire_decode(wire[:9], SEGMENT)


@pytest.mark.parametrize("message", [("lent", 1, 2, 3, 4, 5), ("release", [7]),
                                     ("release", list(range(1024))), ("buffer_size", 1, 64)],
                         ids=["lent", "release", "release-1024", "buffer-size"])
def test_a_truncated_lent_release_or_buffer_size_waits_for_the_rest(message):
    """Every proper prefix of a good frame is "more", not a violation."""
    wire = t.wire_encode(message)
    for cut in range(len(wire)):
        assert t.wire_decode(wire[:cut], SEGMENT) == ([], 0), cut
    assert t.wire_decode(wire, SEGMENT) == ([message], len(wire))


frames = st.one_of(
    st.tuples(st.just("buffer"), ID, U32, st.integers(0, 2**31 - 1), st.just(0),
              st.binary(min_size=1, max_size=SEGMENT)),
    st.tuples(st.just("buffer"), ID, U32, st.integers(0, 2**31 - 1), st.just(1),
              st.binary(max_size=SEGMENT)),
    st.tuples(st.just("error"), U32, st.integers(0, 255), st.binary(max_size=127),
              st.binary(max_size=4095)),
    st.tuples(st.just("request"), ID, U32, st.integers(0, 2**31 - 1), st.binary(max_size=1024)),
    st.tuples(st.just("cancel"), U32),
    st.tuples(st.sampled_from(["credit", "event_credit"]), U32, POSITIVE),
    st.just(("close",)),
    st.tuples(st.just("lent"), U32, U32, st.integers(0, 2**31 - 1), st.integers(1, SEGMENT), U32),
    st.tuples(st.just("release"), st.lists(U32, min_size=1, max_size=1024)),
    st.tuples(st.just("buffer_size"), U32, st.integers(64, SEGMENT)),
)


@given(U32, U32, st.integers(0, 2**31 - 1), st.integers(1, SEGMENT), U32)
def test_any_lent_buffer_encodes_to_its_bytes_and_decodes_back(rid, seq, backlog, size, segment):
    message = ("lent", rid, seq, backlog, size, segment)
    wire = frame(8, lent_body(rid, seq, backlog, 0, size, segment))
    assert t.wire_encode(message) == wire
    assert t.wire_decode(wire, SEGMENT) == ([message], 30)


@given(st.lists(U32, min_size=1, max_size=1024))
def test_any_release_encodes_to_its_bytes_and_decodes_back(segments):
    wire = frame(9, release_body(segments))
    assert t.wire_encode(("release", segments)) == wire
    assert t.wire_decode(wire, SEGMENT) == ([("release", segments)], 17 + 4 * len(segments))


@given(U32, st.integers(64, SEGMENT))
def test_any_buffer_size_encodes_to_its_bytes_and_decodes_back(rid, size):
    wire = frame(10, struct.pack(">II", rid, size))
    assert t.wire_encode(("buffer_size", rid, size)) == wire
    assert t.wire_decode(wire, SEGMENT) == ([("buffer_size", rid, size)], 17)


@given(st.lists(frames, max_size=8))
def test_any_frames_round_trip_through_the_encoders_and_the_decoder(messages):
    stream = b"".join(t.wire_encode(m) for m in messages)
    assert t.wire_decode(stream, SEGMENT) == (messages, len(stream))


@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_a_cut_stream_gives_its_whole_frames_and_waits_for_the_rest(messages, data):
    wires = [t.wire_encode(m) for m in messages]
    stream = b"".join(wires)
    cut = data.draw(st.integers(0, len(stream) - 1))
    got, used = t.wire_decode(stream[:cut], SEGMENT)
    whole = 0
    ends = 0
    for w in wires:
        if ends + len(w) > cut:
            break
        ends += len(w)
        whole += 1
    assert got == messages[:whole] and used == ends


@given(st.binary(max_size=300), st.integers(1, 1 << 20))
def test_any_bytes_give_frames_or_a_reason_and_the_frames_encode_back(data, segment_size):
    try:
        got, used = t.wire_decode(data, segment_size)
    except ValueError as e:
        assert str(e)                                   # a reason, never empty
        return
    assert 0 <= used <= len(data)
    again = b"".join(t.wire_encode(m) for m in got)
    assert t.wire_decode(again, segment_size) == (got, len(again))
