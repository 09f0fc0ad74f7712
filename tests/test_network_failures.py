"""Failures across processes: a producer or consumer killed with SIGKILL
mid-stream, a producer that fails, a consumer that leaves early, a
partition registered late or never; every surviving process gives back
every buffer."""

import time

import pytest

from network_helpers import expected_streams, record_bytes  # noqa: F401

# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

CLEAN = {"standalone_segments": 0, "live_buffers": 0, "segments_out": 0}


def assert_clean(report):
    assert report["counters"] in (None, CLEAN), report
    assert report["threads"] == [], report
    assert report["shared_memory"] == [], report


def endless_producer(children, *, size=1024, min_buffers=8, n=1, **cfg):
    cfg.setdefault("num_segments", 64)
    cfg.setdefault("segment_size", 4096)
    cfg["partitions"] = [{"id": "live", "n": n, "tag": 7, "mode": "endless", "size": size,
                          "min_buffers": min_buffers, "buffer_timeout": 0.001}]
    return children.start("producer", cfg, life=60)


def wait_progress(child, index_or_key, at_least, timeout=20):
    deadline = time.monotonic() + timeout
    while True:
        msg = child.expect("progress", max(0.1, deadline - time.monotonic()))
        value = msg["progress"][index_or_key] if isinstance(msg["progress"], list) \
            else msg["emitted"]
        if value >= at_least:
            return msg


@pytest.mark.timeout(60)
def test_producer_killed_mid_stream(children):
    """kill -9 of the producer: the consumer's iteration raises
    RemoteConnectionError within a few seconds and its process gives back
    every buffer."""
    producer = endless_producer(children)
    addr = producer.address()
    consumer = children.start("consumer", {
        "num_segments": 32, "segment_size": 4096,
        "gates": [[[addr, "live", 0]]], "report": "count", "progress": True})
    wait_progress(consumer, 0, 2000)
    t_kill = time.monotonic()
    producer.kill9()
    err = consumer.expect("gate_error", 10)
    took = time.monotonic() - t_kill
    assert err["error"]["type"] == "RemoteConnectionError", err
    assert took < 3.0, f"the consumer noticed the dead producer after {took:.1f} s"
    res = consumer.expect("results", 10)["results"][0]
    count, last, violations = res["streams"][0]
    assert violations == 0 and count == last + 1 >= 2000, res
    assert_clean(consumer.expect("closed", 10))
    assert consumer.wait_exit(10) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("paused", [False, True], ids=["flowing", "backpressured"])
def test_consumer_killed_mid_stream(children, paused):
    """kill -9 of the consumer, while records flow or while the producer is
    blocked on backpressure: the producer's emit raises
    PartitionReleasedError within a few seconds and its buffers go back."""
    producer = endless_producer(children)
    addr = producer.address()
    cfg = {"num_segments": 32, "segment_size": 4096, "gates": [[[addr, "live", 0]]],
           "report": "count"}
    if paused:
        cfg["pause_after"] = 100
    consumer = children.start("consumer", cfg)
    if paused:
        consumer.expect("paused", 20)
        first = wait_progress(producer, None, 1)
        time.sleep(1.0)
        stalled = [m for m in producer.poll_messages() if "progress" in m][-1]
        assert stalled["emitted"] == first["emitted"] or stalled["back_pressured_ns"] > 5e8
    else:
        wait_progress(producer, None, 3000)
    t_kill = time.monotonic()
    consumer.kill9()
    written = producer.expect("written", 10)
    took = time.monotonic() - t_kill
    assert written.get("error", {}).get("type") == "PartitionReleasedError", written
    assert took < 3.0, f"the producer noticed the dead consumer after {took:.1f} s"
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))
    assert producer.wait_exit(10) == 0


@pytest.mark.timeout(60)
def test_producer_failure_reaches_consumer(children):
    """writer.fail(ValueError("boom")) in the producer: the consumer raises
    ProducerFailedError whose __cause__ is RemoteError('ValueError',
    'boom')."""
    plan = [["r", 100, 0] for _ in range(50)]
    producer = children.start("producer", {
        "num_segments": 32, "segment_size": 1024,
        "partitions": [{"id": "f", "n": 1, "tag": 3, "plan": plan, "mode": "fail"}]})
    addr = producer.address()
    consumer = children.start("consumer", {"num_segments": 32, "segment_size": 1024,
                                           "gates": [[[addr, "f", 0]]]})
    res = consumer.expect("results", 20)["results"][0]
    err = res["error"]
    assert err["type"] == "ProducerFailedError", err
    assert err["cause"]["type"] == "RemoteError", err
    assert (err["cause"]["type_name"], err["cause"]["message"]) == ("ValueError", "boom"), err
    # What did arrive is a prefix of the plan, in order.
    want = expected_streams(3, plan, 1)[0]
    assert res["streams"][0] == want[:len(res["streams"][0])]
    assert_clean(consumer.expect("closed", 10))
    producer.expect("written", 10)
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))


