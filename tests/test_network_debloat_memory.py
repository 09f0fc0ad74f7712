"""Buffer debloating gives memory back over a connection, on every
transport: a slow remote consumer's channel holds few buffers for its
sender and its reader, its gate's floating buffers go back to the
NetworkBufferPool (another pool takes them), the producer keeps one buffer
for the channel, and a consumer that speeds up gets whole segments again."""

import contextlib
import threading
import time

import pytest

from flinkbuf.io import BufferDebloatConfig, RecordWriter, create_partition
from flinkbuf.network import NetworkEnvironment
from helpers import wait_until
from network_helpers import SECRET
from test_debloat_gate import _writer_thread

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

SEG = 4096
FAST = BufferDebloatConfig(True, target=0.05, period=0.01, samples=1, threshold=0)


def _read(it, n, rate):
    got = []
    t0 = time.monotonic()
    for _ in range(n):
        got.append(int.from_bytes(bytes(next(it))[:4], "big"))
        ahead = len(got) / rate - (time.monotonic() - t0)
        if ahead > 0.001:
            time.sleep(ahead)
    return got


@contextlib.contextmanager
def _slow_remote_pair(record_size, **env_kw):
    """A producer and a consumer environment, a debloated partition of one
    subpartition (2..40 buffers) written without end by a thread, and the
    consumer's debloated gate on it: (partition, gate, consumer environment);
    all closed after."""
    prod = NetworkEnvironment(64, SEG, secret=SECRET, **env_kw)
    cons = NetworkEnvironment(48, SEG, secret=SECRET, **env_kw)
    stop = threading.Event()
    th = None
    try:
        part = create_partition(prod.network_buffer_pool, 1, min_buffers=2, max_buffers=40,
                                buffer_debloat=True)
        prod.register_partition("p", part)
        writer = RecordWriter(part, "round_robin", codec="bytes", buffer_timeout=0.01)
        th = _writer_thread(writer, stop, size=record_size)
        gate = cons.create_input_gate([(prod.address, "p", 0)], codec="bytes",
                                      buffer_debloat=FAST)
        with gate:
            yield part, gate, cons
            stop.set()
        th.join(10)
        assert not th.is_alive()
    finally:
        stop.set()
        cons.close()
        prod.close()


@pytest.mark.timeout(60)
def test_a_slow_remote_consumer_holds_few_buffers_and_gives_its_floating_ones_back():
    with _slow_remote_pair(100) as (part, gate, cons):
        it = iter(gate)
        seen = _read(it, 600, 600)           # a second at 600 records a second
        ch = gate.channels[0]
        floating = ch.floating_buffers.pool
        assert floating.min_buffers == 1 and floating.max_buffers == 8
        assert 0 < part.subpartition(0).buffer_size < SEG
        # the channel: at most one buffer for the sender and the reader together
        # beyond what arrived and waits, and none of the gate's floating ones
        assert wait_until(lambda: gate._debloat_metrics()["given_back"] == 7, 5), \
            (gate._debloat_metrics(), floating)
        more = _read(it, 100, 600)
        st = ch.stats()
        assert st["exclusive_available"] + st["floating_available"] + st["queued"] <= 2, st
        assert floating.num_buffers == 1
        # the producer: one buffer for the channel; its pool gave the rest back
        assert part._debloat_given_back() >= 30, part._debloat_given_back()
        second = cons.network_buffer_pool.create_buffer_pool(1, None)
        assert second.num_buffers >= 7 + 1   # the floating ones among them
        second.destroy()
        # speeding up: whole segments, and the memory comes back
        end = time.monotonic() + 5
        while part.subpartition(0).buffer_size != SEG and time.monotonic() < end:
            _read(it, 500, 1e9)
        assert part.subpartition(0).buffer_size == SEG
        _read(it, 2000, 1e9)
        assert wait_until(lambda: gate._debloat_metrics()["given_back"] == 0, 5)
        assert floating.num_buffers == 8
        nums = seen + more
        assert nums == list(range(nums[0], nums[0] + len(nums)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport, encryption", [("tcp", False), ("unix", False),
                                                   ("shm", False), ("tcp", True)],
                         ids=["tcp", "unix", "shm", "sealed"])
def test_a_slow_remote_consumer_s_next_buffer_is_sent_once_it_has_read_the_last(
        transport, encryption):
    """Debloated, a remote channel tells its sender of the buffer it holds
    only when its reader has read every record it took (a record that
    spans buffers still gets the next one): while the reader is inside a
    buffer, nothing waits for it; the records come in order, none lost."""
    # 700-byte records span the buffers debloating picks
    with _slow_remote_pair(700, transport=transport, encryption=encryption) as (part, gate, _):
        it = iter(gate)
        # a second at 50 records a second: 1.75 KB in flight, two buffers' worth
        seen = _read(it, 50, 50)
        assert 0 < part.subpartition(0).buffer_size < SEG
        ch = gate.channels[0]
        waited = []
        for _ in range(40):                     # more, slowly: what waited meanwhile
            seen.append(int.from_bytes(bytes(next(it))[:4], "big"))
            time.sleep(1 / 50)
            waited.append(ch.stats()["queued"])
        # a buffer arrives only when the reader has read the last one
        assert sum(waited) <= 2, (str(waited), gate._debloat_metrics())
        time.sleep(0.2)                         # the reader pauses inside a buffer
        assert ch.stats()["queued"] == 0, ch.stats()
        seen += _read(it, 300, 1e9)             # and goes on at full speed
        assert seen == list(range(seen[0], seen[0] + len(seen)))
