#define _GNU_SOURCE
#include "buffer/pool_internal.h"
#include "buffer/redistribution.h"

#include <stdlib.h>
#include <string.h>

#ifdef FLINKBUF_DEBUG
int64_t fb_pool_debug_out;
#endif

int64_t fb_debug_segments_out(void)
{
#ifdef FLINKBUF_DEBUG
    return __atomic_load_n(&fb_pool_debug_out, __ATOMIC_RELAXED);
#else
    return -1;
#endif
}

/* ---- lists (lock held) ----------------------------------------------- */

static inline int32_t local_pop(fb_localpool_t *lp)
{
    int32_t i = lp->avail_head;
    lp->avail_head = lp->net->link[i];
    lp->num_avail--;
    return i;
}

static inline void local_push(fb_localpool_t *lp, int32_t i)
{
    lp->net->state[i] = FB_SEG_LOCAL;
    lp->net->link[i] = lp->avail_head;
    lp->avail_head = i;
    lp->num_avail++;
}

static void release_arena_if_idle(fb_netpool_t *np)
{
    if (np->destroyed && np->num_free == np->num_segments)
        fb_arena_free(&np->arena);
}

/* A buffer may have become free in lp (lock held): wake its waiters, and a
 * thread waiting through the pool's waiter unless it is this one. */
static void wake_pool_locked(fb_localpool_t *lp)
{
    if (lp->waiters > 0)
        pthread_cond_broadcast(&lp->cv);
    fb_waitpoint_wake(&lp->wp);
}

void fb_pool_notify_return_locked(fb_netpool_t *np)
{
    size_t i;
    if (np->unpooled_waiters > 0)
        pthread_cond_broadcast(&np->unpooled_cv);
    if (np->num_blocked > 0 || np->num_direct > 0)
        for (i = 0; i < np->num_pools; i++)
            if (np->pools[i]->waiters > 0 || fb_waitpoint_serving(&np->pools[i]->wp))
                wake_pool_locked(np->pools[i]);
    release_arena_if_idle(np);
}

/* Hand a segment owned by lp back to the global list. */
static inline void return_to_global(fb_localpool_t *lp, int32_t i)
{
    lp->num_requested--;
    global_push(lp->net, i);
}

/* Flink's lazy shrink: give idle segments beyond the pool size back. */
static int return_excess(fb_localpool_t *lp)
{
    int returned = 0;
    while (lp->num_avail > 0 && (lp->num_overdraft > 0 || lp->num_requested > lp->size)) {
        if (lp->num_overdraft > 0)
            lp->num_overdraft--;
        return_to_global(lp, local_pop(lp));
        returned = 1;
    }
    return returned;
}

static void set_size_locked(fb_localpool_t *lp, int64_t n)
{
    int32_t old = lp->size;
    lp->size = (int32_t)(n < lp->max_buffers ? n : lp->max_buffers);
    return_excess(lp);
    if (lp->size > old)
        wake_pool_locked(lp);
}

/* A pool's cap in the redistribution: its max_buffers, lowered to its
 * demand (never under its minimum). */
static inline int64_t demanded_max(const fb_localpool_t *lp)
{
    int64_t d = lp->demand < lp->min_buffers ? lp->min_buffers : lp->demand;
    return d < lp->max_buffers ? d : lp->max_buffers;
}

void fb_pool_redistribute_locked(fb_netpool_t *np)
{
    size_t i, n = np->num_pools;
    int64_t *mins = np->scratch, *maxs = mins + np->cap_pools, *out = maxs + np->cap_pools;
    int64_t avail = (int64_t)np->num_segments - np->total_required;
    int demanding = 0;
    for (i = 0; i < n; i++) {
        mins[i] = np->pools[i]->min_buffers;
        maxs[i] = np->pools[i]->max_buffers;
        demanding |= demanded_max(np->pools[i]) < maxs[i];
    }
    if (demanding) {     /* the sizes without demands: what the demands give back */
        fb_redistribute(avail, n, mins, maxs, out);
        for (i = 0; i < n; i++) {
            np->pools[i]->given_back = (int32_t)out[i];
            maxs[i] = demanded_max(np->pools[i]);
        }
    }
    fb_redistribute(avail, n, mins, maxs, out);
    for (i = 0; i < n; i++) {
        fb_localpool_t *lp = np->pools[i];
        lp->given_back = demanding && lp->given_back > out[i] ? lp->given_back - (int32_t)out[i]
                                                              : 0;
        set_size_locked(lp, out[i]);
    }
}

