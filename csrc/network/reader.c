/* Frames in: the connection's frame reader (frame_reader.h) driven from its
 * transport, each frame handed to its side (consumer.c, producer.c) or to
 * the lifecycle (lifecycle.c), and the reader thread's loop.
 *
 * Every receive is non-blocking: a thread that would wait for input waits
 * in its own poll (reader_loop, direct.c's read_until), beside its own
 * wake-up, and a frame half read stays with the connection (its frame
 * reader, and the body's target) for whoever reads next. */
#define _GNU_SOURCE
#include "network/reader_internal.h"
#include "network/consumer_internal.h"
#include "network/lifecycle_internal.h"
#include "network/producer_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* What to wait for before the held request goes on (RX_WAIT: the reader
 * thread waits until c->rq_resume). */
#define RX_WAIT 3

/* This side ended the connection already (its close or failure). */
static int ended_here(fb_conn_t *c)
{
    int ended;
    pthread_mutex_lock(&c->mu);
    ended = c->state != CONN_OPEN;
    pthread_mutex_unlock(&c->mu);
    return ended;
}

/* The frame reader's source: what the transport has now, counted, with the
 * time of the last byte kept; its end or failure ends the connection. */
static ssize_t conn_source(void *arg, struct iovec *iov, int iovcnt)
{
    fb_conn_t *c = arg;
    ssize_t r;
    for (;;) {
        r = c->t->ops->recv(c->t, iov, iovcnt);
        if (r > 0) {
            stat_add(&c->stats.bytes_in, r);
            c->rx_since = fb_monotonic_ns();
            return r;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return FB_SOURCE_EMPTY;
        /* An end this side made (its own shutdown: a transport's recv then
         * says 0 too) tells nothing of the peer: what it borrowed comes back
         * by the ledger or the peer's exit, never at once. */
        if (r == 0) {
            if (ended_here(c))
                return FB_SOURCE_END;
            conn_peer_ended(c, FB_NET_ERR_CONNECTION, NULL);
            return FB_SOURCE_END;
        }
        if (errno == ECONNRESET && !ended_here(c))      /* the peer's side went */
            __atomic_store_n(&c->peer_ended, 1, __ATOMIC_RELEASE);
        if (fb_transport_why(c->t) != NULL)
            conn_fail(c, FB_NET_ERR_CONNECTION, "%s", fb_transport_why(c->t));
        else
            conn_fail(c, FB_NET_ERR_CONNECTION, "reading from the connection failed: %s",
                      strerror(errno));
        return FB_SOURCE_FAILED;
    }
}

/* A BUFFER_RESPONSE's fields were read: its body goes to its channel (what
 * is staged now, the rest as it comes), or is dropped.  0, or -1. */
static int read_buffer(fb_conn_t *c)
{
    char why[WHY_LEN];
    int rc;
    char *dst = consumer_body_target(c, &c->fr.frame, &rc, why);
    if (dst != NULL) {
        fb_frame_body_into(&c->fr, dst);
        return 0;
    }
    if (rc == 0) {
        fb_frame_skip_body(&c->fr);         /* a channel that ended */
        return 0;
    }
    if (rc == -2) {
        conn_fail(c, FB_NET_ERR_CONNECTION, "%s", why);
        return -1;
    }
    return protocol_error(c, "%s", why);
}

/* Whether the held PARTITION_REQUEST may be handled now by this thread: 0
 * yes (counted in the peer's budget), RX_YIELD (a direct reader leaves it
 * to the reader thread, which may wait), RX_WAIT (the reader thread waits
 * for the budget until c->rq_resume). */
static int request_now(fb_conn_t *c)
{
    int direct = c->rd_owner == RD_DIRECT;
    int64_t now, wait;
    if (direct && __atomic_load_n(&c->nctl, __ATOMIC_RELAXED) >= CTL_MAX)
        return RX_YIELD;
    now = fb_monotonic_ns();
    if ((wait = producer_request_wait(c, now)) == 0)
        return 0;
    if (direct)
        return RX_YIELD;                  /* the reader thread waits, not a consumer */
    c->rq_resume = now + wait;
    return RX_WAIT;
}

/* A whole control frame (held): acted on by its side.  As read_step. */
static int read_control(fb_conn_t *c)
{
    const fb_wire_frame_t *f = &c->fr.frame;
    char why[WHY_LEN];
    int r = 0;
    if (f->msg == FB_MSG_PARTITION_REQUEST && (r = request_now(c)) != 0)
        return r;
    fb_frame_next(&c->fr);        /* f points into the staging buffer, which stays as it is */
    switch (f->msg) {
    case FB_MSG_ERROR:
        if ((r = consumer_error(c, f, why)) != 0) {
            conn_peer_ended(c, r, why);
            return -1;
        }
        return 1;
    case FB_MSG_PARTITION_REQUEST:
        producer_request(c, f);
        return 1;
    case FB_MSG_BUFFER_LENT:
        r = consumer_lent(c, f, why);
        break;
    case FB_MSG_RELEASE:
        r = producer_release(c, f, why);
        break;
    case FB_MSG_NEW_BUFFER_SIZE:
        r = producer_buffer_size(c, f, why);
        break;
    case FB_MSG_CLOSE:
        conn_peer_ended(c, FB_NET_ERR_CONNECTION, "the peer closed the connection");
        return -1;
    case FB_MSG_HEARTBEAT_REQUEST:
    case FB_MSG_HEARTBEAT_RESPONSE:
        r = heartbeat_frame(c, f, why);
        break;
    default:                      /* ADD_CREDIT, ADD_EVENT_CREDIT, CANCEL_PARTITION_REQUEST */
        r = producer_credit(c, f, why);
        break;
    }
    return r < 0 ? protocol_error(c, "%s", why) : 1;
}

int read_step(fb_conn_t *c)
{
    for (;;) {
        if (c->rx_ch != NULL && c->rx_item.kind == FB_ITEM_DATA
                && __atomic_load_n(&c->recv_abort, __ATOMIC_ACQUIRE)) {
            consumer_body_abort(c);        /* its channel closes: the segment back now */
            fb_frame_skip_body(&c->fr);
        }
        switch (fb_frame_read(&c->fr, conn_source, c)) {
        case FB_FRAME_NONE:
            return 0;
        case FB_FRAME_PROGRESS:
            continue;
        case FB_FRAME_BUFFER:
            if (read_buffer(c) < 0)
                return -1;
            continue;
        case FB_FRAME_BODY:
            consumer_body_done(c, 0);
            return 1;
        case FB_FRAME_SKIPPED:
            return 1;
        case FB_FRAME_CONTROL:
            return read_control(c);
        case FB_FRAME_BAD:
            return protocol_error(c, "%s", c->fr.err);
        default:                           /* the source ended the connection */
            if (c->rx_ch != NULL)
                consumer_body_done(c, -1);
            return -1;
        }
    }
}

/* The peer's budget of requests is spent: the reader thread waits (holding
 * the socket, as the frames wait in the peer's socket) until it is not,
 * or the connection ends. */
static void wait_for_budget(fb_conn_t *c)
{
    pthread_mutex_lock(&c->rd_mu);
    if (!c->rd_stop)
        fb_cond_wait_until(&c->rd_cv, &c->rd_mu, c->rq_resume);
    pthread_mutex_unlock(&c->rd_mu);
}

/* Read frames while the socket has them: as read_step, never 1. */
static int read_available(fb_conn_t *c)
{
    int r;
    for (;;) {
        while ((r = read_step(c)) == 1)
            ;
        if (r != RX_WAIT)
            return r;
        wait_for_budget(c);
        if (__atomic_load_n(&c->rd_stop, __ATOMIC_RELAXED))
            return 0;
    }
}

/* After the connection ended, the frame half read goes: its segment back. */
static void rx_drop(fb_conn_t *c)
{
    if (c->rx_ch != NULL)
        consumer_body_done(c, -1);
    fb_frame_reset(&c->fr);
}

void rd_give_back(fb_conn_t *c)
{
    int drop = c->rd_stop;
    if (drop)
        __atomic_store_n(&c->rd_owner, RD_CLEANUP, __ATOMIC_RELAXED);
    else
        __atomic_store_n(&c->rd_owner, RD_NONE, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rd_mu);
    if (!drop)
        return;
    rx_drop(c);
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_owner, RD_NONE, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&c->rd_done_cv);
    pthread_mutex_unlock(&c->rd_mu);
}

