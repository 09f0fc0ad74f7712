# Layer 4 as one extension module: connections and remote input channels.
from libc.stdint cimport uint32_t

from flinkbuf.buffer._buffer cimport LocalBufferPool
from flinkbuf.csrc.connection cimport fb_conn_t, fb_floating_t, fb_inchan_t
from flinkbuf.csrc.transport cimport fb_transport_t
from flinkbuf.io._io cimport InputChannel


cdef class Connection:
    cdef fb_conn_t *_c
    cdef object _lookup         # partition_id -> ResultPartition or None
    cdef str _local             # this side's address, for messages
    cdef str _peer              # the peer's server address
    cdef str _transport         # "unix", "tcp" or "shm"
    cdef bint _sealed           # frames sealed (AES-256-GCM), both ways
    cdef fb_transport_t *_shm   # the shared-memory transport under it, or NULL
    cdef int _check(self) except -1
    cdef object _error(self)
    cdef dict _shm_waits(self)  # test hook: how its shared-memory waits went


cdef class FloatingBuffers:
    cdef fb_floating_t *_f
    cdef LocalBufferPool _pool
    @staticmethod
    cdef FloatingBuffers _make(LocalBufferPool pool)


cdef class RemoteInputChannel(InputChannel):
    cdef fb_inchan_t *_c
    cdef Connection _conn
    cdef LocalBufferPool _exclusive
    cdef FloatingBuffers _floating
    cdef str _partition_id
    cdef uint32_t _subpartition
    cdef tuple _error_info(self)
