/* Monotonic time, deadlines and timed waits on condition variables: the one
 * clock of the pools (pool.c) and of the exchange (exchange.c).
 *
 * Deadlines are CLOCK_MONOTONIC nanoseconds.  FB_WAIT_FOREVER is the only
 * way to say "no deadline"; every other value is a point in time, and one
 * that has passed means "do not sleep" (a wait then makes one try).
 * fb_deadline_after() follows that rule for timeouts: a timeout <= 0 (or NaN)
 * is a deadline of now, never "forever" — a negative timeout is usually a
 * remaining time that has run out.  Condition variables made with
 * fb_cond_init() wait on CLOCK_MONOTONIC, so a change of the wall clock does
 * not move a deadline.  Plain C, no Python API. */
#ifndef FLINKBUF_CLOCK_H
#define FLINKBUF_CLOCK_H

#include <pthread.h>
#include <stdint.h>

#define FB_WAIT_FOREVER INT64_MAX

/* Waits that a caller with Python-visible state makes (a blocked buffer
 * request, a consumer waiting for input) are cut into slices of this many
 * seconds, so that signals (KeyboardInterrupt) and state changes are seen. */
#define FB_WAIT_SLICE 0.05

/* CLOCK_MONOTONIC in ns. */
int64_t fb_monotonic_ns(void);

/* now + seconds as a deadline: now for seconds <= 0 or NaN; FB_WAIT_FOREVER
 * for +inf or anything past the int64 range. */
int64_t fb_deadline_after(double seconds);

/* pthread_cond_init on CLOCK_MONOTONIC: 0, or -1 on failure. */
int fb_cond_init(pthread_cond_t *cv);

/* One wait on cv (mu held) until signalled or the deadline passes
 * (FB_WAIT_FOREVER: no timeout): 0, or ETIMEDOUT without sleeping when the
 * deadline has passed already.  Wake-ups may be spurious: the caller loops
 * on its condition and on the clock. */
int fb_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ns);

#endif
