# Hooks for the tests and the benchmarks: nothing here is public API, and no
# shipped module needs it.  One extension that cimports the layers' contracts
# (their .pxd files, test hooks declared there included) like any other
# module would, and reaches no field a contract does not name; the hooks of
# each layer are in a file of their own, included here.  Like every
# extension, it links the one library of csrc/ and compiles none of it.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool, NetworkBufferPool
from flinkbuf.csrc.clock cimport fb_monotonic_ns
from flinkbuf.csrc.credit cimport *
from flinkbuf.csrc.pool cimport FB_NO_CHANNEL
from flinkbuf.csrc.status cimport FB_OK
from flinkbuf.io._io cimport BufferDebloater, InputChannel, ResultPartition, _serialize_event
from flinkbuf.network._network cimport Connection
from flinkbuf.serialization._serialization cimport (FULL_BUFFER, FULL_RECORD, RecordDeserializer,
                                                  RecordSerializer, dict_shadow_stats,
                                                  is_no_record)

include "testing_buffer.pxi"
include "testing_serialization.pxi"
include "testing_io.pxi"
include "testing_network.pxi"
