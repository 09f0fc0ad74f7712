/* The consumer's side of a connection (Flink's CreditBasedPartitionRequest-
 * ClientHandler): buffers, errors and lent buffers arriving for in-channels,
 * the control frames in-channels send (requests, credit, buffer sizes),
 * retried requests and buffer sizes that waited for their time,
 * and the releases of segments the peer lent: its arena mapped read-only
 * (network/lease.h), read in place. */
#define _GNU_SOURCE
#include "network/consumer_internal.h"
#include "network/inchan_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffers arriving ---------------------------------------------------------- */

/* The channel a BUFFER_RESPONSE (or BUFFER_LENT) is for, with a reference
 * and marked as being received into, and where its body goes (*item: for a
 * data buffer, the segment its credit stood for); NULL with *rc 0 to drop
 * the body (a channel that ended), or with *rc -1 and why on a protocol
 * error. */
static fb_inchan_t *buffer_target(fb_conn_t *c, uint32_t id, uint32_t seq, uint8_t type,
                                  uint32_t size, fb_item_t *item, int *rc, char *why)
{
    int32_t slot, index;
    int floating;
    fb_inchan_t *ch;
    fb_localpool_t *pool;
    *rc = -1;
    pthread_mutex_lock(&c->mu);
    slot = in_lookup(c, id);
    ch = slot >= 0 ? c->ins[slot] : NULL;
    if (ch == NULL || ch->state != CH_REQUESTED || ch->gap) {
        uint32_t issued = c->next_receiver_id;
        pthread_mutex_unlock(&c->mu);
        if (id == 0 || id >= issued)
            snprintf(why, WHY_LEN, "a buffer for receiver id %u, which was never issued", id);
        else
            *rc = 0;
        return NULL;
    }
    if (seq != ch->next_seq) {
        uint32_t expected = ch->next_seq;
        pthread_mutex_unlock(&c->mu);
        snprintf(why, WHY_LEN, "sequence gap on receiver id %u: got %u, expected %u", id, seq,
                 expected);
        return NULL;
    }
    if (type == 0 && ch->cr.nheld == 0) {
        pthread_mutex_unlock(&c->mu);
        snprintf(why, WHY_LEN, "a data buffer without credit on receiver id %u", id);
        return NULL;
    }
    if (type == 1 && fb_credit_event_arrives(&ch->cr) < 0) {
        pthread_mutex_unlock(&c->mu);
        snprintf(why, WHY_LEN, "more than %d events outstanding on receiver id %u",
                 FB_NET_EVENT_WINDOW, id);
        return NULL;
    }
    ch->next_seq++;
    item->data = NULL;
    item->pool = NULL;
    item->index = -1;
    item->kind = type == 0 ? FB_ITEM_DATA : FB_ITEM_EVENT;
    item->size = (int32_t)size;
    if (type == 0) {                /* into one of the buffers the channel holds */
        fb_credit_consume(&ch->cr, &index, &floating);
        pool = floating ? ch->floating->pool : ch->exclusive;
        item->data = segment_of(pool, index);
        item->pool = pool;
        item->index = index;
        c->recv_busy = ch;          /* a close waits for (or aborts) this receive */
    }
    inchan_incref(ch);
    pthread_mutex_unlock(&c->mu);
    *rc = 0;
    return ch;
}

/* A body arrived (received: 0) or not (-1): queue the item for the
 * consumer if the channel still reads, else give it back; then borrow
 * floating buffers for the sender's backlog.  Both happen before the
 * receive is marked done: a close waits for that, so the pools are alive. */
