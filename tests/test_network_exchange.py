"""Records across processes: every record exactly once and in per-producer
order on every channel, events in order with them, for 1->1, 1->N, N->1
and N->M (producers in separate processes, one consumer process may hold
several gates), over record sizes from 0 bytes to more than two segments,
segment sizes from 64 B to 32 KiB, credit settings and buffer timeouts."""

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from network_helpers import Children, expected_streams

# A thread of the engine that dies with an exception fails the test.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

SEGMENT_SIZES = [64, 128, 256, 1024, 4096, 32768]


def assert_clean(report, who):
    assert report["counters"] in (None, {"standalone_segments": 0, "live_buffers": 0,
                                         "segments_out": 0}), (who, report)
    assert report["threads"] == [], (who, report["threads"])


def run_exchange(children, case, timeout=60.0):
    """Producers 0..P-1 (one process each) with a partition of M
    subpartitions; gate c reads subpartition c of every producer; consumer
    process j holds gates c with c % K == j.  Checks what every channel got
    against the plans."""
    P, M, K = case["P"], case["M"], case["K"]
    common = {"segment_size": case["seg"], "exclusive": case["exclusive"],
              "floating": case["floating"], "direct_reads": case.get("direct_reads", True)}
    producers = []
    for p in range(P):
        part = {"id": f"part-{p}", "n": M, "tag": p, "plan": case["plans"][p],
                "min_buffers": M + 1 + case["extra_buffers"],
                "buffer_timeout": case["buffer_timeout"]}
        producers.append(children.start("producer", dict(
            common, num_segments=M + 4 + case["extra_buffers"], partitions=[part])))
    addrs = [c.address() for c in producers]
    consumers = []
    for j in range(K):
        gates = [[[addrs[p], f"part-{p}", c] for p in range(P)] for c in range(M) if c % K == j]
        need = len(gates) * (P * case["exclusive"] + case["floating"])
        consumers.append((j, gates, children.start("consumer", dict(
            common, num_segments=need + 2, gates=gates))))
    expected = [expected_streams(p, case["plans"][p], M) for p in range(P)]
    for j, gates, cons in consumers:
        results = cons.expect("results", timeout)["results"]
        for g, res in enumerate(results):
            c = [c for c in range(M) if c % K == j][g]
            assert res is not None and "error" not in res, (j, c, res)
            for p in range(P):
                got, want = res["streams"][p], expected[p][c]
                assert len(got) == len(want), (
                    f"consumer {j} gate {c} channel from producer {p}: {len(got)} items, "
                    f"expected {len(want)}")
                for k, (a, b) in enumerate(zip(got, want)):
                    assert a == b, (f"consumer {j} gate {c} producer {p}: item {k} is {a}, "
                                    f"expected {b}")
        assert_clean(cons.expect("closed", 20), f"consumer {j}")
    for p, prod in enumerate(producers):
        written = prod.expect("written", 20)
        assert "error" not in written, written
        prod.send(cmd="close")
        assert_clean(prod.expect("closed", 20), f"producer {p}")
    for c in children.all:
        assert c.wait_exit(20) == 0, c.stderr()


def random_plan(rng, seg, n_ops, M, max_total):
    plan, total = [], 0
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.08:
            plan.append(["e", rng.randrange(1 << 20)])
            continue
        if r < 0.5:
            size = rng.randint(0, 16)
        elif r < 0.85:
            size = rng.randint(0, seg)
        else:
            size = rng.randint(seg, 2 * seg + seg // 2)
        if total + size > max_total:
            size = rng.randint(0, 16)
        total += size
        plan.append(["r", size, rng.randrange(M)])
    return plan


TOPOLOGIES = {
    "1to1": (1, 1, 1),
    "1toN": (1, 3, 3),
    "Nto1": (3, 1, 1),
    "NtoM": (3, 3, 2),      # one consumer process holds two gates
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("direct_reads", [True, False], ids=["direct", "reader-thread"])
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_exchange_topology(children, name, direct_reads):
    """A fixed case per topology: 150 ops per producer (records of 0 B to
    2.5 segments of 256 B, and broadcast events), minimum credit; consumers
    reading their sockets themselves, or only through the reader thread."""
    P, M, K = TOPOLOGIES[name]
    rng = random.Random(name)
    case = {"P": P, "M": M, "K": K, "seg": 256, "exclusive": 1, "floating": 1,
            "direct_reads": direct_reads,
            "extra_buffers": 0, "buffer_timeout": 0.001,
            "plans": [random_plan(rng, 256, 150, M, 1 << 20) for _ in range(P)]}
    run_exchange(children, case)


@st.composite
def exchange_cases(draw):
    seg = draw(st.sampled_from(SEGMENT_SIZES))
    P = draw(st.integers(1, 3))
    M = draw(st.integers(1, 3))
    K = draw(st.integers(1, M))
    sizes = st.one_of(st.integers(0, 16), st.integers(0, seg),
                      st.integers(seg, 2 * seg + seg // 2))
    op = st.one_of(
        st.tuples(st.just("r"), sizes, st.integers(0, M - 1)).map(list),
        st.tuples(st.just("e"), st.integers(-(1 << 40), 1 << 40)).map(list))
    plans = [draw(st.lists(op, max_size=40)) for _ in range(P)]
    return {"P": P, "M": M, "K": K, "seg": seg,
            "exclusive": draw(st.integers(1, 3)), "floating": draw(st.integers(0, 4)),
            "extra_buffers": draw(st.integers(0, 3)),
            "buffer_timeout": draw(st.sampled_from([None, 0, 0.001, 0.05])),
            "direct_reads": draw(st.booleans()),
            "plans": plans}


@pytest.mark.timeout(300)
@settings(max_examples=int(os.environ.get("NETTEST_EXAMPLES", "12")))
@given(case=exchange_cases())
def test_exchange_exactly_once_in_order(case):
    """Hypothesis over topology, segment size, record sizes, credit and
    buffer timeout: every channel gets exactly its producer's records for
    it, in order, with the broadcast events where they were sent."""
    children = Children()
    try:
        run_exchange(children, case)
    finally:
        children.stop_all()
