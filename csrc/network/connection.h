/* One connection between two processes: the network layer's data path,
 * and its contract with the Cython layer (flinkbuf/csrc/connection.pxd).
 *
 * A connection carries every channel between two processes, in both
 * directions (docs/PROTOCOL.md): it serves subpartitions of this process to
 * readers over there (out-channels: the producer's side) and reads
 * subpartitions over there into input gates here (in-channels: the
 * consumer's side).  Two threads per connection, both plain C and never
 * holding the GIL: the reader parses frames and receives buffer bodies
 * straight into pool segments; the writer sends buffers of served
 * subpartitions as their credit allows (header and segment in one vectored
 * send), and the control messages (requests, credit, errors, heartbeats).
 * Sent segments go back to the producer's pool through its ops; received
 * ones reach the consumer through an fb_subpart_t queue, and when the
 * consumer recycles them a pool recycle hook gives them back to their
 * channel as credit.  conn_internal.h names the units that implement it.
 *
 * Credit-based flow control as in Flink: each in-channel has exclusive
 * buffers (a local pool of its own) and borrows from its gate's floating
 * buffers (fb_floating_t) when the sender's backlog says more is coming.
 *
 * Locking: conn->mu guards the connection's tables and every channel's
 * credit state; fb_floating_t.mu guards a gate's waiting list.  Order:
 * conn->mu -> subpartition -> gate (the exchange's order) and conn->mu ->
 * pool; conn->mu and floating->mu are never held together.  Recycle hooks
 * run outside the pool lock.  The owner's callbacks (which take the GIL)
 * are called with no lock held.  No Python API. */
#ifndef FLINKBUF_CONNECTION_H
#define FLINKBUF_CONNECTION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "io/exchange.h"
#include "buffer/pool.h"
#include "common/status.h"
#include "network/credit.h"
#include "network/transport.h"
#include "network/wire.h"   /* frame constants, FB_NET_ERR_* codes */

/* Events a reader may have outstanding per channel (sent and not taken by
 * its consumer): events need no buffer, but their own window bounds them. */
#define FB_NET_EVENT_WINDOW FB_CREDIT_EVENT_WINDOW

typedef struct fb_conn fb_conn_t;
typedef struct fb_inchan fb_inchan_t;
typedef struct fb_floating fb_floating_t;

/* What the owner (the Cython layer) does for a connection.  Called from the
 * connection's threads with no lock held; they take the GIL themselves. */
typedef struct fb_conn_callbacks {
    void *ctx;
    /* A PARTITION_REQUEST: the subpartition to serve, the pool its buffers
     * come from, and an owner reference that keeps both alive (released with
     * release_owner), or an FB_NET_ERR_* code with a message in errbuf. */
    int (*find_subpartition)(void *ctx, const char *partition_id, size_t len,
                             uint32_t subpartition, fb_subpart_t **sp, void **owner,
                             fb_localpool_t **pool, char *errbuf, size_t errlen);
    /* A served subpartition failed: its cause's type name and message. */
    void (*describe_failure)(void *ctx, void *owner, char *type, size_t tlen,
                             char *message, size_t mlen);
    /* The reference goes: the subpartition's reader ended (or the request
     * was not served) and no buffer of the pool is lent to the peer any more
     * (possibly in another thread, after the connection was freed: it must
     * not use the connection). */
    void (*release_owner)(void *ctx, void *owner);
} fb_conn_callbacks_t;

/* Per-connection counters (read without a lock; monotonic). */
typedef struct fb_conn_stats {
    int64_t bytes_in, bytes_out, frames_in, frames_out, buffers_in, buffers_out;
    int64_t frames_in_direct;   /* of frames_in: read by a consumer's own thread */
} fb_conn_stats_t;

/* ---- connection ----------------------------------------------------------- */

/* A connection over the transport `t` (connected and authenticated; the
 * connection owns it from here, and destroys it if this fails), whose
 * buffers are `segment_size` bytes on both sides.  A peer silent for a
 * quarter of `io_timeout` (seconds) is asked for a heartbeat, which its
 * connection's threads answer; one silent for the whole of it (stopped, or
 * stalled in the middle of a frame) fails the connection.  The caller holds
 * one reference.  NULL when out of memory. */
