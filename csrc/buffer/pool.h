/* Network buffer pools: one arena of segments shared by local buffer pools.
 *
 * All state of a network pool and of its local pools is guarded by the
 * network pool's mutex.  Segments are numbered 0..num_segments-1; the global
 * free list and every local free list are threaded through one link array,
 * since a segment sits on at most one list.  Blocking calls wait on a
 * condition variable and must be made without the GIL.
 *
 * Calls out of this unit are the hooks a layer above sets, and no hook ever
 * runs under the pool's lock:
 *  - a recycle hook (fb_recycle_hook_t) runs in the recycling thread; it may
 *    take its owner's locks and queue or send without waiting (credit), but
 *    must not wait, nor set a hook;
 *  - a lender (common/waiter.h, under that contract) serves a thread whose
 *    request would wait: a producer reads the connection that serves its
 *    partition, so that credit arrives and buffers go out in its own
 *    thread; its wake is called by other threads' recycles, resizes and
 *    destroys. */
#ifndef FLINKBUF_POOL_H
#define FLINKBUF_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "buffer/arena.h"
#include "common/status.h"    /* FB_OK and the error codes */
#include "common/clock.h"     /* fb_monotonic_ns, fb_deadline_after, FB_WAIT_FOREVER */
#include "common/waiter.h"    /* the lender a waiting request may serve */

/* Segment states. */
enum { FB_SEG_GLOBAL = 0, FB_SEG_LOCAL = 1, FB_SEG_OUT = 2, FB_SEG_UNPOOLED = 3 };

#define FB_UNBOUNDED INT32_MAX
#define FB_NO_CHANNEL (-1)

typedef struct fb_localpool fb_localpool_t;

/* The hot operations of a local pool, reached through the pool itself: code
 * in other extension modules (which do not link pool.c) calls the one copy
 * in the buffer module, whose counters and checks are the ones that count.
 * A layer above may make a pool of its own ops whose segments are not this
 * unit's (the network layer's lent segments, mapped from another process):
 * its `net` only locates segments (base, stride, segment_size,
 * num_segments), fb_localpool_recycle hands its segments to its ops'
 * recycle, and nothing else of this unit may be called on it. */
/* A recycle hook gets the first claim on every segment recycled into its
 * pool (the network layer's receive buffers go back to their channel this
 * way, to be announced as credit): called outside the lock, it returns 1 to
 * keep the segment (it stays handed out, now the hook owner's) or 0 to let
 * the pool take it.  It must not block, nor set a hook. */
typedef int (*fb_recycle_hook_t)(void *arg, fb_localpool_t *lp, int32_t index);


typedef struct fb_pool_ops {
    int (*request)(fb_localpool_t *lp, int32_t channel, int32_t *index);
    int (*recycle)(fb_localpool_t *lp, int32_t index);
    void (*set_recycle_hook)(fb_localpool_t *lp, fb_recycle_hook_t hook, void *arg);
    /* Offer a lender (none yet: 1, taken; else 0); withdraw it (if arg's). */
    int (*set_waiter)(fb_localpool_t *lp, const fb_lender_t *w);
    void (*clear_waiter)(fb_localpool_t *lp, void *arg);
    /* A lender starts serving in this thread (its wake registered): 1 if a
     * buffer may be free already (do not wait); direct_end when it stops. */
    int (*direct_begin)(fb_localpool_t *lp, void (*wake)(void *), void *arg);
    void (*direct_end)(fb_localpool_t *lp);
    /* A buffer may be free, or the pool was destroyed (a racy look). */
    int (*ready)(fb_localpool_t *lp);
    /* A handed-out segment stops counting toward its channel's cap (it left
     * its subpartition for a consumer that holds it on a credit of its own,
     * as a copied one would); a blocked request may go on. */
    void (*release_channel)(fb_localpool_t *lp, int32_t index);
} fb_pool_ops_t;

