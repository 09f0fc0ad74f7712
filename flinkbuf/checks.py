"""Argument checks shared by every layer's Python code (and, on their error
path, by the compiled layers' ``as_int32`` in ``checks.pxd``).

Each check returns the value (seconds as a float) or raises ``TypeError``
for a value of the wrong type and ``ValueError`` for one out of range, with
a one-line message that names the argument, shows the value and says what
is allowed.  ``why_low`` / ``why_high`` add the reason for a bound.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Collection
from typing import TypeVar, overload

__all__ = ["INT32_MAX", "check_choice", "check_int", "check_real", "check_seconds"]

# Counts and sizes are C int32 in the buffer core.
INT32_MAX = 2 ** 31 - 1

_T = TypeVar("_T")
_SHOWN = (int, float, str, bytes, type(None))
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 40


def _shown(value: object) -> str:
    """A short text of ``value`` for a message: the value itself for a
    number, a string, bytes or None, else its type's name."""
    if isinstance(value, _SHOWN):
        try:
            return _repr.repr(value)
        except Exception:           # noqa: BLE001 - a subclass with a broken __repr__
            pass
    return type(value).__name__


def check_int(value: object, name: str, minimum: int, maximum: int = INT32_MAX, *,
              why_low: str = "", why_high: str = "") -> int:
    """``value`` is an int (not a bool) in ``[minimum, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {_shown(value)}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}{why_low}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}{why_high}")
    return value


def check_real(value: object, name: str, *, gt: float | None = None, ge: float | None = None,
               le: float | None = None, unit: str = "", why_low: str = "") -> float:
    """``value`` is a finite int or float (not a bool) above ``gt`` (or at
    least ``ge``) and at most ``le``; ``unit`` names what it counts."""
    of = f" of {unit}" if unit else ""
    unit = f" {unit}" if unit else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number{of}, got {_shown(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if gt is not None and not value > gt:
        raise ValueError(f"{name} must be > {gt:g}{unit}, got {value:g}{why_low}")
    if ge is not None and not value >= ge:
        raise ValueError(f"{name} must be >= {ge:g}{unit}, got {value:g}{why_low}")
    if le is not None and not value <= le:
        raise ValueError(f"{name} must be <= {le:g}{unit}, got {value:g}")
    return value


@overload
def check_seconds(value: object, name: str, *, maximum: float | None = None) -> float: ...
@overload
def check_seconds(value: object, name: str, *, allow_none: bool,
                  maximum: float | None = None) -> float | None: ...
def check_seconds(value: object, name: str, *, allow_none: bool = False,
                  maximum: float | None = None) -> float | None:
    """A duration: a finite number of seconds > 0 (at most ``maximum``), as
    a float; None too with ``allow_none``."""
    if value is None and allow_none:
        return None
    return float(check_real(value, name, gt=0, le=maximum, unit="seconds"))


def check_choice(value: _T, name: str, choices: Collection[object]) -> _T:
    """``value`` is one of ``choices`` (compared with ``==``)."""
    try:
        known = value in choices
    except (TypeError, ValueError):  # unhashable, or an array that compares elementwise
        known = False
    if not known:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                         f"got {_shown(value)}")
    return value
