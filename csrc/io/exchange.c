#define _GNU_SOURCE
#include "io/exchange.h"

#include <stdlib.h>
#include <string.h>

/* ---- items ------------------------------------------------------------ */

void fb_item_dispose(fb_item_t *item)
{
    if (item->pool != NULL)
        item->pool->ops->recycle(item->pool, item->index);
    else
        free(item->data);
    item->data = NULL;
    item->pool = NULL;
}

void fb_items_dispose(fb_item_t *items, int32_t n)
{
    int32_t k;
    for (k = 0; k < n; k++)
        fb_item_dispose(&items[k]);
    free(items);
}

/* ---- gate ------------------------------------------------------------ */

int fb_gate_init(fb_gate_t *g, int32_t num_channels)
{
    memset(g, 0, sizeof(*g));
    if (num_channels <= 0)
        return FB_ESTATE;
    g->ready = malloc(sizeof(int32_t) * (size_t)num_channels);
    g->queued = calloc((size_t)num_channels, 1);
    if (g->ready == NULL || g->queued == NULL)
        goto nomem;
    if (fb_cond_init(&g->cv) != 0)
        goto nomem;
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        pthread_cond_destroy(&g->cv);
        goto nomem;
    }
    g->num_channels = num_channels;
    g->initialized = 1;
    return FB_OK;
nomem:
    free(g->ready);
    free(g->queued);
    memset(g, 0, sizeof(*g));
    return FB_ENOMEM;
}

void fb_gate_free(fb_gate_t *g)
{
    if (!g->initialized)
        return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->ready);
    free(g->queued);
    memset(g, 0, sizeof(*g));
}

/* The waiter is signalled after the mutex is released: signalled under it,
 * the woken thread would at once block on the mutex the notifier still holds
 * (one more futex wait and wake, and a context switch, per notification).
 * The caller keeps the gate alive (a subpartition notifies under its own
 * lock, under which its gate disconnects before it is freed). */
static void gate_mark(fb_gate_t *g, int32_t channel, int wake)
{
    int signal = 0;
    if (channel < 0 || channel >= g->num_channels)
        return;
    pthread_mutex_lock(&g->mu);
    if (!g->queued[channel]) {
        g->queued[channel] = 1;
        g->ready[(g->head + g->count) % g->num_channels] = channel;
        __atomic_store_n(&g->count, g->count + 1, __ATOMIC_RELEASE);   /* (fb_gate_ready) */
        signal = wake && g->waiters > 0;
        if (wake)
            fb_waitpoint_wake(&g->wp);
    }
    pthread_mutex_unlock(&g->mu);
    if (signal)
        pthread_cond_signal(&g->cv);
}

void fb_gate_notify(fb_gate_t *g, int32_t channel)
{
    gate_mark(g, channel, 1);
}

void fb_gate_mark(fb_gate_t *g, int32_t channel)
{
    gate_mark(g, channel, 0);
}

void fb_gate_wake(fb_gate_t *g)
{
    int signal;
    pthread_mutex_lock(&g->mu);
    signal = g->count > 0 && g->waiters > 0;
    if (g->count > 0)
        fb_waitpoint_wake(&g->wp);
    pthread_mutex_unlock(&g->mu);
    if (signal)
        pthread_cond_signal(&g->cv);
}

int fb_gate_wait(fb_gate_t *g, int64_t deadline_ns, int32_t *channel)
{
    int rc = FB_OK, tried = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->closed) {
            rc = FB_ECLOSED;
            break;
        }
        if (g->count > 0) {
            int32_t ch = g->ready[g->head];
            g->head = (g->head + 1) % g->num_channels;
            __atomic_store_n(&g->count, g->count - 1, __ATOMIC_RELEASE);
            g->queued[ch] = 0;
            *channel = ch;
            break;
        }
        if (deadline_ns <= fb_monotonic_ns()) {
            rc = FB_ETIMEDOUT;
            break;
        }
        if (!tried) {                /* what came meanwhile signalled nobody: re-check */
            tried = !fb_waitpoint_serve(&g->wp, &g->mu, g, deadline_ns);
            continue;
        }
        g->waiters++;
        fb_cond_wait_until(&g->cv, &g->mu, deadline_ns);
        g->waiters--;
        tried = 0;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

