/* Flink's key-group assignment and Java's hashCode()s of common key types.
 *
 * A key goes to a key group by murmur-hashing its 32-bit hash code, and a key
 * group to one of `parallelism` operators by proportional ranges, exactly as
 * Flink's KeyGroupRangeAssignment does (so an int key lands on the same
 * subtask index as an Integer key in a Flink job with the same parallelism and
 * max parallelism).  All arithmetic is on 32-bit two's-complement ints, as in
 * Java.  No Python API. */
#ifndef FLINKBUF_KEYGROUP_H
#define FLINKBUF_KEYGROUP_H

#include <stddef.h>
#include <stdint.h>

/* Flink's MathUtils.murmurHash: MurmurHash3_x86_32 of the int's four
 * little-endian bytes with seed 0, made non-negative (MIN_VALUE -> 0).
 * fb_murmur_hash_inline is the same, for the per-record paths. */
int32_t fb_murmur_hash(int32_t code);

static inline uint32_t fb_rotl32_(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

static inline int32_t fb_murmur_hash_inline(int32_t code)
{
    uint32_t h = (uint32_t)code;
    h *= 0xcc9e2d51u;
    h = fb_rotl32_(h, 15);
    h *= 0x1b873593u;
    h = fb_rotl32_(h, 13);
    h = h * 5u + 0xe6546b64u;
    h ^= 4u; /* the input length in bytes */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    /* Flink: h if h >= 0, -h if not, and 0 for MIN_VALUE; without a branch
     * (the sign is a coin toss): |h|, whose top bit is set only for
     * MIN_VALUE, without that bit. */
    {
        uint32_t sign = 0u - (h >> 31);
        return (int32_t)(((h ^ sign) - sign) & 0x7fffffffu);
    }
}

/* murmur(hash) % max_parallelism */
int32_t fb_key_group(int32_t hash_code, int32_t max_parallelism);

/* key_group * parallelism / max_parallelism, in 64-bit to avoid overflow. */
int32_t fb_operator_index(int32_t key_group, int32_t parallelism, int32_t max_parallelism);

/* A hash code's channel among `parallelism` without a division: the
 * channel of every key group, and the key group of a murmur hash by a mask
 * where max_parallelism is a power of two, else by a multiplication
 * (Lemire's remainder by direct computation, exact for 32-bit dividends).
 * Init: FB_OK, or FB_ENOMEM; the caller checked 1 <= parallelism <=
 * max_parallelism <= 32768.  Free: idempotent (also after a failed init). */
typedef struct {
    int16_t *channel;          /* channel[key_group], max_parallelism entries */
    uint32_t mask;             /* max_parallelism - 1 if a power of two, else 0 */
    uint32_t max_parallelism;
    uint64_t magic;            /* 2**64 / max_parallelism, rounded up (mod 2**64) */
} fb_key_assignment_t;

int fb_key_assignment_init(fb_key_assignment_t *a, int32_t parallelism, int32_t max_parallelism);
void fb_key_assignment_free(fb_key_assignment_t *a);

static inline int32_t fb_key_assignment_channel(const fb_key_assignment_t *a, int32_t hash_code)
{
    uint32_t h = (uint32_t)fb_murmur_hash_inline(hash_code);   /* non-negative */
    uint32_t kg;
    if (a->mask || a->max_parallelism == 1)
        kg = h & a->mask;
    else
#ifdef __SIZEOF_INT128__
        kg = (uint32_t)(((unsigned __int128)(a->magic * h) * a->max_parallelism) >> 64);
#else
        kg = h % a->max_parallelism;
#endif
    return a->channel[kg];
}

/* Java's Long.hashCode, Double.hashCode (with doubleToLongBits' canonical NaN),
 * Arrays.hashCode(byte[]) and String.hashCode over UTF-16 code units of the
 * `len` code points at `data`, each `width` (1, 2 or 4) bytes wide. */
int32_t fb_java_long_hash(int64_t v);
int32_t fb_java_double_hash(double v);
int32_t fb_java_bytes_hash(const unsigned char *p, size_t n);
int32_t fb_java_string_hash(const void *data, int width, size_t len);

/* flinkbuf's hash code of an integer key (as for a Python int): Integer's
 * (the value) in the int32 range, Long's beyond it, and for a uint64 of
 * 2**63 and more BigInteger's. */
int32_t fb_java_int64_hash(int64_t v);
int32_t fb_java_uint64_hash(uint64_t v);

/* Java's String.hashCode of the `n` bytes of UTF-8 at `p` (over its UTF-16
 * code units) in *out: FB_OK, or FB_EINVAL for bytes that are not
 * well-formed UTF-8 (then *out is unset). */
int fb_java_utf8_hash(const unsigned char *p, size_t n, int32_t *out);

/* The kinds of fixed-width keys fb_assign_keys reads. */
enum {
    FB_KEYS_SIGNED = 0,    /* two's-complement integers of 1, 2, 4 or 8 bytes */
    FB_KEYS_UNSIGNED = 1,  /* unsigned integers of 1, 2, 4 or 8 bytes */
    FB_KEYS_BOOL = 2,      /* one byte: zero is false, anything else true (Boolean) */
    FB_KEYS_FLOAT = 3      /* IEEE floats of 4 or 8 bytes, hashed as Double */
};

/* Vectorized key-group assignment, bit-exact with the scalar functions
 * above: for each of the `n` keys at `keys` (native byte order, `width`
 * bytes each, of `kind`), the operator index among `parallelism` of its
 * key group among `max_parallelism` (with parallelism == max_parallelism,
 * the key group itself), stored at `out` as a signed integer of
 * `out_width` (1, 2, 4 or 8) bytes.  Touches no memory beyond
 * `n * width` bytes of keys and `n * out_width` of out.  Returns FB_OK,
 * FB_EINVAL for an unknown kind or width, max_parallelism outside
 * [1, 32768] or parallelism outside [1, max_parallelism], or FB_ENOMEM (its
 * table of max_parallelism channels, 2 bytes each, could not be had).
 * Integer and boolean keys that span at most 65536 values, fewer than half
 * their number, are hashed once per value of their range and looked up. */
int fb_assign_keys(const void *keys, int kind, int width, size_t n, int32_t parallelism,
                   int32_t max_parallelism, void *out, int out_width);

/* The same for `n` keys of variable length: key i is the bytes
 * data[offsets[i], offsets[i + 1]) (`n + 1` offsets of `offset_width`, 4 or
 * 8, bytes; each is read once and checked to lie in [0, data_len] and not
 * below the one before), hashed as String over its UTF-8 (`utf8` != 0) or
 * as byte[].  FB_EINVAL also for a bad offset or ill-formed UTF-8; then
 * *bad (if not NULL) is the key's index and `out` is partly written. */
int fb_assign_varlen_keys(const unsigned char *data, size_t data_len, const void *offsets,
                          int offset_width, size_t n, int utf8, int32_t parallelism,
                          int32_t max_parallelism, void *out, int out_width, size_t *bad);

#endif