typedef struct fb_netpool {
    pthread_mutex_t mu;
    pthread_cond_t unpooled_cv;
    fb_arena_t arena;
    char *base;
    size_t stride;
    int32_t segment_size;
    int32_t num_segments;
    int32_t *link;          /* free-list successor per segment, -1 ends */
    int32_t *channel;       /* channel a handed-out segment was requested for */
    uint8_t *state;         /* FB_SEG_* per segment */
    int32_t free_head;
    int32_t num_free;
    int64_t total_required; /* sum of live pools' mins + unpooled reservations */
    int32_t num_unpooled;   /* unpooled segments handed out */
    int32_t unpooled_waiters;
    int32_t num_blocked;    /* threads blocked in any local pool */
    int32_t num_direct;     /* local pools a thread serves the lender of (its wake registered) */
    fb_localpool_t **pools; /* live pools, creation order */
    size_t num_pools, cap_pools;
    int64_t *scratch;       /* 3 * cap_pools int64 for redistribution */
    int destroyed;
} fb_netpool_t;

struct fb_localpool {
    const fb_pool_ops_t *ops;   /* fb_localpool_request / fb_localpool_recycle */
    fb_netpool_t *net;
    pthread_cond_t cv;
    int32_t min_buffers;
    int32_t max_buffers;     /* FB_UNBOUNDED for no limit */
    int32_t size;            /* current pool size (num_buffers) */
    int32_t num_requested;   /* segments taken from the network pool */
    int32_t avail_head;
    int32_t num_avail;       /* idle segments held here */
    int32_t max_overdraft;
    int32_t num_overdraft;
    int32_t num_subpartitions;
    int32_t max_per_channel; /* FB_UNBOUNDED for no cap */
    int32_t *channel_count;
    int32_t num_unavailable_channels;
    int32_t *channel_limit;  /* per channel, FB_UNBOUNDED: none (buffer debloating) */
    int32_t limit_wait;      /* the channel a blocked request waits for under its limit, or -1 */
    int32_t demand;          /* what its users need now (FB_UNBOUNDED: up to max_buffers) */
    int32_t given_back;      /* segments its demand left to other pools at the last redistribution */
    int32_t waiters;         /* blocked requests and availability waits */
    fb_recycle_hook_t hook;  /* or NULL */
    void *hook_arg;
    int32_t hook_calls;      /* hooks running now (outside the lock) */
    int destroyed;
    fb_waitpoint_t wp;       /* the lender a waiting request may serve */
};

/* Network pool lifecycle. init: 0, FB_EINVAL or FB_ENOMEM.  A `shared`
 * pool's arena is a memory file (arena.fd) that processes on this host
 * may be given to map read-only: the shared-memory transport lends its
 * segments to a consumer that way. */
int fb_netpool_init(fb_netpool_t *np, int32_t num_segments, int32_t segment_size,
                    size_t alignment, int shared);
/* Destroy every local pool, fail unpooled waiters, refuse new work.  The
 * arena is unmapped once no segment is out.  Returns segments still out. */
int32_t fb_netpool_destroy(fb_netpool_t *np);
/* Release everything; no local pool may be used afterwards. */
void fb_netpool_free(fb_netpool_t *np);

static inline char *fb_segment_address(const fb_netpool_t *np, int32_t index)
{
    return np->base + (size_t)index * np->stride;
}

/* A shared pool's memfd while its arena is mapped, else -1 (no lock: set
 * at init, cleared only once no segment is out). */
static inline int fb_netpool_memfd(const fb_netpool_t *np)
{
    return np->arena.map_base != NULL ? np->arena.fd : -1;
}

int32_t fb_netpool_num_free(fb_netpool_t *np);
int64_t fb_netpool_total_required(fb_netpool_t *np);
int32_t fb_netpool_num_unpooled(fb_netpool_t *np);
int32_t fb_netpool_num_outstanding(fb_netpool_t *np); /* not on the global list */
int fb_netpool_arena_released(fb_netpool_t *np);
int fb_netpool_is_destroyed(fb_netpool_t *np);
/* Recompute every pool size now (benchmarks; normally automatic). */
void fb_netpool_redistribute(fb_netpool_t *np);

/* Reserve n segments (they count as required), then wait until deadline_ns
 * (CLOCK_MONOTONIC, FB_WAIT_FOREVER, or <= now for one try) for n free
 * segments and take them all at once into out.  FB_EINSUFFICIENT at once if
 * the reservation can never be met. */
