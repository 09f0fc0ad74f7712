/* The shared-memory transport's waits (csrc/network/shm.c) on their own:
 * when a wait looks at the ring before it sleeps, and what a peer that
 * writes garbage into the fields it publishes can make this side do.  Two
 * transports over one region in one process; the test writes the peer's
 * fields itself where it plays a peer (the layout of docs/PROTOCOL.md,
 * section 2.1).  No check depends on how long anything takes.  Prints "ok"
 * or the first broken promise (exit 1). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "network/shm.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("line %d: %s\n", __LINE__, #cond);                       \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

/* The control page (docs/PROTOCOL.md, section 2.1). */
#define RING_CTL(r) (64 + 192 * (r))
#define RING_READERS_ASLEEP(r) (RING_CTL(r) + 128)
#define RING_BELLS(r) (RING_CTL(r) + 140)
#define SIDE(s) (448 + 64 * (s))
#define SIDE_MOVED(s) (SIDE(s))
#define SIDE_READ(s) (SIDE(s) + 8)
#define SIDE_LOOKED(s) (SIDE(s) + 16)
#define SIDE_CPU(s) (SIDE(s) + 24)

typedef struct pair {
    fb_transport_t *t[2];
    int peer_sock[2];            /* the other ends of the transports' sockets */
    int region[FB_SHM_NFDS];
    char *map;                   /* the test's own mapping of the region */
    size_t size;
} pair_t;

static void pair_new(pair_t *p)
{
    int sv[2][2];
    char err[256];
    struct stat st;
    CHECK(fb_shm_region_new(fb_shm_ring_size(1024), p->region) == 0);
    CHECK(fstat(p->region[FB_SHM_MEMFD], &st) == 0);
    p->size = (size_t)st.st_size;
    p->map = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, p->region[FB_SHM_MEMFD], 0);
    CHECK(p->map != MAP_FAILED);
    for (int side = 0; side < 2; side++) {
        CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv[side]) == 0);
        p->peer_sock[side] = sv[side][1];
        p->t[side] = fb_transport_shm(sv[side][0], p->region[FB_SHM_MEMFD],
                                      p->region[side ? FB_SHM_DATA1 : FB_SHM_DATA0],
                                      p->region[side ? FB_SHM_ROOM1 : FB_SHM_ROOM0], side,
                                      err, sizeof(err));
        if (p->t[side] == NULL)
            printf("%s\n", err);
        CHECK(p->t[side] != NULL);
    }
    close(p->region[FB_SHM_MEMFD]);
}

static void pair_free(pair_t *p)
{
    for (int side = 0; side < 2; side++) {
        p->t[side]->ops->destroy(p->t[side]);
        close(p->peer_sock[side]);
    }
    munmap(p->map, p->size);
}

static fb_shm_stats_t stats_of(fb_transport_t *t)
{
    fb_shm_stats_t st;
    fb_shm_stats(t, &st);
    return st;
}

static void put64(pair_t *p, size_t off, int64_t v)
{
    __atomic_store_n((int64_t *)(p->map + off), v, __ATOMIC_RELAXED);
}

static void put32(pair_t *p, size_t off, int32_t v)
{
    __atomic_store_n((int32_t *)(p->map + off), v, __ATOMIC_RELAXED);
}

static int64_t get64(pair_t *p, size_t off)
{
    return __atomic_load_n((int64_t *)(p->map + off), __ATOMIC_RELAXED);
}

static void send_all(fb_transport_t *t, const char *data, size_t n)
{
    while (n > 0) {
        struct iovec v = {(void *)data, n};
        ssize_t r = t->ops->send(t, &v, 1, 0);
        CHECK(r > 0);
        data += r;
        n -= (size_t)r;
    }
}

static void recv_all(fb_transport_t *t, char *data, size_t n)
{
    while (n > 0) {
        struct iovec v = {data, n};
        ssize_t r = t->ops->recv(t, &v, 1);
        if (r < 0 && errno == EAGAIN) {
            CHECK(t->ops->wait(t, FB_TRANSPORT_READABLE, -1, 1000) >= 0);
            continue;
        }
        CHECK(r > 0);
        data += r;
        n -= (size_t)r;
    }
}

/* A peer that has not moved bytes (it sleeps, or has nothing to do): a
 * wait sleeps at once, without looking. */
static void quiet_peer_is_not_looked_at(void)
{
    pair_t p;
    fb_shm_stats_t st;
    pair_new(&p);
    for (int i = 0; i < 3; i++)
        CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 5) == 0);
    st = stats_of(p.t[1]);
    CHECK(st.waits == 3 && st.looks == 0 && st.looks_paid == 0 && st.sleeps == 3);
    /* the same after it moved bytes long ago */
    put64(&p, SIDE_MOVED(0), fb_monotonic_ns() - 1000000000LL);
    put32(&p, SIDE_CPU(0), -1);
    CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 5) == 0);
    st = stats_of(p.t[1]);
    CHECK(st.waits == 4 && st.looks == 0 && st.sleeps == 4);
    pair_free(&p);
}

