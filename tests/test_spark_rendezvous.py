"""The driver's address rendezvous of flinkbuf.spark's exchanges, without
Spark: threads stand for the tasks of a barrier stage."""

import gc
import logging
import socket
import struct
import threading
import time

import pytest

from flinkbuf.errors import AuthenticationError, RemoteConnectionError
from flinkbuf.network import handshake
from flinkbuf.spark import _rendezvous
from flinkbuf.spark._rendezvous import RendezvousServer, register
from helpers import wait_until

SECRET = b"s" * 32


def _threads():
    return [t for t in threading.enumerate() if t.name.startswith("flinkbuf-rendezvous")]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    _rendezvous.close_all()
    deadline = time.monotonic() + 5
    while _threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads() == []
    assert list(_rendezvous._LIVE) == []


def _register_all(server, n, *, stage=1, first_tid=0, indexes=None, timeout=5.0,
                  secret=SECRET):
    """Register tasks in threads; returns {index: addresses or exception}."""
    results = {}

    def task(i):
        try:
            results[i] = register(server.address, secret, stage=stage,
                                  task_attempt_id=first_tid + i, index=i, num_tasks=n,
                                  address=f"10.0.0.{i}:{1000 + i}", timeout=timeout)
        except Exception as exc:        # noqa: BLE001 - inspected by the test
            results[i] = exc

    threads = [threading.Thread(target=task, args=(i,))
               for i in (range(n) if indexes is None else indexes)]
    for t in threads:
        t.start()
    return threads, results


def _join(threads):
    for t in threads:
        t.join(10)
        assert not t.is_alive()


def test_every_task_gets_every_address():
    with RendezvousServer(SECRET, 4, timeout=5) as server:
        threads, results = _register_all(server, 4)
        _join(threads)
        expected = [f"10.0.0.{i}:{1000 + i}" for i in range(4)]
        assert results == {i: expected for i in range(4)}
        # Another job over the same exchange: another stage, served too.
        threads, results = _register_all(server, 4, stage=2, first_tid=10)
        _join(threads)
        assert results == {i: expected for i in range(4)}
    assert server.closed


def test_no_answer_before_the_last_task_registers():
    with RendezvousServer(SECRET, 3, timeout=5) as server:
        threads, results = _register_all(server, 3, indexes=[0, 1])
        time.sleep(0.3)
        assert results == {}
        more, _ = _register_all(server, 3, indexes=[2])
        _join(threads + more)
        assert len(results[0]) == 3 and results[0] == results[1]


def test_a_missing_task_makes_the_others_fail_in_bounded_time():
    with RendezvousServer(SECRET, 3, timeout=0.5) as server:
        start = time.monotonic()
        threads, results = _register_all(server, 3, indexes=[0, 1])
        _join(threads)
        assert time.monotonic() - start < 3
        for i in (0, 1):
            assert isinstance(results[i], RemoteConnectionError)
            assert "2 of 3 tasks" in str(results[i])


def test_a_retried_stage_attempt_registers_afresh_and_old_tasks_are_refused():
    with RendezvousServer(SECRET, 2, timeout=5) as server:
        # Attempt 1 (task ids 4, 5): task 0 registers, task 1 fails before it does.
        old, old_results = _register_all(server, 2, first_tid=4, indexes=[0])
        time.sleep(0.2)
        # Attempt 2 (task ids 8, 9): the old task 0 is dropped, the new set completes.
        new, new_results = _register_all(server, 2, first_tid=8)
        _join(old + new)
        assert isinstance(old_results[0], RemoteConnectionError)
        assert "newer attempt" in str(old_results[0])
        assert new_results[0] == new_results[1] == ["10.0.0.0:1000", "10.0.0.1:1001"]
        # A late task of attempt 1 is refused.
        late, late_results = _register_all(server, 2, first_tid=4, indexes=[1])
        _join(late)
        assert "older attempt" in str(late_results[1])
        # A retry of the completed stage (its output was lost) registers afresh.
        again, again_results = _register_all(server, 2, first_tid=20)
        _join(again)
        assert again_results[0] == again_results[1]


def test_a_wrong_secret_is_refused_and_the_server_keeps_serving(caplog):
    with RendezvousServer(SECRET, 2, timeout=5) as server, \
            caplog.at_level(logging.WARNING, logger="flinkbuf.spark"):
        with pytest.raises(AuthenticationError):
            register(server.address, b"x" * 32, stage=1, task_attempt_id=0, index=0,
                     num_tasks=2, address="10.0.0.9:9", timeout=2)
        threads, results = _register_all(server, 2)
        _join(threads)
        assert results[0] == results[1] == ["10.0.0.0:1000", "10.0.0.1:1001"]
        assert server.refused >= 1
    assert any("dropped a peer" in r.getMessage() for r in caplog.records)


def _read_to_end(s):
    """What the server sends before it closes (or goes quiet)."""
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return got
            got += chunk
    except (socket.timeout, ConnectionResetError):
        return got


