#include "io/keygroup.h"

#include "common/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int32_t fb_murmur_hash(int32_t code)
{
    return fb_murmur_hash_inline(code);
}

int32_t fb_key_group(int32_t hash_code, int32_t max_parallelism)
{
    return fb_murmur_hash(hash_code) % max_parallelism;
}

int32_t fb_operator_index(int32_t key_group, int32_t parallelism, int32_t max_parallelism)
{
    return (int32_t)((int64_t)key_group * parallelism / max_parallelism);
}

int32_t fb_java_long_hash(int64_t v)
{
    uint64_t u = (uint64_t)v;
    return (int32_t)(uint32_t)(u ^ (u >> 32));
}

int32_t fb_java_double_hash(double v)
{
    uint64_t bits;
    if (isnan(v))
        bits = 0x7ff8000000000000ull;
    else
        memcpy(&bits, &v, sizeof bits);
    return (int32_t)(uint32_t)(bits ^ (bits >> 32));
}

int32_t fb_java_bytes_hash(const unsigned char *p, size_t n)
{
    uint32_t h = 1;
    size_t i;
    for (i = 0; i < n; i++)
        h = 31u * h + (uint32_t)(int32_t)(signed char)p[i];
    return (int32_t)h;
}

/* String.hashCode's step over code point c: its UTF-16 code units, a
 * surrogate pair beyond the BMP. */
static inline uint32_t string_hash_step(uint32_t h, uint32_t c)
{
    if (c >= 0x10000u) {
        c -= 0x10000u;
        h = 31u * h + (0xd800u + (c >> 10));
        return 31u * h + (0xdc00u + (c & 0x3ffu));
    }
    return 31u * h + c;
}

int32_t fb_java_string_hash(const void *data, int width, size_t len)
{
    uint32_t h = 0, c;
    size_t i;
    for (i = 0; i < len; i++) {
        if (width == 1)
            c = ((const uint8_t *)data)[i];
        else if (width == 2)
            c = ((const uint16_t *)data)[i];
        else
            c = ((const uint32_t *)data)[i];
        h = string_hash_step(h, c);
    }
    return (int32_t)h;
}

int32_t fb_java_int64_hash(int64_t v)
{
    int32_t low = (int32_t)(uint32_t)(uint64_t)v;
    return (int64_t)low == v ? low : fb_java_long_hash(v);
}

int32_t fb_java_uint64_hash(uint64_t v)
{
    if (v <= (uint64_t)INT64_MAX)
        return fb_java_int64_hash((int64_t)v);
    /* BigInteger.hashCode of a positive magnitude of two 32-bit words:
     * 31 * high + low, in int arithmetic. */
    return (int32_t)(31u * (uint32_t)(v >> 32) + (uint32_t)v);
}

int fb_java_utf8_hash(const unsigned char *p, size_t n, int32_t *out)
{
    uint32_t h = 0, c;
    size_t i = 0;
    while (i < n) {
        unsigned char b = p[i];
        if (b < 0x80) {
            c = b;
            i += 1;
        } else if (b >= 0xc2 && b <= 0xdf) {
            if (n - i < 2 || (p[i + 1] & 0xc0) != 0x80)
                return FB_EINVAL;
            c = ((uint32_t)(b & 0x1f) << 6) | (p[i + 1] & 0x3f);
            i += 2;
        } else if (b >= 0xe0 && b <= 0xef) {
            if (n - i < 3 || (p[i + 1] & 0xc0) != 0x80 || (p[i + 2] & 0xc0) != 0x80)
                return FB_EINVAL;
            c = ((uint32_t)(b & 0x0f) << 12) | ((uint32_t)(p[i + 1] & 0x3f) << 6)
                | (p[i + 2] & 0x3f);
            if (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))   /* overlong, a surrogate */
                return FB_EINVAL;
            i += 3;
        } else if (b >= 0xf0 && b <= 0xf4) {
            if (n - i < 4 || (p[i + 1] & 0xc0) != 0x80 || (p[i + 2] & 0xc0) != 0x80
                    || (p[i + 3] & 0xc0) != 0x80)
                return FB_EINVAL;
            c = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(p[i + 1] & 0x3f) << 12)
                | ((uint32_t)(p[i + 2] & 0x3f) << 6) | (p[i + 3] & 0x3f);
            if (c < 0x10000 || c > 0x10ffff)
                return FB_EINVAL;
            i += 4;
        } else {
            return FB_EINVAL;      /* a continuation byte, an overlong lead, or > U+10FFFF */
        }
        h = string_hash_step(h, c);
    }
    *out = (int32_t)h;
    return FB_OK;
}

