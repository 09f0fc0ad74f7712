/* What the units of the buffer pools share (pool.c, unpooled.c): the
 * network pool's free list, the debug count of segments handed out, and the
 * two steps every change of the free segments ends with.  All with the
 * network pool's lock held.  Private to csrc/buffer/. */
#ifndef FLINKBUF_POOL_INTERNAL_H
#define FLINKBUF_POOL_INTERNAL_H

#include "buffer/pool.h"

#ifdef FLINKBUF_DEBUG
extern int64_t fb_pool_debug_out;
#define DEBUG_OUT(n) __atomic_add_fetch(&fb_pool_debug_out, (n), __ATOMIC_RELAXED)
#else
#define DEBUG_OUT(n) ((void)0)
#endif

static inline int32_t global_pop(fb_netpool_t *np)
{
    int32_t i = np->free_head;
    np->free_head = np->link[i];
    np->num_free--;
    return i;
}

static inline void global_push(fb_netpool_t *np, int32_t i)
{
    np->state[i] = FB_SEG_GLOBAL;
    np->link[i] = np->free_head;
    np->free_head = i;
    np->num_free++;
}

/* Share the segments not required as unpooled among the local pools
 * (Flink's proportional redistribution, capped by their demands). */
void fb_pool_redistribute_locked(fb_netpool_t *np);
/* Segments came back to the free list: wake whoever may want them (and
 * release the arena of a destroyed pool once all are back). */
void fb_pool_notify_return_locked(fb_netpool_t *np);

#endif
