# csrc/buffer/arena.h: aligned off-heap memory.
cdef extern from "buffer/arena.h" nogil:
    int fb_is_pow2(size_t x)
    size_t fb_stride(size_t segment_size)
    void *fb_aligned_alloc(size_t size, size_t alignment)
    void fb_aligned_free(void *p)