int fb_key_assignment_init(fb_key_assignment_t *a, int32_t parallelism, int32_t max_parallelism)
{
    int32_t kg;
    a->channel = malloc((size_t)max_parallelism * sizeof *a->channel);
    if (a->channel == NULL)
        return FB_ENOMEM;
    for (kg = 0; kg < max_parallelism; kg++)
        a->channel[kg] = (int16_t)fb_operator_index(kg, parallelism, max_parallelism);
    a->max_parallelism = (uint32_t)max_parallelism;
    a->mask = (max_parallelism & (max_parallelism - 1)) == 0 ? (uint32_t)max_parallelism - 1 : 0;
    a->magic = UINT64_MAX / (uint64_t)max_parallelism + 1;
    return FB_OK;
}

void fb_key_assignment_free(fb_key_assignment_t *a)
{
    free(a->channel);
    a->channel = NULL;
}

static inline void store(void *out, int out_width, size_t i, int32_t v)
{
    switch (out_width) {
    case 1: ((int8_t *)out)[i] = (int8_t)v; break;
    case 2: ((int16_t *)out)[i] = (int16_t)v; break;
    case 4: ((int32_t *)out)[i] = v; break;
    default: ((int64_t *)out)[i] = v; break;
    }
}

static int check_assignment(int32_t parallelism, int32_t max_parallelism, int out_width)
{
    if (max_parallelism < 1 || max_parallelism > 32768)
        return FB_EINVAL;
    if (parallelism < 1 || parallelism > max_parallelism)
        return FB_EINVAL;
    if (out_width != 1 && out_width != 2 && out_width != 4 && out_width != 8)
        return FB_EINVAL;
    /* every channel, at most parallelism - 1, fits the output's integers */
    if ((out_width == 1 && parallelism > 128) || (out_width == 2 && parallelism > 32768))
        return FB_EINVAL;
    return FB_OK;
}

/* One loop per key type: the hash of element i of an array of T. */
#define ASSIGN_TO(T, HASH, O)                                                       \
    do {                                                                             \
        const T *k = (const T *)keys;                                                \
        O *o = (O *)out;                                                             \
        for (i = 0; i < n; i++)                                                      \
            o[i] = (O)fb_key_assignment_channel(&a, HASH(k[i]));                     \
    } while (0)
#define ASSIGN_LOOP(T, HASH)                                                        \
    do {                                                                             \
        switch (out_width) {                                                         \
        case 1: ASSIGN_TO(T, HASH, int8_t); break;                                   \
        case 2: ASSIGN_TO(T, HASH, int16_t); break;                                  \
        case 4: ASSIGN_TO(T, HASH, int32_t); break;                                  \
        default: ASSIGN_TO(T, HASH, int64_t); break;                                 \
        }                                                                            \
    } while (0)
#define AS_INT(v) ((int32_t)(v))
#define AS_BOOL(v) ((v) ? 1231 : 1237)

/* Integer keys of a narrow range (a few thousand ids, say) are cheaper
 * looked up than hashed: each value of the range is hashed once into a
 * table of channels, at most RANGE_MAX of them, and only when the keys
 * are at least twice as many as the values.  The first RANGE_PROBE keys
 * decide whether the whole array is scanned for its range at all, so
 * widely spread keys pay next to nothing for the try. */
#define RANGE_MAX 65536u
#define RANGE_PROBE 256u

/* The channel of every value in [lo, lo + span] of T in a new table, or
 * NULL (no memory: the keys are hashed one by one instead). */
