"""Backpressure across the socket: a consumer process that stops reading
stops its producer process (emit blocks, back-pressured time grows, the
emitted count stalls), neither process grows past its buffer pool plus a
small constant while the producer tries to send 1 GiB, and once the
consumer resumes everything arrives, in order."""

import os
import threading
import time

import pytest


# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

MB = 1 << 20
SLACK = 60 * MB                       # what a process may hold beyond its pool


def _asan_quarantine():
    """Under AddressSanitizer freed memory is quarantined (256 MB unless
    ASAN_OPTIONS says otherwise) before it is reused: the consumer's 32 KiB
    record objects fill it, which is not ours to bound."""
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        return 0
    for opt in os.environ.get("ASAN_OPTIONS", "").replace(",", ":").split(":"):
        if opt.startswith("quarantine_size_mb="):
            return int(opt.split("=", 1)[1]) * MB
    return 256 * MB


SLACK += _asan_quarantine() + (100 * MB if _asan_quarantine() else 0)   # + its redzones
RECORD = 32 * 1024
TOTAL = int(os.environ.get("NETTEST_BACKPRESSURE_BYTES", str(1 << 30)))


class RssWatch:
    """The largest RSS of some processes, sampled every 20 ms."""

    def __init__(self, procs):
        self.procs = procs
        self.peak = {c.pid: 0 for c in procs}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.02):
            for c in self.procs:
                self.peak[c.pid] = max(self.peak[c.pid], c.rss())

    def stop(self):
        self._stop.set()
        self._t.join(2)


def latest_progress(child, wait):
    """The last progress report of the producer after ``wait`` seconds."""
    time.sleep(wait)
    last = None
    for m in child.poll_messages():
        if "progress" in m:
            last = m
    if last is None:
        last = child.expect("progress", 5)
    return last


@pytest.mark.timeout(180)
def test_stopped_consumer_stops_producer_across_the_socket(children):
    n_records = TOTAL // RECORD
    producer = children.start("producer", {
        "num_segments": 64, "segment_size": 32768,
        "partitions": [{"id": "bp", "n": 1, "tag": 1, "mode": "endless", "size": RECORD,
                        "limit": n_records, "min_buffers": 16, "buffer_timeout": None}],
    }, life=150)
    hello_p = producer.expect("addr")
    consumer = children.start("consumer", {
        "num_segments": 64, "segment_size": 32768, "exclusive": 2, "floating": 8,
        "gates": [[[hello_p["addr"], "bp", 0]]], "report": "count", "pause_after": 200,
    }, life=150)
    hello_c = consumer.expect("addr")
    watch = RssWatch([producer, consumer])
    try:
        consumer.expect("paused", 30)
        # Let the queues fill, then the producer must stand still.
        first = latest_progress(producer, 1.0)
        second = latest_progress(producer, 1.5)
        assert second["emitted"] == first["emitted"], (first, second)
        assert second["emitted"] < n_records // 4, second
        grown = second["back_pressured_ns"] - first["back_pressured_ns"]
        assert grown >= 1.0e9, f"back-pressured time grew by {grown / 1e9:.2f} s in 1.5 s"
        # What the producer emitted fits in the pools and sockets: far less than 1 GiB.
        assert second["emitted"] * RECORD < 64 * MB, second

        consumer.send(cmd="resume")
        t0 = time.monotonic()
        results = consumer.expect("results", 150)["results"]
        elapsed = time.monotonic() - t0
        written = producer.expect("written", 30)
    finally:
        watch.stop()
    assert "error" not in written, written
    assert written["emitted"] == n_records
    res = results[0]
    assert "error" not in res, res
    count, last, violations = res["streams"][0]
    assert (count, last, violations) == (n_records, n_records - 1, 0), res
    for child, hello in ((producer, hello_p), (consumer, hello_c)):
        limit = hello["rss"] + hello["pool_bytes"] + SLACK
        assert watch.peak[child.pid] <= limit, (
            f"{child.role}: peak RSS {watch.peak[child.pid] / MB:.0f} MB > start "
            f"{hello['rss'] / MB:.0f} MB + pool {hello['pool_bytes'] / MB:.0f} MB + "
            f"{SLACK / MB:.0f} MB")
    closed = consumer.expect("closed", 20)
    assert closed["counters"] in (None, {"standalone_segments": 0, "live_buffers": 0,
                                         "segments_out": 0}), closed
    producer.send(cmd="close")
    closed = producer.expect("closed", 20)
    assert closed["counters"] in (None, {"standalone_segments": 0, "live_buffers": 0,
                                         "segments_out": 0}), closed
    print(f"1 GiB after resume in {elapsed:.1f} s; peak RSS "
          f"{ {c.role: watch.peak[c.pid] // MB for c in (producer, consumer)} } MB")
