# csrc/common/byteorder.h: loads and stores of either byte order.
from libc.stdint cimport uint16_t, uint32_t, uint64_t

cdef extern from "common/byteorder.h" nogil:
    uint16_t fb_load_u16(const char *p, int big)
    uint32_t fb_load_u32(const char *p, int big)
    uint64_t fb_load_u64(const char *p, int big)
    void fb_store_u16(char *p, uint16_t v, int big)
    void fb_store_u32(char *p, uint32_t v, int big)
    void fb_store_u64(char *p, uint64_t v, int big)
    float fb_load_f32(const char *p, int big)
    double fb_load_f64(const char *p, int big)
    void fb_store_f32(char *p, float v, int big)
    void fb_store_f64(char *p, double v, int big)
