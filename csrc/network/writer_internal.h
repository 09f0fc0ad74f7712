/* writer.c's exports: frames out.  To direct.c (a thread reading for
 * itself sends what it left: conn_ready) and connection.c (the writer
 * thread, the batch a producer's thread sends with, the gate hook, ending
 * served channels at the close).  Private to csrc/network.  No Python
 * API. */
#ifndef FLINKBUF_WRITER_INTERNAL_H
#define FLINKBUF_WRITER_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* A batch for a connection's sender (fb_conn_new: the producers'). */
batch_t *batch_new(void);
/* The gate hook (caller_sends): a producer's add made a served subpartition
 * ready, or a thread queued control frames.  If the writer thread is idle,
 * this thread sends what is ready itself, without blocking (it may hold
 * the GIL); otherwise, or if the socket would block, the writer thread is
 * woken to do it. */
void conn_ready(void *arg);
/* The writer thread: wait for a ready slot, gather a batch, send it; at
 * the end the served channels end. */
void *writer_main(void *arg);
/* Every served channel ends (no lock held): a producer's thread sending
 * finishes first, a batch it left unsent goes back. */
void end_served_channels(fb_conn_t *c);

#pragma GCC visibility pop

#endif
