/* Lending segments across processes (lease.h). */
#define _GNU_SOURCE
#include "network/lease.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "buffer/arena.h"   /* fb_stride (inline: arena.c is not linked here) */

struct fb_lease {
    fb_localpool_t lp;          /* first: an item's pool is the lease */
    fb_netpool_t shell;         /* locates segments only (pool.h) */
    pthread_mutex_t mu;
    void *map;
    size_t map_size;
    uint8_t *held;              /* per segment: lent to us, not yet recycled */
    void **tag;                 /* per held segment: its fb_lease_tag */
    uint8_t *ledger;            /* the lender's ledger, mapped read-write */
    size_t ledger_size;
    int32_t num_held;
    int refs;                   /* the connection's, and one per held segment */
    int detached;               /* takes nothing more (let go, or detached) */
    int let_go;                 /* fb_lease_let_go ran */
    fb_lease_release_t release;
    void *release_arg;
    fb_lease_untag_t untag;
};

static void lease_free(fb_lease_t *l)
{
    if (l->map != NULL && l->map != MAP_FAILED)
        munmap(l->map, l->map_size);
    if (l->ledger != NULL && l->ledger != MAP_FAILED)
        munmap(l->ledger, l->ledger_size);
    pthread_mutex_destroy(&l->mu);
    free(l->held);
    free(l->tag);
    free(l);
}

static inline uint32_t *ledger_closed(uint8_t *ledger)
{
    return (uint32_t *)ledger;
}

static inline uint8_t *ledger_entry(uint8_t *ledger, uint32_t segment)
{
    return ledger + FB_LEDGER_HEADER + segment;
}

/* fstat of a memfd sealed against shrinking, or -1 with why in err. */
static int sealed_file(int fd, const char *what, struct stat *st, char *err, size_t errlen)
{
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        snprintf(err, errlen, "the peer's %s is not sealed against shrinking", what);
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        snprintf(err, errlen, "the peer's %s is not a memory file", what);
        return -1;
    }
    return 0;
}

static int lease_recycle(fb_localpool_t *lp, int32_t index);
static int lease_request(fb_localpool_t *lp, int32_t channel, int32_t *index)
{
    (void)lp; (void)channel; (void)index;
    return FB_EDESTROYED;       /* nobody requests a peer's segments */
}

static const fb_pool_ops_t lease_ops = {lease_request, lease_recycle, NULL, NULL, NULL,
                                        NULL, NULL, NULL, NULL};

static int lease_check(int memfd, int32_t segment_size, struct stat *st, char *err,
                       size_t errlen)
{
    if (sealed_file(memfd, "buffer arena", st, err, errlen) != 0)
        return -1;
    if (segment_size <= 0 || st->st_size < (off_t)fb_stride((size_t)segment_size)
            || (uint64_t)st->st_size / fb_stride((size_t)segment_size) > INT32_MAX) {
        snprintf(err, errlen, "the peer's buffer arena has %lld bytes, not a whole number "
                 "of %d-byte segments", (long long)st->st_size, (int)segment_size);
        return -1;
    }
    return 0;
}

fb_lease_t *fb_lease_map(int memfd, int ledger_fd, int32_t segment_size, char *err,
                         size_t errlen)
{
    struct stat st, lst;
    fb_lease_t *l;
    size_t stride;
    if (lease_check(memfd, segment_size, &st, err, errlen) != 0
            || sealed_file(ledger_fd, "ledger", &lst, err, errlen) != 0)
        return NULL;
    stride = fb_stride((size_t)segment_size);
    if (lst.st_size <= FB_LEDGER_HEADER) {
        snprintf(err, errlen, "the peer's ledger has %lld bytes, too few for a segment",
                 (long long)lst.st_size);
        return NULL;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL || pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    l->map_size = (size_t)st.st_size;
    l->ledger_size = (size_t)lst.st_size;
    /* the segments the ledger has room for (the arena's file may be longer) */
    l->shell.num_segments = (int32_t)(l->map_size / stride);
    if ((uint64_t)l->shell.num_segments > (uint64_t)lst.st_size - FB_LEDGER_HEADER)
        l->shell.num_segments = (int32_t)(lst.st_size - FB_LEDGER_HEADER);
    l->held = calloc((size_t)l->shell.num_segments, 1);
    l->tag = calloc((size_t)l->shell.num_segments, sizeof(*l->tag));
    l->map = mmap(NULL, l->map_size, PROT_READ, MAP_SHARED, memfd, 0);
    l->ledger = mmap(NULL, l->ledger_size, PROT_READ | PROT_WRITE, MAP_SHARED, ledger_fd, 0);
    if (l->held == NULL || l->tag == NULL || l->map == MAP_FAILED || l->ledger == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the peer's buffer arena: %s",
                 l->held == NULL || l->tag == NULL ? "out of memory" : strerror(errno));
        lease_free(l);
        return NULL;
    }
    l->shell.base = l->map;
    l->shell.stride = stride;
    l->shell.segment_size = segment_size;
    l->lp.ops = &lease_ops;
    l->lp.net = &l->shell;
    l->refs = 1;
    return l;
}

