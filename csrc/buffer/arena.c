#define _GNU_SOURCE
#include "buffer/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int fb_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* Reserve an anonymous mapping that holds size bytes at an alignment-
 * aligned address (mmap is page aligned; larger alignments over-map). */
static int arena_reserve(fb_arena_t *a, size_t size, size_t alignment)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t extra, map_size;
    char *p;

    memset(a, 0, sizeof(*a));
    a->fd = -1;
    if (size == 0 || !fb_is_pow2(alignment) || alignment < FB_CACHE_LINE)
        return EINVAL;
    extra = alignment > page ? alignment : 0;
    if (size > SIZE_MAX - extra - page)
        return ENOMEM;
    map_size = (size + extra + page - 1) & ~(page - 1);
    p = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return errno ? errno : ENOMEM;
    a->map_base = p;
    a->map_size = map_size;
    a->base = (char *)(((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1));
    a->size = size;
    return 0;
}

int fb_arena_alloc(fb_arena_t *a, size_t size, size_t alignment)
{
    return arena_reserve(a, size, alignment);
}

int fb_arena_alloc_shared(fb_arena_t *a, size_t size, size_t alignment)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), file_size;
    int rc = arena_reserve(a, size, alignment), fd, err;
    if (rc != 0)
        return rc;
    file_size = (size + page - 1) & ~(page - 1);
    fd = memfd_create("flinkbuf-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        goto fail;
    /* No pages yet: like an anonymous arena, committed as it is touched. */
    if (ftruncate(fd, (off_t)file_size) != 0)
        goto fail;
    if (mmap(a->base, file_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
            == MAP_FAILED)
        goto fail;
    /* Our writable mapping exists; nobody gets another one from here on. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE
                                   | F_SEAL_SEAL) != 0)
        goto fail;
    a->fd = fd;
    return 0;
fail:
    err = errno ? errno : ENOMEM;
    if (fd >= 0)
        close(fd);
    fb_arena_free(a);
    return err;
}

void fb_arena_free(fb_arena_t *a)
{
    if (a->map_base != NULL)
        munmap(a->map_base, a->map_size);
    if (a->fd >= 0 && a->map_base != NULL)
        close(a->fd);
    memset(a, 0, sizeof(*a));
    a->fd = -1;
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
