/* The shared-memory transport (shm.h). */
#define _GNU_SOURCE
#include "network/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"

#define SHM_MAGIC 0x46425348u       /* "FBSH" */
#define SHM_VERSION 2u
#define SHM_HEADER 4096u            /* the control page before the rings */

/* When a wait looks at the ring before it sleeps.  A look pays only while
 * the peer runs on another CPU and answers within the look: then it saves
 * this side a wake-up through the kernel (ten or more microseconds), and a
 * round trip between two awake processes takes a few.  A look at a peer
 * that sleeps, waits for a CPU, or would run on this one is worse than
 * useless: it takes the core that the peer (or the process beside it)
 * needs.  So each side publishes when it last moved bytes, when it last
 * looked, and on which CPU it moved them (side_ctl_t), and a wait looks,
 * if the peer did not last move on this wait's CPU (a peer that last ran
 * here does not run now: it sleeps or waits for this core), only
 *   - while the peer moved bytes recently (it is running: it is answering,
 *     or about to).  Recently is learned (learn_live): LIVE_MIN_NS, or as
 *     long as the peer's moves were apart (up to LIVE_MAX_NS) when it
 *     answered a wait that slept soon enough for a look, from another CPU;
 *     a look that did not pay takes a quarter off;
 *   - while the peer looks at the rings itself (it runs on another CPU now)
 *     with bytes from this side to read, or for WAITING_NS without (two
 *     sides that both wait for a third thread stop looking soon);
 *   - or, after this side rang the sleeping peer's doorbell, for as long as
 *     a rung peer took to read on another CPU before (learn_wake);
 * and never longer than SPIN_MAX_NS.  What the peer publishes is a hint: a
 * garbage value only makes a wait look (at most SPIN_MAX_NS) or sleep. */
#define SPIN_MAX_NS 30000           /* the longest look */
#define LIVE_MIN_NS 16000
#define LIVE_MAX_NS 60000
#define LOOKING_NS 2000             /* a look's time older than this: it ended */
#define WAITING_NS 4000
#define WAKE_MAX_NS 30000           /* a rung peer slower than this: no look after a ring */

/* One ring's shared indices.  head and tail only grow (mod 2^64); each
 * is written by one side and sits on a cache line of its own. */
typedef struct ring_ctl {
    _Alignas(64) uint64_t head;       /* bytes written, by the ring's writer */
    _Alignas(64) uint64_t tail;       /* bytes read, by the ring's reader */
    _Alignas(64) uint32_t readers_asleep;  /* the reader's threads polling for input */
    uint32_t writer_asleep;           /* the writer polls for room */
    uint32_t closed;                  /* the writer ended (after its last head) */
    uint32_t bells;                   /* doorbells the writer rang for input (mod 2^32) */
} ring_ctl_t;

/* What a side tells the other about itself (written by that side only). */
typedef struct side_ctl {
    _Alignas(64) int64_t moved_ns;    /* CLOCK_MONOTONIC of its last send or receive */
    int64_t read_ns;                  /* of its last receive */
    int64_t looked_ns;                /* of its last look at the rings (every ~16 pauses) */
    int32_t cpu;                      /* the CPU of its last send or receive (-1: unknown) */
} side_ctl_t;

typedef struct shm_header {
    uint32_t magic, version, ring_size, reserved;
    ring_ctl_t ring[2];               /* ring s: written by side s */
    side_ctl_t side[2];
} shm_header_t;

_Static_assert(sizeof(shm_header_t) <= SHM_HEADER, "the header fits its page");