#define RANGE_TABLE(T, HASH, table, lo, span)                                        \
    do {                                                                             \
        uint64_t j_;                                                                 \
        table = malloc(((size_t)(span) + 1) * sizeof *table);                        \
        if (table != NULL)                                                           \
            for (j_ = 0; j_ <= (span); j_++)                                         \
                table[j_] = (int16_t)fb_key_assignment_channel(                      \
                    &a, HASH((T)((uint64_t)(lo) + j_)));                             \
    } while (0)
#define RANGE_LOOKUP(T, O)                                                          \
    do {                                                                             \
        const T *k = (const T *)keys;                                                \
        O *o = (O *)out;                                                             \
        for (i = 0; i < n; i++)                                                      \
            o[i] = (O)table[(uint64_t)k[i] - (uint64_t)lo];                          \
    } while (0)
/* Sets `done` when the keys of T had a narrow range and are assigned. */
#define ASSIGN_RANGE(T, HASH, done)                                                 \
    do {                                                                             \
        const T *k = (const T *)keys;                                                \
        T lo = k[0], hi = k[0];                                                      \
        size_t end_ = n < RANGE_PROBE ? n : RANGE_PROBE;                             \
        int wide_;                                                                   \
        int16_t *table;                                                              \
        for (i = 1;; end_ = n) {      /* the probe, then the rest */                 \
            for (; i < end_; i++) {                                                  \
                lo = k[i] < lo ? k[i] : lo;                                          \
                hi = k[i] > hi ? k[i] : hi;                                          \
            }                                                                        \
            wide_ = (uint64_t)hi - (uint64_t)lo >= RANGE_MAX                         \
                    || (uint64_t)hi - (uint64_t)lo >= n / 2;                         \
            if (wide_ || end_ == n)                                                  \
                break;                                                               \
        }                                                                            \
        if (wide_)                                                                   \
            break;                                                                   \
        RANGE_TABLE(T, HASH, table, lo, (uint64_t)hi - (uint64_t)lo);                \
        if (table == NULL)                                                           \
            break;                                                                   \
        switch (out_width) {                                                         \
        case 1: RANGE_LOOKUP(T, int8_t); break;                                      \
        case 2: RANGE_LOOKUP(T, int16_t); break;                                     \
        case 4: RANGE_LOOKUP(T, int32_t); break;                                     \
        default: RANGE_LOOKUP(T, int64_t); break;                                    \
        }                                                                            \
        free(table);                                                                 \
        done = 1;                                                                    \
    } while (0)