void fb_lease_set_release(fb_lease_t *l, fb_lease_release_t fn, void *arg,
                          fb_lease_untag_t untag)
{
    pthread_mutex_lock(&l->mu);
    l->release = fn;
    l->release_arg = arg;
    l->untag = untag;
    pthread_mutex_unlock(&l->mu);
}

int fb_lease_take(fb_lease_t *l, uint32_t segment, uint32_t size, fb_item_t *out)
{
    pthread_mutex_lock(&l->mu);
    if (segment >= (uint32_t)l->shell.num_segments || size > (uint32_t)l->shell.segment_size
            || l->held[segment] || l->detached) {
        int detached = l->detached;
        pthread_mutex_unlock(&l->mu);
        return detached ? ESHUTDOWN : EPROTO;
    }
    l->held[segment] = 1;
    l->tag[segment] = NULL;
    __atomic_store_n(ledger_entry(l->ledger, segment), FB_LEDGER_HELD, __ATOMIC_RELAXED);
    l->num_held++;
    l->refs++;
    pthread_mutex_unlock(&l->mu);
    out->data = fb_segment_address(&l->shell, (int32_t)segment);
    out->pool = &l->lp;
    out->index = (int32_t)segment;
    out->kind = FB_ITEM_DATA;
    out->size = (int32_t)size;
    return 0;
}

void fb_lease_tag(fb_lease_t *l, uint32_t segment, void *tag)
{
    pthread_mutex_lock(&l->mu);
    l->tag[segment] = tag;
    pthread_mutex_unlock(&l->mu);
}

/* A held segment's recycle (any thread): released to the peer. */
static int lease_recycle(fb_localpool_t *lp, int32_t index)
{
    fb_lease_t *l = (fb_lease_t *)lp;
    fb_lease_untag_t untag;
    void *tag;
    int last;
    pthread_mutex_lock(&l->mu);
    if (index < 0 || index >= l->shell.num_segments || !l->held[index]) {
        pthread_mutex_unlock(&l->mu);
        return FB_ESTATE;
    }
    l->held[index] = 0;
    l->num_held--;
    tag = l->tag[index];
    l->tag[index] = NULL;
    untag = l->untag;
    /* read no more: the lender may reuse it once it sees this (or RELEASE) */
    __atomic_store_n(ledger_entry(l->ledger, (uint32_t)index), 0, __ATOMIC_RELEASE);
    if (l->release != NULL)
        l->release(l->release_arg, (uint32_t)index);
    last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (tag != NULL && untag != NULL)
        untag(tag);
    if (last)
        lease_free(l);
    return FB_OK;
}

/* Move a private copy of the len bytes (whole pages) at `at` over them:
 * the same bytes at the same addresses, no longer the arena's.  The move
 * (mremap) is one step for the threads reading them: a read sees the
 * arena's bytes or the copy's, which are the same (the lender does not
 * write a segment while it is lent).  valid: the bytes of the arena's file
 * from `at` on (what lies past its end is not touched). */
static int move_private(char *at, size_t len, size_t valid)
{
    void *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED)
        return -1;
    memcpy(copy, at, valid < len ? valid : len);
    if (mprotect(copy, len, PROT_READ) != 0
            || mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
        munmap(copy, len);
        return -1;
    }
    return 0;
}

/* Every held segment's pages made private (l->mu held): 0, or -1 when a
 * copy could not be made (those stay shared). */