int poll_input(fb_conn_t *c, int wake_fd, int ms)
{
    return c->t->ops->wait(c->t, FB_TRANSPORT_READABLE, wake_fd, ms);
}

/* Take the read right for the reader thread (when nobody has it and no
 * lend runs): 1, or 0 when the connection ended (the read right given
 * back, the frame half read dropped). */
static int take_read_right(fb_conn_t *c)
{
    pthread_mutex_lock(&c->rd_mu);
    for (;;) {
        if (c->rd_stop && c->rd_owner == RD_NONE) {
            /* The frame half read goes (a thread reading now drops it
             * itself as it gives the socket back). */
            __atomic_store_n(&c->rd_owner, RD_THREAD, __ATOMIC_RELAXED);
            rd_give_back(c);
            return 0;
        }
        if (c->rd_stop) {
            pthread_mutex_unlock(&c->rd_mu);
            return 0;
        }
        if (c->rd_owner == RD_NONE && fb_monotonic_ns() >= c->rd_lent_until)
            break;
        fb_cond_wait_until(&c->rd_cv, &c->rd_mu, c->rd_owner == RD_NONE
                           ? c->rd_lent_until : fb_monotonic_ns() + RD_LEND_NS);
    }
    __atomic_store_n(&c->rd_owner, RD_THREAD, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rd_mu);
    return 1;
}

