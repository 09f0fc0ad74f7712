/* In-channels: reading a subpartition over there, with the channel's credit
 * (credit.h) fed by the recycle hooks of its exclusive segments and of its
 * gate's floating ones. */
#define _GNU_SOURCE
#include "network/inchan_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    size_unwait_locked(c, ch);
    ch->state = CH_FAILED;
    ch->err_code = code;
    copy_text(ch->err_type, sizeof(ch->err_type), type, strlen(type));
    copy_text(ch->err_msg, sizeof(ch->err_msg), msg, strlen(msg));
    ch->nfailed_items = fb_subpart_terminate(&ch->queue, FB_SP_FAILED, &ch->failed_items);
}

void size_unwait_locked(fb_conn_t *c, fb_inchan_t *ch)
{
    if (ch->size_waiting) {
        ch->size_waiting = 0;
        c->num_sizes_waiting--;
    }
}

int size_schedule_locked(fb_conn_t *c, fb_inchan_t *ch)
{
    if (ch->size_queued || ch->size_waiting || ch->state != CH_REQUESTED
            || c->state != CONN_OPEN || ch->buffer_size == ch->size_sent)
        return 0;
    if (fb_monotonic_ns() < ch->size_at) {
        ch->size_waiting = 1;
        c->num_sizes_waiting++;
        return 2;                        /* the writer sets its wake-up for it */
    }
    if (ctl_push_quiet(c, FB_MSG_NEW_BUFFER_SIZE, ch->receiver_id, NULL, 0, 1) != FB_OK)
        return 0;
    ch->size_queued = 1;
    return 1;
}

/* Act on a credit decision (mu held): queue the message it calls for.
 * Returns how the caller (unlocked) is to wake the writer (writer_kick), or 0. */
static int credit_act(fb_conn_t *c, fb_inchan_t *ch, fb_credit_action_t a, uint8_t msg)
{
    if (a == FB_CREDIT_NOTHING)
        return 0;
    if (a == FB_CREDIT_SEND_QUEUED)
        return 1;
    if (ctl_push_quiet(c, msg, ch->receiver_id, NULL, 0, 1) != FB_OK) {
        if (msg == FB_MSG_ADD_CREDIT)
            fb_credit_unqueue(&ch->cr);
        else
            fb_credit_event_unqueue(&ch->cr);
        return 0;
    }
    return a == FB_CREDIT_DEFER ? 0 : a == FB_CREDIT_BATCH ? 2 : 1;
}

/* The channel reads, and its credit may be announced now (mu held). */
static inline int credit_open(const fb_conn_t *c, const fb_inchan_t *ch)
{
    return ch->state == CH_REQUESTED && c->state == CONN_OPEN;
}

/* Credit held and not told yet goes to the sender, unless the consumer
 * still reads a buffer under a debloating bound (mu held): what
 * credit_act returns. */
static int announce_locked(fb_conn_t *c, fb_inchan_t *ch)
{
    if (ch->reading && ch->cr.limit < ch->cr.cap)
        return 0;
    if (ch->cr.unannounced == 0)
        return 0;
    return credit_act(c, ch, fb_credit_announce(&ch->cr, credit_open(c, ch), consumer_reads(c)),
                      FB_MSG_ADD_CREDIT);
}

/* A segment (exclusive, or floating) for `ch` to hold for its sender, as
 * one more credit, while the channel still reads (no lock held): 1 if the
 * channel took it. */
