"""The frame reader of connections (csrc/network/frame_reader.c), driven
without a socket: a byte stream cut into chunks anywhere (as a socket gives
what has arrived) reads as the wire decoder reads the whole stream at once:
the same frames, the same refusal with the same reason, and a stream that
ends inside a frame said to end inside one.  A buffer whose body is dropped
as it comes (a channel that ended) is read past, the frames after it
unchanged.  The atheris target fuzz/fuzz_frame_reader.py checks the same on
arbitrary inputs."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf import _testing as t
from test_fuzz_streams import mutate, mutation
from test_network_wire import SEGMENT, frames

pytestmark = pytest.mark.one_transport

cuts = st.lists(st.integers(0, 1 << 16), max_size=12)
heartbeats = st.tuples(st.sampled_from(["heartbeat", "heartbeat_response"]),
                       st.integers(1, 2**32 - 1))


def decoded(stream, segment_size, skip=()):
    """What the wire decoder reads of the whole stream, as the reader gives
    it: (frames, mid), the bodies of receivers in ``skip`` as None; or the
    ValueError it raises."""
    try:
        got, used = t.wire_decode(stream, segment_size)
    except ValueError as e:
        return e
    return ([(*f[:5], None) if f[0] == "buffer" and f[1] in skip else f for f in got],
            used < len(stream))


def read(stream, segment_size, at, skip=()):
    try:
        return t.frame_read(stream, segment_size, at, skip)
    except ValueError as e:
        return e


def same(a, b):
    if isinstance(a, ValueError) or isinstance(b, ValueError):
        return type(a) is type(b) and str(a) == str(b)
    return a == b


@given(st.lists(st.one_of(frames, heartbeats), max_size=8), cuts)
def test_frames_cut_anywhere_read_as_the_decoder_reads_them_whole(messages, at):
    stream = b"".join(t.wire_encode(m) for m in messages)
    assert t.frame_read(stream, SEGMENT, at) == (messages, False)


@given(st.lists(frames, min_size=1, max_size=6), cuts, st.data())
def test_a_stream_that_stops_anywhere_gives_its_whole_frames_and_says_it_stopped_inside_one(
        messages, at, data):
    stream = b"".join(t.wire_encode(m) for m in messages)
    end = data.draw(st.integers(0, len(stream)))
    assert same(read(stream[:end], SEGMENT, at), decoded(stream[:end], SEGMENT))


@given(st.lists(frames, min_size=1, max_size=6), st.lists(mutation, min_size=1, max_size=4),
       cuts)
def test_mutated_streams_read_as_the_decoder_reads_them(messages, mutations, at):
    stream = mutate(b"".join(t.wire_encode(m) for m in messages), mutations)
    assert same(read(stream, SEGMENT, at), decoded(stream, SEGMENT))


@given(st.binary(max_size=400), st.integers(1, 1 << 20), cuts)
def test_any_bytes_read_as_the_decoder_reads_them(data, segment_size, at):
    assert same(read(data, segment_size, at), decoded(data, segment_size))


@given(st.lists(frames, min_size=1, max_size=6), cuts, st.data())
def test_a_dropped_body_is_read_past(messages, at, data):
    ids = sorted({m[1] for m in messages if m[0] == "buffer"})
    skip = data.draw(st.lists(st.sampled_from(ids), max_size=2)) if ids else []
    stream = b"".join(t.wire_encode(m) for m in messages)
    assert t.frame_read(stream, SEGMENT, at, skip) == decoded(stream, SEGMENT, set(skip))


def test_a_body_arrives_a_byte_at_a_time():
    message = ("buffer", 7, 0, 3, 0, bytes(range(200)))
    stream = t.wire_encode(message) + t.wire_encode(("credit", 1, 2))
    assert t.frame_read(stream, SEGMENT, range(1, len(stream))) == (
        [message, ("credit", 1, 2)], False)
    assert t.frame_read(stream[:-1], SEGMENT, range(1, len(stream))) == ([message], True)


@pytest.mark.parametrize("body", [(0xFFFFFFFE).to_bytes(4, "big") + (1).to_bytes(4, "big"),
                                  (0xFFFFFFFF).to_bytes(4, "big") + bytes(4)],
                         ids=["one-receiver", "token-0"])
def test_a_malformed_heartbeat_is_refused_with_its_reason(body):
    wire = (17).to_bytes(4, "big") + (0x46425546).to_bytes(4, "big") + bytes([12]) + body
    with pytest.raises(ValueError, match="heartbeat"):
        t.frame_read(wire, SEGMENT)
    with pytest.raises(ValueError, match="heartbeat"):
        t.wire_decode(wire, SEGMENT)
