# Layer 3, tasks exchanging data: ResultPartition, RecordWriter and channel
# selectors, InputGate and input channels, in-band events, buffer debloating;
# one extension over csrc/io/ (exchange.c, keygroup.c, channel_order.c,
# debloat.c, in the one library of csrc/ every extension links).  Compiler directives live in setup.py.
# One concept per included file; errors from C result codes are raised in
# one place per type (ResultPartition._raise_for_rc, the gate's _wait_item).

cimport cython
from libc.math cimport ceil
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport (PyBUF_FORMAT, PyBUF_SIMPLE, PyBUF_STRIDES, PyBUF_WRITABLE,
                             PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer)
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyIndex_Check
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.sequence cimport PySequence_Fast_ITEMS
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.stdint cimport INT32_MAX, INT64_MAX, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from flinkbuf.buffer._buffer cimport Buffer, LocalBufferPool
from flinkbuf.capi cimport fb_prefetch, fb_small_long, write_unraisable
from flinkbuf.checks cimport as_int32, as_timeout
from flinkbuf.csrc.debloat cimport *
from flinkbuf.csrc.clock cimport FB_WAIT_FOREVER, FB_WAIT_SLICE, fb_deadline_after, fb_monotonic_ns
from flinkbuf.csrc.exchange cimport *
from flinkbuf.csrc.keygroup cimport *
from flinkbuf.csrc.channel_order cimport fb_column, fb_gather_by_channel, fb_order_by_channel
from flinkbuf.csrc.status cimport *
from flinkbuf.csrc.pool cimport FB_UNBOUNDED
from flinkbuf.serialization._serialization cimport (CODEC_TYPED, FULL_BUFFER, FULL_RECORD,
                                                  RecordDeserializer, RecordSerializer,
                                                  is_no_record)
from flinkbuf.serialization.typed_flat cimport write_flat

import numbers
import operator
import random
import reprlib as _reprlib
import sys
import threading
import weakref
import weakref

from flinkbuf.checks import check_int
from flinkbuf.serialization import decode as _typed_decode
from flinkbuf.serialization import encode as _typed_encode
from flinkbuf.errors import (
    BufferRequestTimeoutError,
    CorruptRecordError,
    PartitionReleasedError,
    PoolDestroyedError,
    ProducerFailedError,
)



cdef int32_t _as_subpartition(object value, int32_t n) except -1:
    """A subpartition index: any integer (not bool) in [0, n); IndexError
    outside, however large."""
    if isinstance(value, bool) or not PyIndex_Check(value):
        raise TypeError(f"a subpartition index must be an int, got {type(value).__name__}")
    value = operator.index(value)
    if value < 0 or value >= n:
        raise IndexError(f"subpartition {value} is not in [0, {n})")
    return <int32_t>value


cdef object _check_name(object name):
    """A task or partition name: a str or None."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    return name


cdef int _check_failure_cause(object exc) except -1:
    """What fail() takes: an exception instance, or None (no cause)."""
    if exc is None or isinstance(exc, BaseException):
        return 0
    if isinstance(exc, type) and issubclass(exc, BaseException):
        raise TypeError(f"fail() takes an exception instance or None, got the class "
                        f"{exc.__name__}: pass {exc.__name__}(...)")
    raise TypeError(f"fail() takes an exception instance or None, got {type(exc).__name__}")


class _PythonClass:
    """Made by a class statement, like every Python subclass: its
    deallocator is CPython's ``subtype_dealloc``."""


cdef bint _defined_in_python(type t):
    """True if ``t`` was made by a Python class statement (or ``type()``),
    False for an extension type compiled by Cython (static or heap type: its
    deallocator is its own).  Abstract bases with C-level methods refuse to
    instantiate Python subclasses, which cannot implement them."""
    return (<PyTypeObject *>t).tp_dealloc == (<PyTypeObject *>_PythonClass).tp_dealloc


def monotonic_ns():
    """The clock the exchange's timings use (CLOCK_MONOTONIC, ns)."""
    return fb_monotonic_ns()


include "events.pyx"
include "keygroup.pyx"
include "channel_order.pyx"
include "debloat.pyx"
include "channel_selector.pyx"
include "result_partition.pyx"
include "record_writer.pyx"
include "emit_all.pyx"
include "back_pressure.pyx"
include "output_flusher.pyx"
include "gate_debloat.pyx"
include "input_gate.pyx"
include "unknown_input_channel.pyx"
