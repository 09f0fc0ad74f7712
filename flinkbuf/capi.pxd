# CPython C-API helpers that Cython's own cpython/*.pxd lack, shared by every
# layer's extension (the C below is compiled into each module that cimports
# this file).

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
