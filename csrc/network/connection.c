/* A connection's tables (receiver id -> slot), its control queue, how it
 * ends, and its lifecycle API (connection.h). */
#define _GNU_SOURCE
#include "network/connection_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static inline uint32_t id_home(uint32_t id)
{
    return (id * 2654435761u) & (IDMAP_SIZE - 1);
}

void idmap_init(idmap_t *m)
{
    size_t i;
    for (i = 0; i < IDMAP_SIZE; i++)
        m->key[i] = NO_ID;
}

int32_t idmap_get(const idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id);
    if (id == NO_ID)
        return -1;
    while (m->key[i] != NO_ID) {
        if (m->key[i] == id)
            return m->slot[i];
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    return -1;
}

/* The table holds at most FB_NET_MAX_CHANNELS keys: never full. */
void idmap_put(idmap_t *m, uint32_t id, int32_t slot)
{
    uint32_t i = id_home(id);
    while (m->key[i] != NO_ID && m->key[i] != id)
        i = (i + 1) & (IDMAP_SIZE - 1);
    m->key[i] = id;
    m->slot[i] = slot;
}

void idmap_del(idmap_t *m, uint32_t id)
{
    uint32_t i = id_home(id), j, h;
    while (m->key[i] != id) {
        if (m->key[i] == NO_ID)
            return;
        i = (i + 1) & (IDMAP_SIZE - 1);
    }
    /* Shift back the entries after i whose home is not in (i, j]. */
    for (j = (i + 1) & (IDMAP_SIZE - 1); m->key[j] != NO_ID; j = (j + 1) & (IDMAP_SIZE - 1)) {
        h = id_home(m->key[j]);
        if (((j - h) & (IDMAP_SIZE - 1)) >= ((j - i) & (IDMAP_SIZE - 1))) {
            m->key[i] = m->key[j];
            m->slot[i] = m->slot[j];
            i = j;
        }
    }
    m->key[i] = NO_ID;
}

void notify_writer(fb_conn_t *c, int32_t slot)
{
    fb_gate_notify(&c->out, slot);
}

/* Control messages were queued (no lock held): with caller_sends (and `how`
 * 1) this thread sends them now if the writer thread is idle (conn_ready),
 * else (`how` 2) the writer thread is woken. */
void writer_kick(fb_conn_t *c, int how)
{
    if (c->caller_sends && how == 1) {
        fb_gate_mark(&c->out, 0);
        conn_ready(c);
    } else {
        notify_writer(c, 0);
    }
}

void inchan_incref(fb_inchan_t *ch)
{
    __atomic_add_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL);
}

/* Free control messages (no lock needed: they are values). */
void ctl_free_list(ctl_t *m)
{
    ctl_t *next;
    for (; m != NULL; m = next) {
        next = m->next;
        free(m);
    }
}

/* Queue a control message (mu held); the writer sends them in order.  A
 * quiet push leaves waking the writer to the caller, once it has unlocked
 * (woken under mu, the writer would at once block on it). */
int ctl_push_quiet(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                          uint32_t len, int quiet)
{
    ctl_t *m = malloc(sizeof(ctl_t) + len);
    if (m == NULL)
        return FB_ENOMEM;
    m->next = NULL;
    m->type = type;
    m->receiver_id = receiver_id;
    m->len = len;
    if (len)
        memcpy(m->body, body, len);
    if (c->ctl_tail)
        c->ctl_tail->next = m;
    else
        c->ctl_head = m;
    c->ctl_tail = m;
    __atomic_store_n(&c->nctl, c->nctl + 1, __ATOMIC_RELAXED);   /* (read unlocked) */
    if (!quiet)
        notify_writer(c, 0);
    return FB_OK;
}

int ctl_push(fb_conn_t *c, uint8_t type, uint32_t receiver_id, const char *body,
                    uint32_t len)
{
    return ctl_push_quiet(c, type, receiver_id, body, len, 0);
}

/* An ERROR_RESPONSE body: code, type name, message. */
int ctl_error(fb_conn_t *c, uint32_t receiver_id, int code, const char *type,
                     const char *msg)
{
    char body[FB_NET_MAX_ERROR_BODY];
    char *end = fb_wire_put_error_body(body, receiver_id, (uint8_t)code, type, strlen(type), msg,
                                       strlen(msg));
    return ctl_push(c, FB_MSG_ERROR, receiver_id, body, (uint32_t)(end - body));
}

/* Fail an in-channel (mu held): its consumer raises.  What the channel holds
 * (buffers for the sender, items not read) stays with it until its close,
 * which runs in the consumer's thread while the pools are certainly alive:
 * given back from here, it could reach a pool the consumer, woken by the
 * failure, has freed meanwhile. */