def _raw(server, payload, wait=2.0):
    """Send raw bytes; returns what the server sent back before closing."""
    with socket.create_connection(server.address, timeout=wait) as s:
        s.sendall(payload)
        return _read_to_end(s)


def _authenticated(server, body):
    """A connection past the handshake that sends ``body`` as its request
    (length-prefixed); returns the server's answer (bytes) or b''."""
    s = socket.create_connection(server.address, timeout=3)
    try:
        handshake.client(s, SECRET, "10.0.0.9:9", 0, 3)
        s.sendall(body)
        return _read_to_end(s)
    finally:
        s.close()


def test_garbage_and_malformed_requests_are_dropped_and_others_served(caplog):
    with RendezvousServer(SECRET, 2, timeout=1.0) as server, \
            caplog.at_level(logging.WARNING, logger="flinkbuf.spark"):
        assert _raw(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") == b""
        assert _raw(server, bytes(range(256)) * 8) == b""
        assert _raw(server, b"") == b""                     # connects, sends nothing
        # Authenticated, then nonsense: too long, not JSON, wrong fields, wrong size.
        assert _authenticated(server, struct.pack(">I", 1 << 30)) == b""
        assert _authenticated(server, struct.pack(">I", 5) + b"\xff\xfe{[x") == b""
        assert _authenticated(server, struct.pack(">I", 2) + b"[]") == b""
        bad = b'{"stage": 1, "task_attempt_id": 1, "index": 7, "num_tasks": 2, "address": "a"}'
        assert _authenticated(server, struct.pack(">I", len(bad)) + bad) == b""
        threads, results = _register_all(server, 2)
        _join(threads)
        assert results[0] == ["10.0.0.0:1000", "10.0.0.1:1001"]
        assert server.refused >= 7
    messages = [r.getMessage() for r in caplog.records]
    assert sum("dropped a peer" in m for m in messages) >= 7


def test_unauthenticated_sockets_have_their_own_budget():
    """Past its budget of sockets that have not authenticated, the oldest
    is dropped: idle sockets cannot fill the rendezvous."""
    with RendezvousServer(SECRET, 2, timeout=3.0, max_unauthenticated=3) as server:
        idle = [socket.create_connection(server.address, timeout=3) for _ in range(3)]
        try:
            time.sleep(0.3)
            extra = socket.create_connection(server.address, timeout=3)
            assert idle[0].recv(1) == b""                   # the oldest went
            threads, results = _register_all(server, 2)     # and tasks still get in
            _join(threads)
            assert results[0] == results[1] and isinstance(results[0], list)
            extra.close()
        finally:
            for s in idle:
                s.close()


def test_a_flood_of_silent_sockets_does_not_keep_the_tasks_out(caplog):
    """Silent sockets re-opened as fast as they are dropped, far more than
    the budget: every task of the stage still registers, and the log says
    so a few times, not once per socket."""
    caplog.set_level(logging.WARNING, logger="flinkbuf.spark")
    with RendezvousServer(SECRET, 4, timeout=5.0) as server:
        stop = threading.Event()
        opened = [0]

        def flood():
            held = []
            while not stop.is_set():
                try:
                    held.append(socket.create_connection(server.address, timeout=1))
                    opened[0] += 1
                except OSError:
                    pass
                if len(held) > 100:
                    held.pop(0).close()
            for s in held:
                s.close()

        flooders = [threading.Thread(target=flood) for _ in range(2)]
        for t in flooders:
            t.start()
        try:
            # Well past the budget before the tasks come, and on while they do.
            assert wait_until(lambda: opened[0] > 2 * _rendezvous.UNAUTHENTICATED_BUDGET, 20)
            threads, results = _register_all(server, 4)
            _join(threads)
        finally:
            stop.set()
            for t in flooders:
                t.join(10)
        assert all(isinstance(results[i], list) for i in range(4)), results
        assert caplog.text.count("had not authenticated yet") <= server._log_limited.burst


def test_authenticated_connections_are_capped():
    with RendezvousServer(SECRET, 2, timeout=2.0, max_connections=1) as server:
        first, results = _register_all(server, 2, indexes=[0])
        time.sleep(0.3)                                  # task 0 waits, authenticated
        with pytest.raises(RemoteConnectionError, match="gave no answer"):
            register(server.address, SECRET, stage=1, task_attempt_id=1, index=1, num_tasks=2,
                     address="10.0.0.1:1001", timeout=2.0)
        _join(first)
        assert server.refused >= 1


def test_a_task_attempt_id_is_registered_once():
    with RendezvousServer(SECRET, 3, timeout=1.0) as server:
        first, _ = _register_all(server, 3, indexes=[0])
        time.sleep(0.2)
        with pytest.raises(RemoteConnectionError, match="task attempt 0 registered already"):
            register(server.address, SECRET, stage=1, task_attempt_id=0, index=1,
                     num_tasks=3, address="10.0.0.9:9", timeout=2.0)
        _join(first)


def test_a_task_attempt_id_spark_has_not_issued_cannot_poison_the_stage():
    """A registration with an id beyond what Spark issued (2**63 - 1 would
    make every real task look older) is refused; the real tasks proceed."""
    with RendezvousServer(SECRET, 2, timeout=3.0, issued_task_ids=lambda: 10) as server:
        with pytest.raises(RemoteConnectionError):
            register(server.address, SECRET, stage=1, task_attempt_id=2**63 - 1, index=0,
                     num_tasks=2, address="10.0.0.9:9", timeout=2.0)
        threads, results = _register_all(server, 2)
        _join(threads)
        assert isinstance(results[0], list) and results[0] == results[1]
        assert server.attempts_started == 1


def test_close_drops_waiting_tasks_and_leaves_nothing():
    server = RendezvousServer(SECRET, 2, timeout=30)
    port = server.address[1]
    threads, results = _register_all(server, 2, indexes=[0], timeout=30)
    time.sleep(0.2)
    start = time.monotonic()
    server.close()
    _join(threads)
    assert time.monotonic() - start < 5
    assert isinstance(results[0], RemoteConnectionError)
    server.close()                                          # idempotent
    with pytest.raises(RemoteConnectionError, match="refused the connection.*it is closed"):
        register(("127.0.0.1", port), SECRET, stage=1, task_attempt_id=0, index=0,
                 num_tasks=2, address="a:1", timeout=1)


def test_close_does_not_wait_for_the_accept_slice():
    """close() ends the accepting thread's wait at once (not after its next
    0.2 s slice): a server no task reached closes in far less."""
    for _ in range(5):
        server = RendezvousServer(SECRET, 2, timeout=30)
        time.sleep(0.02)                 # the thread is waiting in accept()
        t0 = time.monotonic()
        server.close()
        assert time.monotonic() - t0 < 0.1
        assert not server._thread.is_alive()


def test_a_server_closes_when_its_owner_goes():
    from flinkbuf.spark._prepare import serve_while

    class Owner:
        pass

    owner = Owner()
    server = RendezvousServer(SECRET, 2, timeout=2.0)
    serve_while(server, owner)
    time.sleep(2.3)
    assert not server.closed and _threads()               # held by its owner
    del owner
    gc.collect()
    # Released: it still serves a job that registers now (well within its
    # timeout, on a loaded machine too) ...
    time.sleep(0.2)
    threads, results = _register_all(server, 2)
    _join(threads)
    assert results[0] == results[1]
    assert not server.closed
    # ... and closes once idle for its timeout, its thread and port with it.
    deadline = time.monotonic() + 5
    while not server.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.closed
    with pytest.raises(RemoteConnectionError, match="refused the connection.*it is closed"):
        register(server.address, SECRET, stage=1, task_attempt_id=0, index=0,
                 num_tasks=2, address="a:1", timeout=1)


def test_a_registration_is_acknowledged_when_made_and_its_wait_can_be_cancelled():
    """A Registration is recorded by the driver before its constructor
    returns (the driver acknowledges it); answer() waits for the others,
    and cancel() from another thread ends that wait with a clear error,
    long before the timeout."""
    with RendezvousServer(SECRET, 2, timeout=30) as server:
        reg = _rendezvous.Registration(server.address, SECRET, stage=9, task_attempt_id=4,
                                       index=1, num_tasks=2, address="127.0.0.1:7",
                                       timeout=30, connect_timeout=5)
        with server._lock:
            assert server._attempts[9].tids == [None, 4]      # no waiting: it is there
        threading.Timer(0.2, reg.cancel).start()
        started = time.monotonic()
        with pytest.raises(RemoteConnectionError, match="gave no answer"):
            reg.answer()
        assert time.monotonic() - started < 5
        reg.cancel()                       # again, after the end: nothing happens


def test_a_refused_registration_is_raised_when_made():
    """A registration the driver refuses (an older stage attempt, a task
    attempt registered already) fails at once, in the constructor, before
    the task's records could flow; the stage attempt is not touched."""
    with RendezvousServer(SECRET, 2, timeout=30) as server:
        first = _rendezvous.Registration(server.address, SECRET, stage=3, task_attempt_id=10,
                                         index=0, num_tasks=2, address="127.0.0.1:7",
                                         timeout=30, connect_timeout=5)
        started = time.monotonic()
        for tid, index, why in [(10, 1, "registered already"), (2, 1, "older attempt")]:
            with pytest.raises(RemoteConnectionError, match=f"refused task 1: .*{why}"):
                _rendezvous.Registration(server.address, SECRET, stage=3, task_attempt_id=tid,
                                         index=index, num_tasks=2, address="127.0.0.1:8",
                                         timeout=30, connect_timeout=5)
        assert time.monotonic() - started < 5
        with server._lock:
            assert server._attempts[3].tids == [10, None]
        first.cancel()
        with pytest.raises(RemoteConnectionError):
            first.answer()
