"""Buffer debloating in TaskMetrics, with Flink's names: per gate (what the
gate's debloater says, in flight per channel) and for the task (the largest
size and time to consume, the bytes in flight summed, the memory given
back by the gates and the writers' partitions, in segments and bytes),
over local channels and a remote one; off, nothing but zeros and None."""

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.io.metrics import TaskMetrics, _debloat
from flinkbuf.network import NetworkEnvironment
from helpers import wait_until
from network_helpers import SECRET
from test_debloat_gate import _writer_thread

SEG = 32768
FAST = {"buffer_debloat": True, "buffer_debloat_target": 0.05,
        "buffer_debloat_period": 0.01, "buffer_debloat_samples": 1,
        "buffer_debloat_threshold": 0}
DEBLOAT = ("debloatedBufferSize", "estimatedTimeToConsumeBuffersMs", "inFlightBytes",
           "debloatGivenBackSegments", "debloatGivenBackBytes", "inputGates")


@pytest.fixture
def nbp():
    with fb.NetworkBufferPool(64, SEG) as pool:
        yield pool


def _reader(gate, rate, pause):
    """A thread reading ``gate`` at about ``rate`` records a second until
    ``pause`` is set (or the gate closes)."""
    def run():
        t0 = time.monotonic()
        n = 0
        try:
            for _ in gate:
                n += 1
                if pause.is_set():
                    return
                ahead = n / rate - (time.monotonic() - t0)
                if ahead > 0.001:
                    time.sleep(ahead)
        except ValueError:                  # closed while it waited
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _steady(metrics, gates):
    """A snapshot and the gates' debloat metrics that did not change
    around it (the writers fill what is left of their pools meanwhile)."""
    got = []

    def read():
        before = [g._debloat_metrics() for g in gates]
        s = metrics.snapshot()
        if before == [g._debloat_metrics() for g in gates]:
            got.append((s, before))
        return bool(got)
    assert wait_until(read, 10, 0.01)
    return got[0]


def _expected_gate(index, raw):
    """A gate's entry as the module's table says, from its _debloat_metrics()."""
    return {"gate": index, "bufferDebloat": True, "debloatedBufferSize": raw["buffer_size"],
            "estimatedTimeToConsumeBuffersMs": raw["time_to_consume"] * 1000.0,
            "buffersInUse": raw["buffers_in_use"], "inFlightBytes": sum(raw["in_flight_bytes"]),
            "inFlightBytesPerChannel": raw["in_flight_bytes"],
            "debloatGivenBackSegments": raw["given_back"]}


def test_off_the_task_has_no_size_and_gives_nothing_back(nbp):
    part = fb.create_partition(nbp, 1)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    gate = fb.InputGate([(part, 0)])
    s = TaskMetrics("off", writers=[writer], gates=[gate]).snapshot()
    assert {k: s[k] for k in DEBLOAT} == {
        "debloatedBufferSize": None, "estimatedTimeToConsumeBuffersMs": None,
        "inFlightBytes": None, "debloatGivenBackSegments": 0, "debloatGivenBackBytes": 0,
        "inputGates": [{"gate": 0, "bufferDebloat": False, "debloatedBufferSize": None,
                        "estimatedTimeToConsumeBuffersMs": None, "buffersInUse": None,
                        "inFlightBytes": None, "inFlightBytesPerChannel": [],
                        "debloatGivenBackSegments": 0}]}
    none = TaskMetrics("none").snapshot()
    assert none["inputGates"] == [] and none["debloatedBufferSize"] is None
    writer.close()
    gate.close()


def test_two_slow_gates_each_and_the_task_s_largest_and_sum(nbp):
    """Two gates of one task, each over two local channels, read at two
    rates: each gate's entry is what its debloater says; the task's size
    and time are the largest of the gates', its bytes in flight the sum."""
    parts = [fb.create_partition(nbp, 2, buffer_debloat=True) for _ in range(2)]
    writers = [fb.RecordWriter(p, "round_robin", codec="bytes", buffer_timeout=0.01)
               for p in parts]
    stop = threading.Event()
    threads = [_writer_thread(w, stop, 100) for w in writers]
    gates = [fb.InputGate([(parts[0], k), (parts[1], k)], codec="bytes", **FAST)
             for k in range(2)]
    metrics = TaskMetrics("both", writers=writers, gates=gates)
    pause = threading.Event()
    readers = [_reader(g, rate, pause) for g, rate in zip(gates, (1000, 4000))]
    try:
        assert wait_until(lambda: all(g._debloat_metrics()["buffer_size"] for g in gates), 10)
        time.sleep(0.2)
        pause.set()
        s, raws = _steady(metrics, gates)
        assert s["inputGates"] == [_expected_gate(i, raw) for i, raw in enumerate(raws)]
        assert all(len(g["inFlightBytesPerChannel"]) == 2 for g in s["inputGates"])
        assert s["debloatedBufferSize"] == max(raw["buffer_size"] for raw in raws)
        assert s["estimatedTimeToConsumeBuffersMs"] == \
            max(raw["time_to_consume"] for raw in raws) * 1000.0
        assert s["inFlightBytes"] == sum(sum(raw["in_flight_bytes"]) for raw in raws)
        # Nothing is given back yet (the pools keep their segments).
        assert (s["debloatGivenBackSegments"], s["debloatGivenBackBytes"]) == (0, 0)
    finally:
        stop.set()
        pause.set()
        for g in gates:
            g.close()
        for t in threads + readers:
            t.join(10)
            assert not t.is_alive()


