"""A peer that sends control frames as fast as it can (partition requests
that each need an answer, credit for channels it does not have, a partition
id that is not UTF-8) does not hold up another consumer's records for more
than a second, and costs the server no traceback per frame."""

import struct
import threading
import time

import pytest

from network_helpers import (
    connect_raw,
    credit_frame,
    request_frame,
)

pytestmark = pytest.mark.one_transport

SEG = 4096
# A connection's budget of partition requests (csrc/network/conn_internal.h).
REQUEST_BURST, REQUEST_RATE = 4096, 10_000


def _serve(children):
    producer = children.start("producer", {
        "num_segments": 128, "segment_size": SEG, "io_timeout": 30.0,
        "partitions": [{"id": "live", "n": 1, "tag": 1, "mode": "endless", "size": 300,
                        "min_buffers": 8, "buffer_timeout": 0.001, "pace": 0.002}]},
        life=120)
    address = producer.expect("addr")["addr"]
    consumer = children.start("consumer", {
        "num_segments": 32, "segment_size": SEG, "gates": [[[address, "live", 0]]],
        "report": "count", "progress": True}, life=120)
    return producer, address, consumer


def _count_frames(data):
    n = pos = 0
    while pos + 9 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        if length < 9 or pos + length > len(data):
            break
        pos += length
        n += 1
    return n


def _largest_gap(consumer, seconds):
    """The longest time the consumer's count stood still within ``seconds``."""
    last_count, last_change, gap = None, time.monotonic(), 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for m in consumer.poll_messages():
            assert "gate_error" not in m and "fatal" not in m, m
            if "progress" in m:
                now = time.monotonic()
                if m["progress"][0] != last_count:
                    gap = max(gap, now - last_change)
                    last_count, last_change = m["progress"][0], now
        time.sleep(0.01)
    return max(gap, time.monotonic() - last_change), last_count


FLOODS = {
    "unknown-partition": lambda i: request_frame(i % 4000, 0, 2, "nope"),
    "not-utf8": lambda i: request_frame(i % 4000, 0, 2, b"\xff\xfe" + struct.pack(">I", i)),
    "credit-nobody": lambda i: credit_frame(10_000 + i % 4000, 1),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(FLOODS))
def test_a_control_frame_flood_does_not_stall_another_consumer(children, kind):
    producer, address, consumer = _serve(children)
    gap, count = _largest_gap(consumer, 1.0)
    assert count and count > 0
    sock = connect_raw(address, segment_size=SEG, own_address="127.0.0.1:7")
    stop = threading.Event()
    sent = [0]

    received = bytearray()

    def drain():                     # read every answer: the server never waits for room
        try:
            while not stop.is_set():
                data = sock.recv(1 << 16)
                if not data:
                    break
                received.extend(data)
        except OSError:
            pass

    def flood():
        batch = b"".join(FLOODS[kind](i) for i in range(256))
        try:
            while not stop.is_set():
                sock.sendall(batch)
                sent[0] += 256
        except OSError:
            pass

    threads = [threading.Thread(target=drain, daemon=True),
               threading.Thread(target=flood, daemon=True)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        gap, _ = _largest_gap(consumer, 4.0)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        sock.close()
        for t in threads:
            t.join(10)
    assert sent[0] > 10_000, f"the flood sent {sent[0]} frames only"
    assert gap < 1.0, f"the consumer got nothing for {gap:.2f} s while {sent[0]} frames came"
    log = producer.stderr()
    assert "Traceback" not in log, log[-3000:]
    if kind != "credit-nobody":
        # Each request is answered (an error), within the connection's budget.
        answers = _count_frames(bytes(received))
        assert answers > 1000
        assert answers <= REQUEST_BURST + REQUEST_RATE * elapsed * 1.2, (answers, elapsed)