static void buffer_deliver(fb_conn_t *c, fb_inchan_t *ch, fb_item_t *item, int received,
                           int32_t backlog)
{
    int delivered = 0;
    int last = item->kind == FB_ITEM_EVENT && item->size == 1 && item->data != NULL
               && received == 0 && item->data[0] == 0;     /* EndOfPartition */
    int open;
    pthread_mutex_lock(&c->mu);
    open = received == 0 && ch->state == CH_REQUESTED;
    if (open && last)
        ch->state = CH_FINISHED;
    pthread_mutex_unlock(&c->mu);
    /* Queued with no connection lock held: the consumer it wakes takes that
     * lock at once (to recycle).  A close or failure meanwhile terminates the
     * queue, which then refuses the item (or hands it back with the rest). */
    if (open && fb_subpart_add(&ch->queue, *item, last) == FB_OK) {
        pthread_mutex_lock(&c->mu);
        ch->cr.backlog = backlog;
        ch->buffers_in += item->kind == FB_ITEM_DATA;
        ch->bytes_in += item->size;
        pthread_mutex_unlock(&c->mu);
        item->data = NULL;          /* the queue has it */
        delivered = 1;
    }
    if (item->data != NULL)
        fb_item_dispose(item);
    if (delivered && item->kind == FB_ITEM_DATA)
        want_buffers(ch, backlog);
    pthread_mutex_lock(&c->mu);
    if (c->recv_busy == ch) {
        c->recv_busy = NULL;
        __atomic_store_n(&c->recv_abort, 0, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

char *consumer_body_target(fb_conn_t *c, const fb_wire_frame_t *f, int *rc, char *why)
{
    uint32_t size = f->u.buffer.size;
    fb_item_t item;
    fb_inchan_t *ch = buffer_target(c, f->receiver_id, f->u.buffer.sequence, f->u.buffer.type,
                                    size, &item, rc, why);
    if (ch == NULL)
        return NULL;
    c->rx_ch = ch;
    c->rx_item = item;
    c->rx_backlog = f->u.buffer.backlog;
    if (item.kind == FB_ITEM_EVENT && (c->rx_item.data = malloc(size ? size : 1)) == NULL) {
        snprintf(why, WHY_LEN, "out of memory for an event of %u bytes", size);
        consumer_body_done(c, -1);
        *rc = -2;
        return NULL;
    }
    return c->rx_item.data;
}

void consumer_body_done(fb_conn_t *c, int received)
{
    fb_inchan_t *ch = c->rx_ch;
    if (received == 0) {
        stat_add(&c->stats.frames_in, 1);
        if (c->rx_item.kind == FB_ITEM_DATA)
            stat_add(&c->stats.buffers_in, 1);
    }
    c->rx_ch = NULL;
    buffer_deliver(c, ch, &c->rx_item, received, c->rx_backlog);
    fb_inchan_decref(ch);
}

void consumer_body_abort(fb_conn_t *c)
{
    fb_inchan_t *ch = c->rx_ch;
    fb_item_dispose(&c->rx_item);
    c->rx_item.data = NULL;
    pthread_mutex_lock(&c->mu);
    c->recv_busy = NULL;
    __atomic_store_n(&c->recv_abort, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    c->rx_ch = NULL;
    fb_inchan_decref(ch);
}

/* ---- errors ----------------------------------------------------------------- */

int consumer_error(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
{
    uint32_t id = f->receiver_id;
    int code = f->u.error.code;
    int32_t slot;
    fb_inchan_t *ch;
    char type[FB_NET_MAX_ERROR_TYPE], msg[FB_NET_MAX_MESSAGE];
    copy_text(type, sizeof(type), f->u.error.type, f->u.error.type_len);
    copy_text(msg, sizeof(msg), f->u.error.message, f->u.error.message_len);
    if (id == FB_NET_ALL) {
        snprintf(why, WHY_LEN, "the peer ended the connection: %.4000s", msg);
        return code == FB_NET_ERR_PROTOCOL ? FB_NET_ERR_PROTOCOL : FB_NET_ERR_CONNECTION;
    }
    pthread_mutex_lock(&c->mu);
    slot = in_lookup(c, id);
    ch = slot >= 0 ? c->ins[slot] : NULL;
    if (ch != NULL && ch->state == CH_REQUESTED) {
        int64_t now = fb_monotonic_ns();
        if (code == FB_NET_ERR_NOT_FOUND && now + ch->backoff_ns < ch->request_deadline) {
            size_unwait_locked(c, ch);        /* the retried request carries the size */
            ch->state = CH_RETRY;
            ch->retry_at = now + ch->backoff_ns;
            ch->backoff_ns = ch->backoff_ns * 2 > RETRY_MAX_NS ? RETRY_MAX_NS
                                                              : ch->backoff_ns * 2;
            c->num_retrying++;
            notify_writer(c, 0);          /* recompute its wake-up */
        } else {
            if (code < FB_NET_ERR_PRODUCER_FAILED || code > FB_NET_ERR_REFUSED)
                code = FB_NET_ERR_REFUSED;
            inchan_fail_locked(c, ch, code, type, msg);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* ---- what in-channels send --------------------------------------------------- */

/* The channel's latest buffer size, told to the sender now (mu held). */
static char *put_buffer_size_locked(fb_inchan_t *ch, char *p)
{
    ch->size_sent = ch->buffer_size;
    ch->size_at = fb_monotonic_ns() + SIZE_GAP_NS;
    return fb_wire_put_buffer_size(p, ch->receiver_id, (uint32_t)ch->buffer_size);
}

char *consumer_put_control_locked(fb_conn_t *c, const ctl_t *m, char *p)
{
    int32_t slot = in_lookup(c, m->receiver_id), n;
    fb_inchan_t *ch;
    if (slot < 0)
        return p;                    /* the channel closed meanwhile */
    ch = c->ins[slot];
    switch (m->type) {
    case FB_MSG_NEW_BUFFER_SIZE:
        ch->size_queued = 0;
        if (ch->state != CH_REQUESTED || ch->buffer_size == ch->size_sent)
            return p;                /* a request carries it, or carried it already */
        return put_buffer_size_locked(ch, p);
    case FB_MSG_ADD_CREDIT:
        n = ch->state == CH_REQUESTED ? fb_credit_take_announcement(&ch->cr) : 0;
        fb_credit_unqueue(&ch->cr);
        return n > 0 ? fb_wire_put_credit(p, FB_MSG_ADD_CREDIT, ch->receiver_id, n) : p;
    case FB_MSG_ADD_EVENT_CREDIT:
        n = fb_credit_take_event_grant(&ch->cr, ch->state == CH_REQUESTED);
        return n > 0 ? fb_wire_put_credit(p, FB_MSG_ADD_EVENT_CREDIT, ch->receiver_id, n) : p;
    default:                         /* FB_MSG_PARTITION_REQUEST */
        if (ch->state != CH_REQUESTED)
            return p;
        n = fb_credit_take_initial(&ch->cr);      /* every buffer held: credit */
        p = fb_wire_put_request(p, ch->receiver_id, ch->subpartition, n, ch->partition_id,
                                ch->id_len);
        /* The size announced so far follows its request: the sender serves
         * the request before it reads the next frame. */
        return ch->buffer_size > 0 ? put_buffer_size_locked(ch, p) : p;
    }
}

/* A buffer size waiting for its time (mu held): queued once it came, else
 * when it comes. */
static int64_t size_due_locked(fb_conn_t *c, fb_inchan_t *ch, int64_t now)
{
    if (ch->state == CH_REQUESTED && ch->size_at > now)
        return ch->size_at;
    size_unwait_locked(c, ch);
    if (size_schedule_locked(c, ch) == 1)
        notify_writer(c, 0);
    return FB_WAIT_FOREVER;
}

int64_t consumer_due_locked(fb_conn_t *c)
{
    int64_t now = fb_monotonic_ns(), next = FB_WAIT_FOREVER, at;
    int32_t k;
    if (c->num_retrying == 0 && c->num_sizes_waiting == 0)
        return next;
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++) {
        fb_inchan_t *ch = c->ins[k];
        if (ch == NULL)
            continue;
        if (ch->size_waiting && (at = size_due_locked(c, ch, now)) < next)
            next = at;
        if (ch->state != CH_RETRY)
            continue;
        if (ch->retry_at <= now) {
            ch->state = CH_REQUESTED;
            ch->next_seq = 0;
            fb_credit_reset_events(&ch->cr);
            c->num_retrying--;
            ctl_push(c, FB_MSG_PARTITION_REQUEST, ch->receiver_id, NULL, 0);
        } else if (ch->retry_at < next) {
            next = ch->retry_at;
        }
    }
    return next;
}

/* ---- lent buffers: the peer's arena, read in place ------------------------------ */

/* A held segment of the peer's was recycled (any thread, the lease's lock
 * held): the writer names it in its next RELEASE. */
static void lease_released(void *arg, uint32_t segment)
{
    fb_conn_t *c = arg;
    int32_t n;
    pthread_mutex_lock(&c->rel_mu);
    c->rel[c->nrel] = segment;        /* each segment at most once: held once */
    n = c->nrel + 1;
    __atomic_store_n(&c->nrel, n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rel_mu);
    /* As deferred credit: a consumer that reads the connection itself sends
     * them with its next read, many in one frame, and wakes nobody. */
    if (!consumer_reads(c) || n >= RELEASE_BATCH)
        notify_writer(c, 0);
}

/* A lent segment of `tag` (a channel) was recycled: its credit returns. */
static void lease_untag(void *tag)
{
    fb_inchan_t *ch = tag;
    inchan_return_kept(ch);
    fb_inchan_decref(ch);
}

int fb_conn_borrow(fb_conn_t *c, int memfd, int ledger_fd, char *err, size_t errlen)
{
    fb_lease_t *l = fb_lease_map(memfd, ledger_fd, c->segment_size, err, errlen);
    if (l == NULL)
        return -1;
    c->rel = malloc(sizeof(uint32_t) * (size_t)fb_lease_segments(l));
    if (c->rel == NULL) {
        fb_lease_detach(l);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->lease = l;
    fb_lease_set_release(l, lease_released, c, lease_untag);
    return 0;
}

int32_t fb_conn_borrowed(fb_conn_t *c)
{
    return c->lease != NULL ? fb_lease_held(c->lease) : 0;
}

/* A lent buffer that arrives as the connection ends (the lease let go): it
 * is not read, but its sequence and credit count as a buffer dropped.  The
 * channel delivers nothing after it (an event, a copied buffer): its
 * consumer would see a gap in the data before the failure that conn_end is
 * about to give it. */
static int drop_lent(fb_conn_t *c, const fb_wire_lent_t *b, uint32_t id, char *why)
{
    fb_item_t credit;
    int rc;
    fb_inchan_t *ch = buffer_target(c, id, b->sequence, FB_WIRE_DATA, b->size, &credit, &rc, why);
    if (ch == NULL)
        return rc;
    pthread_mutex_lock(&c->mu);
    ch->gap = 1;
    pthread_mutex_unlock(&c->mu);
    buffer_deliver(c, ch, &credit, -1, (int32_t)b->backlog);   /* the segment back */
    fb_inchan_decref(ch);
    return 0;
}

int consumer_lent(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
{
    const fb_wire_lent_t *b = &f->u.lent;
    fb_inchan_t *ch;
    fb_item_t item, credit;
    int rc;
    if (c->lease == NULL) {
        snprintf(why, WHY_LEN, "a lent buffer, but no arena of the peer is mapped");
        return -1;
    }
    if ((rc = fb_lease_take(c->lease, b->segment, b->size, &item)) == ESHUTDOWN)
        return drop_lent(c, b, f->receiver_id, why);
    if (rc != 0) {
        snprintf(why, WHY_LEN, "a lent buffer in segment %u, which is outside the peer's "
                 "arena or lent already", b->segment);
        return -1;
    }
    ch = buffer_target(c, f->receiver_id, b->sequence, FB_WIRE_DATA, b->size, &credit, &rc, why);
    if (ch == NULL) {
        fb_item_dispose(&item);               /* released at once */
        return rc;
    }
    /* A lent buffer spends a credit as a copied one does: the segment the
     * credit stood for is kept aside until the lent one is recycled. */
    pthread_mutex_lock(&c->mu);
    fb_credit_keep(&ch->cr, credit.index, credit.pool != ch->exclusive);
    inchan_incref(ch);                        /* the tag's */
    pthread_mutex_unlock(&c->mu);
    fb_lease_tag(c->lease, b->segment, ch);
    stat_add(&c->stats.frames_in, 1);
    stat_add(&c->stats.buffers_in, 1);
    buffer_deliver(c, ch, &item, 0, (int32_t)b->backlog);
    fb_inchan_decref(ch);
    return 0;
}

char *consumer_put_releases_locked(fb_conn_t *c, char *p, char *end, int *more)
{
    uint32_t n;
    pthread_mutex_lock(&c->rel_mu);
    while (c->nrel > 0 && end - p >= (ptrdiff_t)FB_NET_MAX_CONTROL_FRAME) {
        n = (uint32_t)c->nrel < RELEASE_BATCH ? (uint32_t)c->nrel : RELEASE_BATCH;
        __atomic_store_n(&c->nrel, c->nrel - (int32_t)n, __ATOMIC_RELAXED);
        p = fb_wire_put_release(p, c->rel + c->nrel, n);
    }
    *more = c->nrel > 0;
    pthread_mutex_unlock(&c->rel_mu);
    return p;
}

void consumer_let_go(fb_conn_t *c)
{
    if (c->lease != NULL)
        fb_lease_let_go(c->lease);
}

void consumer_lease_end(fb_conn_t *c)
{
    if (c->lease != NULL) {
        fb_lease_detach(c->lease);     /* waits out a release in progress */
        c->lease = NULL;
    }
    free(c->rel);
    c->rel = NULL;
}
