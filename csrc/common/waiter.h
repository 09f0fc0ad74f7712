/* One waiter mechanism: a thread that waits for something of an owner (a
 * local pool's buffer, a gate's data) may serve a lender instead of sleeping
 * on the owner's condition variable.  The network layer lends a connection:
 * the waiting thread reads that connection itself (a producer gets its
 * credit, a consumer its buffers) with no hand-off to the connection's
 * threads.  The pool (buffer/pool.h) and the gate (io/exchange.h) each keep
 * one fb_waitpoint_t, under their own lock.
 *
 * The contract, for every owner:
 *  - lender.serve runs in the waiting thread with none of the owner's locks
 *    held and the GIL released (hold/release keep its argument alive around
 *    it).  It may read and write its connection and hand what it reads to
 *    anyone, but it waits only in its own poll, beside the wake it
 *    registers (fb_waitpoint_begin), and never past the deadline it was
 *    given: what it started for others (a frame half read) it leaves for its
 *    owner to finish.  It returns 1 if it waited or did work (the waiting
 *    thread re-checks at once), 0 if it could not serve now (the waiting
 *    thread sleeps on its condition as usual).
 *  - the wake it registers is called under the owner's lock by other
 *    threads (a recycle, a resize, an add, a close): it writes an eventfd,
 *    nothing else.  fb_waitpoint_wake never calls it in the serving thread.
 *  - one thread serves at a time; a lender is offered once and withdrawn by
 *    the argument that offered it.
 * Every function here is called with the owner's lock held.  No Python
 * API. */
#ifndef FLINKBUF_WAITER_H
#define FLINKBUF_WAITER_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

typedef struct fb_lender {
    int (*serve)(void *arg, void *owner, int64_t deadline_ns);
    void (*hold)(void *arg);
    void (*release)(void *arg);
    void *arg;
} fb_lender_t;

typedef struct fb_waitpoint {
    fb_lender_t lender;          /* serve NULL: none offered */
    int busy;                    /* a waiting thread is in lender.serve */
    void (*wake)(void *);        /* set while a thread serves: others call it */
    void *wake_arg;
    pthread_t thread;            /* that thread */
} fb_waitpoint_t;

/* Offer a lender: 1 taken, 0 one is offered already. */
static inline int fb_waitpoint_offer(fb_waitpoint_t *w, const fb_lender_t *lender)
{
    if (w->lender.serve != NULL)
        return 0;
    w->lender = *lender;
    return 1;
}

/* Withdraw the lender, if `arg` offered it. */
static inline void fb_waitpoint_withdraw(fb_waitpoint_t *w, void *arg)
{
    if (w->lender.serve != NULL && w->lender.arg == arg)
        memset(&w->lender, 0, sizeof(w->lender));
}

/* Serve the lender in this thread instead of sleeping, with the owner's
 * lock `mu` released around it: 1 if it served (re-check now), 0 if there is
 * none or another thread serves it (sleep). */
static inline int fb_waitpoint_serve(fb_waitpoint_t *w, pthread_mutex_t *mu, void *owner,
                                     int64_t deadline_ns)
{
    fb_lender_t l;
    int served;
    if (w->lender.serve == NULL || w->busy)
        return 0;
    l = w->lender;
    w->busy = 1;
    l.hold(l.arg);
    pthread_mutex_unlock(mu);
    served = l.serve(l.arg, owner, deadline_ns);
    l.release(l.arg);
    pthread_mutex_lock(mu);
    w->busy = 0;
    return served;
}

/* The serving thread registers its wake: 1 if none was registered before. */
static inline int fb_waitpoint_begin(fb_waitpoint_t *w, void (*wake)(void *), void *arg)
{
    int first = w->wake == NULL;
    w->wake = wake;
    w->wake_arg = arg;
    w->thread = pthread_self();
    return first;
}

/* ... and withdraws it: 1 if one was registered. */
static inline int fb_waitpoint_end(fb_waitpoint_t *w)
{
    int had = w->wake != NULL;
    w->wake = NULL;
    w->wake_arg = NULL;
    return had;
}

/* A thread serves the lender (its wake is registered). */
static inline int fb_waitpoint_serving(const fb_waitpoint_t *w)
{
    return w->wake != NULL;
}

/* Wake the serving thread, unless it is this one. */
static inline void fb_waitpoint_wake(const fb_waitpoint_t *w)
{
    if (w->wake != NULL && !pthread_equal(pthread_self(), w->thread))
        w->wake(w->wake_arg);
}

#endif
