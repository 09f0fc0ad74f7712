"""Buffer debloating in one process: an input gate that consumes slowly tells
its local producers a smaller buffer size, the writer finishes buffers at
that size, records still arrive whole and in order, and a fast consumer
keeps whole segments."""

import pickle
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.io import (BufferDebloatConfig, InputGate, LocalInputChannel, RecordWriter,
                         UnknownInputChannel, create_partition)
from helpers import wait_until

SEG = 32768
FAST = {"buffer_debloat": True, "buffer_debloat_target": 0.05,
        "buffer_debloat_period": 0.01, "buffer_debloat_samples": 1,
        "buffer_debloat_threshold": 0}


@pytest.fixture
def nbp():
    pool = NetworkBufferPool(64, SEG)
    yield pool
    pool.destroy()


def _writer_thread(writer, stop, size=8):
    """Emit numbered records of ``size`` bytes until ``stop`` or release."""
    def run():
        i = 0
        try:
            while not stop.is_set():
                writer.emit(i.to_bytes(4, "big") + b"x" * (size - 4))
                i += 1
        except Exception:                   # noqa: BLE001 - released by the gate's close
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _read_slowly(gate, seconds, rate):
    """Read at about ``rate`` records a second for ``seconds``; the records'
    numbers in order."""
    seen = []
    t0 = time.monotonic()
    for rec in gate:
        seen.append(int.from_bytes(bytes(rec)[:4], "big"))
        elapsed = time.monotonic() - t0
        if elapsed >= seconds:
            break
        ahead = len(seen) / rate - elapsed
        if ahead > 0.001:
            time.sleep(ahead)
    return seen


def test_a_slow_consumer_gets_small_buffers_and_every_record(nbp):
    part = create_partition(nbp, 1)
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.01)
    stop = threading.Event()
    t = _writer_thread(writer, stop, size=100)     # 200 KB/s read: 10 KB in 50 ms
    gate = InputGate([(part, 0)], codec="bytes", **FAST)
    try:
        seen = _read_slowly(gate, 1.5, 2000)
        size = part.subpartition(0).buffer_size
        # 104-byte records at 2000 a second for 50 ms, in one or two buffers in use
        assert size is not None and 2500 <= size <= 15000, size
        metrics = gate._debloat_metrics()
        assert metrics["buffer_size"] == size and 0.02 < metrics["time_to_consume"] < 0.2, metrics
        assert metrics["buffers_in_use"] >= 0 and len(metrics["in_flight_bytes"]) == 1, metrics
        assert metrics["in_flight_bytes"][0] % size == 0, metrics
        # from here on each buffer the gate takes holds at most `size` bytes
        _, bytes0, buffers0, _ = gate._metric_counters()
        more = _read_slowly(gate, 0.5, 2000)
        _, bytes1, buffers1, _ = gate._metric_counters()
        assert buffers1 > buffers0
        # a fraction of a segment (each buffer holds the size announced when
        # it was requested, which moves with the rate a loaded machine reads at)
        assert (bytes1 - bytes0) / (buffers1 - buffers0) < SEG / 3
    finally:
        stop.set()
        gate.close()
        t.join(10)
    records = seen + more
    assert records == list(range(records[0], records[0] + len(records)))
    assert records[0] == 0


def test_a_fast_consumer_keeps_whole_segments(nbp):
    part = create_partition(nbp, 1)
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=None)
    stop = threading.Event()
    t = _writer_thread(writer, stop, size=100)
    gate = InputGate([(part, 0)], codec="bytes", **FAST)
    try:
        n = 0
        end = time.monotonic() + 1.0
        for _ in gate:
            n += 1
            if time.monotonic() > end:
                break
        assert n > 10000
        # in flight: at most a few buffers, each consumed in well under the target
        assert part.subpartition(0).buffer_size in (None, SEG)
    finally:
        stop.set()
        gate.close()
        t.join(10)


