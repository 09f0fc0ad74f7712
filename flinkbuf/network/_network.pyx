# Layer 4, records across processes: connections (csrc/network/, whose
# reader and writer threads never hold the GIL), remote input channels with
# Flink's credit-based flow control, and the callbacks through which a
# connection finds the partitions this process serves.  One extension; the
# environment that owns sockets, handshakes and registries is environment.py.
# Compiler directives live in setup.py.

cimport cython
from libc.errno cimport errno
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy, strlen

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool, NetworkBufferPool, lent_buffer
from flinkbuf.capi cimport write_unraisable
from flinkbuf.csrc.clock cimport fb_deadline_after
from flinkbuf.csrc.connection cimport *
from flinkbuf.csrc.credit cimport *
from flinkbuf.csrc.exchange cimport *
from flinkbuf.csrc.frame_reader cimport *
from flinkbuf.csrc.lease cimport fb_lease_is, fb_ledger_new
from flinkbuf.csrc.pool cimport FB_NO_CHANNEL, fb_netpool_memfd
from flinkbuf.csrc.status cimport *
from flinkbuf.csrc.shm cimport *
from flinkbuf.csrc.seal cimport (FB_SEAL_KEY, fb_seal_free, fb_seal_new, fb_seal_record,
                                 fb_transport_sealed)
from flinkbuf.csrc.transport cimport fb_transport_socket, fb_transport_t
from flinkbuf.csrc.wire cimport *
from flinkbuf.io._io cimport (InputChannel, InputGate, ResultPartition, ResultSubpartition,
                              item_object)

from flinkbuf.errors import (
    PartitionNotFoundError,
    PartitionReleasedError,
    RemoteConnectionError,
    RemoteError,
)

# Passed by the factories alone: these types wrap C state that only they
# set up, so made any other way (T.__new__(T)) they refuse to exist.
cdef object _MADE_HERE = object()


cdef int _refuse_bare(object token, str what) except -1:
    if token is not _MADE_HERE:
        raise TypeError(f"{what} cannot be created directly: they are made by "
                        "NetworkEnvironment")
    return 0


include "connection.pyx"
include "remote_input_channel.pyx"
include "hooks.pxi"
