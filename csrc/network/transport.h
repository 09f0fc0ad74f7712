/* What a connection needs of the byte stream under it, and the socket
 * transport (TCP or a Unix socket) behind that interface.
 *
 * A connection sends frames as vectors (a header, then a body that points
 * into a pool segment, or prebuilt control frames) and receives without
 * ever waiting: every wait happens in `wait`, beside a wake-up eventfd, so
 * that a thread reading on others' behalf returns to its own wait on time
 * (common/waiter.h).  `shutdown` wakes every wait and every blocked send;
 * `close` runs once no thread uses the transport any more, `destroy` with
 * the connection's last reference.  No locks, no
 * Python API. */
#ifndef FLINKBUF_TRANSPORT_H
#define FLINKBUF_TRANSPORT_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

enum { FB_TRANSPORT_READABLE = 1, FB_TRANSPORT_WRITABLE = 2 };

typedef struct fb_transport fb_transport_t;

typedef struct fb_transport_ops {
    /* Send from the vectors: the bytes that went (> 0), or -1 with errno
     * (EAGAIN with `nowait`: nothing fits now; EPIPE, ECONNRESET: the peer
     * went).  Without `nowait` it blocks until something went. */
    ssize_t (*send)(fb_transport_t *t, const struct iovec *iov, int iovcnt, int nowait);
    /* Receive what has arrived into the vectors, never waiting: the bytes
     * (> 0), 0 at the end of the stream, or -1 with errno (EAGAIN: nothing
     * now). */
    ssize_t (*recv)(fb_transport_t *t, struct iovec *iov, int iovcnt);
    /* Wait up to `ms` (-1: no limit) for `events` (FB_TRANSPORT_*) or for
     * the eventfd `wake_fd` (drained when it fired): 0 on a timeout, > 0
     * when something is ready, -1 with errno. */
    int (*wait)(fb_transport_t *t, int events, int wake_fd, int ms);
    /* Both directions end; blocked sends and waits return.  Idempotent,
     * and harmless after close. */
    void (*shutdown)(fb_transport_t *t);
    /* Its descriptors go, once no thread sends, receives or waits on it
     * any more.  Idempotent. */
    void (*close)(fb_transport_t *t);
    /* Free it (closed first). */
    void (*destroy)(fb_transport_t *t);
    /* Why the last receive failed, where errno alone does not say (the
     * sealed transport: which record and how); NULL, or no such op: errno
     * says it. */
    const char *(*why)(fb_transport_t *t);
    /* Whether input waits inside the transport, ready to receive without
     * the stream (the sealed transport's opened records); asked by the
     * thread that reads, before it lets another read.  No such op: never. */
    int (*pending)(fb_transport_t *t);
    /* Whether the transport holds part of a unit of its own that the rest
     * must come for before any of it can be received (the sealed
     * transport's record not whole yet): the connection counts that as a
     * frame half read.  Asked by the thread that reads.  No such op:
     * never (a byte stream gives every byte as it comes). */
    int (*partial)(fb_transport_t *t);
} fb_transport_ops_t;

struct fb_transport {
    const fb_transport_ops_t *ops;
};

static inline const char *fb_transport_why(fb_transport_t *t)
{
    return t->ops->why != NULL ? t->ops->why(t) : NULL;
}

static inline int fb_transport_pending(fb_transport_t *t)
{
    return t->ops->pending != NULL && t->ops->pending(t);
}

static inline int fb_transport_partial(fb_transport_t *t)
{
    return t->ops->partial != NULL && t->ops->partial(t);
}

/* A transport over a connected stream socket, which it owns from here on
 * (closed by close or destroy).  NULL when out of memory (the socket stays the
 * caller's). */
fb_transport_t *fb_transport_socket(int fd);

#endif
