# csrc/network/lease.h: segments lent across processes over shared memory.
from libc.stdint cimport int32_t

from flinkbuf.csrc.pool cimport fb_localpool_t


cdef extern from "network/lease.h" nogil:
    int fb_lease_is(const fb_localpool_t *lp)
    int fb_ledger_new(int32_t num_segments)