@pytest.mark.timeout(60)
def test_consumer_closing_early_releases_only_its_channel(children):
    """A consumer that closes its gate early: the producer's writes to that
    subpartition raise PartitionReleasedError, and the other consumer
    (another process) still gets every record of its own, in order."""
    plan = [["r", 100 + (i % 7), i % 2] for i in range(3000)]
    producer = children.start("producer", {
        "num_segments": 16, "segment_size": 1024,
        "partitions": [{"id": "two", "n": 2, "tag": 5, "plan": plan, "mode": "tolerant",
                        "min_buffers": 4}]})
    addr = producer.address()
    leaver = children.start("consumer", {"num_segments": 16, "segment_size": 1024,
                                         "gates": [[[addr, "two", 0]]], "close_after": 50})
    stayer = children.start("consumer", {"num_segments": 16, "segment_size": 1024,
                                         "gates": [[[addr, "two", 1]]]})
    want = expected_streams(5, plan, 2)
    left = leaver.expect("results", 30)["results"][0]
    assert left["closed_early"] == 50
    assert left["streams"][0] == want[0][:50]
    stayed = stayer.expect("results", 30)["results"][0]
    assert "error" not in stayed, stayed
    assert stayed["streams"][0] == want[1]
    written = producer.expect("written", 10)
    assert "error" not in written, written
    assert written["released"] == [0], written
    for c in (leaver, stayer):
        assert_clean(c.expect("closed", 10))
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))


@pytest.mark.timeout(60)
def test_partition_registered_after_the_request_is_served(children):
    """The consumer asks before the producer registers its partition: the
    request is retried and served once it is registered."""
    plan = [["r", 10 * i, 0] for i in range(200)]
    producer = children.start("producer", {
        "num_segments": 16, "segment_size": 1024, "register_late": True,
        "partitions": [{"id": "late", "n": 1, "tag": 9, "plan": plan}]})
    addr = producer.address()
    consumer = children.start("consumer", {"num_segments": 16, "segment_size": 1024,
                                           "gates": [[[addr, "late", 0]]],
                                           "request_timeout": 20})
    consumer.address()
    time.sleep(1.2)                     # several not-found answers and retries
    producer.send(cmd="register")
    res = consumer.expect("results", 30)["results"][0]
    assert "error" not in res, res
    assert res["streams"][0] == expected_streams(9, plan, 1)[0]
    assert_clean(consumer.expect("closed", 10))
    producer.expect("written", 10)
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))


@pytest.mark.timeout(60)
def test_partition_never_registered_is_not_found(children):
    """A partition that is never registered: PartitionNotFoundError after
    the request timeout (not much before, not much after)."""
    producer = children.start("producer", {
        "num_segments": 16, "segment_size": 1024,
        "partitions": [{"id": "ghost", "n": 1, "tag": 1, "plan": [], "never_register": True}]})
    addr = producer.address()
    timeout = 2.5
    consumer = children.start("consumer", {"num_segments": 16, "segment_size": 1024,
                                           "gates": [[[addr, "ghost", 0]]],
                                           "request_timeout": timeout})
    res = consumer.expect("results", 20)["results"][0]
    assert res["error"]["type"] == "PartitionNotFoundError", res
    assert "ghost" in res["error"]["msg"], res
    # Retries back off up to 1 s, and the last is not sent past the deadline.
    assert timeout - 1.2 <= res["elapsed"] <= timeout + 2.0, res
    assert_clean(consumer.expect("closed", 10))
    producer.send(cmd="close")
    assert_clean(producer.expect("closed", 10))


@pytest.mark.timeout(90)
def test_dropping_a_gate_as_soon_as_its_connection_fails(children):
    """The consumer closes and drops its gate as soon as the connection
    under it fails (a peer that died): its process must survive.  (Run in
    a child process: the bug crashes it.)"""
    child = children.start("race_fail_then_drop", {"iterations": 60, "seconds": 40}, life=80,
                           may_crash=True)
    code = child.wait_exit(80)
    assert code == 0, f"the consumer's process died (exit {code}):\n{child.stderr()[-1500:]}"
    assert_clean(child.expect("survived", 5))