/* ---- network pool ---------------------------------------------------- */

int fb_netpool_init(fb_netpool_t *np, int32_t num_segments, int32_t segment_size,
                    size_t alignment, int shared)
{
    size_t stride, total;
    int32_t i;

    memset(np, 0, sizeof(*np));
    if (num_segments <= 0 || segment_size <= 0 || !fb_is_pow2(alignment) ||
        alignment < FB_CACHE_LINE)
        return FB_EINVAL;
    stride = fb_stride((size_t)segment_size);
    if (stride == 0 || (size_t)num_segments > SIZE_MAX / stride)
        return FB_ENOMEM;
    total = stride * (size_t)num_segments;
    np->link = malloc(sizeof(int32_t) * (size_t)num_segments);
    np->channel = malloc(sizeof(int32_t) * (size_t)num_segments);
    np->state = malloc((size_t)num_segments);
    np->cap_pools = 16;
    np->pools = malloc(sizeof(fb_localpool_t *) * np->cap_pools);
    np->scratch = malloc(sizeof(int64_t) * 3 * np->cap_pools);
    if (!np->link || !np->channel || !np->state || !np->pools || !np->scratch ||
        (shared ? fb_arena_alloc_shared(&np->arena, total, alignment)
                : fb_arena_alloc(&np->arena, total, alignment)) != 0)
        goto nomem;
    if (fb_cond_init(&np->unpooled_cv) != 0)
        goto nomem;
    /* A plain mutex: its uncontended lock+unlock costs about half of an
     * adaptive one's, and request/recycle pairs are mostly uncontended. */
    if (pthread_mutex_init(&np->mu, NULL) != 0) {
        pthread_cond_destroy(&np->unpooled_cv);
        goto nomem;
    }
    np->base = np->arena.base;
    np->stride = stride;
    np->segment_size = segment_size;
    np->num_segments = num_segments;
    /* Free list in address order: segment 0 is handed out first. */
    for (i = 0; i < num_segments; i++) {
        np->link[i] = i + 1 < num_segments ? i + 1 : -1;
        np->channel[i] = FB_NO_CHANNEL;
        np->state[i] = FB_SEG_GLOBAL;
    }
    np->free_head = 0;
    np->num_free = num_segments;
    return FB_OK;
nomem:
    fb_arena_free(&np->arena);
    free(np->link);
    free(np->channel);
    free(np->state);
    free(np->pools);
    free(np->scratch);
    memset(np, 0, sizeof(*np));
    return FB_ENOMEM;
}

static void localpool_destroy_locked(fb_localpool_t *lp)
{
    lp->destroyed = 1;
    while (lp->num_avail > 0) {
        if (lp->num_overdraft > 0)
            lp->num_overdraft--;
        return_to_global(lp, local_pop(lp));
    }
    pthread_cond_broadcast(&lp->cv);
    fb_waitpoint_wake(&lp->wp);
}

int32_t fb_netpool_destroy(fb_netpool_t *np)
{
    size_t i;
    int32_t out;
    pthread_mutex_lock(&np->mu);
    if (!np->destroyed) {
        np->destroyed = 1;
        for (i = 0; i < np->num_pools; i++) {
            np->total_required -= np->pools[i]->min_buffers;
            localpool_destroy_locked(np->pools[i]);
        }
        np->num_pools = 0;
        pthread_cond_broadcast(&np->unpooled_cv);
        release_arena_if_idle(np);
    }
    out = np->num_segments - np->num_free;
    pthread_mutex_unlock(&np->mu);
    return out;
}