void fb_gate_close(fb_gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    __atomic_store_n(&g->closed, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&g->cv);
    fb_waitpoint_wake(&g->wp);
    pthread_mutex_unlock(&g->mu);
}

int fb_gate_set_reader(fb_gate_t *g, const fb_lender_t *r)
{
    int taken;
    pthread_mutex_lock(&g->mu);
    taken = fb_waitpoint_offer(&g->wp, r);
    pthread_mutex_unlock(&g->mu);
    return taken;
}

void fb_gate_clear_reader(fb_gate_t *g, void *arg)
{
    pthread_mutex_lock(&g->mu);
    fb_waitpoint_withdraw(&g->wp, arg);
    pthread_mutex_unlock(&g->mu);
}

int fb_gate_direct_begin(fb_gate_t *g, void (*wake)(void *), void *arg)
{
    int ready;
    pthread_mutex_lock(&g->mu);
    fb_waitpoint_begin(&g->wp, wake, arg);
    ready = g->count > 0 || g->closed;
    pthread_mutex_unlock(&g->mu);
    return ready;
}

void fb_gate_direct_end(fb_gate_t *g)
{
    pthread_mutex_lock(&g->mu);
    fb_waitpoint_end(&g->wp);
    pthread_mutex_unlock(&g->mu);
}

int fb_gate_ready(fb_gate_t *g)
{
    return __atomic_load_n(&g->count, __ATOMIC_ACQUIRE) > 0
           || __atomic_load_n(&g->closed, __ATOMIC_ACQUIRE);
}

/* ---- signal ---------------------------------------------------------- */

int fb_signal_init(fb_signal_t *s)
{
    memset(s, 0, sizeof(*s));
    if (fb_cond_init(&s->cv) != 0)
        return FB_ENOMEM;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        pthread_cond_destroy(&s->cv);
        return FB_ENOMEM;
    }
    s->initialized = 1;
    return FB_OK;
}

void fb_signal_free(fb_signal_t *s)
{
    if (!s->initialized)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    memset(s, 0, sizeof(*s));
}

/* The counter moves first, then waiters are looked at; a waiter registers
 * first, then looks at the counter (both sequentially consistent), so a
 * post is never missed. */
void fb_signal_post(fb_signal_t *s)
{
    __atomic_add_fetch(&s->seq, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->waiters, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&s->mu);
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
}

uint64_t fb_signal_seq(fb_signal_t *s)
{
    return __atomic_load_n(&s->seq, __ATOMIC_SEQ_CST);
}

