"""Range checks shared by the experiments, the demo and the command line.

Every check raises :class:`ExperimentArgumentError` (a ``ValueError``)
with a one-line message that names the argument.  The library functions
name their parameters (``phase_seconds``); the command line passes
``names`` to name its options instead (``--phase-seconds``).
"""

import math
import os

from flinkbuf.errors import FlinkbufError

MAX_SECONDS = 3600.0        # a phase (or a demo step) lasts at most an hour
MAX_COUNT = 2**31 - 1       # counts and sizes are C int32 in the buffer core
CACHE_LINE = 64             # segments sit at a stride rounded up to this
SEGMENT_OVERHEAD = 9        # bytes of bookkeeping per segment (links, state)


class ExperimentArgumentError(FlinkbufError, ValueError):
    """An argument is out of range: nothing ran and nothing was written."""


class MissingRequirementError(FlinkbufError, RuntimeError):
    """Something a command needs is missing (a package, a Java runtime): the
    message says what to install; nothing ran and nothing was written."""


def _name(names, param):
    return (names or {}).get(param, param)


def fail(message):
    raise ExperimentArgumentError(" ".join(str(message).split()))


def check_int(param, value, *, ge, le=MAX_COUNT, names=None, why_low="", why_high=""):
    """``value`` is an int (not a bool) in ``[ge, le]``; ``why_low`` and
    ``why_high`` explain the bounds in the message."""
    name = _name(names, param)
    if isinstance(value, bool) or not isinstance(value, int):
        fail(f"{name} must be an integer, got {value!r}")
    if value < ge:
        fail(f"{name} must be >= {ge}, got {value}{why_low}")
    if value > le:
        fail(f"{name} must be <= {le}, got {value}{why_high}")
    return value


def check_real(param, value, *, gt=None, ge=None, le=None, names=None, why_low=""):
    """``value`` is a finite real number within the given bounds;
    ``why_low`` explains the lower one in the message."""
    name = _name(names, param)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        fail(f"{name} must be finite, got {value}")
    if gt is not None and not value > gt:
        fail(f"{name} must be > {gt:g}, got {value:g}{why_low}")
    if ge is not None and not value >= ge:
        fail(f"{name} must be >= {ge:g}, got {value:g}{why_low}")
    if le is not None and not value <= le:
        fail(f"{name} must be <= {le:g}, got {value:g}")
    return value


def check_seconds(param, value, *, names=None):
    """A duration: finite, > 0 and at most ``MAX_SECONDS`` (an hour)."""
    return check_real(param, value, gt=0, le=MAX_SECONDS, names=names)


def physical_memory():
    """Bytes of memory of this machine, or None if unknown."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def pool_bytes(num_segments, segment_size):
    """Memory a NetworkBufferPool of these segments takes."""
    stride = -(-segment_size // CACHE_LINE) * CACHE_LINE
    return num_segments * (stride + SEGMENT_OVERHEAD)


def check_pool_fits(num_segments, segment_size, *, count_param, size_param, names=None):
    """The pool's arena fits in this machine's memory."""
    need, have = pool_bytes(num_segments, segment_size), physical_memory()
    if have is not None and need > have:
        fail(f"{num_segments} buffers ({_name(names, count_param)}) of {segment_size} bytes "
             f"({_name(names, size_param)}) need {need / 2**30:.1f} GiB, more than this "
             f"machine's {have / 2**30:.1f} GiB of memory")
