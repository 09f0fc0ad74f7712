/* A remote input channel's buffers for its sender, and the credit that
 * announces them (Flink's BufferManager and credit-based flow control).
 *
 * A channel holds segments into which its sender's data buffers arrive:
 * exclusive ones of its own and floating ones borrowed from its gate when
 * the sender's backlog says more is coming.  Each held segment is one
 * credit; credit not yet told to the sender is announced with ADD_CREDIT.
 * Events need no segment: a window of FB_CREDIT_EVENT_WINDOW bounds them,
 * granted back (ADD_EVENT_CREDIT) as the consumer takes them.
 *
 * Pure bookkeeping: no locks (the caller holds the one that guards the
 * channel, and the one of the waiting list for fb_waitlist_*), no I/O, and
 * no pointer to a channel or a connection.  Functions that may call for a
 * message return what the caller is to do (fb_credit_action_t); the
 * caller queues it as values (type, receiver id) and reads the amount when
 * the frame is written (fb_credit_take_*), so one frame carries all the
 * credit gathered by then.  No Python API. */
#ifndef FLINKBUF_CREDIT_H
#define FLINKBUF_CREDIT_H

#include <stdint.h>

#include "common/status.h"

#define FB_CREDIT_EVENT_WINDOW 16

typedef struct fb_credit {
    int32_t *held;              /* segments held for the sender (a stack), and at the
                                 * top of the array the kept ones (fb_credit_keep) */
    uint8_t *held_floating;     /* 1: borrowed from the gate's floating buffers */
    int32_t nheld, nkept, cap;
    int32_t num_exclusive;
    int32_t limit;              /* buffer debloating: held + kept + data waiting for the
                                 * consumer stay under it (cap: no bound) */
    int32_t unannounced;        /* held, and not told to the sender yet */
    int32_t backlog;            /* buffers the sender said it has queued */
    int32_t wants;              /* floating segments asked for (under the waiting list's lock) */
    uint8_t queued;             /* an ADD_CREDIT is queued */
    uint8_t deferred;           /* ... and left for the consumer's next read */
    uint8_t event_queued;       /* an ADD_EVENT_CREDIT is queued */
    uint32_t events_received;   /* events that arrived ... */
    uint32_t events_granted;    /* ... and the events the sender was allowed */
    int32_t events_taken;       /* taken by the consumer, not yet granted back */
} fb_credit_t;

/* What the caller is to do about an ADD_CREDIT (or ADD_EVENT_CREDIT). */
typedef enum fb_credit_action {
    FB_CREDIT_NOTHING = 0,      /* nothing: none is due, or one is queued already */
    FB_CREDIT_SEND,             /* queue one; the sender may be idle: send it now */
    FB_CREDIT_BATCH,            /* queue one; the sender streams: the writer batches it */
    FB_CREDIT_DEFER,            /* queue one, and leave it for the consumer's next read */
    FB_CREDIT_SEND_QUEUED       /* the deferred one must go now (the sender runs short) */
} fb_credit_action_t;

/* Room for `cap` held segments: FB_OK or FB_ENOMEM (fb_credit_free either way). */
int fb_credit_init(fb_credit_t *cr, int32_t cap);
void fb_credit_free(fb_credit_t *cr);

/* Before the request: one exclusive segment.  FB_OK, or FB_ESTATE when full. */
int fb_credit_add_exclusive(fb_credit_t *cr, int32_t index);
/* A segment (exclusive, or floating) to hold for the sender as one more
 * credit: 1 held, 0 full (the caller keeps the segment). */
int fb_credit_hold(fb_credit_t *cr, int32_t index, int floating);
/* After a hold: whether an ADD_CREDIT is due.  `open`: the channel and its
 * connection may send (else nothing is queued, the credit waits for the
 * request); `consumer_reads`: the consumer reads the socket itself now, so
 * credit can wait for its next read unless the sender runs short. */