void fb_netpool_free(fb_netpool_t *np)
{
    if (np->link == NULL)
        return; /* never initialised */
    fb_arena_free(&np->arena);
    pthread_mutex_destroy(&np->mu);
    pthread_cond_destroy(&np->unpooled_cv);
    free(np->link);
    free(np->channel);
    free(np->state);
    free(np->pools);
    free(np->scratch);
    memset(np, 0, sizeof(*np));
}

#define LOCKED_READ(np, expr)                                                                      \
    do {                                                                                           \
        int64_t v_;                                                                                \
        pthread_mutex_lock(&(np)->mu);                                                             \
        v_ = (expr);                                                                               \
        pthread_mutex_unlock(&(np)->mu);                                                           \
        return v_;                                                                                 \
    } while (0)

int32_t fb_netpool_num_free(fb_netpool_t *np) { LOCKED_READ(np, np->num_free); }
int64_t fb_netpool_total_required(fb_netpool_t *np) { LOCKED_READ(np, np->total_required); }
int32_t fb_netpool_num_unpooled(fb_netpool_t *np) { LOCKED_READ(np, np->num_unpooled); }
int32_t fb_netpool_num_outstanding(fb_netpool_t *np)
{
    LOCKED_READ(np, np->num_segments - np->num_free);
}
int fb_netpool_arena_released(fb_netpool_t *np) { LOCKED_READ(np, np->arena.base == NULL); }
int fb_netpool_is_destroyed(fb_netpool_t *np) { LOCKED_READ(np, np->destroyed); }

/* ---- local pools ----------------------------------------------------- */

static int localpool_set_waiter(fb_localpool_t *lp, const fb_lender_t *w)
{
    int taken = 0;
    pthread_mutex_lock(&lp->net->mu);
    if (!lp->destroyed)
        taken = fb_waitpoint_offer(&lp->wp, w);
    pthread_mutex_unlock(&lp->net->mu);
    return taken;
}

static void localpool_clear_waiter(fb_localpool_t *lp, void *arg)
{
    pthread_mutex_lock(&lp->net->mu);
    fb_waitpoint_withdraw(&lp->wp, arg);
    pthread_mutex_unlock(&lp->net->mu);
}

static int localpool_ready_locked(fb_localpool_t *lp)
{
    fb_netpool_t *np = lp->net;
    if (!lp->destroyed && lp->limit_wait >= 0
            && lp->channel_count[lp->limit_wait] >= lp->channel_limit[lp->limit_wait])
        return 0;
    return lp->destroyed || lp->num_avail > 0
           || (np->num_free > 0 && (lp->num_requested < lp->size
                                    || lp->num_overdraft < lp->max_overdraft));
}

static int localpool_direct_begin(fb_localpool_t *lp, void (*wake)(void *), void *arg)
{
    int ready;
    pthread_mutex_lock(&lp->net->mu);
    if (fb_waitpoint_begin(&lp->wp, wake, arg))
        lp->net->num_direct++;
    ready = localpool_ready_locked(lp);
    pthread_mutex_unlock(&lp->net->mu);
    return ready;
}

static void localpool_direct_end(fb_localpool_t *lp)
{
    pthread_mutex_lock(&lp->net->mu);
    if (fb_waitpoint_end(&lp->wp))
        lp->net->num_direct--;
    pthread_mutex_unlock(&lp->net->mu);
}

static int localpool_ready(fb_localpool_t *lp)
{
    int ready;
    pthread_mutex_lock(&lp->net->mu);
    ready = localpool_ready_locked(lp);
    pthread_mutex_unlock(&lp->net->mu);
    return ready;
}

