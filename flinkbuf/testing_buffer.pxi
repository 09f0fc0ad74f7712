# Test hooks of the buffer layer (included by _testing.pyx).

# ---- layer 1 -------------------------------------------------------------------

def set_ref_count(Buffer buffer not None, Py_ssize_t count):
    """Set a live buffer's reference count (>= 1), to reach the limits
    without 2**63 calls to retain()."""
    buffer._check()
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    buffer._refcnt = count


def make_read_only(Buffer buffer not None):
    """Make a live buffer read-only, as a buffer lent by another process is
    (its memory stays writable: the tests check that nothing writes it)."""
    buffer._check()
    buffer._readonly = True
    return buffer


def redistribute_now(NetworkBufferPool pool not None):
    """Run one redistribution of ``pool``'s local pools (normally automatic)."""
    pool._redistribute_now()


def c_request_recycle_loop(LocalBufferPool pool not None, Py_ssize_t iterations):
    """Request+recycle pairs in C without the GIL, through the pool's ops
    (as code in other extension modules calls them); ns per pair."""
    cdef int32_t index
    cdef Py_ssize_t i
    cdef int64_t t0, t1
    cdef int rc = FB_OK
    with nogil:
        t0 = fb_monotonic_ns()
        for i in range(iterations):
            rc = pool._c.ops.request(&pool._c, FB_NO_CHANNEL, &index)
            if rc != FB_OK:
                break
            pool._c.ops.recycle(&pool._c, index)
        t1 = fb_monotonic_ns()
    if rc != FB_OK:
        raise RuntimeError("pool had no buffer for the benchmark loop")
    return (t1 - t0) / <double>(iterations if iterations > 0 else 1)
