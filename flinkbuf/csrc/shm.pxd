# csrc/network/shm.h: the shared-memory transport.
from libc.stdint cimport int32_t, int64_t, uint32_t

from flinkbuf.csrc.transport cimport fb_transport_t


cdef extern from "network/shm.h" nogil:
    enum:
        FB_SHM_MEMFD
        FB_SHM_DATA0
        FB_SHM_ROOM0
        FB_SHM_DATA1
        FB_SHM_ROOM1
        FB_SHM_NFDS

    ctypedef struct fb_shm_stats_t:
        int64_t waits
        int64_t looks
        int64_t looks_paid
        int64_t sleeps

    uint32_t fb_shm_ring_size(int32_t segment_size)
    int fb_shm_region_new(uint32_t ring_size, int *fds)
    fb_transport_t *fb_transport_shm(int sock, int memfd, int data_fd, int room_fd, int side,
                                     char *err, size_t errlen)
    void fb_shm_stats(fb_transport_t *t, fb_shm_stats_t *out)