static void localpool_release_channel(fb_localpool_t *lp, int32_t index)
{
    fb_netpool_t *np = lp->net;
    int32_t ch;
    pthread_mutex_lock(&np->mu);
    if (index >= 0 && index < np->num_segments && np->state[index] == FB_SEG_OUT
            && (ch = np->channel[index]) >= 0) {
        int32_t was = lp->channel_count[ch]--;
        if (was == lp->max_per_channel)
            lp->num_unavailable_channels--;
        if (was == lp->max_per_channel || was == lp->channel_limit[ch])
            wake_pool_locked(lp);
        np->channel[index] = FB_NO_CHANNEL;
    }
    pthread_mutex_unlock(&np->mu);
}

static const fb_pool_ops_t fb_pool_ops = {
    fb_localpool_request, fb_localpool_recycle, fb_localpool_set_recycle_hook,
    localpool_set_waiter, localpool_clear_waiter, localpool_direct_begin,
    localpool_direct_end, localpool_ready, localpool_release_channel};

int fb_localpool_create(fb_netpool_t *np, fb_localpool_t *lp, int32_t min_buffers,
                        int32_t max_buffers, int32_t num_subpartitions,
                        int32_t max_per_channel, int32_t max_overdraft)
{
    int rc = FB_OK;
    memset(lp, 0, sizeof(*lp));
    if (min_buffers <= 0 || max_buffers < min_buffers || num_subpartitions < 0 ||
        max_per_channel <= 0 || max_overdraft < 0)
        return FB_EINVAL;
    if (num_subpartitions > 0) {
        int32_t k;
        lp->channel_count = calloc((size_t)num_subpartitions, sizeof(int32_t));
        lp->channel_limit = malloc((size_t)num_subpartitions * sizeof(int32_t));
        if (lp->channel_count == NULL || lp->channel_limit == NULL) {
            free(lp->channel_count);
            free(lp->channel_limit);
            return FB_ENOMEM;
        }
        for (k = 0; k < num_subpartitions; k++)
            lp->channel_limit[k] = FB_UNBOUNDED;
    }
    if (fb_cond_init(&lp->cv) != 0) {
        free(lp->channel_count);
        free(lp->channel_limit);
        return FB_ENOMEM;
    }
    lp->ops = &fb_pool_ops;
    lp->net = np;
    lp->min_buffers = min_buffers;
    lp->max_buffers = max_buffers;
    lp->size = min_buffers;
    lp->avail_head = -1;
    lp->max_overdraft = max_overdraft;
    lp->num_subpartitions = num_subpartitions;
    lp->max_per_channel = max_per_channel;
    lp->limit_wait = -1;
    lp->demand = FB_UNBOUNDED;

    pthread_mutex_lock(&np->mu);
    if (np->destroyed) {
        rc = FB_EDESTROYED;
    } else if (np->total_required + min_buffers > np->num_segments) {
        rc = FB_EINSUFFICIENT;
    } else if (np->num_pools == np->cap_pools) {
        size_t cap = np->cap_pools * 2;
        fb_localpool_t **pools = realloc(np->pools, sizeof(*pools) * cap);
        int64_t *scratch = pools ? malloc(sizeof(int64_t) * 3 * cap) : NULL;
        if (pools)
            np->pools = pools;
        if (scratch) {
            free(np->scratch);
            np->scratch = scratch;
            np->cap_pools = cap;
        } else {
            rc = FB_ENOMEM;
        }
    }
    if (rc == FB_OK) {
        np->pools[np->num_pools++] = lp;
        np->total_required += min_buffers;
        fb_pool_redistribute_locked(np);
    }
    pthread_mutex_unlock(&np->mu);
    if (rc != FB_OK) {
        pthread_cond_destroy(&lp->cv);
        free(lp->channel_count);
        free(lp->channel_limit);
        memset(lp, 0, sizeof(*lp));
    }
    return rc;
}

