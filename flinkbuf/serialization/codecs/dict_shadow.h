/* The shadow of CPython's dict table that the typed codec's decoder keeps
 * beside a large dict (dict_keys.pyx says why).  C with the Python API,
 * included by the serialization module and by the test hooks; every
 * function is static: no state is shared. */
#ifndef FLINKBUF_DICT_SHADOW_H
#define FLINKBUF_DICT_SHADOW_H

#include <Python.h>

/* CPython's dict table (Objects/dictobject.c, the same in these respects
 * since 3.7): 8 slots for the first key; a key's probe sequence starts at
 * hash & mask and continues with perturb >>= 5, i = (5*i + perturb + 1) &
 * mask; a new key that finds no usable entry left (2/3 of the slots)
 * first resizes the table to the smallest power of two >= 3 * used,
 * placing the keys again in insertion order.  Since 3.11 a table of str
 * keys only is also resized so when another key arrives.
 *
 * Tables of up to FB_SHADOW_SMALL slots are not shadowed slot by slot: a
 * key costs at most a few dozen probes there, and the hashes in
 * insertion order, which are kept, are all a larger table is built
 * from. */
#define FB_SHADOW_EMPTY ((Py_hash_t)-1)     /* no hash is -1 */
#define FB_SHADOW_SMALL 32
#define FB_SHADOW_SMALL_KEYS 21             /* usable in a table of 32 slots */
#define FB_SHADOW_SAME_MAX 16
#if PY_VERSION_HEX >= 0x030B0000
#define FB_SHADOW_STR_TABLES 1
#else
#define FB_SHADOW_STR_TABLES 0
#endif
#if PY_VERSION_HEX < 0x030D0000
#define fb_dict_set_known_hash(d, k, v, h) _PyDict_SetItem_KnownHash((d), (k), (v), (h))
#else
#define fb_dict_set_known_hash(d, k, v, h) PyDict_SetItem((d), (k), (v))
#endif
#if defined(__GNUC__)
#define fb_prefetch(p) __builtin_prefetch((p), 1)
#else
#define fb_prefetch(p) ((void)0)
#endif

typedef struct {
    size_t size;            /* slots of CPython's table (0: none yet) */
    Py_hash_t *slots;       /* the hash in each slot or FB_SHADOW_EMPTY (NULL: small) */
    size_t spare_size;      /* the size the next new key resizes to (0: not known yet) */
    Py_hash_t *spare;       /* ... and that table (NULL: small) */
    Py_hash_t *order;       /* the hashes in insertion order */
    Py_ssize_t order_cap;
    Py_ssize_t used;
    Py_ssize_t usable;
    int str_table;          /* CPython keeps a table of str keys only */
    Py_ssize_t probes;      /* slots visited so far */
    Py_ssize_t limit;       /* ... and allowed */
    Py_hash_t small_order[FB_SHADOW_SMALL_KEYS];
} fb_shadow;

static void fb_shadow_init(fb_shadow *s) {
    s->size = s->spare_size = 0;
    s->slots = s->spare = NULL;
    s->order = s->small_order;
    s->order_cap = FB_SHADOW_SMALL_KEYS;
    s->used = s->usable = s->probes = s->limit = 0;
    s->str_table = 0;
}

static void fb_shadow_free(fb_shadow *s) {
    if (s->slots != NULL)
        PyMem_Free(s->slots);
    if (s->spare != NULL)
        PyMem_Free(s->spare);
    if (s->order != s->small_order)
        PyMem_Free(s->order);
    fb_shadow_init(s);
}

/* Visit h's probe sequence up to its first empty slot (where it stops),
 * counting the slots visited: 0, or -1 beyond the limit.  *same: how many
 * distinct ones hold hash h, counted up to max_same (a sequence may pass
 * a slot more than once: perturb = -2 keeps i where it is for a while). */
static inline int fb_shadow_walk(fb_shadow *s, const Py_hash_t *slots, size_t mask,
                                 Py_hash_t h, size_t *pos, Py_ssize_t *same,
                                 Py_ssize_t max_same) {
    size_t i = (size_t)h & mask, perturb = (size_t)h;
    size_t seen[FB_SHADOW_SAME_MAX];
    Py_ssize_t n = 1, eq = 0, k, room = s->limit - s->probes;
    if (room < 1)
        return -1;
    if (max_same > FB_SHADOW_SAME_MAX)
        max_same = FB_SHADOW_SAME_MAX;
    while (slots[i] != FB_SHADOW_EMPTY) {
        if (slots[i] == h && eq < max_same) {
            for (k = 0; k < eq && seen[k] != i; k++)
                ;
            if (k == eq)
                seen[eq++] = i;
        }
        if (n == room)
            return -1;
        perturb >>= 5;
        i = (i * 5 + perturb + 1) & mask;
        n++;
    }
    s->probes += n;
    *pos = i;
    *same = eq;
    return 0;
}

static size_t fb_shadow_resize_size(Py_ssize_t used) {
    size_t size = 8;
    while (size < 3 * (size_t)used)
        size <<= 1;
    return size;
}

/* The table of `size` slots CPython resizes to (NULL if small): 0, -1
 * beyond the limit, -2 no memory. */
