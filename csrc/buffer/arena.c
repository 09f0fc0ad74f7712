#include "buffer/arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int fb_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

size_t fb_stride(size_t segment_size)
{
    if (segment_size > SIZE_MAX - (FB_CACHE_LINE - 1))
        return 0;
    return (segment_size + FB_CACHE_LINE - 1) & ~(size_t)(FB_CACHE_LINE - 1);
}

int fb_arena_alloc(fb_arena_t *a, size_t size, size_t alignment)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t extra, map_size;
    char *p, *aligned;

    memset(a, 0, sizeof(*a));
    if (size == 0 || !fb_is_pow2(alignment) || alignment < FB_CACHE_LINE)
        return EINVAL;
    /* mmap is page aligned; larger alignments over-map and trim. */
    extra = alignment > page ? alignment : 0;
    if (size > SIZE_MAX - extra - page)
        return ENOMEM;
    map_size = (size + extra + page - 1) & ~(page - 1);
    p = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return errno ? errno : ENOMEM;
    aligned = (char *)(((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1));
    a->map_base = p;
    a->map_size = map_size;
    a->base = aligned;
    a->size = size;
    return 0;
}

void fb_arena_free(fb_arena_t *a)
{
    if (a->map_base != NULL)
        munmap(a->map_base, a->map_size);
    memset(a, 0, sizeof(*a));
}

void *fb_aligned_alloc(size_t size, size_t alignment)
{
    void *p = NULL;
    if (size == 0 || !fb_is_pow2(alignment) || alignment < sizeof(void *))
        return NULL;
    if (posix_memalign(&p, alignment, size) != 0)
        return NULL;
    memset(p, 0, size);
    return p;
}

void fb_aligned_free(void *p) { free(p); }
