/* How a connection ends (its failure, a protocol error, the peer's end)
 * and its heartbeat: a peer that sends nothing for part of the I/O timeout
 * is asked for a HEARTBEAT_RESPONSE, which its connection's threads answer
 * (never its Python code); one silent for the whole of it has stopped, or
 * its host has, and the connection fails. */
#define _GNU_SOURCE
#include "network/lifecycle_internal.h"
#include "network/consumer_internal.h"
#include "network/inchan_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int conn_end(fb_conn_t *c, int code, const char *msg)
{
    int32_t k;
    int deferred;
    uint64_t one = 1;
    /* Before this side ends (no CLOSE_REQUEST went, the socket is open):
     * nothing the peer lent is read any more, so that it may take back
     * every segment as soon as it sees the end. */
    consumer_let_go(c);
    pthread_mutex_lock(&c->mu);
    if (c->state != CONN_OPEN) {
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    c->state = CONN_ENDED;
    c->err_code = code;
    copy_text(c->err_msg, sizeof(c->err_msg), msg, strlen(msg));
    for (k = 0; k < FB_NET_MAX_CHANNELS; k++)
        if (c->ins[k] != NULL)
            inchan_fail_locked(c, c->ins[k], code, "", msg);
    /* The served channels end in the writer thread as it stops (it may be
     * sending their segments now: their owners must outlive that). */
    deferred = c->close_on_send && !c->close_sent;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_stop, 1, __ATOMIC_RELAXED);   /* (read unlocked by a reader mid-frame) */
    pthread_cond_broadcast(&c->rd_cv);
    pthread_cond_broadcast(&c->rd_done_cv);
    if (deferred) {           /* no shutdown wakes the polls: these do */
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
        (void)!write(c->direct_wake_fd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&c->rd_mu);
    return deferred;
}

/* An error and a CLOSE_REQUEST are still to go before the socket closes
 * (the writer closes it once they went, the reader thread a second later). */
static int close_pending(fb_conn_t *c)
{
    int pending;
    pthread_mutex_lock(&c->mu);
    pending = c->close_on_send && !c->close_sent;
    pthread_mutex_unlock(&c->mu);
    return pending;
}

void conn_fail(fb_conn_t *c, int code, const char *fmt, ...)
{
    char msg[FB_NET_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!conn_end(c, code, msg) && !close_pending(c))
        close_socket(c);
}

void conn_write_failed(fb_conn_t *c, int err)
{
    uint64_t one = 1;
    if (err != EPIPE && err != ECONNRESET && err != ENOTCONN) {
        conn_fail(c, FB_NET_ERR_CONNECTION, "writing to the connection failed: %s",
                  strerror(err));
        return;
    }
    if (__atomic_exchange_n(&c->write_errno, err, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_lock(&c->rd_mu);
    __atomic_store_n(&c->rd_lent_until, 0, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&c->rd_cv);
    if (!c->rd_stop)
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
    pthread_mutex_unlock(&c->rd_mu);
}

void conn_peer_ended(fb_conn_t *c, int code, const char *msg)
{
    int err = __atomic_load_n(&c->write_errno, __ATOMIC_ACQUIRE);
    __atomic_store_n(&c->peer_ended, 1, __ATOMIC_RELEASE);
    if (msg != NULL)
        conn_fail(c, code, "%s", msg);
    else
        conn_fail(c, code, "the peer closed the connection%s%s%s",
                  mid_frame(c) ? " in the middle of a frame" : "",
                  err ? " (and writing to it failed: " : "", err ? strerror(err) : "");
}

int protocol_error(fb_conn_t *c, const char *fmt, ...)
{
    char msg[512], why[FB_NET_MAX_MESSAGE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    consumer_let_go(c);             /* before the CLOSE_REQUEST goes (conn_end) */
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN                    /* (a reader runs: so does the writer) */
            && ctl_error(c, FB_NET_ALL, FB_NET_ERR_PROTOCOL, "ProtocolError", msg) == FB_OK
            && (c->close_queued
                || ctl_push(c, FB_MSG_CLOSE, 0, NULL, 0) == FB_OK)) {
        c->close_queued = 1;
        c->close_on_send = 1;
    }
    pthread_mutex_unlock(&c->mu);
    snprintf(why, sizeof(why), "protocol error from the peer: %s", msg);
    if (!conn_end(c, FB_NET_ERR_PROTOCOL, why))
        close_socket(c);
    return -1;
}

/* ---- heartbeat ---------------------------------------------------------------- */

int heartbeat_frame(fb_conn_t *c, const fb_wire_frame_t *f, char *why)
{
    uint32_t token = f->u.heartbeat;
    stat_add(&c->stats.frames_in, 1);
    if (f->msg == FB_MSG_HEARTBEAT_REQUEST) {
        pthread_mutex_lock(&c->mu);
        c->pong_token = token;       /* one answer to write, however many were asked */
        pthread_mutex_unlock(&c->mu);
        notify_writer(c, 0);
        return 0;
    }
    if (token > __atomic_load_n(&c->ping_written, __ATOMIC_ACQUIRE) || token <= c->pong_seen) {
        snprintf(why, WHY_LEN, "a heartbeat response (%u) that answers no request", token);
        return -1;
    }
    c->pong_seen = token;
    return 0;
}

static inline int64_t io_timeout_ns(const fb_conn_t *c)
{
    return (int64_t)c->io_timeout_ms * 1000000;
}

/* When the peer's silence calls for the next step: a heartbeat request, or
 * the end. */
static int64_t next_check(const fb_conn_t *c)
{
    int64_t io = io_timeout_ns(c);
    return c->rx_since + (c->ping_for != c->rx_since ? io / HEARTBEAT_PART : io);
}

int overdue(fb_conn_t *c, int64_t now)
{
    int64_t quiet = now - c->rx_since;
    int ask = 0;
    if (quiet >= io_timeout_ns(c)) {
        if (mid_frame(c))
            conn_fail(c, FB_NET_ERR_CONNECTION,
                      "the peer stalled in the middle of a frame for %d ms", c->io_timeout_ms);
        else
            conn_fail(c, FB_NET_ERR_CONNECTION, "the peer did not answer for %d ms (it stopped, "
                      "or its host did)", c->io_timeout_ms);
        return 1;
    }
    if (quiet < io_timeout_ns(c) / HEARTBEAT_PART || c->ping_for == c->rx_since)
        return 0;
    c->ping_for = c->rx_since;
    pthread_mutex_lock(&c->mu);
    if (c->state == CONN_OPEN) {
        c->ping_token++;
        c->ping_queued = 1;
        ask = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (ask)
        notify_writer(c, 0);
    return 0;
}

int wait_ms(fb_conn_t *c, int64_t deadline, int64_t now)
{
    int64_t check = next_check(c), left;
    if (check < deadline)
        deadline = check;
    if (deadline == FB_WAIT_FOREVER)
        return -1;
    left = deadline - now;
    if (left <= 0)
        return 0;
    return left >= (int64_t)INT32_MAX * 1000000 ? INT32_MAX : (int)((left + 999999) / 1000000);
}
