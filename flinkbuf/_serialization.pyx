# Layer 2: length-prefixed records that span buffers, and their codecs.
# One extension module; each concept lives in its own included file.
# Compiler directives are set once, in setup.py.

cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytearray cimport PyByteArray_FromStringAndSize, PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble, PyFloat_FromDouble
from cpython.list cimport PyList_New, PyList_GET_ITEM, PyList_GET_SIZE, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.tuple cimport PyTuple_New, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from flinkbuf.buffer._buffer cimport Buffer

import pickle
import sys

import numpy

from flinkbuf.errors import CorruptRecordError

cnp.import_array()

cdef extern from "byteorder.h" nogil:
    uint16_t fb_load_u16(const char *p, int big)
    uint32_t fb_load_u32(const char *p, int big)
    uint64_t fb_load_u64(const char *p, int big)
    void fb_store_u16(char *p, uint16_t v, int big)
    void fb_store_u32(char *p, uint32_t v, int big)
    void fb_store_u64(char *p, uint64_t v, int big)
    double fb_load_f64(const char *p, int big)
    void fb_store_f64(char *p, double v, int big)

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ
    void PyErr_WriteUnraisable(object obj)
    int PyList_SetSlice(object lst, Py_ssize_t low, Py_ssize_t high, PyObject *items) except -1
    Py_ssize_t PY_SSIZE_T_MAX
    int _PyBytes_Resize(PyObject **bytes, Py_ssize_t newsize) except -1
    int PyByteArray_Resize(object bytearray, Py_ssize_t size) except -1

# Largest payload the 4-byte length prefix can announce (Flink reads it as
# a signed int).
cdef Py_ssize_t MAX_PAYLOAD = 0x7FFFFFFF

# Values at least this long are not copied into the staging area: the
# serializer keeps a reference and copies them straight into the buffers.
cdef Py_ssize_t EXTERNAL_MIN = 512

cdef type _ndarray_type = numpy.ndarray
cdef type _generic_type = numpy.generic

include "serialization_result.pyx"
include "serialization_stage.pyx"
include "codec_typed.pyx"
include "codec_other.pyx"
include "serialization_serializer.pyx"
include "serialization_deserializer.pyx"


def encode(value):
    """The typed codec's encoding of ``value`` (a record payload, without the
    length prefix) as ``bytes``.  ``TypeError`` for unsupported types,
    ``ValueError`` for structures nested deeper than ``MAX_DEPTH`` or
    containing themselves."""
    cdef RecordSerializer ser = RecordSerializer.__new__(RecordSerializer)
    ser._serialize_record(value)
    return ser._payload_bytes()


def _stage_general(value, codec="typed"):
    """Test support: the staged record (prefix and payload) as the general
    encoder writes it, bypassing the fast paths of serialize_record."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_general(value)
    return ser._record_bytes()


def _stage(value, codec="typed"):
    """Test support: the staged record as serialize_record writes it."""
    cdef RecordSerializer ser = RecordSerializer(codec)
    ser._serialize_record(value)
    return ser._record_bytes()


def decode(data):
    """Decode one typed-codec payload (all of ``data``, a bytes-like object).
    ``CorruptRecordError`` names the offset and the reason if it is malformed,
    not consumed exactly, or holds a dict whose keys would make decoding
    super-linear (more than ``MAX_SAME_HASH_KEYS`` keys of one hash value, or
    more than ``MAX_PROBES_PER_KEY`` hash-table probes per key; docs/FORMAT.md
    2.3).  Time is linear in ``len(data)``."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _typed_decode(<const char *>view.buf, view.len, 0, -1, None)
    finally:
        PyBuffer_Release(&view)


def _dict_shadow(keys):
    """Test support: what the shadow of CPython's dict table that decoding
    keeps for a large dict (codec_typed.pyx) makes of ``keys``, distinct
    keys inserted in order: ``(table size, slots visited)``."""
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


def _c_round_trip(RecordSerializer ser not None, RecordDeserializer des not None,
                  pool, list records, bint keep=True):
    """Benchmark and test support: move ``records`` through ``ser`` into
    buffers from ``pool`` and out of ``des`` with the C-level contract only,
    as a RecordWriter and an InputGate do.  Returns the records read (with
    ``keep``), else how many were read."""
    cdef list out = []
    cdef Py_ssize_t count = 0
    cdef Buffer buf = pool.request_buffer()
    cdef int flags
    cdef object r
    if buf is None:
        raise RuntimeError("the pool has no buffer")
    try:
        for r in records:
            ser._serialize_record(r)
            while True:
                flags = ser._copy_to_buffer(buf)
                if flags & FULL_BUFFER:
                    des._feed(buf)
                    buf = None
                    while True:
                        r = des._next_record()
                        if is_no_record(r):
                            break
                        count += 1
                        if keep:
                            out.append(r)
                    buf = pool.request_buffer()
                    if buf is None:
                        raise RuntimeError("the pool has no buffer")
                if flags & FULL_RECORD:
                    break
        des._feed(buf)
        buf = None
        while True:
            r = des._next_record()
            if is_no_record(r):
                break
            count += 1
            if keep:
                out.append(r)
    finally:
        if buf is not None:
            buf._release()
    return out if keep else count
