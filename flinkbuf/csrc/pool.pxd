# csrc/buffer/pool.h: the network pool and its local pools (locking notes there).
from libc.stdint cimport int32_t, int64_t

cdef extern from "buffer/pool.h" nogil:
    enum:
        FB_UNBOUNDED
        FB_NO_CHANNEL

    ctypedef struct fb_netpool_t:
        int32_t segment_size
        int32_t num_segments
        size_t stride
        char *base

    ctypedef struct fb_localpool_t

    ctypedef int (*fb_recycle_hook_t)(void *arg, fb_localpool_t *lp, int32_t index) noexcept nogil

    ctypedef struct fb_pool_ops_t:
        int (*request)(fb_localpool_t *lp, int32_t channel, int32_t *index) noexcept nogil
        int (*recycle)(fb_localpool_t *lp, int32_t index) noexcept nogil
        void (*set_recycle_hook)(fb_localpool_t *lp, fb_recycle_hook_t hook, void *arg) noexcept nogil

    ctypedef struct fb_localpool_t:
        const fb_pool_ops_t *ops
        fb_netpool_t *net
        int32_t min_buffers
        int32_t max_buffers
        int32_t num_subpartitions
        int32_t max_per_channel
        int32_t max_overdraft

    ctypedef struct fb_localpool_stats_t:
        int32_t size, num_requested, num_avail, num_overdraft, num_unavailable_channels
        int destroyed

    int fb_netpool_init(fb_netpool_t *np, int32_t num_segments, int32_t segment_size,
                        size_t alignment, int shared)
    int fb_netpool_memfd(const fb_netpool_t *np)
    int32_t fb_netpool_destroy(fb_netpool_t *np)
    void fb_netpool_free(fb_netpool_t *np)
    char *fb_segment_address(const fb_netpool_t *np, int32_t index)
    int32_t fb_netpool_num_free(fb_netpool_t *np)
    int64_t fb_netpool_total_required(fb_netpool_t *np)
    int32_t fb_netpool_num_unpooled(fb_netpool_t *np)
    int32_t fb_netpool_num_outstanding(fb_netpool_t *np)
    int fb_netpool_arena_released(fb_netpool_t *np)
    int fb_netpool_is_destroyed(fb_netpool_t *np)
    void fb_netpool_redistribute(fb_netpool_t *np)
    int fb_netpool_request_unpooled(fb_netpool_t *np, int32_t n, int64_t deadline_ns,
                                    int32_t *out)
    int fb_netpool_recycle_unpooled(fb_netpool_t *np, const int32_t *idx, int32_t n)

    int fb_localpool_create(fb_netpool_t *np, fb_localpool_t *lp, int32_t min_buffers,
                            int32_t max_buffers, int32_t num_subpartitions,
                            int32_t max_per_channel, int32_t max_overdraft)
    void fb_localpool_destroy(fb_localpool_t *lp)
    void fb_localpool_free(fb_localpool_t *lp)
    int fb_localpool_request(fb_localpool_t *lp, int32_t channel, int32_t *index)
    int fb_localpool_request_blocking(fb_localpool_t *lp, int32_t channel,
                                      int64_t deadline_ns, int32_t *index)
    int fb_localpool_recycle(fb_localpool_t *lp, int32_t index)
    int fb_localpool_set_num_buffers(fb_localpool_t *lp, int32_t n)
    int fb_localpool_set_channel_limit(fb_localpool_t *lp, int32_t channel, int32_t n)
    int fb_localpool_set_demand(fb_localpool_t *lp, int32_t n)
    int32_t fb_localpool_given_back(fb_localpool_t *lp)
    int fb_localpool_is_available(fb_localpool_t *lp)
    int fb_localpool_wait_available(fb_localpool_t *lp, int64_t deadline_ns)
    void fb_localpool_stats(fb_localpool_t *lp, fb_localpool_stats_t *out)
    int32_t fb_localpool_channel_count(fb_localpool_t *lp, int32_t channel)

    int64_t fb_debug_segments_out()