static int privatize_locked(fb_lease_t *l)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), lo = 0, hi = 0, start, end;
    size_t mapped = (l->map_size + page - 1) & ~(page - 1);
    char *base = l->map;
    int rc = 0;
    for (int32_t k = 0; k < l->shell.num_segments; k++) {
        if (!l->held[k])
            continue;
        start = ((size_t)k * l->shell.stride) & ~(page - 1);
        end = ((size_t)k * l->shell.stride + (size_t)l->shell.segment_size + page - 1)
              & ~(page - 1);
        if (end > mapped)
            end = mapped;
        if (hi > lo && start <= hi) {           /* (segments in order: ranges grow) */
            hi = end > hi ? end : hi;
            continue;
        }
        if (hi > lo && move_private(base + lo, hi - lo, l->map_size - lo) != 0)
            rc = -1;
        lo = start;
        hi = end;
    }
    if (hi > lo && move_private(base + lo, hi - lo, l->map_size - lo) != 0)
        rc = -1;
    return rc;
}

int fb_lease_let_go(fb_lease_t *l)
{
    int rc = 0;
    pthread_mutex_lock(&l->mu);
    if (!l->let_go) {
        l->let_go = 1;
        l->release = NULL;
        l->detached = 1;
        rc = privatize_locked(l);
        __atomic_store_n(ledger_closed(l->ledger),
                         rc == 0 ? FB_LEDGER_LET_GO : FB_LEDGER_DETACHED, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void fb_lease_detach(fb_lease_t *l)
{
    int last;
    fb_lease_let_go(l);
    pthread_mutex_lock(&l->mu);
    last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last)
        lease_free(l);
}

int fb_lease_is(const fb_localpool_t *lp)
{
    return lp != NULL && lp->ops == &lease_ops;
}

int32_t fb_lease_segments(const fb_lease_t *l)
{
    return l->shell.num_segments;
}

int32_t fb_lease_held(fb_lease_t *l)
{
    int32_t n;
    pthread_mutex_lock(&l->mu);
    n = l->num_held;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* ---- producer side ---------------------------------------------------------- */

fb_owner_ref_t *fb_owner_ref_new(void *owner, void (*drop)(void *, void *), void *ctx)
{
    fb_owner_ref_t *ln = malloc(sizeof(*ln));
    if (ln != NULL) {
        ln->refs = 1;
        ln->owner = owner;
        ln->drop = drop;
        ln->ctx = ctx;
    }
    return ln;
}

void fb_owner_ref_hold(fb_owner_ref_t *ln)
{
    __atomic_add_fetch(&ln->refs, 1, __ATOMIC_RELAXED);
}

void fb_owner_ref_put(fb_owner_ref_t *ln)
{
    if (__atomic_sub_fetch(&ln->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        ln->drop(ln->ctx, ln->owner);
        free(ln);
    }
}

int fb_ledger_new(int32_t num_segments)
{
    int fd, saved;
    if (num_segments <= 0) {
        errno = EINVAL;
        return -1;
    }
    fd = memfd_create("flinkbuf-ledger", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)(FB_LEDGER_HEADER + (size_t)num_segments)) != 0
            || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int fb_lent_init(fb_lent_t *t, const fb_netpool_t *np, int ledger_fd)
{
    struct stat st;
    memset(t, 0, sizeof(*t));
    if (fstat(ledger_fd, &st) != 0
            || (uint64_t)st.st_size < FB_LEDGER_HEADER + (uint64_t)np->num_segments)
        return EINVAL;
    t->pool = calloc((size_t)np->num_segments, sizeof(*t->pool));
    t->lender = calloc((size_t)np->num_segments, sizeof(*t->lender));
    t->ledger_size = (size_t)st.st_size;
    t->ledger = mmap(NULL, t->ledger_size, PROT_READ | PROT_WRITE, MAP_SHARED, ledger_fd, 0);
    if (t->ledger == MAP_FAILED)
        t->ledger = NULL;
    if (t->pool == NULL || t->lender == NULL || t->ledger == NULL) {
        fb_lent_free(t);
        return ENOMEM;
    }
    t->np = np;
    t->num_segments = np->num_segments;
    return 0;
}

void fb_lent_put(fb_lent_t *t, int32_t segment, fb_localpool_t *pool, fb_owner_ref_t *ln)
{
    fb_owner_ref_hold(ln);
    t->pool[segment] = pool;
    t->lender[segment] = ln;
    t->count++;
    __atomic_store_n(ledger_entry(t->ledger, (uint32_t)segment), FB_LEDGER_LENT,
                     __ATOMIC_RELEASE);
}

int fb_lent_take(fb_lent_t *t, uint32_t segment, fb_localpool_t **pool, fb_owner_ref_t **ln)
{
    if (t->np == NULL || segment >= (uint32_t)t->num_segments || t->pool[segment] == NULL)
        return EPROTO;
    *pool = t->pool[segment];
    *ln = t->lender[segment];
    t->pool[segment] = NULL;
    t->lender[segment] = NULL;
    t->count--;
    return 0;
}

typedef struct reaper {
    fb_lent_t t;
    int pidfd;
} reaper_t;

static void give_back(fb_lent_t *t, int32_t k)
{
    fb_localpool_t *pool;
    fb_owner_ref_t *ln;
    if (fb_lent_take(t, (uint32_t)k, &pool, &ln) == 0) {
        pool->ops->recycle(pool, k);
        fb_owner_ref_put(ln);
    }
}

/* Give back what the ledger shows the peer let go of (all: it ended). */
static void give_back_released(fb_lent_t *t, int all)
{
    uint32_t closed = all ? FB_LEDGER_LET_GO
                      : __atomic_load_n(ledger_closed(t->ledger), __ATOMIC_ACQUIRE);
    uint8_t state;
    int32_t k;
    for (k = 0; t->count > 0 && k < t->num_segments; k++) {
        if (t->pool[k] == NULL)
            continue;
        state = __atomic_load_n(ledger_entry(t->ledger, (uint32_t)k), __ATOMIC_ACQUIRE);
        /* LENT after the borrower detached: a frame it never read */
        if (closed == FB_LEDGER_LET_GO || state == 0
                || (closed == FB_LEDGER_DETACHED && state != FB_LEDGER_HELD))
            give_back(t, k);
    }
}

int fb_lent_let_go(const fb_lent_t *t)
{
    return t->ledger != NULL
           && __atomic_load_n(ledger_closed(t->ledger), __ATOMIC_ACQUIRE) == FB_LEDGER_LET_GO;
}

void fb_lent_give_back_all(fb_lent_t *t)
{
    if (t->count > 0)
        give_back_released(t, 1);
}

#define REAP_MAX_WAIT_MS 100

static void *reaper_main(void *arg)
{
    reaper_t *r = arg;
    struct pollfd p = {r->pidfd, POLLIN, 0};
    int wait = 1, rc;
    while (r->t.count > 0) {
        rc = poll(&p, 1, wait);
        if (rc < 0 && errno == EINTR)
            continue;
        give_back_released(&r->t, rc != 0);          /* the peer ended (or poll failed) */
        wait = wait < REAP_MAX_WAIT_MS ? wait * 2 : REAP_MAX_WAIT_MS;
    }
    close(r->pidfd);
    fb_lent_free(&r->t);
    free(r);
    return NULL;
}

void fb_lent_reap(fb_lent_t *t, int pidfd)
{
    reaper_t *r;
    pthread_attr_t attr;
    pthread_t th;
    int started = 0;
    if (t->count > 0 && t->ledger != NULL)
        give_back_released(t, 0);        /* what the peer let go of already */
    if (t->count == 0 || pidfd < 0) {
        if (pidfd >= 0)
            close(pidfd);
        fb_lent_free(t);     /* (pidfd < 0: what is lent stays out) */
        return;
    }
    r = malloc(sizeof(*r));
    if (r != NULL && pthread_attr_init(&attr) == 0) {
        r->t = *t;
        r->pidfd = pidfd;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        started = pthread_create(&th, &attr, reaper_main, r) == 0;
        pthread_attr_destroy(&attr);
    }
    if (started) {
        memset(t, 0, sizeof(*t));
        return;
    }
    /* No thread to wait with: what is lent stays out (never reused). */
    free(r);
    close(pidfd);
    fb_lent_free(t);
}

void fb_lent_free(fb_lent_t *t)
{
    if (t->ledger != NULL)
        munmap(t->ledger, t->ledger_size);
    free(t->pool);
    free(t->lender);
    memset(t, 0, sizeof(*t));
}