def test_off_by_default_and_off_announces_nothing(nbp):
    part = create_partition(nbp, 1)
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.01)
    stop = threading.Event()
    t = _writer_thread(writer, stop)
    gate = InputGate([(part, 0)], codec="bytes")
    try:
        assert gate.buffer_debloat == BufferDebloatConfig()
        assert not gate.buffer_debloat.enabled and gate._debloat_metrics() is None
        _read_slowly(gate, 0.5, 2000)
        assert part.subpartition(0).buffer_size is None
    finally:
        stop.set()
        gate.close()
        t.join(10)


def test_an_unknown_channel_passes_the_size_on(nbp):
    """A size announced while a channel's producer is not known reaches the
    producer once the channel is updated."""
    first = create_partition(nbp, 1)
    later = create_partition(nbp, 1)
    w1 = RecordWriter(first, "round_robin", codec="bytes", buffer_timeout=0.01)
    stop = threading.Event()
    t = _writer_thread(w1, stop)
    unknown = UnknownInputChannel("later", 0)
    gate = InputGate([(first, 0), unknown], codec="bytes", **FAST)
    try:
        _read_slowly(gate, 1.0, 2000)
        size = first.subpartition(0).buffer_size
        assert size is not None and size < SEG
        unknown.update(LocalInputChannel(later, 0))
        announced = gate._debloat_metrics()["buffer_size"]
        assert later.subpartition(0).buffer_size == announced
    finally:
        stop.set()
        gate.close()
        t.join(10)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=80),
       cuts=st.lists(st.integers(64, 4096), min_size=1, max_size=8))
