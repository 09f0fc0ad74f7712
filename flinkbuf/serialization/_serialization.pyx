# Layer 2: length-prefixed records that span buffers, and their codecs.
# One extension module; each concept lives in its own included file.
# Compiler directives are set once, in setup.py.

cimport cython
cimport numpy as cnp
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytearray cimport (PyByteArray_AS_STRING, PyByteArray_FromStringAndSize,
                                PyByteArray_GET_SIZE)
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble, PyFloat_FromDouble
from cpython.list cimport PyList_New, PyList_GET_ITEM, PyList_GET_SIZE, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.tuple cimport PyTuple_New, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from flinkbuf.buffer._buffer cimport Buffer
from flinkbuf.capi cimport (PyObject_GC_IsTracked, PyObject_GC_UnTrack,
                           PyUnicode_IS_COMPACT_ASCII, fb_small_long, write_unraisable)
from flinkbuf.csrc.byteorder cimport *

import pickle
import sys

import numpy

from flinkbuf.checks import check_choice
from flinkbuf.errors import CorruptRecordError

cnp.import_array()

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ
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

include "result.pyx"
include "staging.pyx"
include "codecs/typed.pyx"
include "codecs/bytes.pyx"
include "codecs/pickle.pyx"
include "codecs/arrow.pyx"
include "serializer.pyx"
include "deserializer.pyx"
include "record_assembly.pyx"


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
