# codecs/dict_shadow.h: a shadow of CPython's dict table (see dict_keys.pyx).
cdef extern from "dict_shadow.h":
    ctypedef struct fb_shadow:
        size_t size
        Py_ssize_t probes
    void fb_shadow_init(fb_shadow *s) noexcept
    void fb_shadow_free(fb_shadow *s) noexcept
    void fb_shadow_prefetch(fb_shadow *s, Py_hash_t h) noexcept
    int fb_shadow_before(fb_shadow *s, int is_str, Py_ssize_t max_probes) noexcept
    int fb_shadow_after(fb_shadow *s, Py_hash_t h, int is_new, Py_ssize_t *same,
                        Py_ssize_t max_same) noexcept
    int fb_dict_set_known_hash(object d, object k, object v, Py_hash_t h) except -1
    Py_ssize_t PyDict_GET_SIZE(object d)
    Py_hash_t PyObject_Hash(object o) except -1
    Py_hash_t fb_hash "PyObject_Hash" (object o) noexcept     # -1: an exception is set
    int PyErr_ExceptionMatches(object exc) noexcept
    void PyErr_Clear() noexcept
