#define _GNU_SOURCE
#include "common/clock.h"

#include <errno.h>
#include <math.h>
#include <time.h>

int64_t fb_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t fb_deadline_after(double seconds)
{
    int64_t now = fb_monotonic_ns();
    if (isnan(seconds) || seconds <= 0)
        return now;
    if (seconds >= (double)(FB_WAIT_FOREVER - now) / 1e9)
        return FB_WAIT_FOREVER;
    return now + (int64_t)(seconds * 1e9);
}

int fb_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    int rc;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

int fb_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ns)
{
    struct timespec ts;
    if (deadline_ns == FB_WAIT_FOREVER)
        return pthread_cond_wait(cv, mu);
    if (deadline_ns <= fb_monotonic_ns())
        return ETIMEDOUT;
    ts.tv_sec = deadline_ns / 1000000000LL;
    ts.tv_nsec = deadline_ns % 1000000000LL;
    return pthread_cond_timedwait(cv, mu, &ts);
}