/* The reader thread's loop, until the connection ends. */
static void reader_loop(fb_conn_t *c)
{
    int64_t now;
    int r, ms;
    while (take_read_right(c)) {
        if (control_waits(c))
            notify_writer(c, 0);         /* what a consumer left for its next read */
        r = read_available(c);
        /* In the middle of a frame the rest is coming: wait for it holding
         * the socket (a closing channel's abort and a shutdown wake this). */
        while (r == 0 && mid_frame(c) && !__atomic_load_n(&c->rd_stop, __ATOMIC_RELAXED)
               && !overdue(c, now = fb_monotonic_ns())) {
            if (poll_input(c, c->thread_wake_fd, wait_ms(c, FB_WAIT_FOREVER, now)) < 0
                    && errno != EINTR)
                break;
            r = read_available(c);
        }
        now = fb_monotonic_ns();
        if (r == 0 && overdue(c, now))
            r = -1;
        /* Nothing more now: wait for input without the socket's read right,
         * so that a consumer's thread can take it meanwhile (a shutdown
         * wakes this).  While the socket is lent, no longer than the lend:
         * credit the consumer deferred goes out when the reader thread
         * takes over; and no longer than the peer's next check. */
        pthread_mutex_lock(&c->rd_mu);
        ms = wait_ms(c, c->rd_lent_until > now ? c->rd_lent_until : FB_WAIT_FOREVER, now);
        c->rd_thread_polls = r == 0 && c->rd_lent_until <= now;
        rd_give_back(c);
        if (r < 0)
            return;
        while (poll_input(c, c->thread_wake_fd, ms) < 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&c->rd_mu);
        c->rd_thread_polls = 0;
        pthread_mutex_unlock(&c->rd_mu);
    }
}

/* After a protocol error the writer sends the error and a CLOSE_REQUEST,
 * then closes the socket; a peer that does not read gets a second for it. */
static void await_close_sent(fb_conn_t *c)
{
    int64_t deadline = fb_deadline_after(1.0);
    int pending;
    pthread_mutex_lock(&c->mu);
    while (c->close_on_send && !c->close_sent && fb_monotonic_ns() < deadline)
        fb_cond_wait_until(&c->cv, &c->mu, deadline);
    pending = c->close_on_send;
    pthread_mutex_unlock(&c->mu);
    if (pending)
        close_socket(c);
}

void *reader_main(void *arg)
{
    fb_conn_t *c = arg;
    reader_loop(c);
    producer_reclaim(c);         /* what was lent, back now if the peer's side let go */
    await_close_sent(c);
    return NULL;
}
