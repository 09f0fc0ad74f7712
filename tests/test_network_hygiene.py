"""Resource hygiene of NetworkEnvironment (in this process, so the no_leaks
fixture checks every buffer): after close() no flinkbuf-* thread is left,
the connection threads are gone, file descriptors are closed; close()
wakes readers blocked on its channels and producers blocked on its
consumers; a dead peer's connection gives its socket back."""

import gc
import socket
import threading
import time

import pytest

import flinkbuf.buffer as core
from flinkbuf.errors import PartitionReleasedError, RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from helpers import run_in_thread, wait_until
from network_helpers import (
    SECRET,
    Children,
    flinkbuf_threads,
    num_fds,
    num_os_threads,
)

# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

CLEAN = {"standalone_segments": 0, "live_buffers": 0, "segments_out": 0}


def settled(fds, threads, timeout=3.0):
    """Wait until the fd and OS thread counts are back to these."""
    def ok():
        gc.collect()
        return num_fds() <= fds and num_os_threads() <= threads and not flinkbuf_threads()
    wait_until(ok, timeout, 0.02)
    # fewer than before is no leak (a thread of an earlier test may have ended since)
    return max(0, num_fds() - fds), max(0, num_os_threads() - threads), flinkbuf_threads()


def make_env(**kw):
    kw.setdefault("secret", SECRET)
    return NetworkEnvironment(kw.pop("num_segments", 64), kw.pop("segment_size", 1024), **kw)


def exchange(prod_env, cons_env, n=2000):
    part = create_partition(prod_env.network_buffer_pool, 2)
    prod_env.register_partition("p", part)
    gate = cons_env.create_input_gate([(prod_env.address, "p", 0), (prod_env.address, "p", 1)],
                                      codec="bytes")

    def produce():
        with RecordWriter(part, "round_robin", codec="bytes") as w:
            for i in range(n):
                w.emit(i.to_bytes(4, "big") * 20)

    t, res = run_in_thread(produce)
    got = [bytes(r) for r in gate]
    t.join(10)
    assert "error" not in res, res
    assert sorted(got) == sorted(i.to_bytes(4, "big") * 20 for i in range(n))
    gate.close()


@pytest.mark.timeout(30)
def test_close_leaves_no_thread_fd_or_buffer():
    fds, threads = num_fds(), num_os_threads()
    prod, cons = make_env(), make_env()
    exchange(prod, cons)
    assert num_os_threads() >= threads + 4 + 2      # 2 connection ends x 2 C threads, acceptors
    cons.close()
    prod.close()
    assert settled(fds, threads) == (0, 0, [])
    assert core.debug_counters() in (None, CLEAN)


@pytest.mark.timeout(60)
def test_many_environments_in_a_row_leave_nothing():
    fds, threads = num_fds(), num_os_threads()
    for _ in range(10):
        prod, cons = make_env(), make_env()
        exchange(prod, cons, n=50)
        cons.close()
        prod.close()
    assert settled(fds, threads) == (0, 0, [])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("who", ["consumer", "producer", "gate"])
def test_close_wakes_a_blocked_reader(who):
    """A consumer blocked on an empty remote channel (reading its socket
    itself) wakes at once with RemoteConnectionError when either environment
    closes, and with ValueError when another thread closes its gate."""
    prod, cons = make_env(), make_env()
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        t, res = run_in_thread(lambda: next(gate))
        time.sleep(0.3)
        assert t.is_alive()
        t0 = time.monotonic()
        {"consumer": cons, "producer": prod, "gate": gate}[who].close()
        t.join(5)
        assert not t.is_alive()
        assert time.monotonic() - t0 < 2.0
        assert isinstance(res["error"], (RemoteConnectionError, ValueError)), res
        gate.close()
        part.release()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(30)
def test_close_wakes_a_backpressured_producer():
    """A producer blocked in emit (its remote consumer reads nothing) raises
    PartitionReleasedError at once when the consumer's environment
    closes, and everything it held goes back."""
    prod, cons = make_env(), make_env()
    try:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=4)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        w = RecordWriter(part, codec="bytes", buffer_timeout=None)

        def produce():
            for _ in range(100000):
                w.emit(b"x" * 1000)

        t, res = run_in_thread(produce)
        assert wait_until(lambda: w.back_pressured_time_ns > 2e8, 10)
        t0 = time.monotonic()
        cons.close()
        t.join(5)
        assert time.monotonic() - t0 < 2.0
        assert isinstance(res.get("error"), PartitionReleasedError), res
        w.close()
        gate.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(30)
