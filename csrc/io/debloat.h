/* Buffer debloating (Flink's FLIP-183): the buffer size a consumer's input
 * gate announces to its producers, so that the bytes in flight toward it
 * take about `target` to consume.
 *
 * Every `period` the gate takes one sample: the bytes its consumer took and
 * the time it spent not waiting for data.  Their ratio is the throughput
 * (bytes/s; a sample without such time keeps the last one), the throughput
 * times the target is the desired bytes in flight, and that shared among
 * the buffers in use is the size an exponential moving average follows
 * (never more than doubling in one step, kept within [min_size, max_size]).
 * A new size is announced only when it moved by the threshold (a fraction
 * of the last announced size), or reached a bound.
 *
 * Pure bookkeeping: no Python API, no lock (one thread samples a debloater),
 * no clock (times come in as arguments). */
#ifndef FLINKBUF_DEBLOAT_H
#define FLINKBUF_DEBLOAT_H

#include <stddef.h>
#include <stdint.h>

#define FB_DEBLOAT_MIN_PERIOD_NS 1000000      /* 1 ms */
#define FB_DEBLOAT_MAX_SAMPLES 1000

typedef struct fb_debloat_config {
    int64_t target_ns;      /* in-flight time target, > 0 */
    int64_t period_ns;      /* how often a gate samples, >= 1 ms */
    int32_t samples;        /* EMA samples: alpha = 2 / (samples + 1); 1..1000 */
    int32_t threshold_pct;  /* 0..100 */
    int32_t min_size;       /* 1..max_size */
    int32_t max_size;       /* the segment size, >= 1 */
} fb_debloat_config_t;

typedef struct fb_debloater {
    fb_debloat_config_t cfg;
    double ema;               /* the smoothed size, in [min_size, max_size] */
    int32_t size;             /* the last announced size (starts at max_size) */
    int64_t throughput;       /* bytes/s of the last sample with active time (0 before) */
    int64_t time_to_consume_ns;   /* of the buffers in use at the last sample's size */
    int32_t warm;             /* started small: the next sample with active time aims at once */
    int32_t rising;           /* samples in a row that aimed at twice the ema or more */
} fb_debloater_t;

/* FB_OK, or FB_EINVAL with why in err (NUL-terminated, cut at errlen; err
 * may be NULL). */
int fb_debloat_config_check(const fb_debloat_config_t *cfg, char *err, size_t errlen);

/* A debloater at the start: ema and size at max_size, throughput 0.  `cfg`
 * must have passed fb_debloat_config_check. */
void fb_debloater_init(fb_debloater_t *d, const fb_debloat_config_t *cfg);

/* Start small, as a gate does: ema and size at min_size, and the first
 * sample with active time sets the ema to its aim at once (no smoothing,
 * no doubling bound) and announces the size whatever it is (a sample
 * without active time announces nothing).  A slow consumer then never
 * starts behind whole segments, and a fast one leaves small buffers after
 * one sample.  Right after fb_debloater_init. */
void fb_debloater_start_small(fb_debloater_t *d);

/* One sample: `bytes` the consumer took over `active_ns` of time it did not
 * wait for data, and the buffers in use now.  Negative arguments are the
 * caller's bug and read as the nearest sensible value: bytes and active_ns
 * below 0 as 0, buffers_in_use below 1 as 1.
 *
 * throughput = bytes / active_ns (per second, truncated; kept when
 * active_ns is 0; at most INT64_MAX), desired = throughput * target,
 * desirable = min(desired / buffers, 2 * ema), ema += alpha * (desirable -
 * ema) clamped to [min_size, max_size], new = round(ema); but when this
 * sample and the one before both aimed at twice the ema or more
 * (`rising` >= 2), the ema doubles at once (ema = desirable): a consumer
 * that sped up leaves small buffers in a few samples instead of the
 * ~50 the smoothing would take from the minimum to whole segments.  A gate
 * samples again sooner while `rising` (after a tenth of the period).
 * time_to_consume_ns = new * buffers / max(1, throughput) (at most
 * INT64_MAX).  In double arithmetic: nothing overflows.
 *
 * Returns the size to announce (then it is d->size), or 0 to keep the last
 * one: when new equals it, or moved by less than threshold_pct percent of
 * it while strictly between min_size and max_size. */
int32_t fb_debloater_sample(fb_debloater_t *d, int64_t bytes, int64_t active_ns,
                            int32_t buffers_in_use);

#endif