typedef struct shm_transport {
    fb_transport_t base;
    int sock;                 /* the connection's Unix socket: its end is the peer's end */
    int data_fd, room_fd;     /* this side's doorbells: poll, drain, ring the peer's */
    char *map;
    size_t map_size;
    ring_ctl_t *tx, *rx;
    side_ctl_t *me, *peer;
    char *tx_buf, *rx_buf;
    uint64_t size;            /* ring bytes, a power of two */
    uint64_t tx_head;         /* own copies of own indices (atomic: waiters read them) */
    uint64_t rx_tail;
    int shut;                 /* atomic */
    int peer_gone;            /* atomic: the socket or a doorbell reported the end */
    uint32_t bells_seen;      /* atomic: rx->bells when this side last drained its bell */
    int64_t rang_ns;          /* atomic: when this side last rang the peer awake */
    int32_t live_ns;          /* atomic: how long after the peer's move a look pays */
    int32_t wake_ns;          /* atomic: how long a look after a ring may be (0: none) */
    int woke_apart;           /* atomic: the last rung peer read on another CPU, soon */
    fb_shm_stats_t stats;     /* atomic counters */
} shm_t;

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define PEEK(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define SET(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define COUNT(s, f) __atomic_add_fetch(&(s)->stats.f, 1, __ATOMIC_RELAXED)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

uint32_t fb_shm_ring_size(int32_t segment_size)
{
    uint64_t want = segment_size > 0 ? (uint64_t)segment_size * 16 : FB_SHM_MIN_RING;
    uint32_t size = FB_SHM_MIN_RING;
    while (size < want && size < 4u * 1024 * 1024)
        size <<= 1;
    return size;
}

/* ---- the region ------------------------------------------------------------------------ */

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

int fb_shm_region_new(uint32_t ring_size, int fds[FB_SHM_NFDS])
{
    int data[2], room[2], err;
    size_t size = SHM_HEADER + 2 * (size_t)ring_size;
    shm_header_t *h;
    for (int i = 0; i < FB_SHM_NFDS; i++)
        fds[i] = -1;
    if (ring_size < FB_SHM_MIN_RING || ring_size > FB_SHM_MAX_RING
            || (ring_size & (ring_size - 1)) != 0)
        return EINVAL;
    fds[FB_SHM_MEMFD] = memfd_create("flinkbuf-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fds[FB_SHM_MEMFD] < 0)
        return errno;
    if (ftruncate(fds[FB_SHM_MEMFD], (off_t)size) != 0)
        goto fail;
    /* Allocate every page now: a page the kernel cannot find later would
     * be a SIGBUS in whichever process touches it first. */
    if ((err = posix_fallocate(fds[FB_SHM_MEMFD], 0, (off_t)size)) != 0) {
        errno = err;
        goto fail;
    }
    h = mmap(NULL, SHM_HEADER, PROT_READ | PROT_WRITE, MAP_SHARED, fds[FB_SHM_MEMFD], 0);
    if (h == MAP_FAILED)
        goto fail;
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->ring_size = ring_size;
    h->side[0].cpu = h->side[1].cpu = -1;
    munmap(h, SHM_HEADER);
    if (fcntl(fds[FB_SHM_MEMFD], F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        goto fail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, data) != 0)
        goto fail;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, room) != 0) {
        err = errno;
        close(data[0]);
        close(data[1]);
        errno = err;
        goto fail;
    }
    fds[FB_SHM_DATA0] = data[0];
    fds[FB_SHM_ROOM0] = room[0];
    fds[FB_SHM_DATA1] = data[1];
    fds[FB_SHM_ROOM1] = room[1];
    return 0;
fail:
    err = errno ? errno : ENOMEM;
    close_all(fds, FB_SHM_NFDS);
    return err;
}

/* ---- doorbells and the peer's end ------------------------------------------------------ */

static void ring_bell(int fd)
{
    char one = 1;
    /* Full: the other side has wake-ups pending already. */
    (void)!send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Ring `fd` if the other side may sleep on `asleep` (after publishing),
 * counting the ring in `*bells` (NULL: uncounted). */
static inline void wake_if_asleep(shm_t *s, int fd, uint32_t *asleep, uint32_t *bells)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (PEEK(asleep) > 0) {
        if (bells != NULL)
            __atomic_add_fetch(bells, 1, __ATOMIC_RELAXED);
        ring_bell(fd);
        SET(&s->rang_ns, fb_monotonic_ns());
    }
}

/* Empty a doorbell (a short read emptied it); its end closed (the peer
 * went) sets peer_gone. */
static void drain(shm_t *s, int fd)
{
    char buf[64];
    ssize_t r;
    while ((r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) == (ssize_t)sizeof(buf))
        ;
    if (r > 0)
        return;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        __atomic_store_n(&s->peer_gone, 1, __ATOMIC_RELEASE);
}

/* The socket polled readable: nothing is sent on it after the set-up, so
 * its end (or anything else) means the peer is gone. */
static void check_peer(shm_t *s)
{
    char b;
    ssize_t r = recv(s->sock, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        __atomic_store_n(&s->peer_gone, 1, __ATOMIC_RELEASE);
}

/* ---- the rings ------------------------------------------------------------------------- */

/* Bytes readable (> size: the peer corrupted its head). */
static inline uint64_t rx_avail(const shm_t *s)
{
    return LOAD(&s->rx->head) - PEEK(&s->rx_tail);
}

/* Bytes of room ((uint64_t)-1: the peer corrupted its tail). */
static inline uint64_t tx_room(const shm_t *s)
{
    uint64_t used = PEEK(&s->tx_head) - LOAD(&s->tx->tail);
    return used > s->size ? (uint64_t)-1 : s->size - used;
}

static void ring_write(shm_t *s, uint64_t at, const char *src, size_t n)
{
    size_t off = (size_t)(at & (s->size - 1)), first = s->size - off;
    if (first > n)
        first = n;
    memcpy(s->tx_buf + off, src, first);
    memcpy(s->tx_buf, src + first, n - first);
}

static void ring_read(shm_t *s, uint64_t at, char *dst, size_t n)
{
    size_t off = (size_t)(at & (s->size - 1)), first = s->size - off;
    if (first > n)
        first = n;
    memcpy(dst, s->rx_buf + off, first);
    memcpy(dst + first, s->rx_buf, n - first);
}

static int ready(shm_t *s, int events)
{
    if (PEEK(&s->shut) || LOAD(&s->peer_gone))
        return 1;
    if ((events & FB_TRANSPORT_READABLE) && (rx_avail(s) != 0 || LOAD(&s->rx->closed)))
        return 1;
    return (events & FB_TRANSPORT_WRITABLE) && tx_room(s) != 0;
}

/* This side moved bytes (read them: `read`): tell the peer when and where. */
static inline void moved(shm_t *s, int read)
{
    int64_t now = fb_monotonic_ns();
    SET(&s->me->moved_ns, now);
    if (read)
        SET(&s->me->read_ns, now);
    SET(&s->me->cpu, sched_getcpu());
}

/* ---- waiting: look, then sleep ------------------------------------------------------------ */

/* now - then, wrapping (the peer's times can be anything). */
static inline int64_t since(int64_t now, int64_t then)
{
    return (int64_t)((uint64_t)now - (uint64_t)then);
}

/* Whether a look that began at t0 still pays at `now`: the peer looks at
 * the rings now with bytes from this side to read (or this look is young),
 * or it moved bytes within live_ns (since this side last rang it), or it
 * was rung and a rung peer read this soon before.  `moved` and `rang` as
 * read by the caller. */
static inline int peer_live(const shm_t *s, int64_t t0, int64_t now, int64_t moved, int64_t rang)
{
    int64_t looked = since(now, PEEK(&s->peer->looked_ns));
    if (looked >= 0 && looked < LOOKING_NS
            && (now - t0 < WAITING_NS || PEEK(&s->tx_head) != PEEK(&s->tx->tail)))
        return 1;
    if (rang != 0 && since(rang, moved) > 0)   /* it slept since this side rang it */
        return since(now, rang) < PEEK(&s->wake_ns);
    return since(now, moved) >= 0 && since(now, moved) < PEEK(&s->live_ns);
}

/* Look at the ring while the peer is live, for at most SPIN_MAX_NS and ms:
 * 1 if what the wait is for came. */
static int look(shm_t *s, int events, int ms, int64_t t0)
{
    int64_t until = t0 + ((ms > 0 && (int64_t)ms * 1000000 < SPIN_MAX_NS)
                          ? (int64_t)ms * 1000000 : SPIN_MAX_NS), now;
    SET(&s->me->looked_ns, t0);
    for (int i = 1;; i++) {
        cpu_relax();
        if (ready(s, events))
            return 1;
        if ((i & 15) == 0) {
            now = fb_monotonic_ns();
            SET(&s->me->looked_ns, now);
            if (now >= until
                    || !peer_live(s, t0, now, PEEK(&s->peer->moved_ns), PEEK(&s->rang_ns)))
                return 0;
        }
    }
}

/* Learn from a wait that began at t0 on `cpu` and slept (the peer had
 * moved at moved0, this side rang it at rang0; `looked` first, in vain)
 * how long after the peer's move a look pays: a quarter less after a look
 * in vain; as long as the peer's moves were apart (and a quarter more) if
 * it answered a wait that did not look soon enough for a look to have seen
 * it, from another CPU, without being rung. */
static void learn_live(shm_t *s, int cpu, int64_t t0, int64_t moved0, int64_t rang0, int looked)
{
    int64_t moved = PEEK(&s->peer->moved_ns), gap = since(moved, moved0);
    int32_t live = PEEK(&s->live_ns), next = live;
    if (looked)
        next = live - live / 4;
    else if (gap > 0 && gap < LIVE_MAX_NS && since(moved, t0) >= 0
             && since(moved, t0) < SPIN_MAX_NS && (rang0 == 0 || since(rang0, moved0) <= 0)
             && (cpu < 0 || PEEK(&s->peer->cpu) != cpu) && gap + gap / 4 > live)
        next = (int32_t)(gap + gap / 4);
    if (next < LIVE_MIN_NS)
        next = LIVE_MIN_NS;
    if (next > LIVE_MAX_NS)
        next = LIVE_MAX_NS;
    if (next != live)
        SET(&s->live_ns, next);
}

/* Learn from a wait on `cpu` how long a look after a ring may be: once
 * the peer read after this side rang it, as long as that took and half as
 * much again if it ran on another CPU within WAKE_MAX_NS the last two
 * times, else none (a look would have held it off this one, or would not
 * have lasted).  Each ring teaches once. */
static void learn_wake(shm_t *s, int cpu)
{
    int64_t rang = PEEK(&s->rang_ns), took = since(PEEK(&s->peer->read_ns), rang);
    int good;
    if (rang == 0 || took <= 0
            || !__atomic_compare_exchange_n(&s->rang_ns, &rang, 0, 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED))
        return;
    good = took < WAKE_MAX_NS && (cpu < 0 || PEEK(&s->peer->cpu) != cpu);
    if (good && __atomic_exchange_n(&s->woke_apart, 1, __ATOMIC_RELAXED))
        SET(&s->wake_ns, (int32_t)(took + took / 2 + 2000));
    else
        SET(&s->wake_ns, 0);
    if (!good)
        SET(&s->woke_apart, 0);
}

/* Sleep up to ms on the doorbells (and wake_fd), counted as a sleeper so
 * that the peer rings: poll's result. */
static int sleep_on_bells(shm_t *s, int events, int wake_fd, int ms)
{
    struct pollfd p[4];
    int n = 0, rc, iw = -1, ir = -1, id = -1, slept = 0;
    int64_t until = ms > 0 ? fb_monotonic_ns() + (int64_t)ms * 1000000 : 0;
    uint64_t drained;
    if (events & FB_TRANSPORT_READABLE)
        __atomic_add_fetch(&s->rx->readers_asleep, 1, __ATOMIC_SEQ_CST);
    if (events & FB_TRANSPORT_WRITABLE)
        __atomic_add_fetch(&s->tx->writer_asleep, 1, __ATOMIC_SEQ_CST);
    p[n++] = (struct pollfd){s->sock, POLLIN, 0};
    if (events & FB_TRANSPORT_READABLE)
        p[id = n++] = (struct pollfd){s->data_fd, POLLIN, 0};
    if (events & FB_TRANSPORT_WRITABLE)
        p[ir = n++] = (struct pollfd){s->room_fd, POLLIN, 0};
    if (wake_fd >= 0)
        p[iw = n++] = (struct pollfd){wake_fd, POLLIN, 0};
    while (!(rc = ready(s, events))) {
        if (!slept++)
            COUNT(s, sleeps);
        if ((rc = poll(p, (nfds_t)n, ms)) <= 0)
            break;
        if (iw >= 0 && (p[iw].revents & POLLIN))
            (void)!read(wake_fd, &drained, sizeof(drained));
        /* Room is drained here (one sender waits at a time); input by the
         * receive that reads it after a ring, or here when it was read
         * before this thread woke: then the sleep goes on. */
        if (ir >= 0 && p[ir].revents)
            drain(s, s->room_fd);
        if (p[0].revents)
            check_peer(s);
        if (rc > 1 || id < 0 || !p[id].revents || ready(s, events))
            break;
        drain(s, s->data_fd);
        if (ms > 0 && (ms = (int)((until - fb_monotonic_ns() + 999999) / 1000000)) <= 0) {
            rc = 0;
            break;
        }
    }
    if (events & FB_TRANSPORT_READABLE)
        __atomic_sub_fetch(&s->rx->readers_asleep, 1, __ATOMIC_RELAXED);
    if (events & FB_TRANSPORT_WRITABLE)
        __atomic_sub_fetch(&s->tx->writer_asleep, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Wait up to ms for `events` (or the wake-up fd): look first if it pays,
 * then sleep. */
static int shm_wait(fb_transport_t *t, int events, int wake_fd, int ms)
{
    shm_t *s = (shm_t *)t;
    int64_t t0, moved0, rang0;
    int cpu, rc, looked = 0;
    if (ready(s, events))
        return 1;
    COUNT(s, waits);
    t0 = fb_monotonic_ns();
    cpu = sched_getcpu();
    moved0 = PEEK(&s->peer->moved_ns);
    rang0 = PEEK(&s->rang_ns);
    if (ms != 0 && (cpu < 0 || PEEK(&s->peer->cpu) != cpu)
            && peer_live(s, t0, t0, moved0, rang0)) {
        COUNT(s, looks);
        looked = 1;
        if (look(s, events, ms, t0)) {
            COUNT(s, looks_paid);
            learn_wake(s, cpu);
            return 1;
        }
    }
    rc = sleep_on_bells(s, events, wake_fd, ms);
    if (looked || (rc > 0 && ready(s, events)))
        learn_live(s, cpu, t0, moved0, rang0, looked);
    learn_wake(s, cpu);
    return rc;
}

static ssize_t shm_send(fb_transport_t *t, const struct iovec *iov, int iovcnt, int nowait)
{
    shm_t *s = (shm_t *)t;
    uint64_t room, head;
    size_t n = 0, take;
    for (;;) {
        if (PEEK(&s->shut)) {
            errno = EPIPE;
            return -1;
        }
        if (LOAD(&s->peer_gone)) {
            errno = ECONNRESET;
            return -1;
        }
        if ((room = tx_room(s)) == (uint64_t)-1) {
            errno = EPROTO;
            return -1;
        }
        if (room > 0)
            break;
        if (nowait) {
            errno = EAGAIN;
            return -1;
        }
        if (shm_wait(t, FB_TRANSPORT_WRITABLE, -1, -1) < 0 && errno != EINTR)
            return -1;
    }
    head = PEEK(&s->tx_head);
    for (int i = 0; i < iovcnt && room > 0; i++) {
        take = iov[i].iov_len < room ? iov[i].iov_len : (size_t)room;
        ring_write(s, head + n, iov[i].iov_base, take);
        n += take;
        room -= take;
    }
    __atomic_store_n(&s->tx_head, head + n, __ATOMIC_RELAXED);
    STORE(&s->tx->head, head + n);
    moved(s, 0);
    wake_if_asleep(s, s->data_fd, &s->tx->readers_asleep, &s->tx->bells);
    return (ssize_t)n;
}

static ssize_t shm_recv(fb_transport_t *t, struct iovec *iov, int iovcnt)
{
    shm_t *s = (shm_t *)t;
    uint64_t avail = rx_avail(s), tail;
    uint32_t bells = PEEK(&s->rx->bells);
    size_t n = 0, take;
    /* The doorbell is emptied when the peer rang it since the last time,
     * before a second look at the ring (a bell rung meanwhile stays), so
     * that no thread polls awake for input read already. */
    if (bells != PEEK(&s->bells_seen)) {
        SET(&s->bells_seen, bells);
        drain(s, s->data_fd);
        avail = rx_avail(s);
    }
    if (avail > s->size) {
        errno = EPROTO;
        return -1;
    }
    if (avail == 0) {
        if (LOAD(&s->rx->closed) || LOAD(&s->peer_gone) || PEEK(&s->shut))
            return 0;
        errno = EAGAIN;
        return -1;
    }
    tail = PEEK(&s->rx_tail);
    for (int i = 0; i < iovcnt && avail > 0; i++) {
        take = iov[i].iov_len < avail ? iov[i].iov_len : (size_t)avail;
        ring_read(s, tail + n, iov[i].iov_base, take);
        n += take;
        avail -= take;
    }
    __atomic_store_n(&s->rx_tail, tail + n, __ATOMIC_RELAXED);
    STORE(&s->rx->tail, tail + n);
    moved(s, 1);
    wake_if_asleep(s, s->room_fd, &s->rx->writer_asleep, NULL);
    return (ssize_t)n;
}

static void shm_shutdown(fb_transport_t *t)
{
    shm_t *s = (shm_t *)t;
    if (__atomic_exchange_n(&s->shut, 1, __ATOMIC_SEQ_CST) || s->map == NULL)
        return;
    STORE(&s->tx->closed, 1);
    ring_bell(s->data_fd);
    ring_bell(s->room_fd);
    /* Our own end turns readable too: every poll here returns. */
    shutdown(s->sock, SHUT_RDWR);
}

static void shm_close(fb_transport_t *t)
{
    shm_t *s = (shm_t *)t;
    int fds[3] = {s->sock, s->data_fd, s->room_fd};
    close_all(fds, 3);
    s->sock = s->data_fd = s->room_fd = -1;
    if (s->map != NULL) {
        munmap(s->map, s->map_size);
        s->map = NULL;
    }
}

static void shm_destroy(fb_transport_t *t)
{
    shm_close(t);
    free(t);
}

static const fb_transport_ops_t SHM_OPS = {
    .send = shm_send, .recv = shm_recv, .wait = shm_wait, .shutdown = shm_shutdown,
    .close = shm_close, .destroy = shm_destroy,
};

/* ---- attaching ------------------------------------------------------------------------- */

static int is_unix_socket(int fd)
{
    struct stat st;
    int domain = 0;
    socklen_t len = sizeof(domain);
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)
           && getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

/* The region mapped and checked: its header's ring size, or 0 with err. */
static uint32_t map_region(int memfd, char **map, size_t *map_size, char *err, size_t errlen)
{
    const int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    struct stat st;
    shm_header_t *h;
    uint32_t ring;
    int seals = fcntl(memfd, F_GET_SEALS);
    if (seals < 0 || (seals & need) != need) {
        snprintf(err, errlen, "the shared memory region is not sealed against resizing");
        return 0;
    }
    if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)SHM_HEADER
            || st.st_size > (off_t)(SHM_HEADER + 2 * (size_t)FB_SHM_MAX_RING)) {
        snprintf(err, errlen, "the shared memory region has a wrong size");
        return 0;
    }
    *map_size = (size_t)st.st_size;
    *map = mmap(NULL, *map_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (*map == MAP_FAILED) {
        snprintf(err, errlen, "cannot map the shared memory region: %s", strerror(errno));
        *map = NULL;
        return 0;
    }
    h = (shm_header_t *)*map;
    ring = h->ring_size;
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION || ring < FB_SHM_MIN_RING
            || ring > FB_SHM_MAX_RING || (ring & (ring - 1)) != 0
            || *map_size != SHM_HEADER + 2 * (size_t)ring) {
        snprintf(err, errlen, "the shared memory region has a wrong header");
        munmap(*map, *map_size);
        *map = NULL;
        return 0;
    }
    return ring;
}

fb_transport_t *fb_transport_shm(int sock, int memfd, int data_fd, int room_fd, int side,
                                 char *err, size_t errlen)
{
    shm_t *s;
    char *map;
    size_t map_size;
    uint32_t ring;
    if (side != 0 && side != 1) {
        snprintf(err, errlen, "side must be 0 or 1");
        return NULL;
    }
    if (!is_unix_socket(sock) || !is_unix_socket(data_fd) || !is_unix_socket(room_fd)) {
        snprintf(err, errlen, "the shared memory transport needs Unix sockets");
        return NULL;
    }
    if ((ring = map_region(memfd, &map, &map_size, err, errlen)) == 0)
        return NULL;
    if ((s = calloc(1, sizeof(*s))) == NULL) {
        munmap(map, map_size);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->base.ops = &SHM_OPS;
    s->live_ns = LIVE_MIN_NS;
    s->sock = sock;
    s->data_fd = data_fd;
    s->room_fd = room_fd;
    s->map = map;
    s->map_size = map_size;
    s->size = ring;
    s->tx = &((shm_header_t *)map)->ring[side];
    s->rx = &((shm_header_t *)map)->ring[1 - side];
    s->me = &((shm_header_t *)map)->side[side];
    s->peer = &((shm_header_t *)map)->side[1 - side];
    s->tx_buf = map + SHM_HEADER + (size_t)side * ring;
    s->rx_buf = map + SHM_HEADER + (size_t)(1 - side) * ring;
    /* Fresh rings start at zero (calloc): indices the peer wrote otherwise
     * fail the connection at their first use. */
    return &s->base;
}

void fb_shm_stats(fb_transport_t *t, fb_shm_stats_t *out)
{
    shm_t *s = (shm_t *)t;
    out->waits = PEEK(&s->stats.waits);
    out->looks = PEEK(&s->stats.looks);
    out->looks_paid = PEEK(&s->stats.looks_paid);
    out->sleeps = PEEK(&s->stats.sleeps);
}