int fb_assign_keys(const void *keys, int kind, int width, size_t n, int32_t parallelism,
                   int32_t max_parallelism, void *out, int out_width)
{
    size_t i;
    int done = 0;
    fb_key_assignment_t a;
    if (check_assignment(parallelism, max_parallelism, out_width) != FB_OK)
        return FB_EINVAL;
    switch (kind * 16 + width) {
    case FB_KEYS_SIGNED * 16 + 1: case FB_KEYS_SIGNED * 16 + 2: case FB_KEYS_SIGNED * 16 + 4:
    case FB_KEYS_SIGNED * 16 + 8: case FB_KEYS_UNSIGNED * 16 + 1:
    case FB_KEYS_UNSIGNED * 16 + 2: case FB_KEYS_UNSIGNED * 16 + 4:
    case FB_KEYS_UNSIGNED * 16 + 8: case FB_KEYS_BOOL * 16 + 1: case FB_KEYS_FLOAT * 16 + 4:
    case FB_KEYS_FLOAT * 16 + 8:
        break;
    default:
        return FB_EINVAL;
    }
    if (n == 0)
        return FB_OK;
    if (fb_key_assignment_init(&a, parallelism, max_parallelism) != FB_OK)
        return FB_ENOMEM;
    switch (kind * 16 + width) {
    case FB_KEYS_SIGNED * 16 + 1: ASSIGN_RANGE(int8_t, AS_INT, done); break;
    case FB_KEYS_SIGNED * 16 + 2: ASSIGN_RANGE(int16_t, AS_INT, done); break;
    case FB_KEYS_SIGNED * 16 + 4: ASSIGN_RANGE(int32_t, AS_INT, done); break;
    case FB_KEYS_SIGNED * 16 + 8: ASSIGN_RANGE(int64_t, fb_java_int64_hash, done); break;
    case FB_KEYS_UNSIGNED * 16 + 1: ASSIGN_RANGE(uint8_t, AS_INT, done); break;
    case FB_KEYS_UNSIGNED * 16 + 2: ASSIGN_RANGE(uint16_t, AS_INT, done); break;
    case FB_KEYS_UNSIGNED * 16 + 4: ASSIGN_RANGE(uint32_t, fb_java_int64_hash, done); break;
    case FB_KEYS_UNSIGNED * 16 + 8: ASSIGN_RANGE(uint64_t, fb_java_uint64_hash, done); break;
    case FB_KEYS_BOOL * 16 + 1: ASSIGN_RANGE(uint8_t, AS_BOOL, done); break;
    default: break;
    }
    if (done) {
        fb_key_assignment_free(&a);
        return FB_OK;
    }
    switch (kind * 16 + width) {
    case FB_KEYS_SIGNED * 16 + 1: ASSIGN_LOOP(int8_t, AS_INT); break;
    case FB_KEYS_SIGNED * 16 + 2: ASSIGN_LOOP(int16_t, AS_INT); break;
    case FB_KEYS_SIGNED * 16 + 4: ASSIGN_LOOP(int32_t, AS_INT); break;
    case FB_KEYS_SIGNED * 16 + 8: ASSIGN_LOOP(int64_t, fb_java_int64_hash); break;
    case FB_KEYS_UNSIGNED * 16 + 1: ASSIGN_LOOP(uint8_t, AS_INT); break;
    case FB_KEYS_UNSIGNED * 16 + 2: ASSIGN_LOOP(uint16_t, AS_INT); break;
    case FB_KEYS_UNSIGNED * 16 + 4: ASSIGN_LOOP(uint32_t, fb_java_int64_hash); break;
    case FB_KEYS_UNSIGNED * 16 + 8: ASSIGN_LOOP(uint64_t, fb_java_uint64_hash); break;
    case FB_KEYS_BOOL * 16 + 1: ASSIGN_LOOP(uint8_t, AS_BOOL); break;
    case FB_KEYS_FLOAT * 16 + 4: ASSIGN_LOOP(float, fb_java_double_hash); break;
    default: ASSIGN_LOOP(double, fb_java_double_hash); break;
    }
    fb_key_assignment_free(&a);
    return FB_OK;
}

int fb_assign_varlen_keys(const unsigned char *data, size_t data_len, const void *offsets,
                          int offset_width, size_t n, int utf8, int32_t parallelism,
                          int32_t max_parallelism, void *out, int out_width, size_t *bad)
{
    size_t i;
    int64_t start, end;
    int32_t h;
    int rc = FB_OK;
    fb_key_assignment_t a;
    if (check_assignment(parallelism, max_parallelism, out_width) != FB_OK
            || (offset_width != 4 && offset_width != 8))
        return FB_EINVAL;
    if (n == 0)
        return FB_OK;
    if (fb_key_assignment_init(&a, parallelism, max_parallelism) != FB_OK)
        return FB_ENOMEM;
    start = offset_width == 4 ? ((const int32_t *)offsets)[0] : ((const int64_t *)offsets)[0];
    for (i = 0; i < n; i++) {
        end = offset_width == 4 ? ((const int32_t *)offsets)[i + 1]
                                : ((const int64_t *)offsets)[i + 1];
        if (start < 0 || end < start || (uint64_t)end > (uint64_t)data_len
                || (utf8 && fb_java_utf8_hash(data + start, (size_t)(end - start), &h) != FB_OK)) {
            if (bad != NULL)
                *bad = i;
            rc = FB_EINVAL;
            break;
        }
        if (!utf8)
            h = fb_java_bytes_hash(data + start, (size_t)(end - start));
        store(out, out_width, i, fb_key_assignment_channel(&a, h));
        start = end;
    }
    fb_key_assignment_free(&a);
    return rc;
}
