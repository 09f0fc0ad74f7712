# A RecordWriter's back-pressured time, soft and hard apart as in Flink
# (the RecordWriter's docstring says which wait is which).  A wait keeps
# its start in _bp_since and its soft stretch's in _soft_since; both end in
# _end_wait.  Included by _io.pyx, after record_writer.pyx.

from flinkbuf.csrc.pool cimport fb_netpool_num_free, fb_localpool_channel_count


cdef int _soft_while(RecordWriter w, bint soft) except -1:
    """In a wait of ``w``: the time from now on is soft back-pressured time
    (or hard, ``soft`` False) until said otherwise or the wait ends."""
    if soft == (w._soft_since != 0):
        return 0
    cdef int64_t now = fb_monotonic_ns()
    if soft:
        w._soft_since = now
    else:
        w._soft_bp_ns += now - w._soft_since
        w._soft_since = 0
    return 0


cdef int _end_wait(RecordWriter w, int64_t t0) except -1:
    """The wait of ``w`` that began at ``t0`` ended: its time is
    back-pressured time, its soft stretch (if any) soft back-pressured time."""
    cdef int64_t now = fb_monotonic_ns()
    if w._soft_since:
        w._soft_bp_ns += now - w._soft_since
        w._soft_since = 0
    w._bp_ns += now - t0
    w._bp_since = 0
    return 0


cdef bint _soft_wait(RecordWriter w, ResultSubpartition sp, int32_t pool_ch) except -1:
    """``w`` waits for a buffer for ``sp``'s channel (``pool_ch`` in the pool)
    while its pool still has one (or room to take one from its network
    pool): held by a channel at its cap, or by this channel at the buffers
    its debloated size allows."""
    st = w._pool._stats()
    cdef bint held = st.num_unavailable_channels > 0 or (
        pool_ch >= 0 and sp._limit != FB_UNBOUNDED
        and fb_localpool_channel_count(&w._pool._c, pool_ch) >= sp._limit)
    return held and (st.num_avail > 0 or (st.num_requested < st.size
                                          and fb_netpool_num_free(w._pool._c.net) > 0))


cdef tuple _back_pressure_counters(RecordWriter w):
    """(back-pressured ns, of which soft ns) of ``w``, a wait in progress
    included, at one instant."""
    cdef int64_t now = fb_monotonic_ns(), since = w._bp_since
    cdef int64_t soft = w._soft_bp_ns
    if w._soft_base >= 0:                 # in broadcast_event: every wait is soft
        soft += w._bp_ns - w._soft_base + (now - since if since else 0)
    elif w._soft_since:
        soft += now - w._soft_since
    return w._bp_ns + (now - since if since else 0), soft

