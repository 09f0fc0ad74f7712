"""The keyed count of bench/keyed_count.py, its rows but Flink's JVM job,
as one group of bench/run.py's table (conventions: bench/run.py).

Two processes each make half of N ``(i % 1000, i)`` records, route them by
key to one of the two and count per key what they receive (the counts are
checked).  Time per op = the job's time / N, the median of the rounds;
``per_record`` (a RecordWriter's ``emit`` in a Python loop) is the entry the
others are compared with.  The batch rows move more rows than the
per-record rows do.  ``batch``'s target column says, from this pass's
rows, whether it is at least 10x ``per_record``, 1.5x each numpy peer
(``zmq_numpy``, ``mp_numpy``) and 63 M rows/s.  ``python bench/keyed_count.py`` runs the same rows round by
round with Flink's own job beside them.
"""

import statistics

import pytest

from conftest import scale
import keyed_count

ROUNDS = scale(3, 1)
SIZES = {"records": scale(2_000_000, 20_000), "rows": scale(16_000_000, 262_144)}
# Peers first, batch last: its verdict uses this pass's rows.
ORDER = ("floor", "numpy_floor", "mp_queue", "zmq_numpy", "zmq_numpy_ipc", "mp_numpy",
         "per_record", "per_record_shm", "emit_all", "batch", "batch_shm")
GROUP = "keyed count: 2 processes, 1000 keys"

_measured = {}                                  # row -> records/s, this pass


def _verdicts():
    lines = []
    for row, peer, want in keyed_count.TARGETS:
        if row not in _measured or peer not in _measured:
            lines.append(f"{row} >={want:g}x {peer}: not measured in this run")
        else:
            r = _measured[row] / _measured[peer]
            lines.append(f"{row} >={want:g}x {peer}: {'met' if r >= want else 'NOT met'} "
                         f"({r:.1f}x)")
    for row, want in keyed_count.TARGET_RATES:
        if row in _measured:
            rate = _measured[row]
            lines.append(f"{row} >={want / 1e6:g}M rows/s: "
                         f"{'met' if rate >= want else 'NOT met'} ({rate / 1e6:.1f}M)")
    return "; ".join(lines)


@pytest.mark.parametrize("row", ORDER)
def test_keyed_count(benchmark, row):
    benchmark.group = GROUP
    benchmark.extra_info.update(subject=row == "per_record")
    why = keyed_count.unavailable(row)
    if why:
        pytest.skip(why)
    n = SIZES[keyed_count.ROWS[row][2]]
    runs = []
    benchmark.pedantic(lambda: runs.append(keyed_count.measure(row, n)), rounds=ROUNDS,
                       iterations=1, warmup_rounds=0)
    rate = statistics.median(r[0] for r in runs)
    _measured[row] = rate
    benchmark.extra_info.update(ops=n, records=n, ns_per_op=1e9 / rate,
                                cpu_ns_per_record=statistics.median(r[1] for r in runs))
    if row == ORDER[-1]:
        benchmark.extra_info["target"] = _verdicts()
