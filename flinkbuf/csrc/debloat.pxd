# csrc/io/debloat.h: buffer debloating's arithmetic (throughput, the smoothed
# buffer size, when to announce it).
from libc.stdint cimport int32_t, int64_t

cdef extern from "io/debloat.h" nogil:
    enum:
        FB_DEBLOAT_MIN_PERIOD_NS
        FB_DEBLOAT_MAX_SAMPLES

    ctypedef struct fb_debloat_config_t:
        int64_t target_ns
        int64_t period_ns
        int32_t samples
        int32_t threshold_pct
        int32_t min_size
        int32_t max_size

    ctypedef struct fb_debloater_t:
        fb_debloat_config_t cfg
        double ema
        int32_t size
        int64_t throughput
        int64_t time_to_consume_ns
        int32_t warm
        int32_t rising

    int fb_debloat_config_check(const fb_debloat_config_t *cfg, char *err, size_t errlen)
    void fb_debloater_init(fb_debloater_t *d, const fb_debloat_config_t *cfg)
    void fb_debloater_start_small(fb_debloater_t *d)
    int32_t fb_debloater_sample(fb_debloater_t *d, int64_t bytes, int64_t active_ns,
                                int32_t buffers_in_use)