def test_records_arrive_whole_whatever_the_buffer_size(sizes, cuts):
    """Whatever size the subpartition's buffers are finished at, changed
    between any two records, every record arrives whole and in order."""
    nbp = NetworkBufferPool(16, 4096)
    try:
        part = create_partition(nbp, 1, min_buffers=8, max_buffers=8)
        writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=None)
        gate = InputGate([(part, 0)], codec="bytes")
        records = [bytes([k % 251]) * n for k, n in enumerate(sizes)]
        got = []

        def read():
            got.extend(bytes(r) for r in gate)

        reader = threading.Thread(target=read)
        reader.start()
        sp = part.subpartition(0)
        for k, rec in enumerate(records):
            if k % max(1, len(records) // len(cuts)) == 0:
                _set_size(gate, cuts[(k // max(1, len(records) // len(cuts))) % len(cuts)])
            writer.emit(rec)
        writer.close()
        reader.join(30)
        assert got == records
        assert sp.buffer_size == _last_set[0]
        gate.close()
    finally:
        nbp.destroy()


_last_set = [None]


def _set_size(gate, size):
    from flinkbuf import _testing
    _testing.announce_buffer_size(gate.channels[0], size)
    _last_set[0] = size


@pytest.mark.parametrize("kw, message", [
    ({"buffer_debloat": "yes"}, "buffer_debloat"),
    ({"buffer_debloat_target": 0}, "buffer_debloat_target"),
    ({"buffer_debloat_period": -1.0}, "buffer_debloat_period"),
    ({"buffer_debloat_samples": 0}, "buffer_debloat_samples"),
    ({"buffer_debloat_threshold": 101}, "buffer_debloat_threshold"),
    ({"buffer_debloat_min_size": 0}, "buffer_debloat_min_size"),
])
def test_a_bad_option_is_refused_naming_it(nbp, kw, message):
    part = create_partition(nbp, 1)
    with pytest.raises((TypeError, ValueError), match=message):
        InputGate([(part, 0)], **kw)
    part.release()


def test_the_gate_keeps_the_options_it_was_given(nbp):
    part = create_partition(nbp, 1)
    gate = InputGate([(part, 0)], buffer_debloat=True, buffer_debloat_target=0.2,
                     buffer_debloat_min_size=512)
    cfg = gate.buffer_debloat
    assert cfg.enabled and cfg.target == 0.2 and cfg.min_size == 512
    assert cfg.period == 0.2 and cfg.samples == 20 and cfg.threshold == 25
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    gate.close()


def test_a_debloating_partition_starts_small(nbp):
    """Its subpartitions start at the minimum size, so a slow consumer never
    starts behind whole segments; its gate's first sample sets the size."""
    part = create_partition(nbp, 2, min_buffers=48, buffer_debloat=True,
                            buffer_debloat_min_size=512)
    assert [part.subpartition(i).buffer_size for i in range(2)] == [512, 512]
    plain = create_partition(nbp, 1)
    assert plain.subpartition(0).buffer_size is None
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=None)
    for i in range(200):
        writer.emit(b"r" * 100)
    writer.flush()
    assert part.backlog(0) >= 100 * 104 // 512          # buffers of at most 512 bytes
    writer.close()
    for p in (part, plain):
        p.release()
    with pytest.raises(ValueError, match="buffer_debloat_min_size"):
        create_partition(nbp, 1, buffer_debloat=True, buffer_debloat_min_size=0)


def test_a_fast_consumer_leaves_small_buffers_after_one_sample(nbp):
    """A partition that starts small, read by a gate that keeps up: the
    gate's first sample (a tenth of the period in) asks for whole segments."""
    part = create_partition(nbp, 1, buffer_debloat=True)
    writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=None)
    stop = threading.Event()
    t = _writer_thread(writer, stop, size=100)
    gate = InputGate([(part, 0)], codec="bytes", buffer_debloat=True)
    try:
        end = time.monotonic() + 0.5
        for _ in gate:
            if time.monotonic() > end:
                break
        assert part.subpartition(0).buffer_size == SEG
    finally:
        stop.set()
        gate.close()
        t.join(10)


def _exchange_options(**debloat):
    from flinkbuf.spark import _spec
    return _spec.check_options(2, None, num_partitions=None, key=None, selector="hash",
                               codec="typed", segment_size=4096, buffers_per_channel=2,
                               floating_buffers=0, buffer_timeout=0.1, max_record_size=1 << 20,
                               max_parallelism=None, host=None, timeout=10.0, monitor=None,
                               **debloat)


def test_an_exchange_checks_its_debloat_options_on_the_driver(monkeypatch):
    """pipelined_exchange's and arrow_exchange's options: checked before
    anything runs, carried (pickled) to each task, whose environment's gates
    and partition debloat; none given: the tasks' own default."""
    from flinkbuf.network import NetworkEnvironment
    options = _exchange_options()
    assert options.buffer_debloat is None
    options = _exchange_options(buffer_debloat=True, buffer_debloat_target=0.1)
    cfg = pickle.loads(pickle.dumps(options)).buffer_debloat
    assert cfg.enabled and cfg.target == 0.1 and cfg.period == 0.2
    with pytest.raises(ValueError, match="buffer_debloat_samples"):
        _exchange_options(buffer_debloat=True, buffer_debloat_samples=0)
    with NetworkEnvironment(32, 4096, secret=b"s" * 32, buffer_debloat=cfg) as env:
        assert env.config.buffer_debloat == cfg
        part = create_partition(env.network_buffer_pool, 1, buffer_debloat=cfg)
        env.register_partition("p", part)
        gate = env.create_input_gate([(env.address, "p", 0)])
        assert gate.buffer_debloat == cfg
        off = env.create_input_gate([(None, "q", 0)], buffer_debloat=False)
        assert not off.buffer_debloat.enabled and off.buffer_debloat.target == 0.1
        gate.close()
        off.close()
    monkeypatch.setenv("FLINKBUF_NET_BUFFER_DEBLOAT", "1")
    with NetworkEnvironment(8, 4096, secret=b"s" * 32) as env:
        assert env.config.buffer_debloat == BufferDebloatConfig(enabled=True)
    with NetworkEnvironment(8, 4096, secret=b"s" * 32, buffer_debloat=False) as env:
        assert not env.config.buffer_debloat.enabled