void inchan_fail_locked(fb_conn_t *c, fb_inchan_t *ch, int code, const char *type,
                               const char *msg)
{
    if (!holds_buffers(ch))
        return;
    if (ch->state == CH_RETRY)
        c->num_retrying--;
    ch->state = CH_FAILED;
    ch->err_code = code;
    copy_text(ch->err_type, sizeof(ch->err_type), type, strlen(type));
    copy_text(ch->err_msg, sizeof(ch->err_msg), msg, strlen(msg));
    ch->nfailed_items = fb_subpart_terminate(&ch->queue, FB_SP_FAILED, &ch->failed_items);
}

void outchan_free_slot(fb_conn_t *c, outchan_t *oc)
{
    idmap_del(&c->out_ids, oc->receiver_id);
    c->outs[oc->slot] = NULL;
    c->free_outs[c->nfree_outs++] = oc->slot;
}

/* End a served channel whose slot was freed (no lock held): the reader over
 * there is gone, so the subpartition is released (`release`), or it was
 * read to the end; either way the owner reference goes. */
void outchan_end(fb_conn_t *c, outchan_t *oc, int release)
{
    fb_item_t *items = NULL;
    int32_t n;
    fb_subpart_disconnect(oc->sp, &c->out);
    if (oc->pool_waiter)
        oc->pool->ops->clear_waiter(oc->pool, c);
    if (release) {
        n = fb_subpart_terminate(oc->sp, FB_SP_RELEASED, &items);
        if (n > 0)
            fb_items_dispose(items, n);
    }
    fb_owner_ref_put(oc->ref);       /* the owner goes once nothing of it is lent */
    free(oc);
}

/* The connection ended (any thread, no lock held): every channel on it
 * fails or ends, the socket shuts down, the writer wakes. */
/* The socket goes: both directions shut, the writer stops.  Idempotent. */
void close_socket(fb_conn_t *c)
{
    c->t->ops->shutdown(c->t);
    fb_gate_close(&c->out);
}

/* End the connection (if it is open) with why: every in-channel fails,
 * nobody reads any more.  1 if this ended it and the socket stays open for
 * the writer to send what is queued (close_on_send): it closes the socket
 * once the CLOSE_REQUEST went (finish_batch). */
int conn_end(fb_conn_t *c, int code, const char *msg)
{
    int32_t k;
    int deferred;
    uint64_t one = 1;
    pthread_mutex_lock(&c->mu);
    if (c->state != CONN_OPEN) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    c->state = CONN_ENDED;
    c->err_code = code;
    copy_text(c->err_msg, sizeof(c->err_msg), msg, strlen(msg));
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++)
        if (c->ins[k] != NULL)
            inchan_fail_locked(c, c->ins[k], code, "", msg);
    /* The served channels end in the writer thread as it stops (it may be
     * sending their segments now: their owners must outlive that). */
    deferred = c->close_on_send && !c->close_sent;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_stop, 1, __ATOMIC_RELAXED);   /* (read unlocked by a reader mid-frame) */
    pthread_cond_broadcast(&c->rd_cv);
    pthread_cond_broadcast(&c->rd_done_cv);
    if (deferred) {           /* no shutdown wakes the polls: these do */
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
        (void)!write(c->direct_wake_fd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&c->rd_mu);
    return deferred;
}

/* An error and a CLOSE_REQUEST are still to go before the socket closes
 * (the writer closes it once they went, the reader thread a second later). */
static int close_pending(fb_conn_t *c)
{
    int pending;
    pthread_mutex_lock(&c->mu);
    pending = c->close_on_send && !c->close_sent;
    pthread_mutex_unlock(&c->mu);
    return pending;
}

void conn_fail(fb_conn_t *c, int code, const char *fmt, ...)
{
    char msg[FB_NET_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!conn_end(c, code, msg) && !close_pending(c))
        close_socket(c);
}

void conn_write_failed(fb_conn_t *c, int err)
{
    uint64_t one = 1;
    if (err != EPIPE && err != ECONNRESET && err != ENOTCONN) {
        conn_fail(c, FB_NET_ERR_CONNECTION, "writing to the connection failed: %s",
                  strerror(err));
        return;
    }
    if (__atomic_exchange_n(&c->write_errno, err, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_lent_until, 0, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&c->rd_cv);
    if (!c->rd_stop)
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
    pthread_mutex_unlock(&c->rd_mu);
}

int write_failed(fb_conn_t *c)
{
    return __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE) != 0;
}

