/* Lending segments across processes: over the shared-memory transport a
 * producer whose pool is a shared arena (buffer/arena.h) sends a consumer
 * on this host the number of the segment a buffer is in, not its bytes
 * (BUFFER_LENT); the consumer, which mapped that arena read-only, reads the
 * segment in place and names it in a RELEASE once its buffer is recycled.
 *
 * Consumer side, fb_lease_t: the peer's arena mapped read-only, and which
 * of its segments this process holds.  A held segment is an fb_item_t whose
 * pool is the lease's (fb_lease_pool): its recycle, in any thread, hands it
 * to the release function (which queues the RELEASE) until the connection
 * detaches, and then its tag to the untag function; the mapping stays until
 * the last held segment is recycled.
 *
 * Producer side, fb_lent_t: what this process lent to one peer (segment ->
 * the pool it returns to, and its owner's reference).  A segment goes back
 * to its pool only when the peer released it, or, once the connection is
 * over, when the ledger shows the peer let go of it or the peer process
 * ended (fb_lent_reap): never while the other side may still read it.
 *
 * The ledger: a small memfd of the lender's, one per connection, that both
 * map read-write: FB_LEDGER_HEADER bytes (a word the borrower sets as its
 * connection ends: FB_LEDGER_DETACHED, nothing more will be taken, or
 * FB_LEDGER_LET_GO, nothing of the arena is read any more: what it still
 * held it copied into memory of its own), then one byte per segment of the
 * arena: FB_LEDGER_LENT (set by the lender before it sends the frame),
 * FB_LEDGER_HELD (the borrower took it), 0 (the borrower recycled it).  A
 * live connection goes by its RELEASE frames; the ledger is read only after
 * it ended, so a peer process that lives on (a reused worker) gives back
 * what it no longer holds.  A borrower that lies in it only harms itself:
 * it can make the lender reuse a segment it still reads.
 *
 * A connection's end gives every lent segment back at once when the
 * borrower's side ended first or let go (fb_lent_let_go): an honest
 * borrower lets go (fb_lease_let_go) before its side of the connection
 * ends, and one that does not (a hoarder) loses only its own view.
 *
 * Locking: each lease has its own mutex, held while the release function
 * runs (which may take its connection's lock: order lease -> connection);
 * the untag function runs with no lock held; a lent table is the caller's
 * to lock.  No Python API. */
#ifndef FLINKBUF_LEASE_H
#define FLINKBUF_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "buffer/pool.h"
#include "io/exchange.h"

typedef struct fb_lease fb_lease_t;

#define FB_LEDGER_HEADER 64
#define FB_LEDGER_LENT 1
#define FB_LEDGER_HELD 2
#define FB_LEDGER_DETACHED 1            /* the header word: nothing more is taken */
#define FB_LEDGER_LET_GO 2              /* ... and nothing of the arena is read */

/* Called with a released segment's number (the lease's lock held). */
typedef void (*fb_lease_release_t)(void *arg, uint32_t segment);
/* Called with a released segment's tag (no lock held), also after detach. */
typedef void (*fb_lease_untag_t)(void *tag);

/* Map the arena in `memfd` (the peer's) read-only, for segments of
 * segment_size bytes, and the ledger in `ledger_fd` read-write (neither fd
 * is kept: the caller closes them).  Both must be sealed against shrinking
 * (no SIGBUS under a reader), and the ledger must have a byte for every
 * segment.  NULL with why in err. */
fb_lease_t *fb_lease_map(int memfd, int ledger_fd, int32_t segment_size, char *err,
                         size_t errlen);
/* Where releases go from now on (fn NULL: nowhere), and what is called
 * with the tag of each recycled segment (set once, before any take). */
void fb_lease_set_release(fb_lease_t *l, fb_lease_release_t fn, void *arg,
                          fb_lease_untag_t untag);
