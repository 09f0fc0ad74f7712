"""flinkbuf.spark.local_pipeline: a task's stages in threads joined by local
channels with bounded pools (no Spark needed; the Spark use is in
test_spark.py)."""

import threading
import time
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flinkbuf.spark import LocalPipeline, local_pipeline


def _threads():
    return {t.name for t in threading.enumerate() if t.name.startswith("flinkbuf-stage")}


def test_stages_run_in_order_and_keep_order():
    def double(it):
        for x in it:
            yield x * 2

    def pair(it):
        for x in it:
            yield (x, str(x))

    out = list(local_pipeline(range(10_000), double, pair, segment_size=256))
    assert out == [(2 * i, str(2 * i)) for i in range(10_000)]
    assert not _threads()


@given(st.lists(st.one_of(st.integers(), st.text(max_size=30), st.binary(max_size=300))),
       st.integers(0, 3), st.integers(2, 5), st.integers(16, 512))
def test_any_records_through_any_number_of_stages(records, n_stages, buffers, segment_size):
    stages = [lambda it: it] * n_stages
    assert list(local_pipeline(records, *stages, buffers=buffers,
                               segment_size=segment_size)) == records


def test_the_source_is_read_in_another_thread():
    seen = []

    def source():
        for i in range(5):
            seen.append(threading.current_thread().name)
            yield i

    assert list(local_pipeline(source())) == list(range(5))
    assert set(seen) == {"flinkbuf-stage-0"}


def test_a_fast_stage_is_held_back_by_a_slow_one():
    produced = []

    def source():
        for i in range(100_000):
            produced.append(i)
            yield b"x" * 100

    pipe = local_pipeline(source(), buffers=2, segment_size=1024, codec="bytes")
    consumed = 0
    for _ in pipe:
        consumed += 1
        if consumed == 1000:
            time.sleep(0.3)
            # Two buffers of 1 KiB hold about 20 records of 104 bytes: the
            # source waited, it did not run ahead.
            assert len(produced) - consumed < 60
            stats = pipe.stats()
            assert stats[0]["buffers"] == 2
            assert stats[0]["buffers_in_use"] <= 2
    assert consumed == 100_000
    assert pipe.stats()[0]["back_pressured_seconds"] > 0.2


def test_a_stage_that_releases_the_gil_overlaps_the_next():
    blocks = [zlib.compress(np.random.default_rng(i).integers(0, 4, 200_000,
                                                             dtype=np.uint8).tobytes())
              for i in range(40)]

    def inflate(it):
        for b in it:
            yield np.frombuffer(zlib.decompress(b), dtype=np.uint8)

    def total(it):
        for a in it:
            yield int(a.sum())

    expected = [int(np.frombuffer(zlib.decompress(b), np.uint8).sum()) for b in blocks]
    assert list(local_pipeline(blocks, inflate, total, buffers=4)) == expected


def test_an_error_in_a_stage_is_raised_to_the_reader():
    def bad(it):
        for x in it:
            if x == 500:
                raise ValueError("stage failed at 500")
            yield x

    pipe = local_pipeline(range(10_000), bad, lambda it: it)
    with pytest.raises(ValueError, match="stage failed at 500"):
        list(pipe)
    assert not _threads()


def test_an_error_in_the_source_is_raised_to_the_reader():
    def source():
        yield 1
        raise KeyError("source broke")

    with pytest.raises(KeyError, match="source broke"):
        list(local_pipeline(source(), lambda it: it))
    assert not _threads()


def test_an_error_in_the_last_stage_stops_the_others():
    def last(it):
        for x in it:
            if x == 10:
                raise RuntimeError("last failed")
            yield x

    with pytest.raises(RuntimeError, match="last failed"):
        list(local_pipeline(iter(range(10**9)), lambda it: it, last))
    assert not _threads()


def test_closing_early_stops_every_stage():
    pipe = local_pipeline(iter(range(10**9)), lambda it: (x + 1 for x in it), buffers=2)
    assert isinstance(pipe, LocalPipeline)
    assert next(pipe) == 1
    pipe.close()
    assert not _threads()
    assert list(pipe) == []
    with local_pipeline(iter(range(10**9))) as pipe:
        assert next(pipe) == 0
    assert not _threads()


def test_bad_arguments():
    with pytest.raises(TypeError, match="source"):
        local_pipeline(42)
    with pytest.raises(TypeError, match="stage 1"):
        local_pipeline([], lambda it: it, "nope")
    with pytest.raises(ValueError, match="buffers"):
        local_pipeline([], buffers=1)
    with pytest.raises(TypeError, match="segment_size"):
        local_pipeline([], segment_size="big")
    with pytest.raises(ValueError, match="codec"):
        local_pipeline([], codec="json")
    with pytest.raises(ValueError, match="timeout"):
        local_pipeline([], timeout=0)
    assert not _threads()
