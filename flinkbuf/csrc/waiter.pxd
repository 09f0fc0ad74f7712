# csrc/common/waiter.h: the one waiter mechanism (a thread that would wait
# for a pool's buffer or a gate's data serves a lender instead); the
# contract is stated there.  Only the C units use it.
cdef extern from "common/waiter.h" nogil:
    ctypedef struct fb_lender_t:
        void *arg

    ctypedef struct fb_waitpoint_t:
        int busy