static int hold_for_sender(fb_inchan_t *ch, int32_t index, int floating)
{
    fb_conn_t *c = ch->conn;
    int kept = 0, wake = 0;
    pthread_mutex_lock(&c->mu);
    if (holds_buffers(ch) && fb_credit_room(&ch->cr, fb_subpart_backlog(&ch->queue)) > 0
            && fb_credit_hold(&ch->cr, index, floating)) {
        wake = announce_locked(c, ch);
        kept = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
    return kept;
}

/* An exclusive segment recycled by the consumer goes back to its channel. */
static int exclusive_hook(void *arg, fb_localpool_t *lp, int32_t index)
{
    (void)lp;
    return hold_for_sender(arg, index, 0);
}

static inline fb_inchan_t *inchan_of(fb_credit_t *cr)
{
    return (fb_inchan_t *)((char *)cr - offsetof(fb_inchan_t, cr));
}

/* A floating segment recycled by a consumer: lent to the channel that has
 * waited longest, or back to the gate's pool. */
static int floating_hook(void *arg, fb_localpool_t *lp, int32_t index)
{
    fb_floating_t *f = arg;
    fb_credit_t *cr;
    fb_inchan_t *ch;
    int kept;
    (void)lp;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        cr = fb_waitlist_pop(&f->wl);
        ch = cr != NULL ? inchan_of(cr) : NULL;
        if (ch != NULL)
            inchan_incref(ch);      /* a channel on the list is alive (its close removes it) */
        pthread_mutex_unlock(&f->mu);
        if (ch == NULL)
            return 0;
        kept = hold_for_sender(ch, index, 1);
        fb_inchan_decref(ch);
        if (kept)
            return 1;
    }
}

/* The sender has `backlog` buffers more: hold backlog + exclusive buffers for
 * it, borrowing floating ones (no lock held). */
void want_buffers(fb_inchan_t *ch, int32_t backlog)
{
    fb_conn_t *c = ch->conn;
    fb_floating_t *f = ch->floating;
    int32_t need, index;
    int take;
    if (f == NULL || backlog <= 0)
        return;
    pthread_mutex_lock(&c->mu);
    need = holds_buffers(ch) ? fb_credit_need(&ch->cr, backlog) : 0;
    if (need > 0) {
        int32_t room = fb_credit_room(&ch->cr, fb_subpart_backlog(&ch->queue));
        need = need < room ? need : room;
    }
    pthread_mutex_unlock(&c->mu);
    if (need <= 0)
        return;
    pthread_mutex_lock(&f->mu);
    take = fb_waitlist_want(&f->wl, &ch->cr, need) == FB_OK;
    pthread_mutex_unlock(&f->mu);
    /* Registered first, then asked the pool: a recycle in between finds us
     * waiting, so no buffer goes back to the pool unnoticed. */
    while (take) {
        pthread_mutex_lock(&f->mu);
        take = ch->cr.wants > 0;
        pthread_mutex_unlock(&f->mu);
        if (!take || f->pool->ops->request(f->pool, FB_NO_CHANNEL, &index) != FB_OK)
            return;
        pthread_mutex_lock(&f->mu);
        take = fb_waitlist_took(&f->wl, &ch->cr);
        pthread_mutex_unlock(&f->mu);
        if (!take || !hold_for_sender(ch, index, 1)) {
            f->pool->ops->recycle(f->pool, index);     /* to whoever waits, or the pool */
            return;
        }
    }
}

void inchan_return_kept(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    fb_localpool_t *pool;
    int32_t index;
    int floating;
    pthread_mutex_lock(&c->mu);
    if (fb_credit_unkeep(&ch->cr, &index, &floating) != 0) {
        pthread_mutex_unlock(&c->mu);    /* the channel closed: they went back then */
        return;
    }
    pool = floating ? ch->floating->pool : ch->exclusive;
    ch->kept_busy++;                     /* a close waits: the pools must exist */
    pthread_mutex_unlock(&c->mu);
    pool->ops->recycle(pool, index);     /* its hook holds it for the sender again */
    pthread_mutex_lock(&c->mu);
    if (--ch->kept_busy == 0 && ch->state == CH_CLOSED)
        pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

fb_floating_t *fb_floating_new(fb_localpool_t *pool)
{
    fb_floating_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        free(f);
        return NULL;
    }
    f->pool = pool;
    f->refs = 1;
    pool->ops->set_recycle_hook(pool, floating_hook, f);
    return f;
}