fb_conn_t *fb_conn_new(fb_transport_t *t, int32_t segment_size, const fb_conn_callbacks_t *cb,
                       double io_timeout);
/* Before the start, over shared memory with another process on this host:
 * buffers of `np` (a shared pool, whose memfd the peer mapped) are lent,
 * not copied, each for a credit as a copied one; `pidfd` (taken) is the
 * peer process, whose end gives back what it still holds; ledger_fd (not
 * kept: fb_ledger_new, passed to the peer) shows after the connection what
 * the peer let go of.  When the peer's side ends first (or its ledger says
 * it let go of everything), every lent segment comes back at once,
 * whatever it held.  0, ENOMEM, or EINVAL (not a ledger for np). */
int fb_conn_lend(fb_conn_t *c, const fb_netpool_t *np, int pidfd, int ledger_fd);
/* Before the start: map the peer's arena (memfd) to read the buffers it
 * lends, and its ledger (neither fd is kept).  Before this side of the
 * connection ends, what it still holds of the arena is copied into memory
 * of its own (the buffers read the same bytes), so that the peer may take
 * every segment back.  0, or -1 with why in err. */
int fb_conn_borrow(fb_conn_t *c, int memfd, int ledger_fd, char *err, size_t errlen);
/* Buffers lent to the peer now; the peer's held here now. */
int32_t fb_conn_lent(fb_conn_t *c);
int32_t fb_conn_borrowed(fb_conn_t *c);
/* Before the start: whether a producer's thread whose add makes a served
 * subpartition ready sends it itself when the writer thread is idle (non-
 * blocking; what the socket does not take goes to the writer thread), and
 * a thread that queues control messages (credit) sends them likewise (0:
 * every send is the writer thread's). */
/* Consumers' threads waiting on a gate may read the socket themselves
 * (default on; off: only the reader thread reads). */
void fb_conn_set_direct_reads(fb_conn_t *c, int on);
void fb_conn_set_caller_sends(fb_conn_t *c, int on);
/* Start the reader and writer threads: FB_OK, FB_ENOMEM, or FB_ESTATE
 * (started before, or closed). */
int fb_conn_start(fb_conn_t *c);
/* Close: a CLOSE_REQUEST if the connection is open, then both threads end
 * and every channel on it fails (FB_NET_ERR_CLOSED) or ends; waits for the
 * threads (no GIL!).  Buffers the peer lent are copied if still held
 * before this side ends; buffers lent to it come back (at once if the
 * peer's side let go).  Idempotent. */
void fb_conn_close(fb_conn_t *c);
/* References: the owner's, and its channels' and lenders'.  The owner
 * closes the connection before it drops its own; the last reference frees
 * the memory. */
void fb_conn_incref(fb_conn_t *c);
void fb_conn_decref(fb_conn_t *c);
/* 1 while the connection can carry new channels. */
int fb_conn_is_open(fb_conn_t *c);
/* Why it ended: an FB_NET_ERR_* code (0 while open) and a message. */
int fb_conn_error(fb_conn_t *c, char *buf, size_t len);
void fb_conn_stats(fb_conn_t *c, fb_conn_stats_t *out);
int32_t fb_conn_num_channels(fb_conn_t *c);  /* in + out channels live now */

/* ---- floating buffers of one input gate ---------------------------------------- */

/* The floating buffers of a gate: `pool` (the gate's local pool) lends its
 * segments to the gate's in-channels that wait for buffers.  The caller
 * holds one reference; before the pool goes it detaches (its channels are
 * closed by then), which clears the pool's hook. */
fb_floating_t *fb_floating_new(fb_localpool_t *pool);
void fb_floating_detach(fb_floating_t *f);
void fb_floating_decref(fb_floating_t *f);

/* ---- in-channels: reading a subpartition over there ----------------------------- */

/* A channel that reads subpartition `subpartition` of `partition_id` over
 * `c`, receiving into `exclusive` (a local pool of its own, whose segments
 * the caller adds with fb_inchan_add_exclusive before registering) and
 * borrowing from `floating` (or NULL).  The caller holds one reference. */
