# Layer 1, the buffer core: MemorySegment, Buffer, NetworkBufferPool,
# LocalBufferPool, compiled as one extension over csrc/buffer/ (layer 0,
# the one library of csrc/ every extension links).  Other modules cimport the
# types from _buffer.pxd and reach the pools through them (or through
# fb_localpool_t's ops).
# Compiler directives are set once, in setup.py.

cimport cython
from cpython.buffer cimport (PyBuffer_FillInfo, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE,
                             PyBUF_WRITABLE)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.number cimport PyNumber_Index
from cpython.pyport cimport PY_SSIZE_T_MAX, PY_SSIZE_T_MIN
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdint cimport INT64_MAX
from libc.string cimport memmove, memcmp

from flinkbuf.capi cimport write_unraisable
from flinkbuf.checks cimport as_int32, as_timeout
from flinkbuf.csrc.arena cimport fb_aligned_alloc, fb_aligned_free, fb_is_pow2
from flinkbuf.csrc.byteorder cimport *
from flinkbuf.csrc.clock cimport FB_WAIT_FOREVER, FB_WAIT_SLICE, fb_deadline_after, fb_monotonic_ns
from flinkbuf.csrc.pool cimport *
from flinkbuf.csrc.redistribution cimport fb_redistribute
from flinkbuf.csrc.status cimport *

import enum
import resource

from flinkbuf.errors import (
    BufferRequestTimeoutError,
    ExportedBufferError,
    InsufficientBuffersError,
    PoolDestroyedError,
    ReadOnlyBufferError,
    RecycledBufferError,
    SegmentFreedError,
)

_READ_ONLY = ("read-only: the buffer is lent by a producer in another process "
              "(copy it, e.g. bytes(buf), to change it)")

cdef extern from *:
    """
    #ifdef FLINKBUF_DEBUG
    static Py_ssize_t fb_dbg_counters[2];
    #define FB_DBG_ADD(i, n) (fb_dbg_counters[(i)] += (n))
    #define FB_DBG_GET(i) (fb_dbg_counters[(i)])
    #define FB_DBG_ENABLED 1
    #else
    #define FB_DBG_ADD(i, n) ((void)0)
    #define FB_DBG_GET(i) ((Py_ssize_t)-1)
    #define FB_DBG_ENABLED 0
    #endif
    #define FB_DBG_SEGMENTS 0
    #define FB_DBG_BUFFERS 1
    """
    void FB_DBG_ADD(int i, int n)
    Py_ssize_t FB_DBG_GET(int i)
    int FB_DBG_ENABLED
    int FB_DBG_SEGMENTS
    int FB_DBG_BUFFERS

cdef extern from *:
    """
    /* An index or length argument: any int (or object with __index__) as a
     * Py_ssize_t, clamped to PY_SSIZE_T_MIN or PY_SSIZE_T_MAX beyond that
     * range, where every bounds check fails; TypeError for anything else. */
    static CYTHON_INLINE Py_ssize_t fb_as_position(PyObject *o)
    {
        if (PyLong_CheckExact(o)) {
            int overflow;
            long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
            if (overflow > 0 || v > PY_SSIZE_T_MAX)
                return PY_SSIZE_T_MAX;
            if (overflow < 0 || v < PY_SSIZE_T_MIN)
                return PY_SSIZE_T_MIN;
            return (Py_ssize_t)v;   /* -1 with an error set cannot happen here */
        }
        return PyNumber_AsSsize_t(o, NULL);
    }
    """
    Py_ssize_t fb_as_position(object o) except? -1


cdef str _shown(Py_ssize_t value):
    """An index argument for a message: a clamped one was out of range."""
    if value == PY_SSIZE_T_MAX:
        return f"{value} or more"
    if value == PY_SSIZE_T_MIN:
        return f"{value} or less"
    return str(value)


cdef extern from *:
    """
    /* listener(pool): an Exception it raises goes to sys.unraisablehook (0);
     * any other BaseException (KeyboardInterrupt, SystemExit) stays set (-1). */
    static int fb_call_listener(PyObject *listener, PyObject *pool)
    {
        PyObject *r = PyObject_CallOneArg(listener, pool);
        if (r != NULL) {
            Py_DECREF(r);
            return 0;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_WriteUnraisable(listener);
        return 0;
    }
    """
    int fb_call_listener(object listener, object pool) except -1


include "memory_segment.pyx"
include "buffer.pyx"
include "buffer_pool.pyx"


def debug_counters():
    """Counters of a debug build (``FLINKBUF_DEBUG=1``), else None: standalone
    segments allocated and not freed, buffers not yet recycled, and segments
    handed out by pools (pooled and unpooled) and not yet returned."""
    if not FB_DBG_ENABLED:
        return None
    return {
        "standalone_segments": FB_DBG_GET(FB_DBG_SEGMENTS),
        "live_buffers": FB_DBG_GET(FB_DBG_BUFFERS),
        "segments_out": fb_debug_segments_out(),
    }


def redistribute(available, pools):
    """The sizes Flink's redistribution gives ``pools``, a sequence of
    ``(min_buffers, max_buffers)`` in creation order (``max_buffers`` None
    for unbounded), when ``available`` segments exceed all requirements.
    ``available`` is any int >= 0 (the pools' caps bound what they get)."""
    available = PyNumber_Index(available)
    if available < 0:
        raise ValueError(f"available must be >= 0, got {available}")
    # More than int64 holds gives the same sizes: each pool gets < 2**31.
    cdef int64_t avail = available if available <= INT64_MAX else INT64_MAX
    cdef list spec = list(pools)
    cdef Py_ssize_t n = len(spec), i
    cdef int64_t *arr = <int64_t *>PyMem_Malloc(sizeof(int64_t) * 3 * (n if n else 1))
    if arr == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            mn, mx = spec[i]
            arr[i] = as_int32(mn, "min_buffers", 0)
            arr[n + i] = FB_UNBOUNDED if mx is None else as_int32(mx, "max_buffers", 0)
            if arr[n + i] < arr[i]:
                raise ValueError(f"pool {i}: max_buffers {mx} < min_buffers {mn}")
        fb_redistribute(avail, <size_t>n, arr, arr + n, arr + 2 * n)
        return [arr[2 * n + i] for i in range(n)]
    finally:
        PyMem_Free(arr)
