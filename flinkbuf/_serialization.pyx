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
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from flinkbuf._core cimport Buffer

import pickle

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


def decode(data):
    """Decode one typed-codec payload (all of ``data``, a bytes-like object).
    ``CorruptRecordError`` names the offset and the reason if it is malformed
    or not consumed exactly."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return _typed_decode(<const char *>view.buf, view.len, 0, -1, None)
    finally:
        PyBuffer_Release(&view)
