# Test hooks of the buffer layer (included by _testing.pyx): its contract
# (_buffer.pxd) and nothing else.

# ---- layer 1 -------------------------------------------------------------------

def set_ref_count(Buffer buffer not None, Py_ssize_t count):
    """Set a live buffer's reference count (>= 1), to reach the limits
    without 2**63 calls to retain()."""
    buffer._set_ref_count(count)


def make_read_only(Buffer buffer not None):
    """Make a live buffer read-only, as a buffer lent by another process
    is (its memory stays writable: the tests check that nothing writes it)."""
    buffer._make_read_only()
    return buffer


def redistribute_now(NetworkBufferPool pool not None):
    """Run one redistribution of ``pool``'s local pools (normally automatic)."""
    pool._redistribute_now()


def c_request_recycle_loop(LocalBufferPool pool not None, Py_ssize_t iterations):
    """Request+recycle pairs in C without the GIL, through the pool's ops
    (as code in other extension modules calls them); ns per pair."""
    return pool._request_recycle_ns(iterations)
