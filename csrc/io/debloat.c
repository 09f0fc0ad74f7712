#include "io/debloat.h"

#include "common/status.h"

#include <math.h>
#include <stdio.h>

#define NS_PER_S 1e9
#define TWO_63 9223372036854775808.0     /* 2**63: the first double past INT64_MAX */

static int config_error(char *err, size_t errlen, const char *why)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s", why);
    return FB_EINVAL;
}

int fb_debloat_config_check(const fb_debloat_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->target_ns <= 0)
        return config_error(err, errlen, "target_ns must be > 0");
    if (cfg->period_ns < FB_DEBLOAT_MIN_PERIOD_NS)
        return config_error(err, errlen, "period_ns must be >= 1000000 (1 ms)");
    if (cfg->samples < 1 || cfg->samples > FB_DEBLOAT_MAX_SAMPLES)
        return config_error(err, errlen, "samples must be in 1..1000");
    if (cfg->threshold_pct < 0 || cfg->threshold_pct > 100)
        return config_error(err, errlen, "threshold_pct must be in 0..100");
    if (cfg->max_size < 1)
        return config_error(err, errlen, "max_size must be >= 1");
    if (cfg->min_size < 1 || cfg->min_size > cfg->max_size)
        return config_error(err, errlen, "min_size must be in 1..max_size");
    if (err != NULL && errlen > 0)
        err[0] = '\0';
    return FB_OK;
}

void fb_debloater_init(fb_debloater_t *d, const fb_debloat_config_t *cfg)
{
    d->cfg = *cfg;
    d->ema = (double)cfg->max_size;
    d->size = cfg->max_size;
    d->throughput = 0;
    d->time_to_consume_ns = 0;
    d->warm = 0;
    d->rising = 0;
}

void fb_debloater_start_small(fb_debloater_t *d)
{
    d->ema = (double)d->cfg.min_size;
    d->size = d->cfg.min_size;
    d->warm = 1;
}

/* A non-negative double as an int64, INT64_MAX from 2**63 on (the cast
 * itself would be undefined there). */
static int64_t saturate(double x)
{
    return x >= TWO_63 ? INT64_MAX : (int64_t)x;
}

/* Whether a new size stays unannounced: the last one, or one that moved by
 * less than the threshold and is at neither bound. */
static int skip_update(const fb_debloater_t *d, int32_t size)
{
    int64_t delta = (int64_t)size - d->size;
    if (size == d->size)
        return 1;
    if (size <= d->cfg.min_size || size >= d->cfg.max_size)
        return 0;
    if (delta < 0)
        delta = -delta;
    return delta * 100 < (int64_t)d->size * d->cfg.threshold_pct;
}

int32_t fb_debloater_sample(fb_debloater_t *d, int64_t bytes, int64_t active_ns,
                            int32_t buffers_in_use)
{
    const fb_debloat_config_t *cfg = &d->cfg;
    double alpha = 2.0 / ((double)cfg->samples + 1.0);
    double desired, desirable, buffers;
    int32_t size;

    if (bytes < 0)
        bytes = 0;
    if (buffers_in_use < 1)
        buffers_in_use = 1;
    if (active_ns > 0)
        d->throughput = saturate((double)bytes * NS_PER_S / (double)active_ns);
    buffers = (double)buffers_in_use;

    desired = (double)d->throughput * (double)cfg->target_ns / NS_PER_S;
    desirable = desired / buffers;
    if (d->warm) {
        if (active_ns <= 0)
            return 0;                    /* nothing measured yet */
        d->ema = desirable;
    } else if (desirable >= 2.0 * d->ema) {
        desirable = 2.0 * d->ema;
        if (d->rising < 2)
            d->rising++;
        /* Twice in a row: the consumer sped up, not a noisy sample. */
        d->ema = d->rising >= 2 ? desirable : d->ema + alpha * (desirable - d->ema);
    } else {
        d->rising = 0;
        d->ema += alpha * (desirable - d->ema);
    }
    if (d->ema < (double)cfg->min_size)
        d->ema = (double)cfg->min_size;
    if (d->ema > (double)cfg->max_size)
        d->ema = (double)cfg->max_size;
    size = (int32_t)lround(d->ema);

    d->time_to_consume_ns = saturate((double)size * buffers * NS_PER_S
                                     / (double)(d->throughput > 1 ? d->throughput : 1));
    if (!d->warm && skip_update(d, size))
        return 0;
    d->warm = 0;
    d->size = size;
    return size;
}
