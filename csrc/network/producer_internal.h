/* producer.c's exports: the producer's side of a connection, serving
 * subpartitions of this process to the peer.  To reader.c (frames in:
 * PARTITION_REQUEST and its budget, ADD_CREDIT, ADD_EVENT_CREDIT,
 * CANCEL_PARTITION_REQUEST, NEW_BUFFER_SIZE, RELEASE; the lent segments'
 * return when the connection ended), writer.c (what a served channel sends next; ending
 * served channels) and connection.c (lending's end).  A frame the peer
 * should not have sent is refused with -1 and why; the caller ends the
 * connection.  Private to csrc/network.  No Python API. */
#ifndef FLINKBUF_PRODUCER_INTERNAL_H
#define FLINKBUF_PRODUCER_INTERNAL_H

#include "network/conn_internal.h"

/* One buffer response to send, as the producer's side made it. */
typedef struct frame {
    char hdr[FB_NET_HEADER + FB_NET_LENT_FIELDS];   /* (longer than a BUFFER_RESPONSE's) */
    fb_item_t item;
    outchan_t *ended;           /* the channel this frame ends (its last item), or NULL */
    int lent;                   /* a BUFFER_LENT: the segment stays out until released */
} frame_t;

#pragma GCC visibility push(hidden)

/* What served slot `slot` sends now, if anything: one buffer (or event)
 * that its credit allows, in *fr (1), or nothing (0).  A channel that was
 * cancelled, failed or released ends here (its error queued).  No lock
 * held; the frame's item is the caller's (fb_item_dispose once sent,
 * unless lent), and so is ending fr->ended (outchan_end) once it went. */
int producer_take(fb_conn_t *c, int32_t slot, frame_t *fr);
/* A served channel's slot is free again (mu held). */
void outchan_free_slot(fb_conn_t *c, outchan_t *oc);
/* End a served channel whose slot was freed (no lock held): the reader
 * over there is gone, so the subpartition is released (`release`), or it
 * was read to the end; either way the owner reference goes. */
void outchan_end(fb_conn_t *c, outchan_t *oc, int release);
/* How long the next PARTITION_REQUEST must wait within the peer's budget
 * (0: it goes now, and is counted). */
int64_t producer_request_wait(fb_conn_t *c, int64_t now);
/* A PARTITION_REQUEST: served, or answered with an error.  The reader
 * thread (never a direct reader) may wait here for room in the control
 * queue. */
void producer_request(fb_conn_t *c, const fb_wire_frame_t *f);
/* ADD_CREDIT, ADD_EVENT_CREDIT or CANCEL_PARTITION_REQUEST: 0, or -1 with
 * why. */
int producer_credit(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* A NEW_BUFFER_SIZE: the served subpartition's buffers are finished at
 * that size from now on (a channel that ended: ignored).  0, or -1 with
 * why when the peer sends them past its budget (SIZE_BURST, SIZE_INTERVAL_NS). */
int producer_buffer_size(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* A RELEASE: the segments go back to their pools.  0, or -1 with why. */
int producer_release(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* The connection ended (no lock held): if the peer ended its side first,
 * or its ledger says it reads nothing of ours any more, every segment lent
 * to it goes back now, whatever it held; else they wait for
 * producer_lending_end. */
void producer_reclaim(fb_conn_t *c);
/* After the threads: what is still lent goes back as the ledger shows the
 * peer let go of it (or it ended). */
void producer_lending_end(fb_conn_t *c);

#pragma GCC visibility pop

#endif