static int fb_shadow_build(fb_shadow *s, size_t size, Py_hash_t **out) {
    size_t mask = size - 1, pos;
    Py_ssize_t k, eq;
    Py_hash_t *t;
    *out = NULL;
    if (size <= FB_SHADOW_SMALL)
        return 0;
    if (size > PY_SSIZE_T_MAX / sizeof(Py_hash_t)
            || (t = (Py_hash_t *)PyMem_Malloc(size * sizeof(Py_hash_t))) == NULL)
        return -2;
    memset(t, 0xff, size * sizeof(Py_hash_t));      /* all FB_SHADOW_EMPTY */
    for (k = 0; k < s->used && k < 8; k++)
        fb_prefetch(&t[(size_t)s->order[k] & mask]);
    for (k = 0; k < s->used; k++) {
        if (k + 8 < s->used)
            fb_prefetch(&t[(size_t)s->order[k + 8] & mask]);
        if (fb_shadow_walk(s, t, mask, s->order[k], &pos, &eq, 0) < 0) {
            PyMem_Free(t);
            return -1;
        }
        t[pos] = s->order[k];
    }
    *out = t;
    return 0;
}

static void fb_shadow_replace(fb_shadow *s, size_t size, Py_hash_t *t) {
    if (s->slots != NULL)
        PyMem_Free(s->slots);
    if (s->spare != NULL && s->spare != t)
        PyMem_Free(s->spare);
    s->spare = NULL;
    s->spare_size = 0;
    s->slots = t;
    s->size = size;
    s->usable = (Py_ssize_t)((size << 1) / 3) - s->used;
}

/* Soon a key of hash h: fetch the first two slots its lookup visits. */
static inline void fb_shadow_prefetch(fb_shadow *s, Py_hash_t h) {
    if (s->slots != NULL) {
        size_t mask = s->size - 1, i = (size_t)h & mask;
        fb_prefetch(&s->slots[i]);
        fb_prefetch(&s->slots[(i * 5 + ((size_t)h >> 5) + 1) & mask]);
    }
}

static int fb_shadow_before_slow(fb_shadow *s, int is_str) {
    Py_hash_t *t;
    size_t size;
    int r;
    if (s->size == 0) {
        s->size = 8;
        s->usable = 5;
        s->str_table = FB_SHADOW_STR_TABLES && is_str;
    }
    else if (s->str_table && !is_str) {
        size = fb_shadow_resize_size(s->used);
        if ((r = fb_shadow_build(s, size, &t)) < 0)
            return r;
        fb_shadow_replace(s, size, t);
        s->str_table = 0;
    }
    if (s->usable <= 0 && s->spare_size == 0) {
        size = fb_shadow_resize_size(s->used);
        if ((r = fb_shadow_build(s, size, &s->spare)) < 0)
            return r;
        s->spare_size = size;
    }
    return 0;
}

/* Before CPython inserts a key (is_str: an exact str), with max_probes
 * more slots allowed: what CPython does first (its first table; 3.11+: a
 * general table instead of a str one), and the resize a new key causes.
 * 0, -1 beyond the limit, -2 no memory. */
static inline int fb_shadow_before(fb_shadow *s, int is_str, Py_ssize_t max_probes) {
    s->limit += max_probes;
    if (s->usable > 0 && (is_str || !s->str_table))
        return 0;                   /* nothing to do first: the common case */
    return fb_shadow_before_slow(s, is_str);
}

/* After CPython inserted a key of hash h, as a new one or not: the slots
 * its lookup (and a new key's placement after a resize) visited.  0, -1
 * beyond the limit, -2 no memory.  *same: the keys of hash h there before
 * it, up to max_same. */
static int fb_shadow_after_slow(fb_shadow *s, Py_hash_t h, int is_new, Py_ssize_t *same,
                                Py_ssize_t max_same) {
    size_t pos = 0;
    Py_ssize_t k, eq;
    if (s->slots != NULL) {
        if (fb_shadow_walk(s, s->slots, s->size - 1, h, &pos, same, max_same) < 0)
            return -1;
    }
    else {
        for (k = 0, eq = 0; k < s->used && eq < max_same; k++)
            eq += s->order[k] == h;
        *same = eq;
    }
    if (!is_new)
        return 0;
    if (s->used == s->order_cap) {
        Py_ssize_t cap = 2 * s->order_cap;
        Py_hash_t *o;
        if (s->order == s->small_order) {
            if ((o = (Py_hash_t *)PyMem_Malloc((size_t)cap * sizeof(Py_hash_t))) != NULL)
                memcpy(o, s->order, (size_t)s->used * sizeof(Py_hash_t));
        }
        else
            o = (Py_hash_t *)PyMem_Realloc(s->order, (size_t)cap * sizeof(Py_hash_t));
        if (o == NULL)
            return -2;
        s->order = o;
        s->order_cap = cap;
    }
    if (s->usable <= 0) {
        assert(s->spare_size != 0);         /* fb_shadow_before made it */
        fb_shadow_replace(s, s->spare_size, s->spare);
        if (s->slots != NULL
                && fb_shadow_walk(s, s->slots, s->size - 1, h, &pos, &eq, 0) < 0)
            return -1;
    }
    if (s->slots != NULL)
        s->slots[pos] = h;
    s->order[s->used++] = h;
    s->usable--;
    return 0;
}

static inline int fb_shadow_after(fb_shadow *s, Py_hash_t h, int is_new, Py_ssize_t *same,
                                  Py_ssize_t max_same) {
    Py_ssize_t k, eq = 0;
    if (s->slots == NULL && s->usable > 0 && s->used < s->order_cap) {
        /* a small table: count the keys of hash h in the order */
        for (k = 0; k < s->used; k++)
            eq += s->order[k] == h;
        *same = eq < max_same ? eq : max_same;
        if (is_new) {
            s->order[s->used++] = h;
            s->usable--;
        }
        return 0;
    }
    return fb_shadow_after_slow(s, h, is_new, same, max_same);
}

#endif
