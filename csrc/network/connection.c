/* A connection's lifecycle (connection.h): made over an authenticated
 * transport, started (its reader and writer threads), closed (a
 * CLOSE_REQUEST, the threads joined, every channel ended, every lent
 * segment on its way back), and what it tells of itself. */
#define _GNU_SOURCE
#include "network/conn_internal.h"
#include "network/consumer_internal.h"
#include "network/direct_internal.h"
#include "network/lifecycle_internal.h"
#include "network/producer_internal.h"
#include "network/reader_internal.h"
#include "network/writer_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* The locks and condition variables: 0, or -1 (none is left). */
static int init_locks(fb_conn_t *c)
{
    if (pthread_mutex_init(&c->mu, NULL) != 0)
        return -1;
    if (pthread_mutex_init(&c->send_mu, NULL) != 0)
        goto fail_mu;
    if (fb_cond_init(&c->cv) != 0)
        goto fail_send_mu;
    /* (none of these fails on Linux with default attributes) */
    if (pthread_mutex_init(&c->rd_mu, NULL) != 0 || fb_cond_init(&c->rd_cv) != 0
            || fb_cond_init(&c->rd_done_cv) != 0)
        goto fail_cv;
    if (pthread_mutex_init(&c->rel_mu, NULL) != 0)
        goto fail_rd;
    return 0;
fail_rd:
    pthread_cond_destroy(&c->rd_done_cv);
    pthread_cond_destroy(&c->rd_cv);
    pthread_mutex_destroy(&c->rd_mu);
fail_cv:
    pthread_cond_destroy(&c->cv);
fail_send_mu:
    pthread_mutex_destroy(&c->send_mu);
fail_mu:
    pthread_mutex_destroy(&c->mu);
    return -1;
}

/* The memory and descriptors of a new connection: 0, or -1 (the caller
 * frees what was made: release_parts). */
static int make_parts(fb_conn_t *c)
{
    c->ctlbuf = malloc(CTL_CAP);
    c->direct_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->thread_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fb_frame_reader_init(&c->fr, c->segment_size) != 0 || c->ctlbuf == NULL
            || c->direct_wake_fd < 0 || c->thread_wake_fd < 0)
        return -1;
    if (fb_gate_init(&c->out, FB_NET_MAX_CHANNELS + 1) != FB_OK)
        return -1;
    c->direct = batch_new();
    if (c->direct == NULL || init_locks(c) != 0) {
        fb_gate_free(&c->out);
        return -1;
    }
    return 0;
}

static void release_parts(fb_conn_t *c)
{
    if (c->direct_wake_fd >= 0)
        close(c->direct_wake_fd);
    if (c->thread_wake_fd >= 0)
        close(c->thread_wake_fd);
    fb_frame_reader_free(&c->fr);
    free(c->direct);
    free(c->ctlbuf);
    free(c);
}

fb_conn_t *fb_conn_new(fb_transport_t *t, int32_t segment_size, const fb_conn_callbacks_t *cb,
                       double io_timeout)
{
    fb_conn_t *c = calloc(1, sizeof(*c));
    int32_t k;
    if (c == NULL) {
        t->ops->destroy(t);
        return NULL;
    }
    c->direct_wake_fd = c->thread_wake_fd = -1;
    c->segment_size = segment_size;
    if (make_parts(c) != 0) {
        release_parts(c);
        t->ops->destroy(t);
        return NULL;
    }
    c->peer_pidfd = -1;
    c->direct_reads = 1;
    c->t = t;
    c->io_timeout_ms = io_timeout > 0 && io_timeout < 2e6 ? (int)(io_timeout * 1000) : 2000000000;
    c->cb = *cb;
    c->gate_lender = direct_read;
    c->pool_lender = pool_wait;
    c->refs = 1;
    c->next_receiver_id = 1;
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++) {
        c->free_outs[k] = FB_NET_MAX_CHANNELS - k;     /* slots 1..MAX, lowest first */
        c->free_ins[k] = FB_NET_MAX_CHANNELS - 1 - k;
    }
    c->nfree_outs = c->nfree_ins = FB_NET_MAX_CHANNELS;
    idmap_init(&c->out_ids);
    idmap_init(&c->in_ids);
    return c;
}

void fb_conn_set_direct_reads(fb_conn_t *c, int on)
{
    pthread_mutex_lock(&c->rd_mu);
    c->direct_reads = on;
    pthread_mutex_unlock(&c->rd_mu);
}

