# Layer 3 as one extension module; other modules (layer 4) cimport from here.
#
# Contract for cimporters (the network layer, Cython input channels):
#   InputChannel                   the base of a channel written in Cython: it
#                                  implements the C methods of input_gate.pxd
#                                  and notifies gate._c (fb_gate_notify) when
#                                  items arrive
#   gate._c, gate._n, gate._error  the gate's C readiness ring, its size, the
#                                  error that ended it
#   part._pool, part._n, part._subpartitions, part._cause
#                                  what a partition serves from; a served
#                                  subpartition's queue is sp._c (with sp._index,
#                                  sp._cause, sp._pool)
#   part._reader_attached(), part._reader_detached()
#                                  a reader in another process holds the partition
#   item_object(item, pool)        what a gate reads from an item
#   _serialize_event(event)        the bytes a user event travels as
#   BufferDebloatConfig, BufferDebloater
#                                  buffer debloating: config._enabled, a
#                                  debloater's _sample() and its _c (debloat.pxd)
#
# Test hooks (flinkbuf._testing): part._reader_count(), debloater._ema(); any
# channel's _announce_buffer_size() and _buffers_in_use() (the gate's, for
# buffer debloating).
#
# Every other field and C method in the included files is the classes' own:
# Cython needs them declared here, and no other module uses them.
from libc.stdint cimport int32_t, int64_t

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool
from flinkbuf.csrc.debloat cimport fb_debloater_t
from flinkbuf.csrc.exchange cimport fb_gate_t, fb_item_t, fb_signal_t, fb_subpart_t
from flinkbuf.csrc.keygroup cimport fb_key_assignment_t
from flinkbuf.serialization._serialization cimport RecordDeserializer, RecordSerializer

cdef class ResultPartition
cdef class InputGate

# What the gate reads from an item a channel handed over (input_gate.pyx).
cdef object item_object(fb_item_t *item, LocalBufferPool pool)
# The bytes a user event travels as (events.pyx).
cdef bytes _serialize_event(object event)

include "debloat.pxd"
include "channel_selector.pxd"
include "result_partition.pxd"
include "record_writer.pxd"
include "gate_debloat.pxd"
include "input_gate.pxd"
