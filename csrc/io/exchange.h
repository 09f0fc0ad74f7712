/* Local exchange between tasks: subpartition queues and input-gate readiness.
 *
 * A subpartition is a FIFO of items (finished data buffers and serialized
 * events) written by one producer thread and read by one consumer.  An item
 * is plain memory, no Python object: a pooled segment (returned through its
 * pool's ops) or malloc'd bytes (freed), so that threads without the GIL (the
 * network layer's) can send, receive and dispose of items.  Whoever takes an
 * item out of a queue owns it and disposes of it once (fb_item_dispose);
 * a terminate call hands back whatever was queued.  A subpartition may be connected to one gate;
 * whenever it turns non-empty it tells the gate, which keeps a FIFO of the
 * channels that have data (each at most once) so a consumer serves its
 * channels in turn and sleeps on a condition variable while none has data.
 *
 * Locking: each subpartition and each gate has its own mutex; the only nesting
 * is subpartition -> gate (a subpartition notifies its gate under its own lock,
 * which keeps the gate pointer valid: a gate disconnects under that same lock
 * before it is freed).  Blocking calls must be made without the GIL.  No
 * Python API.
 *
 * Calls out of this unit are the hooks a layer above sets, under this
 * contract (the pool's, pool.h):
 *  - a gate hook's `ready` (fb_gate_hook_t) runs in the adding thread once
 *    the subpartition's lock is released; it may send without waiting;
 *  - a lender (common/waiter.h, under that contract) serves a thread whose
 *    gate wait would sleep: the consumer reads the connection of the gate's
 *    first remote channel itself; its wake is called by other threads' adds
 *    and by a close. */
#ifndef FLINKBUF_EXCHANGE_H
#define FLINKBUF_EXCHANGE_H

#include <pthread.h>
#include <stdint.h>

#include "common/status.h"    /* result codes */
#include "common/clock.h"     /* deadlines: fb_deadline_after, FB_WAIT_FOREVER */
#include "buffer/pool.h"      /* fb_localpool_t: where a segment item returns (through its ops) */
#include "common/waiter.h"    /* the lender a waiting consumer may serve */

/* Item kinds. */
enum { FB_ITEM_DATA = 0, FB_ITEM_EVENT = 1 };

/* Subpartition states. */
enum { FB_SP_LIVE = 0, FB_SP_RELEASED = 1, FB_SP_FAILED = 2 };

typedef struct fb_item {
    char *data;             /* the bytes */
    fb_localpool_t *pool;   /* a pooled segment: the pool it returns to; NULL: malloc'd */
    int32_t index;          /* the segment's number in its network pool */
    int32_t kind;           /* FB_ITEM_DATA or FB_ITEM_EVENT */
    int32_t size;           /* bytes at data */
} fb_item_t;

/* Give an item's memory back, once: its segment to its pool, or free(). */
void fb_item_dispose(fb_item_t *item);
/* Dispose of n items, then free() the array (as a terminate call returns it). */
void fb_items_dispose(fb_item_t *items, int32_t n);

/* What a gate's owner may do instead of the gate waking its waiter when a
 * producer's add makes a subpartition ready (the network writer: send it in
 * the producer's thread).  `ready` runs in the adding thread once the
 * subpartition's lock is released (hold/release keep `arg` alive from under
 * that lock until then); it must wake the waiter itself (fb_gate_wake) when
 * it does not serve the channel. */
typedef struct fb_gate_hook {
    void (*ready)(void *arg);
    void (*hold)(void *arg);
    void (*release)(void *arg);
    void *arg;
} fb_gate_hook_t;


typedef struct fb_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t num_channels;
    int32_t *ready;   /* ring of channel indices with data */
    uint8_t *queued;  /* per channel: in the ring */
    int32_t head, count;
    int32_t waiters;
    int closed;
    int initialized;
    const fb_gate_hook_t *hook;   /* NULL: adds wake the waiter (set before connecting) */
    fb_waitpoint_t wp;            /* the lender a waiting consumer may serve */
} fb_gate_t;

/* A counter that consumers bump and a producer can sleep on: "something was
 * consumed" (a subpartition's backlog went down, or it was terminated). */
typedef struct fb_signal {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t seq;      /* atomic */
    int32_t waiters;   /* atomic */
    int initialized;
} fb_signal_t;

typedef struct fb_subpart {
    pthread_mutex_t mu;
    fb_item_t *ring;   /* NULL once terminated with items (handed to the caller) */
    int32_t cap, head, count;
    int32_t backlog;   /* data items queued; written under mu, read atomically */
    int32_t events;    /* event items queued; written under mu, read atomically */
    int32_t state;     /* FB_SP_*; written under mu, read atomically */
    int32_t finished;  /* the producer added its last item */
    int32_t buffer_size; /* the size its consumer announced (0: whole segments; -n: n,
                          * the size it starts at, no consumer said yet); atomic */
    fb_gate_t *gate;   /* consumer to notify, or NULL */
    int32_t gate_channel;
    fb_signal_t *on_poll; /* posted after every poll and on termination */
    int initialized;
} fb_subpart_t;

