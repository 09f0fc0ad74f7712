# csrc/common/clock.h: the monotonic clock and deadlines of every blocking wait.
from libc.stdint cimport int64_t

cdef extern from "common/clock.h" nogil:
    int64_t FB_WAIT_FOREVER
    # Blocking waits that hold Python-visible state wake this often (seconds)
    # to look at signals (KeyboardInterrupt) and at the state they wait on.
    double FB_WAIT_SLICE
    int64_t fb_monotonic_ns()
    # now + seconds; a timeout <= 0 (or NaN) is a deadline of now (no waiting)
    int64_t fb_deadline_after(double seconds)
