"""Input gates whose producers are not all known when the gate is made: an
address of None in create_input_gate makes an UnknownInputChannel, and
update_input_channel connects it once the address is known (another
process's partition over a connection, or this one's own), while the gate
already reads its other channels.  Every transport."""

import socket
import threading
import time

import pytest

import flinkbuf as fb
from flinkbuf.errors import PartitionReleasedError, RemoteConnectionError
from flinkbuf.network import NetworkEnvironment
from network_helpers import SECRET

SEG = 1024


def _env(**kw):
    return NetworkEnvironment(64, SEG, secret=SECRET, connect_timeout=2.0, request_timeout=5.0,
                              **kw)


def _serve(env, pid, records):
    """Register a partition of one subpartition as ``pid`` in ``env`` and
    write ``records`` into it from a thread (returned, to join; its
    ``partition`` and, if released, its ``released`` error attached)."""
    part = fb.create_partition(env.network_buffer_pool, 1, min_buffers=4)
    env.register_partition(pid, part)

    def write():
        try:
            with fb.RecordWriter(part, buffer_timeout=0.001) as w:
                for r in records:
                    w.emit(r)
        except PartitionReleasedError as exc:
            t.released = exc
    t = threading.Thread(target=write)
    t.partition, t.released = part, None
    t.start()
    return t


def test_a_gate_reads_its_own_partition_before_a_peers_address_is_known():
    with _env() as producer, _env() as consumer:
        theirs = _serve(producer, "x", [("them", i) for i in range(2000)])
        ours = _serve(consumer, "x", [("us", i) for i in range(500)])
        gate = consumer.create_input_gate([(consumer.address, "x", 0), (None, "x", 0)])
        try:
            unknown = gate.channels[1]
            assert isinstance(unknown, fb.UnknownInputChannel)
            assert (unknown.partition_id, unknown.subpartition) == ("x", 0)
            first = [next(gate) for _ in range(500)]           # no peer needed for these
            assert first == [("us", i) for i in range(500)]
            assert consumer.connections() == []
            threading.Timer(0.05, consumer.update_input_channel,
                            (unknown, producer.address)).start()
            rest = list(gate)
            assert rest == [("them", i) for i in range(2000)]
            assert type(unknown.channel).__name__ == "RemoteInputChannel"
            assert len(consumer.connections()) == 1
        finally:
            gate.close()
            theirs.join(10)
            ours.join(10)


def test_an_unknown_channel_may_turn_out_to_read_this_process():
    with _env() as env:
        t = _serve(env, "own", list(range(100)))
        with env.create_input_gate([(None, "own", 0)]) as gate:
            env.update_input_channel(gate.channels[0], env.address)
            assert isinstance(gate.channels[0].channel, fb.LocalInputChannel)
            assert list(gate) == list(range(100))
            assert env.connections() == []
        t.join(10)


def test_update_input_channel_refuses_channels_it_cannot_update():
    with _env() as env, _env() as other:
        t = _serve(env, "p", [1])
        gate = env.create_input_gate([(None, "p", 0)])
        elsewhere = other.create_input_gate([(None, "p", 0)])
        try:
            with pytest.raises(TypeError, match="UnknownInputChannel"):
                env.update_input_channel("channel", env.address)
            with pytest.raises(ValueError, match="not made by this environment"):
                env.update_input_channel(elsewhere.channels[0], env.address)
            with pytest.raises(ValueError, match="not made by this environment"):
                env.update_input_channel(fb.UnknownInputChannel("p", 0), env.address)
            env.update_input_channel(gate.channels[0], env.address)
            with pytest.raises(ValueError, match="updated already"):
                env.update_input_channel(gate.channels[0], env.address)
            assert list(gate) == [1]
        finally:
            gate.close()
            elsewhere.close()
            t.join(10)


def test_an_unreachable_address_fails_within_the_connect_timeout_and_can_be_failed():
    with socket.socket() as s:                  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with _env(transport="tcp") as env:
        gate = env.create_input_gate([(None, "p", 0)])
        try:
            unknown = gate.channels[0]
            started = time.monotonic()
            with pytest.raises(RemoteConnectionError):
                env.update_input_channel(unknown, dead)
            assert time.monotonic() - started < 5
            assert unknown.channel is None           # still unknown: a caller may give up
            unknown.fail(RemoteConnectionError(f"cannot reach {dead}"))
            with pytest.raises(RemoteConnectionError, match="cannot reach"):
                next(gate)
        finally:
            gate.close()


def test_an_update_after_the_gate_closed_gives_the_new_channel_back():
    """The channel made for it is closed at once: its buffers go back (the
    leak check after every test) and its connection carries no channel."""
    with _env() as producer, _env() as consumer:
        t = _serve(producer, "p", range(10_000))
        gate = consumer.create_input_gate([(None, "p", 0)])
        gate.close()
        try:
            with pytest.raises(ValueError, match="closed"):
                consumer.update_input_channel(gate.channels[0], producer.address)
            assert [c.num_channels for c in consumer.connections()] == [0]
            assert gate.channels[0].channel is None
        finally:
            t.partition.release()            # the writer, blocked without a reader, ends
            t.join(10)
        assert not t.is_alive() and t.released is not None


def test_a_closed_environment_updates_nothing():
    env = _env()
    gate = env.create_input_gate([(None, "p", 0)])
    env.close()
    with pytest.raises(Exception, match="closed"):
        env.update_input_channel(gate.channels[0], "127.0.0.1:1")
    gate.close()