/* ---- gate ---- */
int fb_gate_init(fb_gate_t *g, int32_t num_channels);     /* FB_OK / FB_ENOMEM */
void fb_gate_free(fb_gate_t *g);                           /* no waiter may remain */
/* Mark `channel` as having data (no-op if already marked) and wake a waiter. */
void fb_gate_notify(fb_gate_t *g, int32_t channel);
/* Mark `channel` as having data without waking anyone (the caller serves
 * it, or wakes the waiter with fb_gate_wake). */
void fb_gate_mark(fb_gate_t *g, int32_t channel);
/* Wake a waiter if some channel has data. */
void fb_gate_wake(fb_gate_t *g);
/* Wait until some channel has data and take it off the ring:
 * FB_OK (channel in *channel), FB_ETIMEDOUT, or FB_ECLOSED.  Deadlines
 * are clock.h's: FB_WAIT_FOREVER, or a time (one that passed: no waiting). */
int fb_gate_wait(fb_gate_t *g, int64_t deadline_ns, int32_t *channel);
/* Wake every waiter with FB_ECLOSED, now and later. */
void fb_gate_close(fb_gate_t *g);
/* Offer a reader (none yet: 1, taken; else 0); withdraw it (if arg's). */
int fb_gate_set_reader(fb_gate_t *g, const fb_lender_t *r);
void fb_gate_clear_reader(fb_gate_t *g, void *arg);
/* A reader starts waiting in this thread: adds from other threads call
 * wake(arg) until fb_gate_direct_end.  1: the gate has data or is closed
 * already (do not wait). */
int fb_gate_direct_begin(fb_gate_t *g, void (*wake)(void *), void *arg);
void fb_gate_direct_end(fb_gate_t *g);
/* The gate has data or is closed (a racy look, for a reader's loop). */
int fb_gate_ready(fb_gate_t *g);

/* ---- signal ---- */
int fb_signal_init(fb_signal_t *s);                        /* FB_OK / FB_ENOMEM */
void fb_signal_free(fb_signal_t *s);
void fb_signal_post(fb_signal_t *s);
uint64_t fb_signal_seq(fb_signal_t *s);
/* Wait until the counter differs from `seen`: FB_OK or FB_ETIMEDOUT. */
int fb_signal_wait(fb_signal_t *s, uint64_t seen, int64_t deadline_ns);

/* ---- subpartition ---- */
/* `on_poll` (may be NULL) must outlive the subpartition. */
int fb_subpart_init(fb_subpart_t *sp, fb_signal_t *on_poll); /* FB_OK / FB_ENOMEM */
void fb_subpart_free(fb_subpart_t *sp);                    /* caller drained it first */
/* Append an item; `last` marks the producer's final item.  FB_ERELEASED or
 * FB_EFAILED (the item was not taken), FB_ESTATE after the last item,
 * FB_ENOMEM. */
int fb_subpart_add(fb_subpart_t *sp, fb_item_t item, int last);
/* Take the oldest item: FB_OK, FB_EMPTY, FB_EFAILED, FB_ERELEASED.
 * If items remain the connected gate is told again (fair turns). */
int fb_subpart_poll(fb_subpart_t *sp, fb_item_t *out);
/* For a reader over the network: take the oldest item, a data buffer while
 * credit > 0, an event while event_credit > 0.  FB_OK (*last: it was the
 * producer's last item), FB_EMPTY (nothing, or an item waiting for its
 * credit: the gate is not told again until someone notifies it),
 * FB_EFAILED, FB_ERELEASED. */
int fb_subpart_poll_credit(fb_subpart_t *sp, int32_t credit, int32_t event_credit,
                           fb_item_t *out, int *last);
/* Connect a consumer: FB_ESTATE if one is connected or it was released. */
int fb_subpart_connect(fb_subpart_t *sp, fb_gate_t *g, int32_t channel);
void fb_subpart_disconnect(fb_subpart_t *sp, fb_gate_t *g);
/* Move to `state` (FB_SP_RELEASED or FB_SP_FAILED; a terminated subpartition
 * keeps its first state) and hand every queued item to the caller: *out is an
 * array of the returned count, oldest first (NULL when 0), which the caller
 * frees with free().  Never fails and never allocates (the queue's own
 * storage is handed over), so teardown paths can always recycle what was
 * queued.  The gate is told. */
int32_t fb_subpart_terminate(fb_subpart_t *sp, int32_t state, fb_item_t **out);
int32_t fb_subpart_backlog(const fb_subpart_t *sp);
/* The buffer size the consumer announced (buffer debloating): the producer
 * finishes buffers at that many bytes; 0 (the start): whole segments.  Any
 * thread; the caller checks the size (> 0, at most a segment). */
void fb_subpart_set_buffer_size(fb_subpart_t *sp, int32_t size);
int32_t fb_subpart_buffer_size(const fb_subpart_t *sp);
int32_t fb_subpart_events(const fb_subpart_t *sp);         /* events queued */
int32_t fb_subpart_state(const fb_subpart_t *sp);
int32_t fb_subpart_size(fb_subpart_t *sp);                 /* items queued */
/* Nothing is left for the consumer: its reader took the producer's last
 * item, or the subpartition was released or failed. */
int fb_subpart_drained(fb_subpart_t *sp);

#endif