/* A BUFFER_LENT named `segment` with `size` bytes: *out is the item that
 * holds it.  0, EPROTO when the segment is outside the arena or held
 * already (the producer lent it twice), or ESHUTDOWN once the lease let go
 * or detached (the connection is ending: the frame is dropped). */
int fb_lease_take(fb_lease_t *l, uint32_t segment, uint32_t size, fb_item_t *out);
/* Tag a segment just taken (before its item leaves the caller): the tag
 * goes to the untag function when the segment is recycled. */
void fb_lease_tag(fb_lease_t *l, uint32_t segment, void *tag);
/* The connection ends (before its side does): no more takes or releases,
 * and every segment still held is copied into memory of this process's
 * own at the same address (what reads it reads the same bytes, none of
 * the arena); the ledger says so (FB_LEDGER_LET_GO).  0, or -1 when out of
 * memory (those stay shared; the ledger says FB_LEDGER_DETACHED).
 * Idempotent. */
int fb_lease_let_go(fb_lease_t *l);
/* The connection is gone: its reference goes (the lease is freed once
 * nothing is held); it lets go first if it did not. */
void fb_lease_detach(fb_lease_t *l);
/* 1 if lp is a lease's pool (an item of it is a lent segment). */
int fb_lease_is(const fb_localpool_t *lp);
/* Segments held now; segments the arena has. */
int32_t fb_lease_held(fb_lease_t *l);
int32_t fb_lease_segments(const fb_lease_t *l);

/* ---- producer side ---------------------------------------------------------- */

/* Who keeps a lent segment's pool alive: a reference-counted owner (the
 * served partition), dropped with drop(ctx, owner) when the last one goes. */
typedef struct fb_owner_ref {
    int refs;                               /* atomic */
    void *owner;
    void (*drop)(void *ctx, void *owner);
    void *ctx;
} fb_owner_ref_t;

fb_owner_ref_t *fb_owner_ref_new(void *owner, void (*drop)(void *, void *), void *ctx);
void fb_owner_ref_hold(fb_owner_ref_t *ln);
void fb_owner_ref_put(fb_owner_ref_t *ln);

typedef struct fb_lent {
    const fb_netpool_t *np;                 /* the arena lent from */
    int32_t num_segments;                   /* its segments (np may go before the table) */
    fb_localpool_t **pool;                  /* per segment: where it returns, NULL: not lent */
    fb_owner_ref_t **lender;
    int32_t count;
    uint8_t *ledger;                        /* mapped, or NULL */
    size_t ledger_size;
} fb_lent_t;

/* A new ledger for an arena of num_segments segments: a sealed memfd, or
 * -1 with errno set. */
int fb_ledger_new(int32_t num_segments);
/* 0, ENOMEM, or EINVAL when ledger_fd (not kept) is not a ledger for np. */
int fb_lent_init(fb_lent_t *t, const fb_netpool_t *np, int ledger_fd);
/* Record a lent segment (takes a reference of ln) and mark it in the
 * ledger. */
void fb_lent_put(fb_lent_t *t, int32_t segment, fb_localpool_t *pool, fb_owner_ref_t *ln);
/* The peer released `segment`: 0 and what to give it back to, or EPROTO
 * when it was not lent. */
int fb_lent_take(fb_lent_t *t, uint32_t segment, fb_localpool_t **pool, fb_owner_ref_t **ln);
/* The borrower let go of everything (its ledger says FB_LEDGER_LET_GO). */
int fb_lent_let_go(const fb_lent_t *t);
/* Every segment of the table goes back to its pool now (no lock of the
 * caller held: recycles run hooks). */
void fb_lent_give_back_all(fb_lent_t *t);
/* The connection is over: whatever is still lent goes back, in a thread of
 * its own, as the ledger shows the peer let go of it, and all of it once
 * the peer process (pidfd, which this takes) has ended; with pidfd < 0,
 * never.  The table is empty afterwards (and freed). */
void fb_lent_reap(fb_lent_t *t, int pidfd);
void fb_lent_free(fb_lent_t *t);

#endif
