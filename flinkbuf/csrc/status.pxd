# csrc/common/status.h: the result codes of every csrc unit.
cdef extern from "common/status.h" nogil:
    enum:
        FB_OK
        FB_EMPTY
        FB_ETIMEDOUT
        FB_EDESTROYED
        FB_EINSUFFICIENT
        FB_EINVAL
        FB_ESTATE
        FB_ENOMEM
        FB_ERELEASED
        FB_EFAILED
        FB_ECLOSED
