#include "io/keygroup.h"

#include <math.h>
#include <string.h>

/* Java int arithmetic: wrap modulo 2^32. */
static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

int32_t fb_murmur_hash(int32_t code)
{
    uint32_t h = (uint32_t)code;
    h *= 0xcc9e2d51u;
    h = rotl32(h, 15);
    h *= 0x1b873593u;
    h = rotl32(h, 13);
    h = h * 5u + 0xe6546b64u;
    h ^= 4u; /* the input length in bytes */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    if ((int32_t)h >= 0)
        return (int32_t)h;
    if (h != 0x80000000u)
        return (int32_t)(0u - h);
    return 0;
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
        if (c >= 0x10000u) { /* a surrogate pair in UTF-16 */
            c -= 0x10000u;
            h = 31u * h + (0xd800u + (c >> 10));
            h = 31u * h + (0xdc00u + (c & 0x3ffu));
        } else {
            h = 31u * h + c;
        }
    }
    return (int32_t)h;
}