static void floating_incref(fb_floating_t *f)
{
    __atomic_add_fetch(&f->refs, 1, __ATOMIC_ACQ_REL);
}

void fb_floating_detach(fb_floating_t *f)
{
    fb_localpool_t *pool = f->pool;
    pool->ops->set_recycle_hook(pool, NULL, NULL);
}

void fb_floating_decref(fb_floating_t *f)
{
    if (f == NULL || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_destroy(&f->mu);
    fb_waitlist_free(&f->wl);
    free(f);
}

fb_inchan_t *fb_inchan_new(fb_conn_t *c, const char *partition_id, size_t len,
                           uint32_t subpartition, fb_localpool_t *exclusive,
                           fb_floating_t *floating, int64_t request_deadline_ns)
{
    fb_inchan_t *ch;
    int64_t cap;
    if (len > FB_NET_MAX_PARTITION_ID)
        return NULL;
    ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return NULL;
    cap = (int64_t)exclusive->max_buffers + (floating != NULL ? floating->pool->max_buffers : 0);
    if (cap > 1 << 20 || cap < 1)
        cap = 1 << 20;                /* unbounded pools: more than a channel can hold */
    if (fb_credit_init(&ch->cr, (int32_t)cap) != FB_OK
            || fb_signal_init(&ch->on_poll) != FB_OK)
        goto fail;
    if (fb_subpart_init(&ch->queue, &ch->on_poll) != FB_OK) {
        fb_signal_free(&ch->on_poll);
        goto fail;
    }
    memcpy(ch->partition_id, partition_id, len);
    ch->id_len = (uint16_t)len;
    ch->subpartition = subpartition;
    ch->exclusive = exclusive;
    ch->floating = floating;
    if (floating)
        floating_incref(floating);
    ch->conn = c;
    fb_conn_incref(c);
    ch->refs = 1;
    ch->slot = -1;
    ch->state = CH_NEW;
    ch->request_deadline = request_deadline_ns;
    ch->backoff_ns = RETRY_FIRST_NS;
    return ch;
fail:
    fb_credit_free(&ch->cr);
    free(ch);
    return NULL;
}

int fb_inchan_add_exclusive(fb_inchan_t *ch, int32_t index)
{
    int rc = FB_OK;
    pthread_mutex_lock(&ch->conn->mu);
    rc = ch->state != CH_NEW ? FB_ESTATE : fb_credit_add_exclusive(&ch->cr, index);
    pthread_mutex_unlock(&ch->conn->mu);
    return rc;
}

int fb_inchan_open(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    int rc = FB_OK;
    ch->exclusive->ops->set_recycle_hook(ch->exclusive, exclusive_hook, ch);
    pthread_mutex_lock(&c->mu);
    if (ch->state != CH_NEW)
        rc = FB_ESTATE;
    else if (c->state != CONN_OPEN)
        rc = FB_ECLOSED;
    else if (c->nfree_ins == 0 || c->next_receiver_id == FB_NET_ALL)
        rc = FB_EINVAL;
    if (rc == FB_OK) {
        ch->slot = c->free_ins[--c->nfree_ins];
        ch->receiver_id = c->next_receiver_id++;
        c->ins[ch->slot] = ch;
        idmap_put(&c->in_ids, ch->receiver_id, ch->slot);
        inchan_incref(ch);                   /* the connection's */
        ch->state = CH_REQUESTED;
        if (ctl_push(c, FB_MSG_PARTITION_REQUEST, ch->receiver_id, NULL, 0) != FB_OK)
            rc = FB_ENOMEM;                  /* the channel stays: close() cleans up */
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

fb_subpart_t *fb_inchan_queue(fb_inchan_t *ch)
{
    return &ch->queue;
}

void fb_inchan_close(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    fb_item_t *items = NULL;
    const int32_t *held;
    const uint8_t *floating;
    int32_t n, k, nheld;
    int registered = 0;
    pthread_mutex_lock(&c->mu);
    if (ch->state == CH_CLOSED) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if ((ch->state == CH_REQUESTED || ch->state == CH_RETRY) && c->state == CONN_OPEN)
        ctl_push(c, FB_MSG_CANCEL, ch->receiver_id, NULL, 0);
    if (ch->state == CH_RETRY)
        c->num_retrying--;
    size_unwait_locked(c, ch);
    /* (control messages queued for it find no channel when written) */
    if (ch->slot >= 0 && c->ins[ch->slot] == ch) {
        idmap_del(&c->in_ids, ch->receiver_id);
        c->ins[ch->slot] = NULL;
        c->free_ins[c->nfree_ins++] = ch->slot;
        registered = 1;
    }
    ch->state = CH_CLOSED;
    while (c->recv_busy == ch) {
        /* The reader receives into one of our segments: have it let go now
         * (a stalled peer must not hold this close up). */
        uint64_t one = 1;
        __atomic_store_n(&c->recv_abort, 1, __ATOMIC_RELEASE);
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
        (void)!write(c->direct_wake_fd, &one, sizeof(one));
        pthread_cond_wait(&c->cv, &c->mu);
    }
    fb_credit_release_all(&ch->cr, &held, &floating, &nheld);   /* closed: none held after */
    while (ch->kept_busy > 0)            /* a kept segment on its way back to our pools */
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    /* Everything the channel holds goes back now, in the closing thread,
     * while the pools certainly exist (no connection lock held: a floating
     * segment may be lent on to a channel of this connection). */
    ch->exclusive->ops->set_recycle_hook(ch->exclusive, NULL, NULL);
    if (ch->floating) {
        pthread_mutex_lock(&ch->floating->mu);
        fb_waitlist_remove(&ch->floating->wl, &ch->cr);
        pthread_mutex_unlock(&ch->floating->mu);
    }
    for (k = 0; k < nheld; k++) {
        fb_localpool_t *pool = floating[k] ? ch->floating->pool : ch->exclusive;
        pool->ops->recycle(pool, held[k]);
    }
    if (ch->nfailed_items > 0) {
        fb_items_dispose(ch->failed_items, ch->nfailed_items);
        ch->nfailed_items = 0;
        ch->failed_items = NULL;
    }
    n = fb_subpart_terminate(&ch->queue, FB_SP_RELEASED, &items);
    if (n > 0)
        fb_items_dispose(items, n);
    if (registered)
        fb_inchan_decref(ch);                /* the connection's */
}

static void inchan_hold(void *arg)
{
    inchan_incref(arg);
}

static void inchan_release(void *arg)
{
    fb_inchan_decref(arg);
}

int fb_inchan_attach_reader(fb_inchan_t *ch, fb_gate_t *g)
{
    fb_lender_t r = {ch->conn->gate_lender, inchan_hold, inchan_release, ch};
    return fb_gate_set_reader(g, &r);
}

void fb_inchan_detach_reader(fb_inchan_t *ch, fb_gate_t *g)
{
    fb_gate_clear_reader(g, ch);
}

void fb_inchan_decref(fb_inchan_t *ch)
{
    if (__atomic_sub_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    fb_subpart_free(&ch->queue);
    fb_signal_free(&ch->on_poll);
    fb_floating_decref(ch->floating);
    fb_conn_decref(ch->conn);
    fb_credit_free(&ch->cr);
    free(ch);
}

void fb_inchan_event_taken(fb_inchan_t *ch)
{
    fb_conn_t *c = ch->conn;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    wake = credit_act(c, ch, fb_credit_event_taken(&ch->cr, credit_open(c, ch)),
                      FB_MSG_ADD_EVENT_CREDIT);
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
}

void fb_inchan_announce_buffer_size(fb_inchan_t *ch, int32_t size)
{
    fb_conn_t *c = ch->conn;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    if (holds_buffers(ch) && size > 0) {
        ch->buffer_size = size;      /* a request not written yet carries it */
        wake = size_schedule_locked(c, ch);
    }
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
}

/* Why reclaim runs: the bound set (or lifted), the consumer took a buffer
 * (it reads one now), or its records ran dry. */
enum reclaim_why { RECLAIM_BOUND, RECLAIM_TAKEN, RECLAIM_DRY };

/* Room opened (the bound rose, or the consumer took a buffer that waited):
 * hold exclusive segments given back to the channel's pool for the sender
 * again (floating ones come as the sender's backlog asks for them).  The
 * reading flag and the credit held back for it change under the same lock
 * hold as the room is counted. */
static void reclaim(fb_inchan_t *ch, int32_t n, enum reclaim_why why)
{
    fb_conn_t *c = ch->conn;
    int32_t room = 0, index;
    int wake = 0;
    pthread_mutex_lock(&c->mu);
    if (why != RECLAIM_BOUND)
        __atomic_store_n(&ch->reading, why == RECLAIM_TAKEN, __ATOMIC_RELAXED);
    if (!holds_buffers(ch)) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (why == RECLAIM_BOUND)
        fb_credit_set_limit(&ch->cr, n);
    if (why != RECLAIM_TAKEN)
        wake = announce_locked(c, ch);      /* what was held back: a bound lifted, or dry */
    if (why == RECLAIM_BOUND || ch->cr.limit < ch->cr.cap)
        room = fb_credit_room(&ch->cr, fb_subpart_backlog(&ch->queue));
    pthread_mutex_unlock(&c->mu);
    if (wake)
        writer_kick(c, wake);
    while (room-- > 0 && ch->exclusive->ops->request(ch->exclusive, FB_NO_CHANNEL, &index) == FB_OK)
        if (!hold_for_sender(ch, index, 0)) {
            ch->exclusive->ops->recycle(ch->exclusive, index);
            break;
        }
}

void fb_inchan_set_buffer_limit(fb_inchan_t *ch, int32_t n)
{
    reclaim(ch, n, RECLAIM_BOUND);
}

void fb_inchan_buffer_taken(fb_inchan_t *ch)
{
    if (__atomic_load_n(&ch->cr.limit, __ATOMIC_RELAXED) >= ch->cr.cap)
        return;
    reclaim(ch, 0, RECLAIM_TAKEN);
}

void fb_inchan_reader_dry(fb_inchan_t *ch)
{
    if (!__atomic_load_n(&ch->reading, __ATOMIC_RELAXED))
        return;
    reclaim(ch, 0, RECLAIM_DRY);
}

int fb_inchan_error(fb_inchan_t *ch, char *type, size_t tlen, char *message, size_t mlen)
{
    int code;
    pthread_mutex_lock(&ch->conn->mu);
    code = ch->state == CH_FAILED ? ch->err_code : 0;
    copy_text(type, tlen, ch->err_type, strlen(ch->err_type));
    copy_text(message, mlen, ch->err_msg, strlen(ch->err_msg));
    pthread_mutex_unlock(&ch->conn->mu);
    return code;
}

uint32_t fb_inchan_receiver_id(fb_inchan_t *ch)
{
    return ch->receiver_id;
}

void fb_inchan_stats(fb_inchan_t *ch, fb_inchan_stats_t *out)
{
    pthread_mutex_lock(&ch->conn->mu);
    fb_credit_counts(&ch->cr, &out->exclusive_available, &out->floating_available);
    out->exclusive_total = ch->cr.num_exclusive;
    out->backlog = ch->cr.backlog;
    out->queued = fb_subpart_backlog(&ch->queue);
    out->buffers_in = ch->buffers_in;
    out->bytes_in = ch->bytes_in;
    pthread_mutex_unlock(&ch->conn->mu);
}
