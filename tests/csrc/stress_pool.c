/* Multi-threaded stress of csrc/pool.c, built with ThreadSanitizer or
 * AddressSanitizer+UBSan by tests/test_csrc.py.  Exits non-zero on any
 * broken invariant; the sanitizers abort on races and memory errors. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer/pool.h"

#define NUM_SEGMENTS 64
#define SEGMENT_SIZE 100
#define NUM_WORKERS 6
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static fb_netpool_t np;
static fb_localpool_t pools[3];
static int iterations = 20000;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned seed = (unsigned)id * 2654435761u;
    for (int it = 0; it < iterations; it++) {
        fb_localpool_t *lp = &pools[rand_r(&seed) % 3];
        int32_t held[3];
        int n = 1 + rand_r(&seed) % 3, got = 0;
        for (int k = 0; k < n; k++) {
            int32_t ch = lp->num_subpartitions ? (int32_t)(rand_r(&seed) % 4) : FB_NO_CHANNEL;
            int rc = k == 0 ? fb_localpool_request_blocking(lp, ch, fb_deadline_after(5.0), &held[got])
                            : fb_localpool_request(lp, ch, &held[got]);
            if (rc == FB_EMPTY)
                break;
            CHECK(rc == FB_OK);
            memset(fb_segment_address(&np, held[got]), id, SEGMENT_SIZE);
            got++;
        }
        for (int k = 0; k < got; k++) {
            char *p = fb_segment_address(&np, held[k]);
            for (int b = 0; b < SEGMENT_SIZE; b++)
                CHECK(p[b] == (char)id); /* nobody else had this segment */
            CHECK(fb_localpool_recycle(lp, held[k]) == FB_OK);
        }
    }
    return NULL;
}

static void *churn(void *arg)
{
    (void)arg;
    for (int it = 0; it < iterations / 20; it++) {
        fb_localpool_t tmp;
        int32_t idx[4], seg;
        int rc = fb_localpool_create(&np, &tmp, 2, 8, 0, FB_UNBOUNDED, 0);
        CHECK(rc == FB_OK);
        rc = fb_localpool_request_blocking(&tmp, FB_NO_CHANNEL, fb_deadline_after(5.0), &seg);
        CHECK(rc == FB_OK);
        fb_localpool_destroy(&tmp); /* lazy: seg is still out */
        CHECK(fb_localpool_request(&tmp, FB_NO_CHANNEL, &idx[0]) == FB_EDESTROYED);
        CHECK(fb_localpool_recycle(&tmp, seg) == FB_OK);
        fb_localpool_free(&tmp);
        fb_localpool_set_num_buffers(&pools[it % 3], 2 + it % 10);
        rc = fb_netpool_request_unpooled(&np, 4, fb_deadline_after(5.0), idx);
        CHECK(rc == FB_OK);
        CHECK(fb_netpool_recycle_unpooled(&np, idx, 4) == FB_OK);
        CHECK(fb_netpool_recycle_unpooled(&np, idx, 4) == FB_ESTATE);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    pthread_t th[NUM_WORKERS + 1];
    fb_localpool_stats_t st;
    int64_t requested = 0;
    if (argc > 1)
        iterations = atoi(argv[1]);
    CHECK(fb_netpool_init(&np, NUM_SEGMENTS, SEGMENT_SIZE, 4096, 0) == FB_OK);
    CHECK(fb_localpool_create(&np, &pools[0], 4, FB_UNBOUNDED, 0, FB_UNBOUNDED, 0) == FB_OK);
    CHECK(fb_localpool_create(&np, &pools[1], 4, 16, 4, 3, 0) == FB_OK);
    CHECK(fb_localpool_create(&np, &pools[2], 2, 4, 0, FB_UNBOUNDED, 2) == FB_OK);
    for (int i = 0; i < NUM_WORKERS; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)(i + 1));
    pthread_create(&th[NUM_WORKERS], NULL, churn, NULL);
    for (int i = 0; i <= NUM_WORKERS; i++)
        pthread_join(th[i], NULL);
    /* conservation: free + requested by pools + unpooled = total */
    for (int i = 0; i < 3; i++) {
        fb_localpool_stats(&pools[i], &st);
        CHECK(st.num_requested == st.num_avail); /* nothing handed out */
        CHECK(st.num_overdraft == 0 && st.num_unavailable_channels == 0);
        requested += st.num_requested;
    }
    CHECK(fb_netpool_num_free(&np) + requested + fb_netpool_num_unpooled(&np) == NUM_SEGMENTS);
    CHECK(fb_netpool_total_required(&np) == 10);
    for (int i = 0; i < 3; i++)
        fb_localpool_destroy(&pools[i]);
    CHECK(fb_netpool_destroy(&np) == 0);
    CHECK(fb_netpool_arena_released(&np));
    for (int i = 0; i < 3; i++)
        fb_localpool_free(&pools[i]);
    fb_netpool_free(&np);
    printf("ok\n");
    return 0;
}
