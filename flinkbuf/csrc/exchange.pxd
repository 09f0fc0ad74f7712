# csrc/io/exchange.h: subpartition queues, gate readiness, consume signals.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t

from flinkbuf.csrc.pool cimport fb_localpool_t

cdef extern from "io/exchange.h" nogil:
    enum:
        FB_ITEM_DATA
        FB_ITEM_EVENT
        FB_SP_LIVE
        FB_SP_RELEASED
        FB_SP_FAILED

    ctypedef struct fb_item_t:
        char *data              # the bytes
        fb_localpool_t *pool    # a pooled segment's pool, or NULL: malloc'd
        int32_t index           # the segment's number in its network pool
        int32_t kind            # FB_ITEM_DATA or FB_ITEM_EVENT
        int32_t size

    void fb_item_dispose(fb_item_t *item)
    void fb_items_dispose(fb_item_t *items, int32_t n)

    ctypedef struct fb_gate_t:
        int32_t num_channels

    ctypedef struct fb_signal_t:
        pass

    ctypedef struct fb_subpart_t:
        pass

    int fb_gate_init(fb_gate_t *g, int32_t num_channels)
    void fb_gate_free(fb_gate_t *g)
    void fb_gate_notify(fb_gate_t *g, int32_t channel)
    int fb_gate_wait(fb_gate_t *g, int64_t deadline_ns, int32_t *channel)
    void fb_gate_close(fb_gate_t *g)

    int fb_signal_init(fb_signal_t *s)
    void fb_signal_free(fb_signal_t *s)
    void fb_signal_post(fb_signal_t *s)
    uint64_t fb_signal_seq(fb_signal_t *s)
    int fb_signal_wait(fb_signal_t *s, uint64_t seen, int64_t deadline_ns)

    int fb_subpart_init(fb_subpart_t *sp, fb_signal_t *on_poll)
    void fb_subpart_free(fb_subpart_t *sp)
    int fb_subpart_add(fb_subpart_t *sp, fb_item_t item, int last)
    int fb_subpart_poll(fb_subpart_t *sp, fb_item_t *out)
    int fb_subpart_connect(fb_subpart_t *sp, fb_gate_t *g, int32_t channel)
    void fb_subpart_disconnect(fb_subpart_t *sp, fb_gate_t *g)
    int32_t fb_subpart_terminate(fb_subpart_t *sp, int32_t state, fb_item_t **out)
    int32_t fb_subpart_backlog(const fb_subpart_t *sp)
    void fb_subpart_set_buffer_size(fb_subpart_t *sp, int32_t size)
    int32_t fb_subpart_buffer_size(const fb_subpart_t *sp)
    int32_t fb_subpart_events(const fb_subpart_t *sp)
    int32_t fb_subpart_state(const fb_subpart_t *sp)
    int32_t fb_subpart_size(fb_subpart_t *sp)
    int fb_subpart_drained(fb_subpart_t *sp)