void fb_localpool_destroy(fb_localpool_t *lp)
{
    fb_netpool_t *np = lp->net;
    size_t i;
    if (np == NULL)
        return;
    pthread_mutex_lock(&np->mu);
    if (!lp->destroyed) {
        for (i = 0; i < np->num_pools; i++)
            if (np->pools[i] == lp) {
                memmove(np->pools + i, np->pools + i + 1, (np->num_pools - i - 1) * sizeof(lp));
                np->num_pools--;
                np->total_required -= lp->min_buffers;
                break;
            }
        localpool_destroy_locked(lp);
        fb_pool_redistribute_locked(np);
        fb_pool_notify_return_locked(np);
    }
    pthread_mutex_unlock(&np->mu);
}

void fb_localpool_free(fb_localpool_t *lp)
{
    if (lp->net == NULL)
        return;
    pthread_cond_destroy(&lp->cv);
    free(lp->channel_count);
    free(lp->channel_limit);
    memset(lp, 0, sizeof(*lp));
}

static inline int try_take(fb_localpool_t *lp, int32_t channel, int32_t *index)
{
    fb_netpool_t *np = lp->net;
    int32_t i;
    if (channel >= 0 && lp->channel_count[channel] >= lp->channel_limit[channel])
        return FB_EMPTY;
    if (lp->num_avail > 0) {
        i = local_pop(lp);
    } else if (np->num_free > 0 &&
               (lp->num_requested < lp->size || lp->num_overdraft < lp->max_overdraft)) {
        if (lp->num_requested >= lp->size)
            lp->num_overdraft++;
        i = global_pop(np);
        lp->num_requested++;
    } else {
        return FB_EMPTY;
    }
    np->state[i] = FB_SEG_OUT;
    np->channel[i] = channel;
    if (channel >= 0 && ++lp->channel_count[channel] == lp->max_per_channel)
        lp->num_unavailable_channels++;
    DEBUG_OUT(1);
    *index = i;
    return FB_OK;
}

/* Sleep on the pool's condition variable (lock held); the caller re-checks. */
static void wait_on_pool(fb_localpool_t *lp, int64_t deadline_ns)
{
    lp->waiters++;
    lp->net->num_blocked++;
    fb_cond_wait_until(&lp->cv, &lp->net->mu, deadline_ns);
    lp->waiters--;
    lp->net->num_blocked--;
}

static inline int valid_channel(fb_localpool_t *lp, int32_t channel)
{
    return channel == FB_NO_CHANNEL || (channel >= 0 && channel < lp->num_subpartitions);
}

int fb_localpool_request(fb_localpool_t *lp, int32_t channel, int32_t *index)
{
    int rc;
    if (!valid_channel(lp, channel))
        return FB_EINVAL;
    pthread_mutex_lock(&lp->net->mu);
    rc = lp->destroyed ? FB_EDESTROYED : try_take(lp, channel, index);
    pthread_mutex_unlock(&lp->net->mu);
    return rc;
}

int fb_localpool_request_blocking(fb_localpool_t *lp, int32_t channel, int64_t deadline_ns,
                                  int32_t *index)
{
    fb_netpool_t *np = lp->net;
    int rc, tried = 0;
    if (!valid_channel(lp, channel))
        return FB_EINVAL;
    pthread_mutex_lock(&np->mu);
    for (;;) {
        if (lp->destroyed) {
            rc = FB_EDESTROYED;
            break;
        }
        rc = try_take(lp, channel, index);
        if (rc == FB_OK)
            break;
        if (deadline_ns <= fb_monotonic_ns()) {
            rc = FB_ETIMEDOUT;
            break;
        }
        /* A lender serves until a buffer may be free: for this channel. */
        lp->limit_wait = channel >= 0 && lp->channel_count[channel] >= lp->channel_limit[channel]
                         ? channel : -1;
        if (!tried) {                /* what came meanwhile woke nobody: re-check */
            tried = !fb_waitpoint_serve(&lp->wp, &np->mu, lp, deadline_ns);
            continue;
        }
        wait_on_pool(lp, deadline_ns);
        tried = 0;
    }
    lp->limit_wait = -1;
    pthread_mutex_unlock(&np->mu);
    return rc;
}

