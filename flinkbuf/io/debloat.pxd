# Buffer debloating (debloat.pyx).
#
# Contract for cimporters (the gate): config._enabled; debloater._sample()
# (the size to announce, or 0: keep the last), which touches no Python
# object; debloater._c, read only: _c.size (the last announced size),
# _c.time_to_consume_ns, _c.throughput, _c.cfg.period_ns (how often to sample),
# _c.warm and _c.rising (sample again sooner: after a tenth of the period).
#
# Test hooks (flinkbuf._testing): debloater._ema(), debloater._rising().
cdef class BufferDebloatConfig:
    cdef bint _enabled
    cdef double _target         # seconds, in (0, 3600]
    cdef double _period         # seconds, in [0.001, 3600]
    cdef int32_t _samples       # 1..1000
    cdef int32_t _threshold     # percent, 0..100
    cdef int32_t _min_size      # >= 1 (a debloater clamps it to its segment size)
    cdef tuple _fields(self)


cdef class BufferDebloater:
    cdef fb_debloater_t _c
    cdef BufferDebloatConfig _config    # None until __init__
    cdef int32_t _sample(self, int64_t bytes, int64_t active_ns,
                         int32_t buffers_in_use) noexcept nogil
    cdef double _ema(self) noexcept
    cdef int32_t _rising(self) noexcept
