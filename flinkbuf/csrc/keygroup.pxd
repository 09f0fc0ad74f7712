# csrc/io/keygroup.h: Flink's key groups and Java's hashCode()s.
from libc.stdint cimport int16_t, int32_t, int64_t, uint64_t

cdef extern from "io/keygroup.h" nogil:
    int32_t fb_murmur_hash(int32_t code)
    int32_t fb_murmur_hash_inline(int32_t code)

    ctypedef struct fb_key_assignment_t:
        int16_t *channel
    int fb_key_assignment_init(fb_key_assignment_t *a, int32_t parallelism,
                               int32_t max_parallelism)
    void fb_key_assignment_free(fb_key_assignment_t *a)
    int32_t fb_key_assignment_channel(const fb_key_assignment_t *a, int32_t hash_code)
    int32_t fb_key_group(int32_t hash_code, int32_t max_parallelism)
    int32_t fb_operator_index(int32_t key_group, int32_t parallelism, int32_t max_parallelism)
    int32_t fb_java_long_hash(int64_t v)
    int32_t fb_java_double_hash(double v)
    int32_t fb_java_bytes_hash(const unsigned char *p, size_t n)
    int32_t fb_java_string_hash(const void *data, int width, size_t len)
    int32_t fb_java_int64_hash(int64_t v)
    int32_t fb_java_uint64_hash(uint64_t v)
    int fb_java_utf8_hash(const unsigned char *p, size_t n, int32_t *out)

    enum:
        FB_KEYS_SIGNED
        FB_KEYS_UNSIGNED
        FB_KEYS_BOOL
        FB_KEYS_FLOAT

    int fb_assign_keys(const void *keys, int kind, int width, size_t n, int32_t parallelism,
                       int32_t max_parallelism, void *out, int out_width)
    int fb_assign_varlen_keys(const unsigned char *data, size_t data_len, const void *offsets,
                              int offset_width, size_t n, int utf8, int32_t parallelism,
                              int32_t max_parallelism, void *out, int out_width, size_t *bad)