@pytest.mark.timeout(60)
def test_a_remote_gate_s_channel_in_flight(nbp):
    """A debloating gate over a remote channel and a local one: one entry
    per channel, each in flight as its debloater counts it."""
    def env(**kw):
        return NetworkEnvironment(64, 4096, secret=SECRET, **kw)

    with env() as prod, env(**FAST) as cons:
        remote = fb.create_partition(prod.network_buffer_pool, 1, min_buffers=8,
                                     buffer_debloat=True)
        prod.register_partition("r", remote)
        local = fb.create_partition(cons.network_buffer_pool, 1, buffer_debloat=True)
        cons.register_partition("l", local)
        gate = cons.create_input_gate([(prod.address, "r", 0), (cons.address, "l", 0)],
                                      codec="bytes")
        metrics = TaskMetrics("consumer", gates=[gate])
        writers = [fb.RecordWriter(p, codec="bytes", buffer_timeout=0.01) for p in (remote, local)]
        stop = threading.Event()
        pause = threading.Event()
        threads = [_writer_thread(w, stop, 100) for w in writers] + [_reader(gate, 2000, pause)]
        try:
            assert wait_until(lambda: gate._debloat_metrics()["buffer_size"], 10)
            time.sleep(0.2)
            pause.set()
            s, (raw,) = _steady(metrics, [gate])
            (entry,) = s["inputGates"]
            assert entry["inFlightBytesPerChannel"] == raw["in_flight_bytes"]
            assert len(entry["inFlightBytesPerChannel"]) == 2
            assert entry["debloatedBufferSize"] == raw["buffer_size"]
            assert all(b % raw["buffer_size"] == 0 for b in entry["inFlightBytesPerChannel"])
        finally:
            stop.set()
            pause.set()
            gate.close()
            for t in threads:
                t.join(10)


# ---- the memory given back: the sum, for values a test controls ---------------------------------

class _Pool:
    def __init__(self, segment_size):
        self.network_buffer_pool = type("NBP", (), {"segment_size": segment_size})()


class _Gate:
    """What _debloat reads of a gate: its debloat metrics and where its
    buffers come from (a local channel's pool, or a remote channel's
    floating pool, or, unknown, neither)."""

    def __init__(self, given_back, segment_size, where):
        self.given_back, self.pool, self.where = given_back, _Pool(segment_size), where

    def _debloat_metrics(self):
        return {"buffer_size": 1024, "time_to_consume": 0.5, "buffers_in_use": 3,
                "in_flight_bytes": [1024, 2048], "given_back": self.given_back}

    def source_pools(self):
        return [self.pool] if self.where == "local" else []

    def _own_buffer_counters(self):
        return [None, (0, 2, 0, 0, self.pool if self.where == "remote" else None)]


class _Partition:
    def __init__(self, given_back, segment_size):
        self.given_back, self.pool = given_back, _Pool(segment_size)

    def _debloat_given_back(self):
        return self.given_back


class _Writer:
    def __init__(self, partition):
        self.partition = partition


_GIVEN = st.integers(0, 10_000)
_SEGMENT = st.sampled_from([256, 4096, 32768])


@given(st.lists(st.tuples(_GIVEN, _SEGMENT, st.sampled_from(["local", "remote", "unknown"])),
                max_size=4),
       st.lists(st.tuples(_GIVEN, _SEGMENT), max_size=3), st.data())
def test_given_back_sums_segments_and_their_bytes(gates, partitions, data):
    """Segments: every gate's and every distinct partition's; bytes: each
    times its segment size (a gate that cannot tell its own: the writers'
    partition's)."""
    fakes = [_Gate(*g) for g in gates]
    parts = [_Partition(*p) for p in partitions]
    # Writers may share a partition: it counts once.
    writers = [_Writer(p) for p in parts] + [_Writer(p) for p in
                                             data.draw(st.lists(st.sampled_from(parts))
                                                       if parts else st.just([]))]
    got = _debloat(fakes, writers)
    fallback = parts[0].pool.network_buffer_pool.segment_size if parts else 0
    assert got["debloatGivenBackSegments"] == \
        sum(g[0] for g in gates) + sum(p[0] for p in partitions)
    assert got["debloatGivenBackBytes"] == \
        sum(n * (size if where != "unknown" else fallback) for n, size, where in gates) + \
        sum(n * size for n, size in partitions)
    assert [e["debloatGivenBackSegments"] for e in got["inputGates"]] == [g[0] for g in gates]
    assert got["inFlightBytes"] == (3072 * len(gates) if gates else None)


def test_given_back_reads_the_gates_and_the_partitions_of_a_real_task(nbp):
    """Today's pools give nothing back: 0 segments, 0 bytes, from real
    gates and partitions (whose _debloat_given_back the sum reads)."""
    part = fb.create_partition(nbp, 1, buffer_debloat=True)
    writer = fb.RecordWriter(part, buffer_timeout=None)
    gate = fb.InputGate([(part, 0)], **FAST)
    got = _debloat([gate], [writer])
    assert part._debloat_given_back() == gate._debloat_metrics()["given_back"] == 0
    assert (got["debloatGivenBackSegments"], got["debloatGivenBackBytes"]) == (0, 0)
    writer.close()
    gate.close()
