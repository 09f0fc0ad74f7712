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
 * little-endian bytes with seed 0, made non-negative (MIN_VALUE -> 0). */
int32_t fb_murmur_hash(int32_t code);

/* murmur(hash) % max_parallelism */
int32_t fb_key_group(int32_t hash_code, int32_t max_parallelism);

/* key_group * parallelism / max_parallelism, in 64-bit to avoid overflow. */
int32_t fb_operator_index(int32_t key_group, int32_t parallelism, int32_t max_parallelism);

/* Java's Long.hashCode, Double.hashCode (with doubleToLongBits' canonical NaN),
 * Arrays.hashCode(byte[]) and String.hashCode over UTF-16 code units of the
 * `len` code points at `data`, each `width` (1, 2 or 4) bytes wide. */
int32_t fb_java_long_hash(int64_t v);
int32_t fb_java_double_hash(double v);
int32_t fb_java_bytes_hash(const unsigned char *p, size_t n);
int32_t fb_java_string_hash(const void *data, int width, size_t len);

#endif
