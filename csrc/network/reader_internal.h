/* reader.c's exports: frames in.  To direct.c (a thread that reads for
 * itself steps the same reader) and connection.c (the reader thread).
 * Private to csrc/network.  No Python API. */
#ifndef FLINKBUF_READER_INTERNAL_H
#define FLINKBUF_READER_INTERNAL_H

#include "network/conn_internal.h"

#pragma GCC visibility push(hidden)

/* Read and act on what the socket has now, as far as the frame at hand
 * goes, without waiting: 1 a frame was handled; 0 the socket has nothing
 * more now (in the middle of a frame, or at its start); RX_YIELD a thread
 * reading on others' behalf (a direct reader) met a partition request it
 * cannot take now (the control queue is full, or the peer's budget of
 * requests is spent: it leaves it to the reader thread, which waits);
 * -1 the connection failed.  The read right's holder calls it. */
int read_step(fb_conn_t *c);
/* Give the socket's read right back (rd_mu held by the caller, and
 * released here).  After the connection ended, the last holder drops the
 * frame half read. */
void rd_give_back(fb_conn_t *c);
/* Wait up to ms (-1: no limit) for input on the socket or a wake-up on the
 * eventfd wake_fd (drained): poll's result. */
int poll_input(fb_conn_t *c, int wake_fd, int ms);
/* The reader thread, until the connection ends. */
void *reader_main(void *arg);

#pragma GCC visibility pop

#endif
