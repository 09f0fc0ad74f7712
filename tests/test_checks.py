"""flinkbuf.checks, the one argument checker: what it accepts, and that each
refusal names the argument, shows the value and says what is allowed."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf.checks import INT32_MAX, check_choice, check_int, check_real, check_seconds


@given(st.integers(-2**40, 2**40), st.integers(-100, 100), st.integers(0, 200))
def test_check_int_accepts_exactly_the_ints_in_range(value, minimum, width):
    maximum = minimum + width
    if minimum <= value <= maximum:
        assert check_int(value, "n", minimum, maximum) == value
    elif value < minimum:
        with pytest.raises(ValueError, match=f"^n must be >= {minimum}, got {value}$"):
            check_int(value, "n", minimum, maximum)
    else:
        with pytest.raises(ValueError, match=f"^n must be <= {maximum}, got {value}$"):
            check_int(value, "n", minimum, maximum)


@pytest.mark.parametrize("value, shown", [
    (True, "True"), (2.0, "2.0"), ("3", "'3'"), (None, "None"), ([1], "list"),
    (np.float64(1.5), r"np.float64\(1.5\)")])
def test_check_int_refuses_other_types_showing_them(value, shown):
    with pytest.raises(TypeError, match=f"^count must be an integer, got {shown}$"):
        check_int(value, "count", 0)


def test_check_int_takes_int_subclasses_and_adds_the_reasons():
    assert check_int(np.int64(3).item(), "n", 0) == 3
    assert check_int(INT32_MAX, "n", 0) == INT32_MAX
    with pytest.raises(ValueError, match=r"^n must be <= 2147483647, got 2147483648 \(int32\)$"):
        check_int(INT32_MAX + 1, "n", 0, why_high=" (int32)")
    with pytest.raises(ValueError, match=r"^n must be >= 2, got 1 \(two at least\)$"):
        check_int(1, "n", 2, why_low=" (two at least)")


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-10, 10))
def test_check_seconds_accepts_exactly_the_positive_finite_numbers(value):
    if isinstance(value, float) and not math.isfinite(value):
        with pytest.raises(ValueError, match="^timeout must be finite, got"):
            check_seconds(value, "timeout")
    elif value > 0:
        got = check_seconds(value, "timeout")
        assert got == value and type(got) is float
    else:
        with pytest.raises(ValueError, match="^timeout must be > 0 seconds, got"):
            check_seconds(value, "timeout")


def test_check_seconds_bounds_none_and_types():
    assert check_seconds(None, "t", allow_none=True) is None
    with pytest.raises(TypeError, match="^t must be a number of seconds, got None$"):
        check_seconds(None, "t")
    with pytest.raises(TypeError, match="^t must be a number of seconds, got True$"):
        check_seconds(True, "t")
    with pytest.raises(ValueError, match="^t must be <= 3600 seconds, got 3601$"):
        check_seconds(3601, "t", maximum=3600)
    assert check_real(0.5, "f", ge=0.5, le=1) == 0.5
    with pytest.raises(ValueError, match=r"^f must be >= 0.5, got 0.4 \(why\)$"):
        check_real(0.4, "f", ge=0.5, why_low=" (why)")


def test_check_choice_lists_the_choices():
    assert check_choice("bytes", "codec", fb.serialization.CODECS) == "bytes"
    for bad, shown in (("json", "'json'"), (None, "None"), ([1], "list"),
                       (np.zeros(3), "ndarray")):
        with pytest.raises(ValueError, match=f"^codec must be one of 'typed', 'bytes', "
                                             f"'pickle', 'arrow', got {shown}$"):
            check_choice(bad, "codec", fb.serialization.CODECS)


def test_every_layer_reports_through_the_one_checker():
    """The compiled layers (as_int32), the io layer and the network layer
    give the same message for the same mistake."""
    from flinkbuf.network import NetworkEnvironment
    with pytest.raises(ValueError, match="^num_segments must be >= 1, got 0$"):
        fb.NetworkBufferPool(0, 64)
    with pytest.raises(TypeError, match="^segment_size must be an integer, got 2.5$"):
        fb.NetworkBufferPool(4, 2.5)
    with pytest.raises(ValueError, match="^num_subpartitions must be >= 1, got 0$"):
        fb.create_partition(fb.NetworkBufferPool(4, 64), 0)
    with pytest.raises(ValueError, match="^exclusive_buffers_per_channel must be >= 1, got 0$"):
        NetworkEnvironment(4, 64, secret=b"s" * 32, exclusive_buffers_per_channel=0)
    with pytest.raises(ValueError, match="^port must be <= 65535, got 70000$"):
        NetworkEnvironment(4, 64, secret=b"s" * 32, port=70000)
    with pytest.raises(ValueError, match="^codec must be one of 'typed', 'bytes', 'pickle', "
                                         "'arrow', got 'json'$"):
        fb.RecordSerializer("json")
    with pytest.raises(ValueError, match="^window must be > 0 seconds, got 0$"):
        fb.TaskMetrics("t", window=0)
