"""Layer 3: tasks exchanging records through buffers (Flink's runtime.io.network).

A producer task writes records with a :class:`RecordWriter` into the
subpartitions of its :class:`ResultPartition`; each consumer task reads its
subpartitions through the :class:`LocalInputChannel` s of an
:class:`InputGate`.  Buffers go from the producer's pool to the consumer by
reference and back to the pool when the consumer has read them, so a slow
consumer makes the producer's next buffer request wait: backpressure.

A minimal pipeline::

    nbp = NetworkBufferPool(num_segments=64, segment_size=32768)
    partition = create_partition(nbp, num_subpartitions=2)
    gates = [InputGate([(partition, i)]) for i in range(2)]
    with RecordWriter(partition, "round_robin") as writer:   # in the producer thread
        for record in source:
            writer.emit(record)
    for record in gates[0]:                                    # in a consumer thread
        ...

Closing the writer (or leaving its ``with`` block) finishes the partition:
each consumer reads its subpartition to EndOfPartition, and its gate
releases the subpartition when it is done.  On an exception the writer
fails the partition and consumers raise :class:`ProducerFailedError`.
``with partition:`` on the producer's side does the same: a normal exit
finishes it (closing a writer still open) and drops nothing; an exception
fails it, and what is queued is dropped.  A consumer that leaves early
(``gate.close()``) only affects its own subpartition: records for it raise
:class:`PartitionReleasedError` from the writer's next buffer for that
channel on (records already in a buffer for it are lost with it), and the
other consumers carry on.

Channel selectors: :class:`RoundRobinSelector` (Flink's rebalance),
:class:`RescaleSelector` (with :func:`pointwise_connections`),
:class:`HashSelector` (Flink's key groups, bit-exact with Flink's
``KeyGroupRangeAssignment``; keys are hashed as Java's ``hashCode()``, never
with Python's per-process salted ``hash()``: ints in the int32 range as
``Integer`` (``v``), larger ones as ``Long`` (``(int) (v ^ (v >>> 32))``),
``str`` as ``String``; see :func:`java_hash_code`), :class:`BroadcastSelector`,
:class:`ForwardSelector`, :class:`GlobalSelector`, :class:`CustomSelector`
and :class:`BacklogAwareRebalanceSelector` (the backlog-aware round robin,
``"backlog_aware"``; the name ``"rebalance"`` is round robin, as in Flink).
:func:`assign_keys_to_operators` assigns a whole array of keys at once, and
:func:`order_by_channel` groups the rows of such an array by channel.

Column batches: a :class:`BatchWriter` routes the rows of Arrow record
batches (or of mappings of column name -> numpy array) by a key column, as
the hash selector routes records (:func:`key_partitions` says where each
key goes), and sends each consumer its piece of every batch; an input gate
of ``codec="arrow"`` yields each piece as a batch of the kind written,
rebuilt over the received record's memory.

Buffer debloating: a :class:`BufferDebloatConfig` says how input gates size
the buffers their producers fill, so that the bytes in flight toward a
consumer take about ``target`` seconds to consume; a :class:`BufferDebloater`
computes one gate's size from samples of its consumer's throughput.

A task's buffers: :func:`task_segments` (how many its pool needs) and
:func:`create_partition`; :func:`local_pipeline` runs a task's stages in
threads joined by local channels.
"""

from __future__ import annotations

from flinkbuf.io._io import (
    END_OF_PARTITION,
    MAX_QUEUED_EVENTS,
    BacklogAwareRebalanceSelector,
    BroadcastSelector,
    BufferDebloatConfig,
    BufferDebloater,
    ChannelSelector,
    CustomSelector,
    Event,
    ForwardSelector,
    GlobalSelector,
    HashSelector,
    InputChannel,
    InputGate,
    LocalInputChannel,
    RecordWriter,
    RescaleSelector,
    ResultPartition,
    ResultSubpartition,
    RoundRobinSelector,
    UnknownInputChannel,
    UserEvent,
    assign_key_to_operator,
    assign_keys_to_operators,
    java_hash_code,
    key_group_for_hash,
    monotonic_ns,
    murmur_hash,
    operator_index_for_key_group,
    order_by_channel,
)
from flinkbuf.checks import check_int
from flinkbuf.errors import PartitionReleasedError, ProducerFailedError
from flinkbuf.io.batch_keys import key_partitions
from flinkbuf.io.batch_writer import BatchWriter
from flinkbuf.io.pipeline import LocalPipeline, local_pipeline
from flinkbuf.io.pools import create_partition, partition_buffers, task_segments

__all__ = [
    "END_OF_PARTITION",
    "MAX_QUEUED_EVENTS",
    "BacklogAwareRebalanceSelector",
    "BatchWriter",
    "BroadcastSelector",
    "BufferDebloatConfig",
    "BufferDebloater",
    "ChannelSelector",
    "CustomSelector",
    "Event",
    "ForwardSelector",
    "GlobalSelector",
    "HashSelector",
    "InputChannel",
    "InputGate",
    "LocalInputChannel",
    "LocalPipeline",
    "PartitionReleasedError",
    "ProducerFailedError",
    "RecordWriter",
    "RescaleSelector",
    "ResultPartition",
    "ResultSubpartition",
    "RoundRobinSelector",
    "UnknownInputChannel",
    "UserEvent",
    "assign_key_to_operator",
    "assign_keys_to_operators",
    "create_partition",
    "default_max_parallelism",
    "java_hash_code",
    "key_group_for_hash",
    "key_partitions",
    "local_pipeline",
    "monotonic_ns",
    "murmur_hash",
    "operator_index_for_key_group",
    "order_by_channel",
    "partition_buffers",
    "pointwise_connections",
    "task_segments",
]


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default max parallelism for an operator of ``parallelism``:
    ``parallelism * 1.5`` rounded up to a power of two, within [128, 32768]."""
    check_int(parallelism, "parallelism", 1)
    n = parallelism + parallelism // 2
    power = 1
    while power < n:
        power <<= 1
    return min(max(power, 128), 32768)


_MAX_PARALLELISM = 1 << 15      # Flink's upper bound on a job's parallelism


def pointwise_connections(
        num_producers: int, num_consumers: int,
) -> tuple[list[int], list[list[tuple[int, int]]]]:
    """How Flink wires a pointwise edge (forward, rescale).

    Returns ``(subpartitions, inputs)``: ``subpartitions[p]`` is the number
    of subpartitions producer ``p`` needs, and ``inputs[c]`` lists the
    ``(producer, subpartition)`` pairs consumer ``c`` reads.  With at least
    as many producers as consumers each consumer reads a contiguous range of
    producers (one subpartition each); with fewer, each producer feeds a
    contiguous range of consumers.  Each side has at most 32768 tasks
    (Flink's limit on parallelism): the lists hold an entry per pair."""
    check_int(num_producers, "num_producers", 1, _MAX_PARALLELISM)
    check_int(num_consumers, "num_consumers", 1, _MAX_PARALLELISM)
    p, c = num_producers, num_consumers
    inputs: list[list[tuple[int, int]]] = [[] for _ in range(c)]
    if p >= c:
        subpartitions = [1] * p
        for consumer in range(c):
            for producer in range(consumer * p // c, (consumer + 1) * p // c):
                inputs[consumer].append((producer, 0))
    else:
        subpartitions = []
        for producer in range(p):
            start = (producer * c + p - 1) // p
            end = ((producer + 1) * c + p - 1) // p
            subpartitions.append(end - start)
            for k, consumer in enumerate(range(start, end)):
                inputs[consumer].append((producer, k))
    return subpartitions, inputs