int fb_localpool_recycle(fb_localpool_t *lp, int32_t index)
{
    fb_netpool_t *np = lp->net;
    int32_t ch;
    if (lp->ops != &fb_pool_ops)        /* a lender's segment (see fb_pool_ops_t) */
        return lp->ops->recycle(lp, index);
    pthread_mutex_lock(&np->mu);
    if (index < 0 || index >= np->num_segments || np->state[index] != FB_SEG_OUT) {
        pthread_mutex_unlock(&np->mu);
        return FB_ESTATE;
    }
    if (lp->hook != NULL && !lp->destroyed) {
        fb_recycle_hook_t hook = lp->hook;
        void *arg = lp->hook_arg;
        int kept;
        lp->hook_calls++;
        pthread_mutex_unlock(&np->mu);
        kept = hook(arg, lp, index);
        pthread_mutex_lock(&np->mu);
        if (--lp->hook_calls == 0 && lp->waiters > 0)
            pthread_cond_broadcast(&lp->cv);    /* a set_recycle_hook may wait */
        if (kept) {
            pthread_mutex_unlock(&np->mu);
            return FB_OK;
        }
    }
    ch = np->channel[index];
    if (ch >= 0 && lp->channel_count[ch]-- == lp->max_per_channel)
        lp->num_unavailable_channels--;
    np->channel[index] = FB_NO_CHANNEL;
    DEBUG_OUT(-1);
    if (lp->destroyed || lp->num_overdraft > 0 || lp->num_requested > lp->size) {
        if (lp->num_overdraft > 0)
            lp->num_overdraft--;
        return_to_global(lp, index);
        fb_pool_notify_return_locked(np);
    } else {
        local_push(lp, index);
    }
    wake_pool_locked(lp);
    pthread_mutex_unlock(&np->mu);
    return FB_OK;
}

void fb_localpool_set_recycle_hook(fb_localpool_t *lp, fb_recycle_hook_t hook, void *arg)
{
    fb_netpool_t *np = lp->net;
    pthread_mutex_lock(&np->mu);
    lp->hook = hook;
    lp->hook_arg = arg;
    lp->waiters++;
    while (lp->hook_calls > 0)
        pthread_cond_wait(&lp->cv, &np->mu);
    lp->waiters--;
    pthread_mutex_unlock(&np->mu);
}

/* The largest size a resize may give lp.  Redistribution keeps the sizes
 * of all live pools within the segments not reserved as unpooled; a resize
 * must at least leave every other pool j its minimum: the sizes of all
 * pools but j, plus min_j, fit in those segments.  With no other pool, lp
 * may have all of them. */
static int64_t max_resize_locked(fb_localpool_t *lp)
{
    fb_netpool_t *np = lp->net;
    int64_t unreserved = np->num_segments - np->total_required; /* + the mins below */
    int64_t others = 0, least_slack = -1;
    size_t i;
    for (i = 0; i < np->num_pools; i++) {
        fb_localpool_t *p = np->pools[i];
        unreserved += p->min_buffers;
        if (p == lp)
            continue;
        others += p->size;
        if (least_slack < 0 || p->size - p->min_buffers < least_slack)
            least_slack = p->size - p->min_buffers;
    }
    if (least_slack >= 0)
        unreserved -= others - least_slack;
    /* Not below the minimum, should the sizes ever have broken the rule. */
    return unreserved > lp->min_buffers ? unreserved : lp->min_buffers;
}

int fb_localpool_set_num_buffers(fb_localpool_t *lp, int32_t n)
{
    fb_netpool_t *np = lp->net;
    int rc = FB_OK;
    pthread_mutex_lock(&np->mu);
    if (lp->destroyed)
        rc = FB_EDESTROYED;
    else if (n < lp->min_buffers)
        rc = FB_EINVAL;
    else {
        int32_t before = np->num_free;
        int64_t limit = max_resize_locked(lp);
        set_size_locked(lp, n < limit ? n : limit);
        if (np->num_free != before)
            fb_pool_notify_return_locked(np);
    }
    pthread_mutex_unlock(&np->mu);
    return rc;
}

