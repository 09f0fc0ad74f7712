/* inchan.c's exports to the units above it (consumer.c: a buffer's
 * delivery and lent buffers; lifecycle.c: failing every in-channel when
 * the connection ends).  The public half of in-channels is connection.h.
 * Private to csrc/network.  No Python API. */
#ifndef FLINKBUF_INCHAN_INTERNAL_H
#define FLINKBUF_INCHAN_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* The sender has `backlog` buffers more: hold backlog + exclusive buffers
 * for it, borrowing floating ones (no lock held). */
void want_buffers(fb_inchan_t *ch, int32_t backlog);
/* A lent buffer of ch was recycled: a segment its credit kept aside goes
 * back, and with it the credit (no lock held). */
void inchan_return_kept(fb_inchan_t *ch);
/* Fail an in-channel (mu held): its consumer raises.  What it holds stays
 * with it until its close (fb_inchan_close), in the consumer's thread. */
void inchan_fail_locked(fb_conn_t *c, fb_inchan_t *ch, int code, const char *type,
                        const char *msg);

#pragma GCC visibility pop

#endif
