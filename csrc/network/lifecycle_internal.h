/* lifecycle.c's exports: how a connection ends, and its heartbeat.  To
 * writer.c (a write failed), reader.c and direct.c (the peer's end, a
 * protocol error, the heartbeat frames, the checks of a silent peer) and
 * connection.c (closing).  Private to csrc/network.  No Python API. */
#ifndef FLINKBUF_LIFECYCLE_INTERNAL_H
#define FLINKBUF_LIFECYCLE_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* End the connection (if it is open) with why: buffers the peer lent are
 * let go of first, every in-channel fails, nobody reads any more.  1 if
 * this ended it and the socket stays open for the writer to send what is
 * queued (close_on_send): it closes the socket once the CLOSE_REQUEST went.
 * No lock held. */
int conn_end(fb_conn_t *c, int code, const char *msg);
/* End it and shut the socket (unless an error and a CLOSE_REQUEST are
 * still to go).  No lock held. */
void conn_fail(fb_conn_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writing failed with errno err: as the peer went (the reader will read
 * its end), or for another reason (the connection fails). */
void conn_write_failed(fb_conn_t *c, int err);
/* The peer ended its side: a read found the end of the stream, its
 * CLOSE_REQUEST or a connection-wide error (what it read, in msg; NULL:
 * the end of the stream). */
void conn_peer_ended(fb_conn_t *c, int code, const char *msg);
/* The peer broke the protocol: tell it why (an ERROR_RESPONSE, then a
 * CLOSE_REQUEST, which the writer sends before it closes the socket), and
 * end the connection here now.  -1. */
int protocol_error(fb_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A HEARTBEAT_REQUEST (answered by the writer) or HEARTBEAT_RESPONSE: 0,
 * or -1 with why (a response that answers no request). */
int heartbeat_frame(fb_conn_t *c, const fb_wire_frame_t *f, char *why);
/* The read right's holder looks at the peer's silence (since c->rx_since):
 * after a part of the I/O timeout it asks for a heartbeat (once per
 * silence); after the whole of it the connection fails (in the middle of
 * a frame: the peer stalled; else it stopped answering).  1 if it failed. */
int overdue(fb_conn_t *c, int64_t now);
/* How long a wait for input may last, in ms for poll (-1: no limit): up to
 * `deadline` (FB_WAIT_FOREVER: none) and up to the peer's next check
 * (overdue).  0 when that is now. */
int wait_ms(fb_conn_t *c, int64_t deadline, int64_t now);

#pragma GCC visibility pop

#endif