int fb_netpool_request_unpooled(fb_netpool_t *np, int32_t n, int64_t deadline_ns, int32_t *out);
/* Return unpooled segments; FB_ESTATE (changing nothing) if any is not out. */
int fb_netpool_recycle_unpooled(fb_netpool_t *np, const int32_t *idx, int32_t n);

/* Local pool lifecycle.  create: FB_EINSUFFICIENT if the mins would exceed
 * the total, FB_EDESTROYED, FB_ENOMEM, FB_EINVAL.  lp is caller memory. */
int fb_localpool_create(fb_netpool_t *np, fb_localpool_t *lp, int32_t min_buffers,
                        int32_t max_buffers, int32_t num_subpartitions,
                        int32_t max_per_channel, int32_t max_overdraft);
/* Lazy destroy: idle segments go back now, handed-out ones on recycle. */
void fb_localpool_destroy(fb_localpool_t *lp);
/* Free lp's own memory; lp must be destroyed and have nothing out. */
void fb_localpool_free(fb_localpool_t *lp);

/* Take one segment: FB_OK, FB_EMPTY or FB_EDESTROYED.  channel is
 * FB_NO_CHANNEL or in [0, num_subpartitions). */
int fb_localpool_request(fb_localpool_t *lp, int32_t channel, int32_t *index);
/* As above but wait (no GIL!) until deadline_ns: FB_ETIMEDOUT, FB_EDESTROYED. */
int fb_localpool_request_blocking(fb_localpool_t *lp, int32_t channel, int64_t deadline_ns,
                                  int32_t *index);
/* Give a segment back (to the hook first, if one is set); FB_ESTATE if it
 * is not out (double recycle). */
int fb_localpool_recycle(fb_localpool_t *lp, int32_t index);
/* Set (or clear, with NULL) the recycle hook.  Returns once no call of the
 * previous hook is in progress, so its argument may be freed afterwards;
 * a destroyed pool calls no hook. */
void fb_localpool_set_recycle_hook(fb_localpool_t *lp, fb_recycle_hook_t hook, void *arg);
/* Resize to n, capped at max_buffers and at what leaves every other live
 * pool room for its min_buffers (the sizes of all pools but one, plus that
 * one's minimum, fit in the segments not reserved as unpooled; so never
 * more than min_buffers + total - required).  FB_EINVAL if n < min_buffers;
 * FB_EDESTROYED if destroyed. */
int fb_localpool_set_num_buffers(fb_localpool_t *lp, int32_t n);
/* Buffer debloating.  A channel's limit: a request for it finds nothing
 * while the channel has `n` segments out (n >= 1, or FB_UNBOUNDED: none);
 * it bounds a debloated channel's buffers, whatever the pool's size.
 * FB_EINVAL for a bad channel or n. */
int fb_localpool_set_channel_limit(fb_localpool_t *lp, int32_t channel, int32_t n);
/* The pool's demand: redistribution sizes it as if its max_buffers were
 * max(min_buffers, n) (FB_UNBOUNDED: max_buffers again), so that segments
 * it does not need go back to the network pool (idle ones now, handed-out
 * ones as they are recycled) and to pools that can use them; raising it
 * takes them back as they are free.  FB_EINVAL if n < 0. */
int fb_localpool_set_demand(fb_localpool_t *lp, int32_t n);
/* Segments the pool's demand leaves to other pools: its size at the last
 * redistribution had its demand been unbounded, minus its size. */
int32_t fb_localpool_given_back(fb_localpool_t *lp);
int fb_localpool_is_available(fb_localpool_t *lp);
/* Wait until available: FB_OK, FB_ETIMEDOUT or FB_EDESTROYED. */
int fb_localpool_wait_available(fb_localpool_t *lp, int64_t deadline_ns);

/* Snapshot of a local pool's counters, taken under the lock. */
typedef struct fb_localpool_stats {
    int32_t size, num_requested, num_avail, num_overdraft, num_unavailable_channels;
    int destroyed;
} fb_localpool_stats_t;
void fb_localpool_stats(fb_localpool_t *lp, fb_localpool_stats_t *out);
int32_t fb_localpool_channel_count(fb_localpool_t *lp, int32_t channel);

/* Debug build: segments handed out by all pools of the process. */
int64_t fb_debug_segments_out(void);

#endif
