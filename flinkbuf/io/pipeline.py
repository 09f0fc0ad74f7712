"""Exchange inside one task: a partition's stages in threads joined by local
channels with a bounded pool (:func:`local_pipeline`).

A task (a Spark task, say) runs its partition's code in one thread.  When
one stage releases the GIL (decompression, file or socket I/O, numpy),
running it in a thread of its own overlaps it with the next stage; a local
channel with a fixed number of buffers between them keeps the memory
bounded, and its blocking buffer request slows the upstream stage down to
the speed of the downstream one (backpressure), exactly as between Flink
tasks.
"""

import time

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.checks import check_choice, check_int, check_seconds
from flinkbuf.io._io import ForwardSelector, InputGate, RecordWriter
from flinkbuf.io.metrics import TaskMetrics
from flinkbuf.io.pools import create_partition, task_segments
from flinkbuf.io.producer import ProducerThread, emit_all
from flinkbuf.serialization import CODECS

__all__ = ["LocalPipeline", "local_pipeline"]


def _stage(fn):
    """What a stage's thread runs: ``fn`` over its input, each record it
    yields emitted."""

    def produce(writer, source):
        emit_all(writer, fn(source))
    return produce


class LocalPipeline:
    """The iterator :func:`local_pipeline` returns: the last stage's output.

    :meth:`stats` (from any thread) gives each exchange's records, bytes,
    the upstream stage's back-pressured seconds and the buffers in use;
    :meth:`close` stops every stage (also done when the iteration ends,
    fails, or the iterator is garbage collected).
    """

    def __init__(self, source, stages, buffers, segment_size, codec, buffer_timeout, timeout):
        self._timeout = timeout
        links = len(stages) or 1
        self._nbp = NetworkBufferPool(task_segments([buffers] * links), segment_size)
        self._threads = []
        self._gates = []
        self._closed = False
        self._partitions = []
        self.metrics = []
        try:
            upstream = [source] + list(stages[:-1]) if stages else [source]
            feed = None
            for k, fn in enumerate(upstream):
                partition = create_partition(self._nbp, 1, min_buffers=buffers,
                                             name=f"stage-{k}")
                self._partitions.append(partition)
                writer = RecordWriter(partition, ForwardSelector(), codec=codec,
                                      buffer_timeout=buffer_timeout, name=f"stage-{k}")
                gate = InputGate([(partition, 0)], codec=codec, name=f"stage-{k + 1}")
                self._gates.append(gate)
                if k == 0:
                    thread = ProducerThread(writer, iter(fn), name="flinkbuf-stage-0")
                else:
                    thread = ProducerThread(writer, feed, produce=_stage(fn),
                                            name=f"flinkbuf-stage-{k}")
                self._threads.append(thread)
                self.metrics.append(TaskMetrics(f"stage-{k}", writers=[writer], gates=[gate]))
                feed = gate
            self._last = stages[-1] if stages else None
            for t in self._threads:
                t.start()
            self._out = iter(self._last(feed) if self._last is not None else feed)
        except BaseException:
            self.close()
            raise

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed:
            raise StopIteration
        try:
            return next(self._out)
        except StopIteration:
            self._finish()
            raise
        except BaseException as exc:
            first = self._first_error()
            self.close()
            if first is not None and first is not exc:
                raise first from None
            raise

    def _first_error(self):
        for t in self._threads:
            if t.error is not None:
                return t.error
        return None

    def _finish(self):
        """The last stage is done: every upstream stage ended; raise the
        first error of one."""
        try:
            self._join()
            first = self._first_error()
            if first is not None:
                raise first
        finally:
            self.close()

    def _join(self):
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        for t in self._threads:
            while t.is_alive():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"stage {t.name} did not end within {self._timeout:g} s")
                t.join(0.05)

    def stats(self):
        """Per exchange between stage k and stage k + 1: records and bytes,
        stage k's back-pressured seconds, the buffers in use and in all."""
        out = []
        for k, (t, gate) in enumerate(zip(self._threads, self._gates)):
            pool = t.writer.partition.pool
            out.append({
                "stage": k,
                "records": t.writer.num_records_out,
                "bytes": t.writer.num_bytes_out,
                "back_pressured_seconds": t.writer.back_pressured_time_ns / 1e9,
                "records_in": gate.num_records_in,
                "buffers_in_use": pool.num_requested - pool.num_available,
                "buffers": pool.num_buffers,
            })
        return out

    def close(self):
        """Stop every stage: close the channels (upstream writes then
        raise and their threads end) and wait for the threads (up to the
        timeout).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._threads:
            if t.is_alive():
                try:
                    t.writer.fail(RuntimeError("the pipeline was closed"))
                except Exception:          # noqa: BLE001
                    pass
        for g in self._gates:
            g.close()
        try:
            self._join()
        except TimeoutError:
            pass                           # daemon threads, blocked in their source
        self._nbp.destroy()

    def __del__(self):
        try:
            self.close()
        except Exception:                  # noqa: BLE001 - nothing to report to
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def local_pipeline(source, *stages, buffers=4, segment_size=32768, codec="typed",
                   buffer_timeout=0.1, timeout=60.0):
    """Run ``stages`` over ``source`` in threads joined by local channels;
    returns a :class:`LocalPipeline`, an iterator of the last stage's output.

    ``source`` (any iterable, such as a Spark partition's iterator) is read
    in a thread of its own; each stage ``fn(iterator) -> iterable`` but the
    last runs in a thread of its own too, reading the previous one's output;
    the last stage runs in the thread that iterates the pipeline.  Between
    two stages sit ``buffers`` buffers of ``segment_size`` bytes (at least
    2): a stage that gets ahead waits for a buffer of its channel (without
    the GIL) until the next stage has read one.  Records go through
    ``codec`` (one of :data:`~flinkbuf.serialization.CODECS`: ``"typed"``,
    ``"bytes"`` or ``"pickle"``) and keep their order.  With no stages the
    source is read ahead in its thread.

    An error in the source or a stage ends the pipeline: the iteration
    raises it (the original exception), and every thread ends.  Closing the
    pipeline early (``close()``, ``with``, or dropping it) stops every
    stage; threads still blocked in their own source after ``timeout``
    seconds are left to end on their own (they are daemon threads).

    In a Spark job::

        rdd.mapPartitions(lambda it: local_pipeline(it, decompress, parse))
    """
    try:
        iter(source)
    except TypeError:
        raise TypeError(f"source must be iterable, got {type(source).__name__}") from None
    for k, fn in enumerate(stages):
        if not callable(fn):
            raise TypeError(f"stage {k} must be callable (iterator -> iterable), got "
                            f"{type(fn).__name__}")
    check_int(buffers, "buffers", 2, 1 << 30)
    check_int(segment_size, "segment_size", 16, 1 << 30)
    check_choice(codec, "codec", CODECS)
    check_seconds(timeout, "timeout", allow_none=True)
    return LocalPipeline(source, stages, buffers, segment_size, codec, buffer_timeout, timeout)
