/* inchan.c's exports to the units above it (consumer.c: a buffer's
 * delivery, lent buffers and buffer sizes due; lifecycle.c: failing every in-channel when
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

/* Buffer debloating (mu held): the channel's NEW_BUFFER_SIZE is queued if
 * its latest size is news to the sender and one may go now, or waits for
 * its time (size_at).  Returns how the caller, unlocked, wakes the writer
 * (writer_kick; 2: to set its wake-up for the wait), or 0. */
int size_schedule_locked(fb_conn_t *c, fb_inchan_t *ch);
/* The channel's NEW_BUFFER_SIZE waits no more (mu held). */
void size_unwait_locked(fb_conn_t *c, fb_inchan_t *ch);

#pragma GCC visibility pop

#endif
