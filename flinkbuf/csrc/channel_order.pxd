# csrc/io/channel_order.h: rows grouped by channel (a stable counting sort),
# and columns gathered so.
from libc.stddef cimport ptrdiff_t
from libc.stdint cimport int32_t, int64_t

cdef extern from "io/channel_order.h" nogil:
    int fb_order_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                            void *order, int order_width, int64_t *counts, size_t *bad,
                            int64_t *bad_channel)

    ctypedef struct fb_column:
        const void *values
        ptrdiff_t stride
        size_t itemsize
        void *out

    int fb_gather_by_channel(const void *channels, int width, size_t n, int32_t num_channels,
                             void *order, int order_width, int64_t *counts,
                             const fb_column *columns, size_t num_columns, size_t *bad,
                             int64_t *bad_channel)
