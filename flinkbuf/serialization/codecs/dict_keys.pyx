# Decoding dicts in time linear in their size, whatever keys a writer
# chose.  Included by typed_decoder.pyx.

# The hashes of int, float, tuple, None and bool keys are not salted (hash(n)
# is n mod 2**61 - 1), so a writer chooses them, and so how much work
# CPython's dict does to insert the keys: keys of one hash value make it
# quadratic, and so do distinct hashes whose probe sequences keep meeting
# (multiples of 2**18 or 2**24: each key visits more slots the larger the
# table).  A dict of more than MAX_SAME_HASH_KEYS pairs is therefore built
# beside a shadow of CPython's own table (the same slots, probe sequence,
# sizes and resizes) that counts the slots CPython visits: more than
# MAX_SAME_HASH_KEYS keys of one hash value, or more than MAX_PROBES_PER_KEY
# slots per key on average, make the record corrupt.  A key's lookup is
# checked just after CPython made it (it costs at most one table's worth),
# a resize, which may place every key again, before.  All keys of hash h lie
# on h's probe sequence before its first empty slot, so the walk that costs
# a key also counts them.  Only str and bytes keys, whose hashes are salted
# per process, are inserted without a shadow until another key arrives.

from flinkbuf.serialization.codecs.dict_shadow cimport *


# Without hash randomization (PYTHONHASHSEED=0) str and bytes hashes are
# known too: every key is shadowed.
cdef bint _SALTED_STR = sys.flags.hash_randomization != 0


cdef int _shadow_failed(_Dec *d, const char *kat, int r, Py_ssize_t nkeys) except -1:
    if r == -2:
        raise MemoryError()
    return _corrupt(d, kat, f"the keys of this dict make CPython's hash table visit more "
                            f"than {MAX_PROBES_PER_KEY} slots per key ({nkeys} keys): "
                            f"refused, decoding it would take super-linear time")


cdef int _unhashable_key(_Dec *d, const char *kat, object key) except -1:
    """PyObject_Hash(key) failed: a list or dict key is corrupt (TypeError),
    anything else propagates."""
    if PyErr_ExceptionMatches(TypeError):
        PyErr_Clear()
        _corrupt(d, kat, f"unhashable dict key of type {type(key).__name__}")
    return -1


cdef inline int _shadow_insert(_Dec *d, const char *kat, fb_shadow *s, dict m, object key,
                               object value, Py_hash_t h, Py_ssize_t nkeys) except -1:
    """Insert into ``m`` a key of hash ``h``, the ``nkeys``-th of the dict,
    within the limits the shadow ``s`` checks."""
    cdef Py_ssize_t same = 0, size = PyDict_GET_SIZE(m)
    cdef bint is_new = False
    cdef int r = fb_shadow_before(s, type(key) is str, MAX_PROBES_PER_KEY)
    if r == 0:
        fb_dict_set_known_hash(m, key, value, h)
        is_new = PyDict_GET_SIZE(m) != size
        r = fb_shadow_after(s, h, is_new, &same, MAX_SAME_HASH_KEYS)
    if r:
        return _shadow_failed(d, kat, r, nkeys)
    if same >= MAX_SAME_HASH_KEYS and is_new:
        _corrupt(d, kat, f"more than {MAX_SAME_HASH_KEYS} keys of one dict have the hash "
                         f"value {h}: refused, decoding it would take quadratic time")
    return 0


cdef int _shadow_start(_Dec *d, const char *kat, fb_shadow *s, dict m) except -1:
    """Bring the shadow up to date with the keys inserted so far."""
    cdef Py_ssize_t pos = 0, same, k = 0
    cdef PyObject *key
    cdef PyObject *value
    cdef Py_hash_t h
    cdef int r
    while PyDict_Next(m, &pos, &key, &value):
        k += 1
        h = PyObject_Hash(<object>key)
        r = fb_shadow_before(s, type(<object>key) is str, MAX_PROBES_PER_KEY)
        if r == 0:
            r = fb_shadow_after(s, h, True, &same, 0)
        if r:
            return _shadow_failed(d, kat, r, k)
    return 0


cdef tuple dict_shadow_stats(object keys):
    """What the shadow of CPython's dict table that decoding keeps for a
    large dict makes of ``keys``, distinct keys inserted in order:
    ``(table size, slots visited)``."""
    cdef fb_shadow s
    cdef Py_ssize_t same
    cdef Py_hash_t h
    cdef int r = 0
    fb_shadow_init(&s)
    try:
        for k in keys:
            h = PyObject_Hash(k)
            r = fb_shadow_before(&s, type(k) is str, 1 << 32)
            if r == 0:
                r = fb_shadow_after(&s, h, True, &same, 0)
            if r:
                raise MemoryError()
        return s.size, s.probes
    finally:
        fb_shadow_free(&s)
