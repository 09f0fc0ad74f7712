/* direct.c's exports: the lenders a connection offers (common/waiter.h's
 * fb_lender_t.serve), which connection.c sets on it (c->gate_lender,
 * c->pool_lender) for inchan.c and producer.c to offer.  Private to
 * csrc/network.  No Python API. */
#ifndef FLINKBUF_DIRECT_INTERNAL_H
#define FLINKBUF_DIRECT_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* The lender of a remote channel's gate (arg: the in-channel): the
 * consumer's thread, waiting for its gate, receives from the connection
 * itself up to its deadline. */
int direct_read(void *arg, void *g, int64_t deadline_ns);
/* The lender of a served partition's pool (arg: the connection): a
 * producer waiting for a buffer reads the connection itself, so that
 * credit arrives, and the buffers go out and come back, in its own thread. */
int pool_wait(void *arg, void *lp, int64_t deadline_ns);

#pragma GCC visibility pop

#endif
