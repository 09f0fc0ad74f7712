/* Unaligned loads and stores in either byte order. Header-only. */
#ifndef FLINKBUF_BYTEORDER_H
#define FLINKBUF_BYTEORDER_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define FB_NATIVE_BIG 1
#else
#define FB_NATIVE_BIG 0
#endif

#define FB_DEFINE_LOADSTORE(bits)                                                                  \
    static inline uint##bits##_t fb_load_u##bits(const char *p, int big)                           \
    {                                                                                              \
        uint##bits##_t v;                                                                          \
        memcpy(&v, p, sizeof v);                                                                   \
        return big != FB_NATIVE_BIG ? fb_bswap##bits(v) : v;                                       \
    }                                                                                              \
    static inline void fb_store_u##bits(char *p, uint##bits##_t v, int big)                        \
    {                                                                                              \
        if (big != FB_NATIVE_BIG)                                                                  \
            v = fb_bswap##bits(v);                                                                 \
        memcpy(p, &v, sizeof v);                                                                   \
    }

static inline uint16_t fb_bswap16(uint16_t v) { return __builtin_bswap16(v); }
static inline uint32_t fb_bswap32(uint32_t v) { return __builtin_bswap32(v); }
static inline uint64_t fb_bswap64(uint64_t v) { return __builtin_bswap64(v); }

FB_DEFINE_LOADSTORE(16)
FB_DEFINE_LOADSTORE(32)
FB_DEFINE_LOADSTORE(64)

static inline float fb_load_f32(const char *p, int big)
{
    uint32_t u = fb_load_u32(p, big);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void fb_store_f32(char *p, float f, int big)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    fb_store_u32(p, u, big);
}
static inline double fb_load_f64(const char *p, int big)
{
    uint64_t u = fb_load_u64(p, big);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static inline void fb_store_f64(char *p, double d, int big)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    fb_store_u64(p, u, big);
}

#endif
