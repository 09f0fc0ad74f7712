"""A peer that stops (SIGSTOP: its process, threads and all) is noticed
within the I/O timeout: a connection asks a silent peer for a heartbeat,
which the peer's connection threads answer, never its Python code, and
fails when no byte came for the whole timeout, naming the peer.  A peer
that is merely slow (its consumer does not read for several timeouts, or
its Python threads are busy) answers, and is never failed.  Every test runs
once per transport (tcp, unix, shm, and tcp sealed: conftest.py)."""

import os
import signal
import struct
import threading
import time

import pytest

from flinkbuf.errors import PartitionReleasedError, RemoteConnectionError
from flinkbuf.io import RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from helpers import wait_until
from network_helpers import SECRET, record_bytes

SEG = 4096
IO_TIMEOUT = 2.0
# What a loaded machine may add to a timeout (scheduling, the last bytes in
# flight when the peer stopped).
SLACK = 1.5


class Endless:
    """A writer thread that emits numbered records to subpartition 0 of
    ``part`` until stopped or its write raises (``error``, ``t_error``)."""

    def __init__(self, part):
        self.writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.001)
        self.stop = threading.Event()
        self.count = 0
        self.error = None
        self.t_error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        data = bytearray(record_bytes(1, 0, 200))
        try:
            while not self.stop.is_set():
                struct.pack_into(">I", data, 2, self.count & 0xFFFFFFFF)
                self.writer.emit(data)
                self.count += 1
        except BaseException as exc:                   # noqa: BLE001 - checked by the test
            self.error, self.t_error = exc, time.monotonic()

    def close(self):
        self.stop.set()
        self.thread.join(10)
        try:
            self.writer.close()
        except BaseException:                          # noqa: BLE001 - released by then
            pass


def producer_cfg(io_timeout):
    return {"num_segments": 64, "segment_size": SEG, "io_timeout": io_timeout,
            "partitions": [{"id": "p", "n": 1, "tag": 1, "mode": "endless", "size": 200,
                            "min_buffers": 4, "buffer_timeout": 0.001}]}


def consumer_cfg(address, io_timeout, **kw):
    return {"num_segments": 64, "segment_size": SEG, "io_timeout": io_timeout,
            "gates": [[[address, "p", 0]]], "report": "count", "progress": True, **kw}


def progress_of(child, at_least, timeout=30.0):
    """The child consumer's count once it is at least ``at_least``."""
    deadline = time.monotonic() + timeout
    while True:
        msg = child.expect("progress", max(0.1, deadline - time.monotonic()))
        if msg["progress"][0] >= at_least:
            return msg["progress"][0]


def stopped(child):
    """SIGSTOP the child; the time it stopped."""
    os.kill(child.pid, signal.SIGSTOP)
    return time.monotonic()


def test_a_stopped_producer_fails_its_consumer_within_the_io_timeout(children):
    prod = children.start("producer", producer_cfg(IO_TIMEOUT), life=60)
    address = prod.address()
    with NetworkEnvironment(64, SEG, secret=SECRET, io_timeout=IO_TIMEOUT) as env:
        gate = env.create_input_gate([(address, "p", 0)], codec="bytes")
        try:
            it = iter(gate)
            for _ in range(200):
                next(it)
            t0 = stopped(prod)
            try:
                with pytest.raises(RemoteConnectionError) as info:
                    for _ in it:
                        pass
                took = time.monotonic() - t0
            finally:
                os.kill(prod.pid, signal.SIGCONT)
        finally:
            gate.close()
    assert 0.5 * IO_TIMEOUT <= took <= IO_TIMEOUT + SLACK, took
    assert "did not answer" in str(info.value) and address in str(info.value), str(info.value)


def test_a_stopped_consumer_fails_its_producer_within_the_io_timeout(children):
    with NetworkEnvironment(64, SEG, secret=SECRET, io_timeout=IO_TIMEOUT) as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=4)
        env.register_partition("p", part)
        address = "{}:{}".format(*env.address)
        cons = children.start("consumer", consumer_cfg(address, IO_TIMEOUT), life=60)
        peer = cons.address()
        writer = Endless(part)
        try:
            progress_of(cons, 200)
            [conn] = env.connections()
            t0 = stopped(cons)
            try:
                assert wait_until(lambda: not conn.is_open, IO_TIMEOUT + SLACK + 2, 0.01)
                took = time.monotonic() - t0
                assert wait_until(lambda: writer.error is not None, 5)
            finally:
                os.kill(cons.pid, signal.SIGCONT)
        finally:
            writer.close()
    assert 0.5 * IO_TIMEOUT <= took <= IO_TIMEOUT + SLACK, took
    error = str(conn.error)
    assert "did not answer" in error and peer in error, error
    # the producer's writer learns that its reader is gone
    assert isinstance(writer.error, PartitionReleasedError), repr(writer.error)


def busy(seconds):
    """Keep this process's Python busy (the GIL taken in turns)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(range(1000))
    return n


PAUSE_TIMEOUT = 1.5
PAUSE = 3 * PAUSE_TIMEOUT


def test_a_consumer_that_does_not_read_for_several_io_timeouts_is_not_failed(children):
    """This process's consumer stops reading (its Python busy) for three
    times the I/O timeout, under backpressure from a producer process:
    neither side fails, and the records go on where they stopped."""
    prod = children.start("producer", producer_cfg(PAUSE_TIMEOUT), life=60)
    address = prod.address()
    with NetworkEnvironment(64, SEG, secret=SECRET, io_timeout=PAUSE_TIMEOUT) as env:
        gate = env.create_input_gate([(address, "p", 0)], codec="bytes")
        try:
            it = iter(gate)
            last = -1
            for _ in range(200):
                last = struct.unpack_from(">I", next(it), 2)[0]
            [conn] = env.connections()
            busy(PAUSE)
            assert conn.is_open, conn.error
            for _ in range(2000):
                index = struct.unpack_from(">I", next(it), 2)[0]
                assert index == last + 1
                last = index
            assert env.connections() == [conn]
            # (before this side's close releases the producer's subpartition)
            errors = [m for m in prod.poll_messages() if "error" in m]
            assert errors == [], errors
        finally:
            gate.close()


def test_a_producer_whose_consumer_pauses_for_several_io_timeouts_is_not_failed(children):
    """A consumer process pauses (its gate not read) for three times the I/O
    timeout while this process's producer is backpressured by it: neither
    side fails, and the consumer then reads on."""
    with NetworkEnvironment(64, SEG, secret=SECRET, io_timeout=PAUSE_TIMEOUT) as env:
        part = create_partition(env.network_buffer_pool, 1, min_buffers=4)
        env.register_partition("p", part)
        address = "{}:{}".format(*env.address)
        cons = children.start("consumer", consumer_cfg(address, PAUSE_TIMEOUT, pause_after=200),
                              life=60)
        writer = Endless(part)
        try:
            cons.expect("paused")
            [conn] = env.connections()
            time.sleep(PAUSE_TIMEOUT)
            emitted = writer.count
            time.sleep(PAUSE - PAUSE_TIMEOUT)
            assert conn.is_open, conn.error
            assert writer.error is None, writer.error
            assert writer.count == emitted               # backpressured all along
            cons.send(cmd="resume")
            progress_of(cons, 2000)
            assert conn.is_open and writer.error is None, (conn.error, writer.error)
        finally:
            writer.close()
    errors = [m for m in cons.poll_messages() if "gate_error" in m]
    assert errors == [], errors