static inline int is_available_locked(fb_localpool_t *lp)
{
    return !lp->destroyed && lp->num_unavailable_channels == 0 &&
           (lp->num_avail > 0 || (lp->net->num_free > 0 && lp->num_requested < lp->size));
}

int fb_localpool_set_channel_limit(fb_localpool_t *lp, int32_t channel, int32_t n)
{
    fb_netpool_t *np = lp->net;
    int32_t old;
    if (channel < 0 || channel >= lp->num_subpartitions || n < 1)
        return FB_EINVAL;
    pthread_mutex_lock(&np->mu);
    old = lp->channel_limit[channel];
    lp->channel_limit[channel] = n;
    if (n > old && lp->channel_count[channel] >= old)
        wake_pool_locked(lp);          /* a request for it may go on */
    pthread_mutex_unlock(&np->mu);
    return FB_OK;
}

int fb_localpool_set_demand(fb_localpool_t *lp, int32_t n)
{
    fb_netpool_t *np = lp->net;
    int32_t before;
    if (n < 0)
        return FB_EINVAL;
    pthread_mutex_lock(&np->mu);
    if (!lp->destroyed && n != lp->demand) {
        before = np->num_free;
        lp->demand = n;
        fb_pool_redistribute_locked(np);
        if (np->num_free != before)
            fb_pool_notify_return_locked(np);
    }
    pthread_mutex_unlock(&np->mu);
    return FB_OK;
}

int32_t fb_localpool_given_back(fb_localpool_t *lp)
{
    int32_t n;
    pthread_mutex_lock(&lp->net->mu);
    n = lp->destroyed ? 0 : lp->given_back;
    pthread_mutex_unlock(&lp->net->mu);
    return n;
}

int fb_localpool_is_available(fb_localpool_t *lp)
{
    int r;
    pthread_mutex_lock(&lp->net->mu);
    r = is_available_locked(lp);
    pthread_mutex_unlock(&lp->net->mu);
    return r;
}

int fb_localpool_wait_available(fb_localpool_t *lp, int64_t deadline_ns)
{
    fb_netpool_t *np = lp->net;
    int rc, tried = 0;
    pthread_mutex_lock(&np->mu);
    for (;;) {
        if (lp->destroyed) {
            rc = FB_EDESTROYED;
            break;
        }
        if (is_available_locked(lp)) {
            rc = FB_OK;
            break;
        }
        if (deadline_ns <= fb_monotonic_ns()) {
            rc = FB_ETIMEDOUT;
            break;
        }
        if (!tried) {
            tried = !fb_waitpoint_serve(&lp->wp, &np->mu, lp, deadline_ns);
            continue;
        }
        wait_on_pool(lp, deadline_ns);
        tried = 0;
    }
    pthread_mutex_unlock(&np->mu);
    return rc;
}

void fb_localpool_stats(fb_localpool_t *lp, fb_localpool_stats_t *out)
{
    pthread_mutex_lock(&lp->net->mu);
    out->size = lp->size;
    out->num_requested = lp->num_requested;
    out->num_avail = lp->num_avail;
    out->num_overdraft = lp->num_overdraft;
    out->num_unavailable_channels = lp->num_unavailable_channels;
    out->destroyed = lp->destroyed;
    pthread_mutex_unlock(&lp->net->mu);
}

int32_t fb_localpool_channel_count(fb_localpool_t *lp, int32_t channel)
{
    int32_t c = 0;
    pthread_mutex_lock(&lp->net->mu);
    if (channel >= 0 && channel < lp->num_subpartitions)
        c = lp->channel_count[channel];
    pthread_mutex_unlock(&lp->net->mu);
    return c;
}

void fb_netpool_redistribute(fb_netpool_t *np)
{
    pthread_mutex_lock(&np->mu);
    fb_pool_redistribute_locked(np);
    fb_pool_notify_return_locked(np);
    pthread_mutex_unlock(&np->mu);
}
