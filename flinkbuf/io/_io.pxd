# Layer 3 as one extension module; other modules (layer 4) cimport from here.
from libc.stdint cimport int32_t, int64_t

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool
from flinkbuf.csrc.exchange cimport fb_gate_t, fb_item_t, fb_signal_t, fb_subpart_t
from flinkbuf.serialization._serialization cimport RecordDeserializer, RecordSerializer

cdef class ResultPartition
cdef class InputGate

# What the gate reads from an item a channel handed over (input_gate.pyx).
cdef object item_object(fb_item_t *item, LocalBufferPool pool)
# The bytes a user event travels as (events.pyx).
cdef bytes _serialize_event(object event)

include "channel_selector.pxd"
include "result_partition.pxd"
include "record_writer.pxd"
include "input_gate.pxd"