fb_inchan_t *fb_inchan_new(fb_conn_t *c, const char *partition_id, size_t len,
                           uint32_t subpartition, fb_localpool_t *exclusive,
                           fb_floating_t *floating, int64_t request_deadline_ns);
/* One exclusive segment (of `exclusive`, handed out to the caller). */
int fb_inchan_add_exclusive(fb_inchan_t *ch, int32_t index);
/* Register on the connection and send the PARTITION_REQUEST (initial credit:
 * the exclusive segments): FB_OK, FB_ECLOSED, or FB_EINVAL past the channel
 * cap.  Not-found answers are retried (50 ms, doubling up to 1 s) until the
 * deadline. */
int fb_inchan_open(fb_inchan_t *ch);
/* The received items, for the consumer's gate (fb_subpart_connect/poll). */
fb_subpart_t *fb_inchan_queue(fb_inchan_t *ch);
/* The consumer is done (end of partition, or it closed early): a
 * CANCEL_PARTITION_REQUEST unless the stream ended, then every segment the
 * channel holds goes back to its pool.  Waits (no GIL!) for a receive into
 * one of its segments in progress.  Idempotent. */
void fb_inchan_close(fb_inchan_t *ch);
/* Offer the channel's connection as the gate's reader (a lender, common/waiter.h:
 * its consumer receives from the socket itself while waiting): 1 if taken
 * (a gate has one), 0 if the gate has a reader already.  Detach before the
 * channel leaves the gate. */
int fb_inchan_attach_reader(fb_inchan_t *ch, fb_gate_t *g);
void fb_inchan_detach_reader(fb_inchan_t *ch, fb_gate_t *g);
void fb_inchan_decref(fb_inchan_t *ch);
/* The consumer took an event of this channel (its gate polled it): one more
 * event may come (an ADD_EVENT_CREDIT is scheduled). */
void fb_inchan_event_taken(fb_inchan_t *ch);
/* Buffer debloating: tell the sender to finish this channel's buffers at
 * `size` bytes (the caller checked it: fb_wire_min_buffer_size to the
 * segment size).  Any thread.  One NEW_BUFFER_SIZE at a time carries the
 * latest size when it is written (announcing while one waits changes only
 * its size), at most one a millisecond; a channel whose request was not
 * written yet, or is retried, sends it right after its PARTITION_REQUEST; a
 * channel that ended ignores it. */
void fb_inchan_announce_buffer_size(fb_inchan_t *ch, int32_t size);
/* Buffer debloating: the channel holds at most `n` segments for its sender
 * and its consumer together (n <= 0: no bound); a segment recycled beyond
 * them goes back to its pool (an exclusive one is taken back when the
 * bound rises).  No lock held, not from a recycle hook. */
void fb_inchan_set_buffer_limit(fb_inchan_t *ch, int32_t n);
/* The consumer took a data buffer from the channel's queue: under a bound,
 * room for one more held segment may have opened, and the credit of what
 * the channel holds waits until the consumer has read the buffer (so a
 * slow consumer's next buffer is not on its way while it still reads this
 * one).  No lock held. */
void fb_inchan_buffer_taken(fb_inchan_t *ch);
/* The consumer read everything it took from the channel (a record that
 * spans into the next buffer may be part-read): credit held back is told
 * to the sender now.  No lock held; cheap when no bound is set. */
void fb_inchan_reader_dry(fb_inchan_t *ch);
/* Why the channel failed: FB_NET_ERR_* (0 if it did not), the cause's type
 * name (for a producer failure) and a message. */
int fb_inchan_error(fb_inchan_t *ch, char *type, size_t tlen, char *message, size_t mlen);
uint32_t fb_inchan_receiver_id(fb_inchan_t *ch);
/* Counters for metrics: buffers held for the sender (exclusive, floating),
 * exclusive segments in all, the sender's last backlog, data buffers that
 * arrived and wait to be read (queued), and what arrived. */
typedef struct fb_inchan_stats {
    int32_t exclusive_available, floating_available, exclusive_total, backlog, queued;
    int64_t buffers_in, bytes_in;
} fb_inchan_stats_t;
void fb_inchan_stats(fb_inchan_t *ch, fb_inchan_stats_t *out);

#endif
