"""A producer in a thread of its own: it writes records through a
:class:`~flinkbuf.RecordWriter` and then closes the writer (EndOfPartition
on every channel), or, when writing raises, fails it (its consumers raise
:class:`~flinkbuf.ProducerFailedError`) and keeps the error for the thread
that waits for it.  :func:`~flinkbuf.io.local_pipeline`'s stages and the
Spark exchanges' producers are such threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from flinkbuf.io._io import RecordWriter, monotonic_ns

__all__ = ["ProducerThread", "emit_all"]


def emit_all(writer: RecordWriter, records: Iterable[Any]) -> int:
    """Emit every record of ``records`` through ``writer``
    (:meth:`RecordWriter.emit_all`); the number of records written."""
    return writer.emit_all(records)


class ProducerThread(threading.Thread):
    """A daemon thread that runs ``produce(writer, source)`` (by default
    :func:`emit_all`: every record of ``source``, iterated in the thread),
    then closes ``writer``.  An exception (any ``BaseException``) is kept in
    :attr:`error` and fails the writer with it; the thread then ends
    quietly, and whoever joins it raises the error.  The thread drops
    ``source`` and ``produce`` when it ends.  :attr:`started_ns` and
    :attr:`ended_ns` (``monotonic_ns()``, None until then) say when it began
    to produce and when it was done, the writer closed or failed."""

    def __init__(self, writer: RecordWriter, source: Iterable[Any], *,
                 produce: Callable[[RecordWriter, Any], object] = emit_all,
                 name: str | None = None) -> None:
        if not isinstance(writer, RecordWriter):
            raise TypeError(f"writer must be a RecordWriter, got {type(writer).__name__}")
        if not callable(produce):
            raise TypeError(f"produce must be callable (writer, source), got "
                            f"{type(produce).__name__}")
        super().__init__(name=name, daemon=True)
        self.writer = writer
        self.error: BaseException | None = None
        self.started_ns: int | None = None
        self.ended_ns: int | None = None
        self._source: Iterable[Any] | None = source
        self._produce: Callable[[RecordWriter, Any], object] | None = produce

    def run(self) -> None:
        writer, produce, source = self.writer, self._produce, self._source
        self._produce = self._source = None
        if produce is None:
            return                     # run() again: it ran already
        self.started_ns = monotonic_ns()
        try:
            produce(writer, source)
            writer.close()
        except BaseException as exc:   # noqa: BLE001 - raised by the thread that joins
            self.error = exc
            try:
                writer.fail(exc)
            except Exception:         # noqa: BLE001 - the partition may be gone already
                pass
        finally:
            self.ended_ns = monotonic_ns()
