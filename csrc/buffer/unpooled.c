/* Unpooled segments of a network pool (Flink's requestUnpooledMemorySegments):
 * taken from the free list outside every local pool, required first so
 * that redistribution leaves them free. */
#include "buffer/pool_internal.h"

int fb_netpool_request_unpooled(fb_netpool_t *np, int32_t n, int64_t deadline_ns, int32_t *out)
{
    int32_t k;
    int rc = FB_OK;
    if (n <= 0)
        return FB_EINVAL;
    pthread_mutex_lock(&np->mu);
    if (np->destroyed) {
        rc = FB_EDESTROYED;
        goto done;
    }
    if (np->total_required + n > np->num_segments) {
        rc = FB_EINSUFFICIENT;
        goto done;
    }
    np->total_required += n;
    fb_pool_redistribute_locked(np);
    while (np->num_free < n) {
        int w;
        if (np->destroyed) {
            rc = FB_EDESTROYED;
            goto done;
        }
        if (deadline_ns <= fb_monotonic_ns()) {
            rc = FB_ETIMEDOUT;
            break;
        }
        np->unpooled_waiters++;
        w = fb_cond_wait_until(&np->unpooled_cv, &np->mu, deadline_ns);
        np->unpooled_waiters--;
        (void)w; /* loop re-checks both the count and the clock */
    }
    if (rc == FB_ETIMEDOUT) {
        np->total_required -= n;
        fb_pool_redistribute_locked(np);
        goto done;
    }
    for (k = 0; k < n; k++) {
        out[k] = global_pop(np);
        np->state[out[k]] = FB_SEG_UNPOOLED;
    }
    np->num_unpooled += n;
    DEBUG_OUT(n);
done:
    pthread_mutex_unlock(&np->mu);
    return rc;
}

#define FB_SEG_MARK 0x80

int fb_netpool_recycle_unpooled(fb_netpool_t *np, const int32_t *idx, int32_t n)
{
    int32_t k;
    int rc = FB_OK;
    if (n < 0)
        return FB_EINVAL;
    pthread_mutex_lock(&np->mu);
    /* Validate the whole batch (duplicates included) before changing anything. */
    for (k = 0; k < n; k++) {
        if (idx[k] < 0 || idx[k] >= np->num_segments || np->state[idx[k]] != FB_SEG_UNPOOLED) {
            rc = FB_ESTATE;
            break;
        }
        np->state[idx[k]] |= FB_SEG_MARK;
    }
    if (rc != FB_OK) {
        while (k-- > 0)
            np->state[idx[k]] &= ~FB_SEG_MARK;
        goto done;
    }
    for (k = 0; k < n; k++)
        global_push(np, idx[k]);
    np->num_unpooled -= n;
    if (!np->destroyed) {
        np->total_required -= n;
        fb_pool_redistribute_locked(np);
    }
    DEBUG_OUT(-n);
    fb_pool_notify_return_locked(np);
done:
    pthread_mutex_unlock(&np->mu);
    return rc;
}