/* The peer closed the connection (a read found the end of the stream). */
void conn_fail_peer_closed(fb_conn_t *c, int mid_frame)
{
    int err = __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE);
    conn_fail(c, FB_NET_ERR_CONNECTION, "the peer closed the connection%s%s%s",
              mid_frame ? " in the middle of a frame" : "",
              err ? " (and writing to it failed: " : "", err ? strerror(err) : "");
}

void end_served_channels(fb_conn_t *c)
{
    outchan_t **ended;
    int32_t n = 0, k;
    /* A producer's thread sending now finishes first; a batch it left
     * unsent goes back (the connection has ended: it is not sent). */
    pthread_mutex_lock(&c->send_mu);
    if (c->pending != NULL) {
        batch_t *spare = c->pending;
        flush_pending(c, 0);
        if (c->direct == NULL)
            c->direct = spare;
    }
    pthread_mutex_unlock(&c->send_mu);
    ended = malloc(sizeof(outchan_t *) * FB_NET_MAX_CHANNELS);
    pthread_mutex_lock(&c->mu);
    for (k = 1; k <= FB_NET_MAX_CHANNELS; k++)
        if (c->outs[k] != NULL) {
            if (ended == NULL) {        /* no memory: one at a time, unlocking between */
                outchan_t *oc = c->outs[k];
                outchan_free_slot(c, oc);
                pthread_mutex_unlock(&c->mu);
                outchan_end(c, oc, 1);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            ended[n++] = c->outs[k];
            outchan_free_slot(c, c->outs[k]);
        }
    pthread_mutex_unlock(&c->mu);
    for (k = 0; k < n; k++)
        outchan_end(c, ended[k], 1);
    free(ended);
}

int32_t in_lookup(fb_conn_t *c, uint32_t id)
{
    return idmap_get(&c->in_ids, id);
}

void conn_hold(void *arg)
{
    fb_conn_incref(arg);
}

void conn_release(void *arg)
{
    fb_conn_decref(arg);
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
    c->rd = malloc(RD_CAP);
    c->ctlbuf = malloc(CTL_CAP);
    c->direct_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->thread_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->rd == NULL || c->ctlbuf == NULL || c->direct_wake_fd < 0
            || c->thread_wake_fd < 0
            || fb_gate_init(&c->out, FB_NET_MAX_CHANNELS + 1) != FB_OK)
        goto fail;
    c->direct = batch_new();
    if (c->direct == NULL)
        goto fail_gate;
    if (pthread_mutex_init(&c->mu, NULL) != 0)
        goto fail_gate;
    if (pthread_mutex_init(&c->send_mu, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    if (fb_cond_init(&c->cv) != 0) {
        pthread_mutex_destroy(&c->send_mu);
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    if (pthread_mutex_init(&c->rd_mu, NULL) != 0 || fb_cond_init(&c->rd_cv) != 0
            || fb_cond_init(&c->rd_done_cv) != 0) {
        /* (none of these fails on Linux with default attributes) */
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->send_mu);
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    if (pthread_mutex_init(&c->rel_mu, NULL) != 0) {
        pthread_cond_destroy(&c->rd_done_cv);
        pthread_cond_destroy(&c->rd_cv);
        pthread_mutex_destroy(&c->rd_mu);
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->send_mu);
        pthread_mutex_destroy(&c->mu);
        goto fail_gate;
    }
    c->peer_pidfd = -1;
    c->direct_reads = 1;
    c->t = t;
    c->segment_size = segment_size;
    c->io_timeout_ms = io_timeout > 0 && io_timeout < 2e6 ? (int)(io_timeout * 1000) : 2000000000;
    c->cb = *cb;
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
fail_gate:
    free(c->direct);
    fb_gate_free(&c->out);
fail:
    if (c->direct_wake_fd >= 0)
        close(c->direct_wake_fd);
    if (c->thread_wake_fd >= 0)
        close(c->thread_wake_fd);
    free(c->rd);
    free(c->ctlbuf);
    free(c);
    t->ops->destroy(t);
    return NULL;
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

void fb_conn_close(fb_conn_t *c)
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
    lending_detach(c);          /* nobody reads or writes frames any more */
    lending_end(c);
}

void fb_conn_incref(fb_conn_t *c)
{
    __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL);
}

void fb_conn_decref(fb_conn_t *c)
{
    if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    fb_conn_close(c);
    ctl_free_list(c->ctl_head);     /* holds no channel: a channel holds this connection */
    fb_gate_free(&c->out);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->rd_cv);
    pthread_cond_destroy(&c->rd_done_cv);
    pthread_mutex_destroy(&c->rd_mu);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->rel_mu);
    c->t->ops->destroy(c->t);
    free(c->direct);
    free(c->rd);
    free(c->ctlbuf);
    free(c);
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