/* A peer that moves bytes now on another CPU is looked at: the look ends
 * when it goes quiet, and the wait sleeps then.  (Retried: the test's
 * thread may be preempted between writing the peer's time and the wait.) */
static void running_peer_is_looked_at(void)
{
    pair_t p;
    fb_shm_stats_t st;
    int tries = 0;
    pair_new(&p);
    put32(&p, SIDE_CPU(0), -1);
    do {
        put64(&p, SIDE_MOVED(0), fb_monotonic_ns());
        CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 1) == 0);
        st = stats_of(p.t[1]);
    } while (st.looks == 0 && ++tries < 10000);
    CHECK(st.looks >= 1);
    CHECK(st.looks_paid == 0 && st.sleeps == st.waits);
    pair_free(&p);
}

/* A peer that looks at the rings now (its time of looking is fresh) runs
 * on another CPU: it is looked at, though it moved no bytes for long. */
static void looking_peer_is_looked_at(void)
{
    pair_t p;
    fb_shm_stats_t st;
    int tries = 0;
    pair_new(&p);
    put64(&p, SIDE_MOVED(0), fb_monotonic_ns() - 1000000000LL);
    do {
        put64(&p, SIDE_LOOKED(0), fb_monotonic_ns());
        CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 1) == 0);
        st = stats_of(p.t[1]);
    } while (st.looks == 0 && ++tries < 10000);
    CHECK(st.looks >= 1 && st.looks_paid == 0);
    /* and a look publishes this side's time of looking */
    CHECK(get64(&p, SIDE_LOOKED(1)) > 0);
    pair_free(&p);
}

/* A peer that last moved on this wait's CPU does not run now: no look. */
static void peer_on_this_cpu_is_not_looked_at(void)
{
    pair_t p;
    cpu_set_t saved, one;
    fb_shm_stats_t st;
    int cpu;
    CHECK(sched_getaffinity(0, sizeof(saved), &saved) == 0);
    for (cpu = 0; !CPU_ISSET(cpu, &saved); cpu++)
        ;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    CHECK(sched_setaffinity(0, sizeof(one), &one) == 0);
    pair_new(&p);
    put32(&p, SIDE_CPU(0), cpu);
    for (int i = 0; i < 200; i++) {
        put64(&p, SIDE_MOVED(0), fb_monotonic_ns());
        CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 1) == 0);
    }
    st = stats_of(p.t[1]);
    CHECK(st.waits == 200 && st.looks == 0 && st.sleeps == 200);
    pair_free(&p);
    CHECK(sched_setaffinity(0, sizeof(saved), &saved) == 0);
}

/* What a side publishes is what the peer reads: its time of moving bytes
 * (and of reading them) and its CPU. */
static void a_side_publishes_when_it_moved(void)
{
    pair_t p;
    char buf[5];
    int64_t before;
    pair_new(&p);
    before = fb_monotonic_ns();
    send_all(p.t[0], "hello", 5);
    CHECK(get64(&p, SIDE_MOVED(0)) >= before && get64(&p, SIDE_READ(0)) == 0);
    recv_all(p.t[1], buf, 5);
    CHECK(memcmp(buf, "hello", 5) == 0);
    CHECK(get64(&p, SIDE_READ(1)) >= before && get64(&p, SIDE_MOVED(1)) >= before);
    CHECK(__atomic_load_n((int32_t *)(p.map + SIDE_CPU(1)), __ATOMIC_RELAXED) >= -1);
    pair_free(&p);
}

/* Garbage in the peer's fields: times in the future or the distant past,
 * any CPU, a time of reading that would teach a look after a ring, bells
 * that never match.  Waits return at their timeout without looking at a
 * peer whose time is no time, and the bytes still go across exactly. */
