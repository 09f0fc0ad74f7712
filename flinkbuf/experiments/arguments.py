"""Range checks shared by the experiments, the demo and the command line.

Every check raises :class:`ExperimentArgumentError` (a ``ValueError``)
with a one-line message that names the argument.  The library functions
name their parameters (``phase_seconds``); the command line passes
``names`` to name its options instead (``--phase-seconds``).
"""

import os

from flinkbuf import checks
from flinkbuf.errors import FlinkbufError

MAX_SECONDS = 3600.0        # a phase (or a demo step) lasts at most an hour
MAX_COUNT = checks.INT32_MAX   # counts and sizes are C int32 in the buffer core
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


def _checked(check, value, param, names, **bounds):
    """``check`` (one of :mod:`flinkbuf.checks`) of ``value`` under the
    name to report, its TypeError or ValueError as
    :class:`ExperimentArgumentError`."""
    try:
        return check(value, _name(names, param), **bounds)
    except (TypeError, ValueError) as exc:
        error = exc
    fail(error)


def check_int(param, value, *, ge, le=MAX_COUNT, names=None, why_low="", why_high=""):
    """``value`` is an int (not a bool) in ``[ge, le]``; ``why_low`` and
    ``why_high`` explain the bounds in the message."""
    return _checked(checks.check_int, value, param, names, minimum=ge, maximum=le,
                    why_low=why_low, why_high=why_high)


def check_real(param, value, *, gt=None, ge=None, le=None, names=None, why_low=""):
    """``value`` is a finite real number within the given bounds;
    ``why_low`` explains the lower one in the message."""
    return _checked(checks.check_real, value, param, names, gt=gt, ge=ge, le=le,
                    why_low=why_low)


def check_choice(param, value, choices, *, names=None):
    """``value`` is one of ``choices``."""
    return _checked(checks.check_choice, value, param, names, choices=choices)


def check_seconds(param, value, *, names=None):
    """A duration: finite, > 0 and at most ``MAX_SECONDS`` (an hour)."""
    return _checked(checks.check_seconds, value, param, names, maximum=MAX_SECONDS)


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
