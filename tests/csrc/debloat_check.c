/* csrc/io/debloat.c on its own: the configuration check, worked steps, and
 * every extreme of its inputs (under the sanitizers, a cast out of range or
 * an overflow aborts).  Prints "ok" or the first broken promise (exit 1). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/status.h"
#include "io/debloat.h"

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            printf("line %d: %s\n", __LINE__, #cond);                       \
            return 1;                                                       \
        }                                                                   \
    } while (0)

#define NS 1000000000LL

static fb_debloat_config_t config(int32_t samples, int32_t threshold, int32_t min_size,
                                  int32_t max_size)
{
    fb_debloat_config_t cfg = {NS, 200 * 1000000LL, samples, threshold, min_size, max_size};
    return cfg;
}

static int check_config(void)
{
    char err[64];
    fb_debloat_config_t good = config(20, 25, 256, 32768), bad;
    CHECK(fb_debloat_config_check(&good, err, sizeof err) == FB_OK && err[0] == '\0');
    CHECK(fb_debloat_config_check(&good, NULL, 0) == FB_OK);
    bad = good; bad.target_ns = 0;
    CHECK(fb_debloat_config_check(&bad, err, sizeof err) == FB_EINVAL && strstr(err, "target"));
    bad = good; bad.period_ns = FB_DEBLOAT_MIN_PERIOD_NS - 1;
    CHECK(fb_debloat_config_check(&bad, err, sizeof err) == FB_EINVAL && strstr(err, "period"));
    bad = good; bad.samples = 0;
    CHECK(fb_debloat_config_check(&bad, err, sizeof err) == FB_EINVAL && strstr(err, "samples"));
    bad.samples = FB_DEBLOAT_MAX_SAMPLES + 1;
    CHECK(fb_debloat_config_check(&bad, NULL, 0) == FB_EINVAL);
    bad = good; bad.threshold_pct = 101;
    CHECK(fb_debloat_config_check(&bad, err, 4) == FB_EINVAL && strlen(err) == 3);
    bad = good; bad.max_size = 0;
    CHECK(fb_debloat_config_check(&bad, err, sizeof err) == FB_EINVAL && strstr(err, "max"));
    bad = good; bad.min_size = 32769;
    CHECK(fb_debloat_config_check(&bad, err, sizeof err) == FB_EINVAL && strstr(err, "min"));
    return 0;
}

/* samples 1 (alpha 1), target 1 s, 1 s of activity: the size is the bytes
 * taken per buffer, at most twice the last, announced past the threshold. */
static int check_steps(void)
{
    fb_debloat_config_t cfg = config(1, 25, 100, 4096);
    fb_debloater_t d;
    fb_debloater_init(&d, &cfg);
    CHECK(d.size == 4096 && d.ema == 4096.0 && d.throughput == 0);
    CHECK(fb_debloater_sample(&d, 1000, NS, 1) == 1000 && d.time_to_consume_ns == NS);
    CHECK(fb_debloater_sample(&d, 751, NS, 1) == 0 && d.size == 1000);
    CHECK(fb_debloater_sample(&d, 1250, NS, 1) == 1250);
    CHECK(fb_debloater_sample(&d, 1000000, NS, 1) == 2500 && d.ema == 2500.0);
    CHECK(fb_debloater_sample(&d, 1000000, NS, 0) == 4096);      /* 0 buffers count as 1 */
    CHECK(fb_debloater_sample(&d, 3000, NS, 40) == 100);
    CHECK(fb_debloater_sample(&d, -5, NS, 1) == 0 && d.throughput == 0);
    CHECK(fb_debloater_sample(&d, 5000, 0, 1) == 0 && d.throughput == 0);
    CHECK(fb_debloater_sample(&d, 5000, -1, 1) == 0 && d.throughput == 0);
    /* a smoother one: each step a tenth of the way (samples 19) */
    cfg = config(19, 0, 1, 1000);
    fb_debloater_init(&d, &cfg);
    CHECK(fb_debloater_sample(&d, 0, NS, 1) == 900 && d.ema == 900.0);
    return 0;
}

static int check_extremes(void)
{
    static const int64_t bytes[] = {INT64_MIN, -1, 0, 1, 1LL << 40, 1LL << 62, INT64_MAX};
    static const int64_t active[] = {INT64_MIN, -1, 0, 1, NS, INT64_MAX};
    static const int32_t buffers[] = {INT32_MIN, -1, 0, 1, 1000, INT32_MAX};
    static const int32_t sizes[] = {1, 2, 32768, INT32_MAX};
    size_t b, a, n, s;
    double expected;
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        fb_debloat_config_t cfg = config(1, 0, 1, sizes[s]);
        fb_debloater_t d;
        cfg.target_ns = 3600 * NS;
        fb_debloater_init(&d, &cfg);
        for (b = 0; b < sizeof bytes / sizeof bytes[0]; b++)
            for (a = 0; a < sizeof active / sizeof active[0]; a++)
                for (n = 0; n < sizeof buffers / sizeof buffers[0]; n++) {
                    double before = d.ema;
                    int32_t got = fb_debloater_sample(&d, bytes[b], active[a], buffers[n]);
                    CHECK(got == 0 || got == d.size);
                    CHECK(d.size >= 1 && d.size <= sizes[s]);
                    CHECK(d.ema >= 1.0 && d.ema <= (double)sizes[s] && d.ema <= 2 * before);
                    CHECK(d.throughput >= 0 && d.time_to_consume_ns >= 0);
                }
        for (n = 0; n < 33; n++)      /* doubling at most, up to the segment size */
            fb_debloater_sample(&d, INT64_MAX, 1, 1);
        CHECK(d.throughput == INT64_MAX && d.size == sizes[s]);
        /* throughput 0 counts as 1 B/s: size * buffers seconds, at most INT64_MAX ns
         * (min_size = max_size: the size stays) */
        cfg.min_size = sizes[s];
        fb_debloater_init(&d, &cfg);
        fb_debloater_sample(&d, 0, 0, INT32_MAX);
        expected = (double)sizes[s] * INT32_MAX * 1e9;
        if (expected >= 9223372036854775808.0)
            CHECK(d.time_to_consume_ns == INT64_MAX);
        else
            CHECK(fabs((double)d.time_to_consume_ns - expected) < 1024.0);
    }
    return 0;
}

int main(void)
{
    if (check_config() || check_steps() || check_extremes())
        return 1;
    printf("ok\n");
    return 0;
}