static void garbage_from_the_peer_changes_nothing_that_matters(void)
{
    static const int64_t times[] = {INT64_MAX, INT64_MIN, -1, 1, 0};
    pair_t p;
    fb_shm_stats_t st;
    char buf[64];
    int64_t now;
    pair_new(&p);
    for (size_t k = 0; k < sizeof(times) / sizeof(times[0]); k++) {
        put64(&p, SIDE_MOVED(0), times[k]);
        put64(&p, SIDE_READ(0), times[k]);
        put64(&p, SIDE_LOOKED(0), times[k]);
        put32(&p, SIDE_CPU(0), (int32_t)(k * 7919) - 3);
        put32(&p, RING_BELLS(0), (int32_t)(0x9e3779b9u * (uint32_t)k));
        CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 2) == 0);
    }
    now = fb_monotonic_ns();
    put64(&p, SIDE_MOVED(0), now + 1000000000LL);      /* a second ahead */
    CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 2) == 0);
    st = stats_of(p.t[1]);
    CHECK(st.looks == 0 && st.sleeps == st.waits && st.waits == 6);
    /* side 1 rings a peer that says it sleeps, then the peer claims to have
     * read soon after on another CPU: at most a bounded look, no error */
    put32(&p, RING_READERS_ASLEEP(1), 1000);
    send_all(p.t[1], "ping", 4);
    put64(&p, SIDE_READ(0), fb_monotonic_ns() + 5000);
    put32(&p, SIDE_CPU(0), -1);
    CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 2) == 0);
    CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 2) == 0);
    put32(&p, RING_READERS_ASLEEP(1), 0);
    recv_all(p.t[0], buf, 4);
    CHECK(memcmp(buf, "ping", 4) == 0);
    send_all(p.t[0], "pong", 4);
    recv_all(p.t[1], buf, 4);
    CHECK(memcmp(buf, "pong", 4) == 0);
    pair_free(&p);
}

/* ---- an exchange under a peer scribbling on its fields ----------------------------------- */

#define STREAM (8u << 20)

typedef struct run {
    pair_t *p;
    int stop;
} run_t;

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)(i * 2654435761u >> 13);
}

static void *sender(void *arg)
{
    run_t *r = arg;
    static char chunk[7000];
    uint64_t i = 0, n;
    unsigned seed = 1;
    while (i < STREAM) {
        n = 1 + (uint64_t)rand_r(&seed) % sizeof(chunk);
        if (n > STREAM - i)
            n = STREAM - i;
        for (uint64_t k = 0; k < n; k++)
            chunk[k] = (char)pattern(i + k);
        send_all(r->p->t[0], chunk, n);
        i += n;
    }
    return NULL;
}

static void *scribbler(void *arg)
{
    run_t *r = arg;
    unsigned seed = 7;
    while (!__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
        int64_t now = fb_monotonic_ns();
        int64_t pick[] = {now, now - 3000, now + 3000, INT64_MAX, INT64_MIN,
                          (int64_t)rand_r(&seed) << 32 | (int64_t)rand_r(&seed)};
        put64(r->p, SIDE_MOVED(0), pick[rand_r(&seed) % 6]);
        put64(r->p, SIDE_READ(0), pick[rand_r(&seed) % 6]);
        put64(r->p, SIDE_LOOKED(0), pick[rand_r(&seed) % 6]);
        put32(r->p, SIDE_CPU(0), rand_r(&seed) % 4 - 1);
        put32(r->p, RING_BELLS(0), rand_r(&seed));
        sched_yield();
    }
    return NULL;
}

/* The bytes go across exactly, in order, and every wait ends, while the
 * sender's side scribbles on the fields a receiving side only reads as
 * hints (its time and CPU, its count of bells). */
static void exchange_under_a_scribbling_peer(void)
{
    pair_t p;
    run_t r = {&p, 0};
    pthread_t ts, tg;
    static char buf[9000];
    uint64_t got = 0;
    fb_shm_stats_t st;
    pair_new(&p);
    CHECK(pthread_create(&ts, NULL, sender, &r) == 0);
    CHECK(pthread_create(&tg, NULL, scribbler, &r) == 0);
    while (got < STREAM) {
        size_t want = 1 + (size_t)(got % sizeof(buf));
        struct iovec v = {buf, want};
        ssize_t n = p.t[1]->ops->recv(p.t[1], &v, 1);
        if (n < 0 && errno == EAGAIN) {
            CHECK(p.t[1]->ops->wait(p.t[1], FB_TRANSPORT_READABLE, -1, 10000) > 0);
            continue;
        }
        CHECK(n > 0);
        for (ssize_t k = 0; k < n; k++)
            CHECK((uint8_t)buf[k] == pattern(got + (uint64_t)k));
        got += (uint64_t)n;
    }
    __atomic_store_n(&r.stop, 1, __ATOMIC_RELAXED);
    CHECK(pthread_join(ts, NULL) == 0);
    CHECK(pthread_join(tg, NULL) == 0);
    st = stats_of(p.t[1]);
    CHECK(st.looks <= st.waits && st.looks_paid <= st.looks && st.sleeps <= st.waits);
    pair_free(&p);
}

int main(void)
{
    quiet_peer_is_not_looked_at();
    running_peer_is_looked_at();
    looking_peer_is_looked_at();
    peer_on_this_cpu_is_not_looked_at();
    a_side_publishes_when_it_moved();
    garbage_from_the_peer_changes_nothing_that_matters();
    exchange_under_a_scribbling_peer();
    printf("ok\n");
    return 0;
}
