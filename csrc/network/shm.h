/* The shared-memory transport: two processes on one host exchange frames
 * through a pair of byte rings in memory both map, with the Unix socket
 * they connected over kept only to learn when the other process ends.
 *
 * The server makes the region (fb_shm_region_new): a sealed memfd, which
 * has no name in any file system and disappears with the last process
 * that maps it, plus two socketpairs of doorbells, and passes the memfd
 * and the client's doorbells over the Unix socket (SCM_RIGHTS).  Each side
 * then attaches (fb_transport_shm), which checks everything it was given:
 * the seals (nobody can shrink the region under a reader: no SIGBUS), the
 * size, the header, the descriptor kinds.
 *
 * Ring s is written by side s and read by the other.  A writer publishes
 * its head after copying, a reader its tail; each keeps its own copy of
 * its index and checks the other's (a peer that corrupts the shared
 * indices fails the connection, it cannot make this side read or write
 * outside the ring).  A waiter counts itself as a sleeper and polls its
 * doorbell, which the other side rings only when it sees a sleeper; before
 * that it looks at the ring only while the look pays: while the peer runs
 * on another CPU (each side publishes when and where it last moved bytes,
 * hints that garbage cannot turn into more than a bounded look).  No locks,
 * no Python API. */
#ifndef FLINKBUF_SHM_H
#define FLINKBUF_SHM_H

#include <stddef.h>
#include <stdint.h>

#include "network/transport.h"

/* The descriptors of a region: the memfd, then each side's two doorbells
 * (ends of two socketpairs: a byte on one end wakes whoever polls the
 * other).  Doorbells are sockets, not eventfds, so that every read and
 * write of them can be made non-blocking per call (MSG_DONTWAIT): the
 * peer shares their file descriptions and could change their flags. */
enum {
    FB_SHM_MEMFD = 0,
    FB_SHM_DATA0 = 1,    /* side 0 waits here for input */
    FB_SHM_ROOM0 = 2,    /* side 0 waits here for room to send */
    FB_SHM_DATA1 = 3,
    FB_SHM_ROOM1 = 4,
    FB_SHM_NFDS = 5
};

#define FB_SHM_MIN_RING (4u * 1024)
#define FB_SHM_MAX_RING (64u * 1024 * 1024)

/* The ring size for a segment size: a power of two of 16 segments, within
 * [FB_SHM_MIN_RING, 4 MiB]. */
uint32_t fb_shm_ring_size(int32_t segment_size);

/* Make a region with rings of ring_size bytes (a power of two within the
 * bounds) and its doorbells into fds[FB_SHM_NFDS] (the caller's, close-on-
 * exec; the pages are allocated now, so that touching them later cannot
 * fail): 0, or an errno (nothing left open). */
int fb_shm_region_new(uint32_t ring_size, int fds[FB_SHM_NFDS]);

/* How a transport's waits went: `waits` found nothing ready at once; of
 * them `looks` looked at the ring before sleeping (the peer was running),
 * `looks_paid` found what they waited for while looking; `sleeps` slept
 * on a doorbell. */
typedef struct fb_shm_stats {
    int64_t waits, looks, looks_paid, sleeps;
} fb_shm_stats_t;

/* A transport over the region in `memfd` for `side` (0: the server, 1: the
 * client), waiting on the side's doorbells `data_fd` and `room_fd`, and
 * owning, on success, the connected Unix socket `sock` and the two
 * doorbells (the memfd is only mapped: the caller closes it).  NULL with a
 * reason in err when something is not as it should be (every descriptor
 * stays the caller's then). */
fb_transport_t *fb_transport_shm(int sock, int memfd, int data_fd, int room_fd, int side,
                                 char *err, size_t errlen);

/* The wait counters of a transport made by fb_transport_shm. */
void fb_shm_stats(fb_transport_t *t, fb_shm_stats_t *out);

#endif
