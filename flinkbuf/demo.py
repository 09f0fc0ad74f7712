"""A two-thread backpressure demo on the buffer core alone.

A producer fills buffers from a pool of 2 (Flink's 2015 experiment: 2
buffers of 4096 bytes) and hands them to a consumer through a plain queue;
the consumer recycles them.  When the consumer slows down the producer's
blocking buffer request waits (without the GIL): the producer's rate drops
to the consumer's.  Nothing else throttles it.

The verdict comes from the measured rates: the slowed consumer must really
have been slower than at full speed, the producer's rate must follow it
(within ``FOLLOW_TOLERANCE``), its buffer requests must have held it (blocked
for most of that phase), and released, the consumer must speed up again.
When a measurement cannot show that, the demo says so instead.
"""

import collections
import threading
import time

import flinkbuf as fb
from flinkbuf.experiments.arguments import MAX_SECONDS, check_int, check_pool_fits, check_real

NUM_SEGMENTS = 4
POOL_BUFFERS = 2
SLOW_DELAY = 200e-6          # the slowed consumer's sleep per buffer
# A slowed consumer handles at most 1 / SLOW_DELAY = 5,000 buffers/s: a phase
# of MIN_PHASE_SECONDS holds a few hundred of them, enough for a rate that the
# producer's at most POOL_BUFFERS buffers ahead do not blur.
MIN_PHASE_SECONDS = 0.1
# Filling a buffer of more than this takes about as long as the slowed
# consumer's delay (a memory copy at a few GB/s): slowing it shows nothing.
MAX_SEGMENT_SIZE = 1 << 20
FOLLOW_TOLERANCE = 0.05      # slowed: the producer's rate within 5 % of the consumer's
SLOWED_MAX = 0.5             # slowed: the consumer at most half its full-speed rate
BLOCKED_MIN = 0.5            # slowed: the producer blocked at least half the phase
_PHASES = (("consumer at full speed", 0.0), ("consumer slowed", SLOW_DELAY),
           ("consumer released", 0.0))


def check_arguments(phase_seconds=1.0, segment_size=4096, *, names=None):
    """Raise :class:`~flinkbuf.experiments.ExperimentArgumentError` (a
    ``ValueError``) unless the arguments of :func:`run_demo` are in range:
    phases of at least ``MIN_PHASE_SECONDS``, buffers of at most
    ``MAX_SEGMENT_SIZE`` bytes."""
    check_real("phase_seconds", phase_seconds, ge=MIN_PHASE_SECONDS, le=MAX_SECONDS,
               names=names,
               why_low=" (a shorter phase holds too few buffers of the slowed consumer, at "
                       f"most {1 / SLOW_DELAY:,.0f} per second, for a rate)")
    check_int("segment_size", segment_size, ge=1, le=MAX_SEGMENT_SIZE, names=names,
              why_high=" (filling a larger buffer takes about as long as the slowed "
                       f"consumer's {SLOW_DELAY * 1e3:g} ms per buffer: slowing it would show "
                       "nothing)")
    check_pool_fits(NUM_SEGMENTS, segment_size, count_param="num_segments",
                    size_param="segment_size", names=names)


