# csrc/buffer/redistribution.h: Flink's proportional redistribution of buffers.
from libc.stdint cimport int64_t

cdef extern from "buffer/redistribution.h" nogil:
    void fb_redistribute(int64_t avail, size_t n, const int64_t *mins,
                         const int64_t *maxs, int64_t *out)
