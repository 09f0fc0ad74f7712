"""What the network layer tells the layers below and above it, in one
process (so the no_leaks fixture checks every buffer): a partition served
to another process is consumed once its connection has sent everything (or
the error, or its reader left, or the connection dropped), and
ResultPartition.wait_consumed wakes when that happens; an input gate over a
partition of its own environment waits for its registration."""

import time

import pytest

import flinkbuf as fb
from flinkbuf.errors import PartitionNotFoundError, ProducerFailedError, RemoteConnectionError
from flinkbuf.network import NetworkEnvironment
from helpers import run_in_thread, wait_until
from network_helpers import SECRET

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def _env(**kw):
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024),
                              secret=SECRET, **kw)


def _records(n):
    return [i.to_bytes(4, "big") * 200 for i in range(n)]    # 800 B: one buffer each


@pytest.fixture
def envs():
    prod, cons = _env(), _env()
    yield prod, cons
    cons.close()
    prod.close()


def _served(prod, cons, n, *, pid="p"):
    """A finished partition of ``prod`` holding ``n`` one-buffer records,
    more than the remote gate's credit (2 exclusive + 8 floating), and that
    gate in ``cons``."""
    part = fb.create_partition(prod.network_buffer_pool, 1, min_buffers=n + 2)
    prod.register_partition(pid, part)
    gate = cons.create_input_gate([(prod.address, pid, 0)], codec="bytes")
    with fb.RecordWriter(part, codec="bytes", buffer_timeout=0) as writer:
        for r in _records(n):
            writer.emit(r)
    return part, gate


@pytest.mark.timeout(60)
def test_a_remote_reader_consumes_once_everything_is_sent(envs):
    """While the consumer does not read, credit holds most buffers back:
    not consumed.  Once it reads, the wait returns True as soon as the last
    buffers and EndOfPartition are on their way, and they stay with the
    consumer when the producer's environment closes right then."""
    prod, cons = envs
    part, gate = _served(prod, cons, 30)
    assert part.wait_consumed(0.3) is False
    got = []

    def consume():
        for r in gate:
            got.append(bytes(r))
            time.sleep(0.02)          # the last ones are read after the producer left

    t, res = run_in_thread(consume)
    assert part.wait_consumed(20) is True
    prod.close()                      # the producer's process may go now
    assert len(got) < 30
    t.join(10)
    assert "error" not in res, res
    assert got == _records(30)
    gate.close()


@pytest.mark.timeout(60)
def test_the_connection_holds_the_partition_while_it_serves_it(envs):
    """A served subpartition counts as a reader of its partition from the
    request until its channel ends; a request that is refused (a second
    reader of the subpartition) holds it for no longer than the refusal."""
    from flinkbuf._testing import num_readers
    prod, cons = envs
    part = fb.create_partition(prod.network_buffer_pool, 1)
    prod.register_partition("p", part)
    assert num_readers(part) == 0
    gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
    assert wait_until(lambda: num_readers(part) == 1, 5)
    second = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
    with pytest.raises(RemoteConnectionError, match="already has a reader"):
        next(second)
    second.close()
    # (the refused request lets go of it in the server's thread, after its answer)
    assert wait_until(lambda: num_readers(part) == 1, 5), num_readers(part)
    with fb.RecordWriter(part, codec="bytes", buffer_timeout=0) as writer:
        writer.emit(b"x")
    assert part.wait_consumed(10) is True
    assert num_readers(part) == 0
    assert [bytes(r) for r in gate] == [b"x"]
    gate.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["the consumer closes its gate",
                                 "the consumer's environment closes"])
def test_a_reader_that_goes_away_leaves_nothing_to_consume(envs, how):
    """A consumer that leaves early (its gate closed: the subpartition is
    released) or whose connection drops ends its served channel: the wait
    returns True without the rest being read."""
    prod, cons = envs
    part, gate = _served(prod, cons, 30)
    assert next(iter(gate)) is not None
    t, res = run_in_thread(part.wait_consumed, 20)
    time.sleep(0.05)
    assert t.is_alive()
    if how == "the consumer closes its gate":
        gate.close()
    else:
        cons.close()
    t.join(10)
    assert res["value"] is True, res
    assert part.subpartition(0).is_released
    gate.close()


