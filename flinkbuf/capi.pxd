# CPython C-API helpers that Cython's own cpython/*.pxd lack, shared by every
# layer's extension (the C below is compiled into each module that cimports
# this file).

from cpython.object cimport PyObject

cdef extern from *:
    """
    /* Report the exception being handled to sys.unraisablehook: inside a
     * Cython except clause the exception is no longer on the error
     * indicator, where PyErr_WriteUnraisable looks for it. */
    static void fb_write_unraisable_handled(PyObject *obj)
    {
        PyObject *type, *value, *tb;
        PyErr_GetExcInfo(&type, &value, &tb);
        PyErr_Restore(type, value, tb);
        PyErr_WriteUnraisable(obj);
    }
    """
    # In an except clause: report the exception being handled as unraisable
    # (destructors, listeners: code whose errors cannot propagate).
    void write_unraisable "fb_write_unraisable_handled" (object obj)

cdef extern from "Python.h":
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    # The garbage collector's tracking of a container (3.9+ for IsTracked).
    bint PyObject_GC_IsTracked(object o) noexcept
    void PyObject_GC_UnTrack(void *o) noexcept

cdef extern from *:
    """
    /* A Python int's value when it is small (one or two 30-bit digits on
     * CPython 3.11, "compact" from 3.12: what most ints of records are),
     * read without a call: 1 and *out set, or 0 for any other int (use
     * PyLong_AsLongLongAndOverflow then).  `v` must be an int. */
    static inline int fb_small_long(PyObject *v, long long *out)
    {
    #if PY_VERSION_HEX >= 0x030C0000
        if (!PyUnstable_Long_IsCompact((PyLongObject *)v))
            return 0;
        *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)v);
        return 1;
    #else
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        if (size == 0) {
            *out = 0;
            return 1;
        }
        if (size == 1 || size == -1) {
            *out = (long long)size * (long long)d[0];
            return 1;
        }
        if (size == 2 || size == -2) {
            long long x = (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
            *out = size < 0 ? -x : x;
            return 1;
        }
        return 0;
    #endif
    }
    """
    # 1 and *out for a small int (no call, no error), 0 for other ints.
    bint fb_small_long(PyObject *v, long long *out) noexcept

cdef extern from *:
    """
    /* A hint to load the cache line at `p` ahead of its use (no fault). */
    static inline void fb_prefetch(const void *p) { __builtin_prefetch(p); }
    """
    void fb_prefetch(const void *p) noexcept nogil