int fb_signal_wait(fb_signal_t *s, uint64_t seen, int64_t deadline_ns)
{
    int rc = FB_OK;
    pthread_mutex_lock(&s->mu);
    __atomic_add_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        if (__atomic_load_n(&s->seq, __ATOMIC_SEQ_CST) != seen)
            break;
        if (deadline_ns <= fb_monotonic_ns()) {
            rc = FB_ETIMEDOUT;
            break;
        }
        fb_cond_wait_until(&s->cv, &s->mu, deadline_ns);
    }
    __atomic_sub_fetch(&s->waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ---- subpartition ---------------------------------------------------- */

#define SP_INITIAL_CAP 8

int fb_subpart_init(fb_subpart_t *sp, fb_signal_t *on_poll)
{
    memset(sp, 0, sizeof(*sp));
    sp->ring = malloc(sizeof(fb_item_t) * SP_INITIAL_CAP);
    if (sp->ring == NULL)
        return FB_ENOMEM;
    if (pthread_mutex_init(&sp->mu, NULL) != 0) {
        free(sp->ring);
        sp->ring = NULL;
        return FB_ENOMEM;
    }
    sp->cap = SP_INITIAL_CAP;
    sp->gate_channel = -1;
    sp->on_poll = on_poll;
    sp->initialized = 1;
    return FB_OK;
}

void fb_subpart_free(fb_subpart_t *sp)
{
    if (!sp->initialized)
        return;
    pthread_mutex_destroy(&sp->mu);
    free(sp->ring);
    memset(sp, 0, sizeof(*sp));
}

/* Double the ring, keeping the order (lock held). */
static int grow(fb_subpart_t *sp)
{
    int32_t cap = sp->cap * 2, k;
    fb_item_t *ring;
    if (cap <= sp->cap)
        return FB_ENOMEM;
    ring = malloc(sizeof(fb_item_t) * (size_t)cap);
    if (ring == NULL)
        return FB_ENOMEM;
    for (k = 0; k < sp->count; k++)
        ring[k] = sp->ring[(sp->head + k) % sp->cap];
    free(sp->ring);
    sp->ring = ring;
    sp->cap = cap;
    sp->head = 0;
    return FB_OK;
}

int fb_subpart_add(fb_subpart_t *sp, fb_item_t item, int last)
{
    int rc = FB_OK;
    const fb_gate_hook_t *hook = NULL;
    pthread_mutex_lock(&sp->mu);
    if (sp->state == FB_SP_RELEASED) {
        rc = FB_ERELEASED;
    } else if (sp->state == FB_SP_FAILED) {
        rc = FB_EFAILED;
    } else if (sp->finished) {
        rc = FB_ESTATE;
    } else if (sp->count == sp->cap && grow(sp) != FB_OK) {
        rc = FB_ENOMEM;
    } else {
        sp->ring[(sp->head + sp->count) % sp->cap] = item;
        sp->count++;
        if (item.kind == FB_ITEM_DATA)
            __atomic_store_n(&sp->backlog, sp->backlog + 1, __ATOMIC_RELAXED);
        else
            __atomic_store_n(&sp->events, sp->events + 1, __ATOMIC_RELAXED);
        if (last)
            sp->finished = 1;
        if (sp->count == 1 && sp->gate != NULL) {
            hook = sp->gate->hook;
            gate_mark(sp->gate, sp->gate_channel, hook == NULL);
            if (hook != NULL)
                hook->hold(hook->arg);
        }
    }
    pthread_mutex_unlock(&sp->mu);
    if (hook != NULL) {
        hook->ready(hook->arg);
        hook->release(hook->arg);
    }
    return rc;
}

/* Take the head item (lock held, count > 0). */
static void take_head(fb_subpart_t *sp, fb_item_t *out)
{
    *out = sp->ring[sp->head];
    sp->head = (sp->head + 1) % sp->cap;
    sp->count--;
    if (out->kind == FB_ITEM_DATA)
        __atomic_store_n(&sp->backlog, sp->backlog - 1, __ATOMIC_RELAXED);
    else
        __atomic_store_n(&sp->events, sp->events - 1, __ATOMIC_RELAXED);
    /* More to take: marked again.  A gate with a hook is drained by its
     * owner, which takes marked channels before it sleeps (the network
     * writer, or a producer's thread sending): waking its thread here would
     * only make it compete for the work the taker is doing. */
    if (sp->count > 0 && sp->gate != NULL)
        gate_mark(sp->gate, sp->gate_channel, sp->gate->hook == NULL);
}

int fb_subpart_poll(fb_subpart_t *sp, fb_item_t *out)
{
    int rc = FB_OK;
    pthread_mutex_lock(&sp->mu);
    if (sp->state == FB_SP_FAILED)
        rc = FB_EFAILED;
    else if (sp->state == FB_SP_RELEASED)
        rc = FB_ERELEASED;
    else if (sp->count == 0)
        rc = FB_EMPTY;
    else
        take_head(sp, out);
    pthread_mutex_unlock(&sp->mu);
    if (rc == FB_OK && sp->on_poll != NULL)
        fb_signal_post(sp->on_poll);
    return rc;
}

int fb_subpart_poll_credit(fb_subpart_t *sp, int32_t credit, int32_t event_credit,
                           fb_item_t *out, int *last)
{
    int rc = FB_OK;
    pthread_mutex_lock(&sp->mu);
    if (sp->state == FB_SP_FAILED) {
        rc = FB_EFAILED;
    } else if (sp->state == FB_SP_RELEASED) {
        rc = FB_ERELEASED;
    } else if (sp->count == 0
               || (sp->ring[sp->head].kind == FB_ITEM_DATA ? credit : event_credit) <= 0) {
        rc = FB_EMPTY;          /* the gate is told again when credit comes */
    } else {
        take_head(sp, out);
        *last = sp->finished && sp->count == 0;
    }
    pthread_mutex_unlock(&sp->mu);
    if (rc == FB_OK && sp->on_poll != NULL)
        fb_signal_post(sp->on_poll);
    return rc;
}

int fb_subpart_connect(fb_subpart_t *sp, fb_gate_t *g, int32_t channel)
{
    int rc = FB_OK;
    pthread_mutex_lock(&sp->mu);
    if (sp->gate != NULL || sp->state == FB_SP_RELEASED) {
        rc = FB_ESTATE;
    } else {
        sp->gate = g;
        sp->gate_channel = channel;
        /* Data (or a failure) that came before the consumer. */
        if (sp->count > 0 || sp->state == FB_SP_FAILED)
            fb_gate_notify(g, channel);
    }
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

void fb_subpart_disconnect(fb_subpart_t *sp, fb_gate_t *g)
{
    pthread_mutex_lock(&sp->mu);
    if (sp->gate == g) {
        sp->gate = NULL;
        sp->gate_channel = -1;
    }
    pthread_mutex_unlock(&sp->mu);
}

/* Reverse items [lo, hi) of a ring in place. */
static void reverse_items(fb_item_t *a, int32_t lo, int32_t hi)
{
    fb_item_t t;
    while (lo < --hi) {
        t = a[lo];
        a[lo++] = a[hi];
        a[hi] = t;
    }
}

int32_t fb_subpart_terminate(fb_subpart_t *sp, int32_t state, fb_item_t **out)
{
    int32_t n;
    fb_item_t *items = NULL;
    pthread_mutex_lock(&sp->mu);
    n = sp->count;
    if (n > 0) {
        /* A terminated subpartition never queues again (add and poll look at
         * the state first), so its ring itself goes to the caller: rotated
         * in place so that the items, oldest first, start at index 0.  No
         * allocation: this runs on teardown paths that must not fail. */
        items = sp->ring;
        if (sp->head != 0) {
            reverse_items(items, 0, sp->head);
            reverse_items(items, sp->head, sp->cap);
            reverse_items(items, 0, sp->cap);
        }
        sp->ring = NULL;
        sp->cap = 0;
    }
    sp->head = 0;
    sp->count = 0;
    __atomic_store_n(&sp->backlog, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&sp->events, 0, __ATOMIC_RELAXED);
    if (sp->state == FB_SP_LIVE)
        __atomic_store_n(&sp->state, state, __ATOMIC_RELEASE);
    if (sp->gate != NULL)
        fb_gate_notify(sp->gate, sp->gate_channel);
    pthread_mutex_unlock(&sp->mu);
    if (sp->on_poll != NULL)
        fb_signal_post(sp->on_poll);
    *out = items;
    return n;
}

int32_t fb_subpart_backlog(const fb_subpart_t *sp)
{
    return __atomic_load_n(&sp->backlog, __ATOMIC_RELAXED);
}

void fb_subpart_set_buffer_size(fb_subpart_t *sp, int32_t size)
{
    __atomic_store_n(&sp->buffer_size, size, __ATOMIC_RELAXED);
}

int32_t fb_subpart_buffer_size(const fb_subpart_t *sp)
{
    return __atomic_load_n(&sp->buffer_size, __ATOMIC_RELAXED);
}

int32_t fb_subpart_events(const fb_subpart_t *sp)
{
    return __atomic_load_n(&sp->events, __ATOMIC_RELAXED);
}

int32_t fb_subpart_state(const fb_subpart_t *sp)
{
    return __atomic_load_n(&sp->state, __ATOMIC_ACQUIRE);
}

int32_t fb_subpart_size(fb_subpart_t *sp)
{
    int32_t n;
    pthread_mutex_lock(&sp->mu);
    n = sp->count;
    pthread_mutex_unlock(&sp->mu);
    return n;
}

int fb_subpart_drained(fb_subpart_t *sp)
{
    int drained;
    pthread_mutex_lock(&sp->mu);
    drained = sp->state != FB_SP_LIVE || (sp->finished && sp->count == 0);
    pthread_mutex_unlock(&sp->mu);
    return drained;
}