void fb_conn_set_caller_sends(fb_conn_t *c, int on)
{
    c->caller_sends = on != 0;
    c->hook.ready = conn_ready;
    c->hook.hold = conn_hold;
    c->hook.release = conn_release;
    c->hook.arg = c;
    c->out.hook = on ? &c->hook : NULL;
}

int fb_conn_start(fb_conn_t *c)
{
    if (c->started || c->closed)
        return FB_ESTATE;
    c->rx_since = c->ping_for = fb_monotonic_ns();   /* the peer's silence starts now */
    if (pthread_create(&c->reader, NULL, reader_main, c) != 0)
        return FB_ENOMEM;
    if (pthread_create(&c->writer, NULL, writer_main, c) != 0) {
        conn_fail(c, FB_NET_ERR_CLOSED, "cannot start the connection's threads");
        pthread_join(c->reader, NULL);
        return FB_ENOMEM;
    }
    c->started = 1;
    return FB_OK;
}

/* A CLOSE_REQUEST, if the connection is open: it goes before the socket
 * closes (for up to a second). */
static void send_close(fb_conn_t *c)
{
    int64_t deadline;
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN && c->started && !c->close_queued) {
        c->close_queued = 1;
        ctl_push(c, FB_MSG_CLOSE, 0, NULL, 0);
        deadline = fb_deadline_after(1.0);
        while (!c->close_sent && c->state == CONN_OPEN && fb_monotonic_ns() < deadline)
            fb_cond_wait_until(&c->cv, &c->mu, deadline);
    }
    pthread_mutex_unlock(&c->mu);
}

void fb_conn_close(fb_conn_t *c)
{
    consumer_let_go(c);         /* before this side ends: nothing lent is read any more */
    send_close(c);
    conn_fail(c, FB_NET_ERR_CLOSED, "the connection was closed");
    if (c->started) {
        pthread_join(c->reader, NULL);
        pthread_join(c->writer, NULL);
        c->started = 0;
    }
    pthread_mutex_lock(&c->rd_mu);          /* a consumer's thread reading it leaves */
    while (c->rd_owner != RD_NONE)
        pthread_cond_wait(&c->rd_done_cv, &c->rd_mu);
    pthread_mutex_unlock(&c->rd_mu);
    end_served_channels(c);     /* the writer ended them, unless it never ran */
    if (c->direct_wake_fd >= 0) {  /* the threads are gone: the descriptors go now */
        c->t->ops->close(c->t);
        close(c->direct_wake_fd);
        c->direct_wake_fd = -1;
        close(c->thread_wake_fd);
        c->thread_wake_fd = -1;
    }
    consumer_lease_end(c);      /* nobody reads or writes frames any more */
    producer_reclaim(c);        /* (if the reader thread never ran) */
    producer_lending_end(c);
    c->closed = 1;
}

int fb_conn_is_open(fb_conn_t *c)
{
    int open;
    pthread_mutex_lock(&c->mu);
    open = c->state == CONN_OPEN;
    pthread_mutex_unlock(&c->mu);
    return open;
}

int fb_conn_error(fb_conn_t *c, char *buf, size_t len)
{
    int code;
    pthread_mutex_lock(&c->mu);
    code = c->state == CONN_OPEN ? 0 : c->err_code;
    copy_text(buf, len, c->err_msg, strlen(c->err_msg));
    pthread_mutex_unlock(&c->mu);
    return code;
}

void fb_conn_stats(fb_conn_t *c, fb_conn_stats_t *out)
{
    out->bytes_in = __atomic_load_n(&c->stats.bytes_in, __ATOMIC_RELAXED);
    out->bytes_out = __atomic_load_n(&c->stats.bytes_out, __ATOMIC_RELAXED);
    out->frames_in = __atomic_load_n(&c->stats.frames_in, __ATOMIC_RELAXED);
    out->frames_out = __atomic_load_n(&c->stats.frames_out, __ATOMIC_RELAXED);
    out->buffers_in = __atomic_load_n(&c->stats.buffers_in, __ATOMIC_RELAXED);
    out->buffers_out = __atomic_load_n(&c->stats.buffers_out, __ATOMIC_RELAXED);
    out->frames_in_direct = __atomic_load_n(&c->stats.frames_in_direct, __ATOMIC_RELAXED);
}

int32_t fb_conn_num_channels(fb_conn_t *c)
{
    int32_t n;
    pthread_mutex_lock(&c->mu);
    n = 2 * FB_NET_MAX_CHANNELS - c->nfree_ins - c->nfree_outs;
    pthread_mutex_unlock(&c->mu);
    return n;
}