def test_segment_size_mismatch_is_refused_clearly(caplog):
    fds, threads = num_fds(), num_os_threads()
    prod, cons = make_env(segment_size=1024), make_env(segment_size=2048)
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("p", part)
        with caplog.at_level("WARNING", logger="flinkbuf.network"):
            with pytest.raises(RemoteConnectionError, match="1024 bytes.*2048|2048.*1024"):
                cons.create_input_gate([(prod.address, "p", 0)])
            assert wait_until(lambda: "refused a connection" in caplog.text, 5), caplog.text
        part.release()
    finally:
        cons.close()
        prod.close()
    assert settled(fds, threads) == (0, 0, [])


@pytest.mark.timeout(30)
def test_wrong_secret_refused_and_logged_in_process(caplog):
    prod = make_env()
    cons = make_env(secret=b"another secret, 32 bytes long!!!")
    try:
        part = create_partition(prod.network_buffer_pool, 1)
        prod.register_partition("p", part)
        with caplog.at_level("WARNING", logger="flinkbuf.network"):
            from flinkbuf.errors import AuthenticationError
            with pytest.raises(AuthenticationError):
                cons.create_input_gate([(prod.address, "p", 0)])
            assert wait_until(lambda: "refused a connection" in caplog.text, 5), caplog.text
        assert not part.subpartition(0).is_released
        part.release()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(30)
def test_close_ends_handshakes_in_progress():
    fds, threads = num_fds(), num_os_threads()
    env = make_env(connect_timeout=5.0)
    silent = socket.create_connection(env.address)
    try:
        time.sleep(0.3)
        env.close()
        left = settled(fds + 1, threads, timeout=1.0)      # + our own client socket
        assert left == (0, 0, []), left
    finally:
        silent.close()
        time.sleep(0.1)


@pytest.mark.timeout(60)
def test_dead_connection_gives_its_socket_back():
    """A peer that dies: once the gate reading it is closed, the
    environment (still open, as a long-running process's is) holds no
    socket for it any more."""
    children = Children()
    env = make_env(segment_size=4096)
    try:
        fds = num_fds()
        for _ in range(3):
            p = children.start("producer", {
                "num_segments": 32, "segment_size": 4096,
                "partitions": [{"id": "live", "n": 1, "tag": 1, "mode": "endless",
                                "size": 100, "min_buffers": 4}]})
            gate = env.create_input_gate([(p.address(), "live", 0)], codec="bytes")
            next(gate)
            p.kill9()
            with pytest.raises(RemoteConnectionError):
                for _ in gate:
                    pass
            time.sleep(0.2)    # (see test_dropping_a_gate_as_soon_as_its_connection_fails)
            gate.close()
            del gate
            p.stop()
        children.stop_all()
        gc.collect()
        wait_until(lambda: num_fds() <= fds, 2)
        assert num_fds() <= fds, f"{num_fds() - fds} sockets of dead connections still open"
    finally:
        children.stop_all()
        env.close()


@pytest.mark.timeout(30)
def test_closed_environment_refuses_use():
    env = make_env()
    part = create_partition(env.network_buffer_pool, 1)
    env.close()
    env.close()                         # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        env.create_input_gate([("127.0.0.1:1", "p", 0)])
    with pytest.raises(RuntimeError, match="closed"):
        env.register_partition("p", part)
    part.release()
    assert flinkbuf_threads() == []


@pytest.mark.timeout(30)
def test_gate_dropped_without_close_releases_its_subpartition():
    """A gate that is only garbage collected: its remote channel cancels
    the request, the producer's next write raises PartitionReleasedError,
    and every buffer on both sides goes back."""
    prod, cons = make_env(), make_env()
    try:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=4)
        prod.register_partition("p", part)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes")
        w = RecordWriter(part, codec="bytes", buffer_timeout=0)
        w.emit(b"a")
        assert next(gate) == b"a"
        del gate
        gc.collect()

        def produce():
            for _ in range(100000):
                w.emit(b"x" * 100)

        t, res = run_in_thread(produce)
        t.join(5)
        assert isinstance(res.get("error"), PartitionReleasedError), res
        w.close()
    finally:
        cons.close()
        prod.close()


@pytest.mark.timeout(60)
def test_close_right_after_creation_raises_in_no_thread():
    """An environment closed at once (its accept thread may not have
    started serving yet): no thread dies with an exception."""
    errors = []
    old = threading.excepthook
    threading.excepthook = lambda args: errors.append(
        f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")
    try:
        for _ in range(15):
            make_env().close()
        wait_until(lambda: not flinkbuf_threads(), 5)
    finally:
        threading.excepthook = old
    assert errors == []
    assert flinkbuf_threads() == []


def test_close_does_not_wait_for_the_acceptor_to_look_up():
    """close() wakes the thread that accepts connections instead of waiting
    for its next look at the sockets (0.2 s): an environment that served
    nothing closes in far less."""
    for _ in range(5):
        env = make_env()
        time.sleep(0.02)                 # the acceptor is waiting in select()
        t0 = time.monotonic()
        env.close()
        assert time.monotonic() - t0 < 0.1
        assert not env._acceptor.is_alive()
