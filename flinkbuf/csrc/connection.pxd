# csrc/network/connection.h: one connection between two processes (the network
# layer's data path: frames, credit-based flow control, reader and writer
# threads).  Locking notes there; the wire format is wire.pxd's.
from libc.stdint cimport int32_t, int64_t, uint32_t

from flinkbuf.csrc.exchange cimport fb_gate_t, fb_subpart_t
from flinkbuf.csrc.pool cimport fb_localpool_t, fb_netpool_t
from flinkbuf.csrc.transport cimport fb_transport_t

cdef extern from "network/connection.h" nogil:
    enum:
        FB_NET_EVENT_WINDOW

    ctypedef struct fb_conn_t
    ctypedef struct fb_inchan_t
    ctypedef struct fb_floating_t

    ctypedef struct fb_conn_callbacks_t:
        void *ctx
        int (*find_subpartition)(void *ctx, const char *partition_id, size_t len,
                                 uint32_t subpartition, fb_subpart_t **sp, void **owner,
                                 fb_localpool_t **pool, char *errbuf, size_t errlen) noexcept
        void (*describe_failure)(void *ctx, void *owner, char *type, size_t tlen,
                                 char *message, size_t mlen) noexcept
        void (*release_owner)(void *ctx, void *owner) noexcept

    ctypedef struct fb_conn_stats_t:
        int64_t bytes_in, bytes_out, frames_in, frames_out, buffers_in, buffers_out
        int64_t frames_in_direct

    fb_conn_t *fb_conn_new(fb_transport_t *t, int32_t segment_size, const fb_conn_callbacks_t *cb,
                           double io_timeout)
    void fb_conn_set_caller_sends(fb_conn_t *c, int on)
    void fb_conn_set_direct_reads(fb_conn_t *c, int on)
    int fb_conn_start(fb_conn_t *c)
    int fb_conn_lend(fb_conn_t *c, const fb_netpool_t *np, int pidfd, int ledger_fd)
    int fb_conn_borrow(fb_conn_t *c, int memfd, int ledger_fd, char *err, size_t errlen)
    int32_t fb_conn_lent(fb_conn_t *c)
    int32_t fb_conn_borrowed(fb_conn_t *c)
    void fb_conn_close(fb_conn_t *c)
    void fb_conn_incref(fb_conn_t *c)
    void fb_conn_decref(fb_conn_t *c)
    int fb_conn_is_open(fb_conn_t *c)
    int fb_conn_error(fb_conn_t *c, char *buf, size_t len)
    void fb_conn_stats(fb_conn_t *c, fb_conn_stats_t *out)
    int32_t fb_conn_num_channels(fb_conn_t *c)

    fb_floating_t *fb_floating_new(fb_localpool_t *pool)
    void fb_floating_detach(fb_floating_t *f)
    void fb_floating_decref(fb_floating_t *f)

    ctypedef struct fb_inchan_stats_t:
        int32_t exclusive_available, floating_available, exclusive_total, backlog, queued
        int64_t buffers_in, bytes_in

    fb_inchan_t *fb_inchan_new(fb_conn_t *c, const char *partition_id, size_t len,
                               uint32_t subpartition, fb_localpool_t *exclusive,
                               fb_floating_t *floating, int64_t request_deadline_ns)
    int fb_inchan_add_exclusive(fb_inchan_t *ch, int32_t index)
    int fb_inchan_open(fb_inchan_t *ch)
    fb_subpart_t *fb_inchan_queue(fb_inchan_t *ch)
    void fb_inchan_event_taken(fb_inchan_t *ch)
    void fb_inchan_announce_buffer_size(fb_inchan_t *ch, int32_t size)
    void fb_inchan_set_buffer_limit(fb_inchan_t *ch, int32_t n)
    void fb_inchan_buffer_taken(fb_inchan_t *ch)
    void fb_inchan_reader_dry(fb_inchan_t *ch)
    void fb_inchan_close(fb_inchan_t *ch)
    void fb_inchan_decref(fb_inchan_t *ch)
    int fb_inchan_attach_reader(fb_inchan_t *ch, fb_gate_t *g)
    void fb_inchan_detach_reader(fb_inchan_t *ch, fb_gate_t *g)
    int fb_inchan_error(fb_inchan_t *ch, char *type, size_t tlen, char *message, size_t mlen)
    uint32_t fb_inchan_receiver_id(fb_inchan_t *ch)
    void fb_inchan_stats(fb_inchan_t *ch, fb_inchan_stats_t *out)