@pytest.mark.timeout(60)
def test_a_failed_partition_is_consumed_once_its_error_is_sent(envs):
    """A producer that fails: the remote reader gets the error (not a
    dropped connection) even though the producer's environment closes as
    soon as the wait returns."""
    prod, cons = envs
    part = fb.create_partition(prod.network_buffer_pool, 1)
    prod.register_partition("p", part)
    gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
    writer = fb.RecordWriter(part, codec="bytes", buffer_timeout=0)
    writer.emit(b"x")
    assert bytes(next(iter(gate))) == b"x"
    assert part.wait_consumed(0.1) is False
    writer.fail(ValueError("the producer broke"))
    assert part.wait_consumed(10) is True
    prod.close()
    with pytest.raises(ProducerFailedError) as info:
        list(gate)
    assert "the producer broke" in str(info.value.__cause__)
    gate.close()


@pytest.mark.timeout(60)
def test_a_slow_remote_reader_is_waited_for_while_it_reads(envs):
    """With reset_on_progress, a consumer that takes a buffer every 50 ms
    (its last 10 buffers are sent once it has read 20: about 1 s) is waited
    for with a 0.4 s timeout; one that stops is given up 0.4 s after its
    last step."""
    prod, cons = envs
    part, gate = _served(prod, cons, 30)

    def consume():
        for _ in gate:
            time.sleep(0.05)

    t, res = run_in_thread(consume)
    t0 = time.monotonic()
    assert part.wait_consumed(0.4, reset_on_progress=True) is True
    assert time.monotonic() - t0 > 0.6
    t.join(10)
    assert "error" not in res, res
    gate.close()

    part, gate = _served(prod, cons, 30, pid="q")
    it = iter(gate)
    for _ in range(3):
        next(it)
    stopped = time.monotonic()
    assert part.wait_consumed(0.4, reset_on_progress=True) is False
    assert time.monotonic() - stopped >= 0.4
    gate.close()


# ---- a gate over a partition of its own environment -----------------------------------

@pytest.mark.timeout(30)
def test_a_local_channel_waits_for_its_partition_to_be_registered():
    """create_input_gate over this environment's address waits for the
    partition (as a remote request would) and returns as soon as another
    thread registers it."""
    with _env(request_timeout=20) as env:
        part = fb.create_partition(env.network_buffer_pool, 1)
        t, res = run_in_thread(env.create_input_gate, [(env.address, "later", 0)])
        time.sleep(0.2)
        assert t.is_alive()
        registered = time.monotonic()
        env.register_partition("later", part)
        t.join(5)
        assert time.monotonic() - registered < 1.0
        gate = res["value"]
        with fb.RecordWriter(part) as writer:
            writer.emit("hello")
        assert list(gate) == ["hello"]
        gate.close()


@pytest.mark.timeout(30)
def test_a_local_channel_gives_up_after_the_request_timeout():
    with _env(request_timeout=0.3) as env:
        t0 = time.monotonic()
        with pytest.raises(PartitionNotFoundError, match="'never'.*0.3 s"):
            env.create_input_gate([(env.address, "never", 0)])
        assert 0.29 <= time.monotonic() - t0 < 5


@pytest.mark.timeout(30)
def test_closing_the_environment_ends_a_wait_for_a_local_partition():
    env = _env(request_timeout=20)
    try:
        t, res = run_in_thread(env.create_input_gate, [(env.address, "never", 0)])
        time.sleep(0.2)
        assert t.is_alive()
        env.close()
        t.join(5)
        assert isinstance(res.get("error"), RuntimeError), res
        assert "closed" in str(res["error"])
    finally:
        env.close()
