/* consumer.c's exports: the consumer's side of a connection, what arrives
 * for in-channels and what they send.  To reader.c (frames in: a buffer's
 * body for its channel, ERROR_RESPONSE, BUFFER_LENT), writer.c (the frames
 * of in-channels: requests, credit, releases; retries of requests) and
 * connection.c (the lease's end).  A frame the peer should not have sent
 * is refused with -1 and why; the caller ends the connection.  Private to
 * csrc/network.  No Python API. */
#ifndef FLINKBUF_CONSUMER_INTERNAL_H
#define FLINKBUF_CONSUMER_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* A BUFFER_RESPONSE's fields were read: where its body goes (c->rx_ch,
 * c->rx_item: the channel's segment, or memory of its own for an event),
 * or NULL to drop it (a channel that ended); -1 in *rc with why on a
 * protocol error, -2 when out of memory (why says so). */
char *consumer_body_target(fb_conn_t *c, const fb_wire_frame_t *f, int *rc, char *why);
/* The body went whole into the target (received 0) or did not (-1): the
 * item goes to its channel, or back. */
void consumer_body_done(fb_conn_t *c, int received);
/* The channel receiving the body closes (recv_abort): the segment goes
 * back at once, the rest of the body is dropped. */
void consumer_body_abort(fb_conn_t *c);
/* An ERROR_RESPONSE: its channel fails (or retries a request not found);
 * 0, or the FB_NET_ERR_* code to end the whole connection with (a
 * connection-wide error; why: the peer's message). */
int consumer_error(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* A BUFFER_LENT: 0, or -1 with why. */
int consumer_lent(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* Writing: the frame of an in-channel's queued message (PARTITION_REQUEST,
 * and the NEW_BUFFER_SIZE after it when a size was announced; ADD_CREDIT,
 * ADD_EVENT_CREDIT, NEW_BUFFER_SIZE) at p, its amounts read now (mu held),
 * at most CTL_FRAME_ROOM bytes; p when there is nothing to send (the
 * channel ended, or the sender knows the size). */
char *consumer_put_control_locked(fb_conn_t *c, const ctl_t *m, char *p);
/* Writing: RELEASEs of recycled lent segments at p, up to end (mu held);
 * *more when some are left for the next batch. */
char *consumer_put_releases_locked(fb_conn_t *c, char *p, char *end, int *more);
/* Requests whose retry time came are queued again, and buffer sizes whose
 * time came are queued (mu held): the next such time, or FB_WAIT_FOREVER. */
int64_t consumer_due_locked(fb_conn_t *c);
/* The connection ends (before its side does: no CLOSE_REQUEST or shutdown
 * went yet): buffers the peer lent are read no more from its arena (a
 * private copy of each one still held), so that the peer may take every
 * segment back once it sees the end.  Idempotent; no lock held. */
void consumer_let_go(fb_conn_t *c);
/* After the threads: the lease goes (freed once nothing is held). */
void consumer_lease_end(fb_conn_t *c);

#pragma GCC visibility pop

#endif
