"""A task's buffers: how many segments its :class:`~flinkbuf.NetworkBufferPool`
needs (:func:`task_segments`, :func:`partition_buffers`), and a partition
with a buffer pool of its own (:func:`create_partition`)."""

from __future__ import annotations

from collections.abc import Iterable

from flinkbuf.buffer import NetworkBufferPool
from flinkbuf.checks import check_int
from flinkbuf.io._io import BufferDebloatConfig, ResultPartition

__all__ = ["create_partition", "partition_buffers", "task_segments"]


def partition_buffers(num_subpartitions: int, buffers_per_channel: int = 1) -> int:
    """The buffers a partition's pool holds: ``buffers_per_channel`` per
    subpartition and one more (with one per subpartition, Flink's minimum
    and :func:`create_partition`'s default)."""
    check_int(num_subpartitions, "num_subpartitions", 1)
    check_int(buffers_per_channel, "buffers_per_channel", 1)
    return check_int(num_subpartitions * buffers_per_channel + 1, "the partition's buffers", 1)


def task_segments(partitions: Iterable[int] = (), remote_channels: Iterable[int] = (), *,
                  exclusive_buffers_per_channel: int = 2,
                  floating_buffers_per_gate: int = 8) -> int:
    """The segments a task's :class:`~flinkbuf.NetworkBufferPool` needs for
    the partitions it writes and the input gates it reads.

    ``partitions``: the buffers of each partition's pool (its
    ``min_buffers``, say :func:`partition_buffers`).  ``remote_channels``:
    for each input gate, how many of its channels read another process's
    partition over a connection; each such channel takes
    ``exclusive_buffers_per_channel`` buffers and a gate with one takes
    ``floating_buffers_per_gate`` more, as
    :class:`~flinkbuf.network.NetworkEnvironment` is configured.  A local
    channel takes none: it reads the producer's buffers.  This is the size
    for full speed: a debloating gate requires only one of its floating
    buffers and takes the others while they are free."""
    exclusive = check_int(exclusive_buffers_per_channel, "exclusive_buffers_per_channel", 1)
    floating = check_int(floating_buffers_per_gate, "floating_buffers_per_gate", 0)
    total = 0
    for buffers in partitions:
        total += check_int(buffers, "a partition's buffers", 1)
    for remote in remote_channels:
        if check_int(remote, "a gate's remote channels", 0):
            total += remote * exclusive + floating
    return check_int(total, "the task's segments", 0)


def create_partition(network_pool: NetworkBufferPool, num_subpartitions: int, *,
                     min_buffers: int | None = None, max_buffers: int | None = None,
                     max_buffers_per_channel: int | None = None,
                     max_overdraft_buffers: int = 0, name: str | None = None,
                     buffer_debloat: bool | BufferDebloatConfig | None = None,
                     buffer_debloat_min_size: int | None = None) -> ResultPartition:
    """A :class:`ResultPartition` with a buffer pool made for it from
    ``network_pool``: at least ``num_subpartitions + 1`` buffers (Flink's
    minimum; more if ``min_buffers`` says so), growing up to ``max_buffers``
    (default: the minimum, i.e. a fixed-size pool), counted per
    subpartition so that ``max_buffers_per_channel`` applies.
    ``buffer_debloat``, ``buffer_debloat_min_size``: see
    :class:`ResultPartition`."""
    if not isinstance(network_pool, NetworkBufferPool):
        raise TypeError(f"network_pool must be a NetworkBufferPool, got "
                        f"{type(network_pool).__name__}")
    check_int(num_subpartitions, "num_subpartitions", 1)
    lo = partition_buffers(num_subpartitions) if min_buffers is None else min_buffers
    hi = lo if max_buffers is None else max_buffers
    pool = network_pool.create_buffer_pool(
        lo, hi, num_subpartitions=num_subpartitions,
        max_buffers_per_channel=max_buffers_per_channel,
        max_overdraft_buffers=max_overdraft_buffers)
    try:
        return ResultPartition(pool, num_subpartitions, name=name, buffer_debloat=buffer_debloat,
                               buffer_debloat_min_size=buffer_debloat_min_size)
    except BaseException:
        pool.destroy()
        raise
