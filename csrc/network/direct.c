/* Reads by a thread that waits for something else: a consumer waiting for
 * its gate, or a producer waiting for a buffer of its pool, reads the
 * connection itself (common/waiter.h's lender) up to its own deadline. */
#define _GNU_SOURCE
#include "network/direct_internal.h"
#include "network/lifecycle_internal.h"
#include "network/reader_internal.h"
#include "network/writer_internal.h"

#include <errno.h>
#include <unistd.h>

static void direct_wake(void *arg)
{
    fb_conn_t *c = arg;
    uint64_t one = 1;
    (void)!write(c->direct_wake_fd, &one, sizeof(one));
}

/* What a thread reading the socket for itself waits for: its gate to have
 * data, or its pool a buffer (begin registers the wake, as in exchange.h). */
typedef struct waiting {
    int (*begin)(void *target, void (*wake)(void *), void *arg);
    void (*end)(void *target);
    int (*ready)(void *target);
    void *target;
} waiting_t;

/* This thread reads the connection itself while nobody else does, until
 * `w` is ready or the deadline passes: every frame it reads is handled as
 * the reader thread would handle it (buffers for any channel, credit and
 * requests for served partitions, whose sends it makes itself), and adds
 * from other threads wake it through direct_wake_fd.  It never waits on
 * the connection past its own deadline: a frame half read when it leaves
 * stays with the connection for the reader thread, and a request that
 * would wait for room in the control queue is left to the reader thread
 * too.  When it leaves with data it lends the socket for RD_LEND_NS.  1 if
 * it waited or read, 0 if the socket was not free (or was handed back at
 * once: the caller sleeps on its own condition then). */
static int read_until(fb_conn_t *c, const waiting_t *w, int64_t deadline_ns)
{
    int served = 0, r = 0, ms;
    int64_t now;
    pthread_mutex_lock(&c->rd_mu);
    if (c->rd_stop || c->rd_owner != RD_NONE || !c->direct_reads) {
        pthread_mutex_unlock(&c->rd_mu);
        return 0;
    }
    __atomic_store_n(&c->rd_owner, RD_DIRECT, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->rd_mu);
    if (!w->begin(w->target, direct_wake, c)) {
        served = 1;
        for (;;) {
            if ((r = read_step(c)) == 1) {
                stat_add(&c->stats.frames_in_direct, 1);
                if (w->ready(w->target))
                    break;
                continue;
            }
            if (r != 0)
                break;
            now = fb_monotonic_ns();
            if (now >= deadline_ns || overdue(c, now))
                break;
            /* Credit (and releases) deferred for this read go out before the wait: the
             * buffers that came since may have left the sender short, and
             * the reader thread, which would send it, does not read now. */
            if (control_waits(c)) {
                if (c->caller_sends) {
                    fb_gate_mark(&c->out, 0);
                    conn_ready(c);
                } else {
                    notify_writer(c, 0);
                }
            }
            ms = wait_ms(c, deadline_ns, now);
            if (poll_input(c, c->direct_wake_fd, ms) < 0 && errno != EINTR)
                break;
            if (w->ready(w->target))
                break;
        }
        /* A frame staged whole, or input waiting inside the transport,
         * would wait for no input: the reader thread would not see it.
         * What is staged now is a frame's start only. */
        while (r >= 0 && r != RX_YIELD && (fb_frame_staged_whole(&c->fr)
                                           || fb_transport_pending(c->t)))
            if ((r = read_step(c)) == 1)
                stat_add(&c->stats.frames_in_direct, 1);
    }
    w->end(w->target);
    pthread_mutex_lock(&c->rd_mu);
    if (r == RX_YIELD)
        served = 0;
    if (served)
        __atomic_store_n(&c->rd_lent_until, fb_monotonic_ns() + RD_LEND_NS, __ATOMIC_RELAXED);
    if ((served || r == RX_YIELD) && c->rd_thread_polls) {
        /* with no time limit: let it see the lend, or take over */
        uint64_t one = 1;
        c->rd_thread_polls = 0;
        /* under rd_mu: a close waits for it before the descriptor goes */
        (void)!write(c->thread_wake_fd, &one, sizeof(one));
    }
    rd_give_back(c);
    return served;
}

static int gate_begin(void *g, void (*wake)(void *), void *arg)
{
    return fb_gate_direct_begin(g, wake, arg);
}

static void gate_end(void *g)
{
    fb_gate_direct_end(g);
}

static int gate_ready(void *g)
{
    return fb_gate_ready(g);
}

int direct_read(void *arg, void *g, int64_t deadline_ns)
{
    fb_inchan_t *ch = arg;
    waiting_t w = {gate_begin, gate_end, gate_ready, g};
    return read_until(ch->conn, &w, deadline_ns);
}

static int pool_begin(void *lp, void (*wake)(void *), void *arg)
{
    return ((fb_localpool_t *)lp)->ops->direct_begin(lp, wake, arg);
}

static void pool_end(void *lp)
{
    ((fb_localpool_t *)lp)->ops->direct_end(lp);
}

static int pool_ready(void *lp)
{
    return ((fb_localpool_t *)lp)->ops->ready(lp);
}

int pool_wait(void *arg, void *lp, int64_t deadline_ns)
{
    waiting_t w = {pool_begin, pool_end, pool_ready, lp};
    return read_until(arg, &w, deadline_ns);
}