def verdict(phases):
    """What the measured ``phases`` (dicts with ``seconds``, ``produced``,
    ``consumed`` buffers and ``blocked_seconds``, in the order of the demo)
    show: a dict with ``followed`` (True, False, or None when the data
    cannot tell) and ``lines`` saying why."""
    full, slowed, released = phases
    p_slow, c_slow = slowed["produced"] / slowed["seconds"], slowed["consumed"] / slowed["seconds"]
    c_full = full["consumed"] / full["seconds"]
    c_released = released["consumed"] / released["seconds"]
    blocked = slowed["blocked_seconds"] / slowed["seconds"]
    # the producer is at most POOL_BUFFERS buffers ahead of the consumer at any
    # moment: over a phase its count may differ by that much, whatever the rates
    slack = max(FOLLOW_TOLERANCE * c_slow, POOL_BUFFERS / slowed["seconds"])
    out = {"consumer_slowed_vs_full": round(c_slow / c_full, 3) if c_full else None,
           "producer_vs_consumer_slowed": round(p_slow / c_slow, 3) if c_slow else None,
           "producer_blocked_slowed": round(blocked, 3),
           "consumer_released_vs_slowed": round(c_released / c_slow, 2) if c_slow else None}
    if not (full["consumed"] and slowed["consumed"] and released["consumed"]):
        empty = [p["name"] for p in phases if not p["consumed"]]
        return {**out, "followed": None, "lines": [
            f"inconclusive: no buffer went through in the phase {', '.join(empty)}"]}
    if c_slow > SLOWED_MAX * c_full:
        return {**out, "followed": None, "lines": [
            f"inconclusive: slowing the consumer did not slow it down ({c_slow:,.0f} buffers/s "
            f"against {c_full:,.0f} at full speed; its delay is "
            f"{SLOW_DELAY * 1e3:g} ms per buffer): the machine may be too busy"]}
    lines = [f"slowed: the consumer ran at {c_slow / c_full:.0%} of its full-speed rate, the "
             f"producer at {p_slow:,.0f} buffers/s against the consumer's {c_slow:,.0f}, its "
             f"buffer requests blocked {blocked:.0%} of the time"]
    if abs(p_slow - c_slow) > slack:
        return {**out, "followed": False, "lines": lines + [
            f"NO: the producer did not follow the slowed consumer (more than "
            f"{FOLLOW_TOLERANCE:.0%} apart)"]}
    if blocked < BLOCKED_MIN:
        return {**out, "followed": None, "lines": lines + [
            f"inconclusive: the producer's rate followed, but its buffer requests blocked only "
            f"{blocked:.0%} of the time (< {BLOCKED_MIN:.0%}): something else held it"]}
    if c_released < 1 / SLOWED_MAX * c_slow:
        return {**out, "followed": False, "lines": lines + [
            f"NO: released, the consumer did not speed up again ({c_released:,.0f} buffers/s)"]}
    p_released = released["produced"] / released["seconds"]
    return {**out, "followed": True, "lines": lines + [
        f"released: the consumer ran at {c_released:,.0f} buffers/s again "
        f"({c_released / c_full:.0%} of its first rate), the producer at {p_released:,.0f}",
        "so the producer followed the consumer: when the consumer slowed down, the producer's "
        "buffer requests blocked instead of letting it run ahead"]}


def run_demo(phase_seconds=1.0, segment_size=4096, out=print):
    """Run the three phases, ``phase_seconds`` each, printing a line per
    phase and the verdict with ``out``; returns :func:`verdict`'s dict,
    with the ``phases`` measured."""
    check_arguments(phase_seconds, segment_size)
    nbp = fb.NetworkBufferPool(num_segments=NUM_SEGMENTS, segment_size=segment_size)
    pool = nbp.create_buffer_pool(min_buffers=POOL_BUFFERS, max_buffers=POOL_BUFFERS)
    handoff = collections.deque()
    ready = threading.Semaphore(0)
    stop = threading.Event()
    consumer_delay = [0.0]
    produced = [0]
    consumed = [0]
    blocked_ns = [0]

    def producer():
        payload = b"x" * segment_size
        while not stop.is_set():
            t0 = time.perf_counter_ns()
            try:
                buf = pool.request_buffer_blocking(timeout=0.5)
            except fb.BufferRequestTimeoutError:
                continue
            blocked_ns[0] += time.perf_counter_ns() - t0
            buf.write(payload)
            handoff.append(buf)
            produced[0] += 1
            ready.release()
        ready.release()

    def consumer():
        while True:
            ready.acquire()
            if not handoff:
                if stop.is_set():
                    return
                continue
            buf = handoff.popleft()
            if consumer_delay[0]:
                time.sleep(consumer_delay[0])
            consumed[0] += buf.readable_bytes // segment_size
            buf.recycle()

    threads = [threading.Thread(target=producer, name="producer", daemon=True),
               threading.Thread(target=consumer, name="consumer", daemon=True)]
    for t in threads:
        t.start()
    out(f"pool: {pool.num_buffers} buffers of {segment_size} bytes")
    out(f"{'phase':<24} {'produced/s':>12} {'consumed/s':>12} {'producer blocked':>17}")
    phases = []
    try:
        for name, delay in _PHASES:
            consumer_delay[0] = delay
            p0, c0, b0, t0 = produced[0], consumed[0], blocked_ns[0], time.perf_counter()
            time.sleep(phase_seconds)
            dt = time.perf_counter() - t0
            phase = {"name": name, "seconds": dt, "produced": produced[0] - p0,
                     "consumed": consumed[0] - c0, "blocked_seconds": (blocked_ns[0] - b0) / 1e9}
            phases.append(phase)
            out(f"{name:<24} {phase['produced'] / dt:12,.0f} {phase['consumed'] / dt:12,.0f} "
                f"{min(1.0, phase['blocked_seconds'] / dt):16.0%}")
    finally:
        stop.set()
        for t in threads:
            t.join()
        while handoff:
            handoff.popleft().recycle()
        nbp.destroy()
    result = verdict(phases)
    for line in result["lines"]:
        out(line)
    return {**result, "phases": phases}
