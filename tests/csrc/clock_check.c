/* csrc/clock.c on its own: deadline arithmetic and timed waits.  Prints "ok"
 * or the first broken promise (exit 1). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include "common/clock.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("line %d: %s\n", __LINE__, #cond);                       \
            return 1;                                                       \
        }                                                                   \
    } while (0)

int main(void)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    int64_t before, after, d;
    int rc;

    /* timeouts that have run out, or are no number: a deadline of now */
    double now_like[] = {0.0, -0.0, -1e-9, -1.0, -1e300, -INFINITY, NAN};
    for (unsigned k = 0; k < sizeof now_like / sizeof now_like[0]; k++) {
        before = fb_monotonic_ns();
        d = fb_deadline_after(now_like[k]);
        after = fb_monotonic_ns();
        CHECK(before <= d && d <= after);
    }
    /* too far for int64 nanoseconds: forever */
    CHECK(fb_deadline_after(INFINITY) == FB_WAIT_FOREVER);
    CHECK(fb_deadline_after(1e300) == FB_WAIT_FOREVER);
    CHECK(fb_deadline_after(9.3e9) == FB_WAIT_FOREVER);
    /* an ordinary timeout */
    before = fb_monotonic_ns();
    d = fb_deadline_after(2.5);
    after = fb_monotonic_ns();
    CHECK(before + 2500000000LL <= d && d <= after + 2500000000LL);

    CHECK(fb_cond_init(&cv) == 0);
    pthread_mutex_lock(&mu);
    /* a deadline that has passed: ETIMEDOUT at once, no sleep */
    before = fb_monotonic_ns();
    CHECK(fb_cond_wait_until(&cv, &mu, fb_deadline_after(-5.0)) == ETIMEDOUT);
    CHECK(fb_cond_wait_until(&cv, &mu, 0) == ETIMEDOUT);
    CHECK(fb_cond_wait_until(&cv, &mu, -123) == ETIMEDOUT);
    CHECK(fb_monotonic_ns() - before < 50000000LL);
    /* a future one: returns no earlier than it (spurious wake-ups aside, so
     * loop as callers do) */
    d = fb_deadline_after(0.02);
    do {
        rc = fb_cond_wait_until(&cv, &mu, d);
    } while (rc == 0);
    CHECK(rc == ETIMEDOUT);
    CHECK(fb_monotonic_ns() >= d);
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&cv);
    printf("ok\n");
    return 0;
}
