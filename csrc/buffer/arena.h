/* Aligned off-heap arenas: one zeroed, lazily committed block per pool,
 * anonymous or (shared) in a memory file that another process may map
 * read-only. */
#ifndef FLINKBUF_ARENA_H
#define FLINKBUF_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define FB_CACHE_LINE 64

typedef struct fb_arena {
    void *base;        /* aligned start handed to users */
    void *map_base;    /* what mmap returned (may precede base) */
    size_t map_size;   /* what to munmap */
    size_t size;       /* usable bytes from base */
    int fd;            /* a shared arena's memfd (base is its offset 0), else -1 */
} fb_arena_t;

/* 1 if x is a power of two (x > 0). */
int fb_is_pow2(size_t x);

/* Segment stride: size rounded up to a cache line; 0 on overflow. */
static inline size_t fb_stride(size_t segment_size)
{
    if (segment_size > SIZE_MAX - (FB_CACHE_LINE - 1))
        return 0;
    return (segment_size + FB_CACHE_LINE - 1) & ~(size_t)(FB_CACHE_LINE - 1);
}

/* Map size bytes aligned to alignment (a power of two >= 64). 0 or an errno. */
int fb_arena_alloc(fb_arena_t *a, size_t size, size_t alignment);

/* As fb_arena_alloc, in a memfd mapped from its offset 0: nameless, sealed
 * against shrinking, growing and any later writable mapping (F_SEAL_FUTURE_WRITE),
 * so a process given its descriptor can only read it.  0 or an errno. */
int fb_arena_alloc_shared(fb_arena_t *a, size_t size, size_t alignment);

/* Unmap (and close a shared arena's memfd); safe to call twice. */
void fb_arena_free(fb_arena_t *a);

/* A standalone zeroed block (posix_memalign). NULL on failure. */
void *fb_aligned_alloc(size_t size, size_t alignment);
void fb_aligned_free(void *p);

#endif