fb_credit_action_t fb_credit_announce(fb_credit_t *cr, int open, int consumer_reads);
/* The ADD_CREDIT could not be queued (out of memory): it is not pending. */
void fb_credit_unqueue(fb_credit_t *cr);
/* Writing the queued ADD_CREDIT: the credit it carries (0: none to send). */
int32_t fb_credit_take_announcement(fb_credit_t *cr);
/* Writing a PARTITION_REQUEST: its initial credit, every held segment. */
int32_t fb_credit_take_initial(fb_credit_t *cr);

/* A data buffer arrives: the segment it goes into (0), or -1 when the
 * sender had no credit (a protocol error). */
int fb_credit_consume(fb_credit_t *cr, int32_t *index, int *floating);
/* A lent buffer arrived instead (it needs no segment of ours): keep the one
 * its credit consumed aside until the lent buffer is recycled (always room:
 * the consume made it). */
void fb_credit_keep(fb_credit_t *cr, int32_t index, int floating);
/* A lent buffer was recycled: a kept segment to give back (0; the caller
 * holds it for the sender again), or -1 when none is kept. */
int fb_credit_unkeep(fb_credit_t *cr, int32_t *index, int *floating);
/* The channel ends: every held and kept segment is given up (*n of them,
 * the arrays stay valid until fb_credit_free); no credit is left to
 * announce. */
void fb_credit_release_all(fb_credit_t *cr, const int32_t **held, const uint8_t **floating,
                           int32_t *n);
/* The sender has `backlog` buffers queued: floating segments wanted to hold
 * backlog + exclusive ones (0 if none). */
int32_t fb_credit_need(fb_credit_t *cr, int32_t backlog);
/* How many more segments the channel may hold for its sender while
 * `waiting` data buffers wait for its consumer (0: none; a recycled
 * segment then goes back to its pool).  Without a bound (buffer
 * debloating's), only the array's room counts. */
int32_t fb_credit_room(const fb_credit_t *cr, int32_t waiting);
/* The limit of fb_credit_room: n >= 1, or n > cap (or n <= 0) for none. */
void fb_credit_set_limit(fb_credit_t *cr, int32_t n);
/* Held segments, counted by kind. */
void fb_credit_counts(const fb_credit_t *cr, int32_t *exclusive, int32_t *floating);

/* Events.  A new request starts a fresh window. */
void fb_credit_reset_events(fb_credit_t *cr);
/* An event arrives: 0, or -1 beyond the window (a protocol error). */
int fb_credit_event_arrives(fb_credit_t *cr);
/* The consumer took one: FB_CREDIT_SEND to queue an ADD_EVENT_CREDIT, or
 * FB_CREDIT_NOTHING (one is queued, or not `open`). */
fb_credit_action_t fb_credit_event_taken(fb_credit_t *cr, int open);
void fb_credit_event_unqueue(fb_credit_t *cr);
/* Writing the queued ADD_EVENT_CREDIT: the events it grants (0: none);
 * `open` 0 drops them. */
int32_t fb_credit_take_event_grant(fb_credit_t *cr, int open);

/* ---- a gate's waiting list for floating segments ------------------------------- */

/* Channels that want floating segments, oldest first (Flink's buffer
 * listeners).  The caller holds the list's lock around every call. */
typedef struct fb_waitlist {
    fb_credit_t **waiting;
    int32_t n, cap;
} fb_waitlist_t;

/* `cr` wants up to `need` segments (first come, first served): FB_OK or FB_ENOMEM. */
int fb_waitlist_want(fb_waitlist_t *wl, fb_credit_t *cr, int32_t need);
/* A segment came back: the channel waiting longest, with one want fewer
 * (off the list when it wants no more); NULL if none waits. */
fb_credit_t *fb_waitlist_pop(fb_waitlist_t *wl);
/* `cr` got a segment on its own: 1 if it still wanted one (one want fewer). */
int fb_waitlist_took(fb_waitlist_t *wl, fb_credit_t *cr);
/* `cr` wants nothing any more. */
void fb_waitlist_remove(fb_waitlist_t *wl, fb_credit_t *cr);
void fb_waitlist_free(fb_waitlist_t *wl);

#endif
