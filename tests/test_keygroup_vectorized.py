"""flinkbuf.io.assign_keys_to_operators, the key-group assignment of a whole
array in C: bit-exact with the scalar assign_key_to_operator for every key
type it takes, and a clear exception (never a crash, never a write) for
every bad argument."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flinkbuf.io import assign_key_to_operator, assign_keys_to_operators
from helpers import ticks_during

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
OUT_DTYPES = [np.int8, np.int16, np.int32, np.int64]


@st.composite
def parallelisms(draw):
    """(parallelism, max_parallelism), parallelism <= 128 (int8 outputs)."""
    max_parallelism = draw(st.one_of(st.sampled_from([1, 128, 256, 32768]),
                                     st.integers(1, 32768)))
    return draw(st.integers(1, min(128, max_parallelism))), max_parallelism


def _scalar(keys, parallelism, max_parallelism):
    return [assign_key_to_operator(k, parallelism, max_parallelism) for k in keys]


def _assign(keys, parallelism, max_parallelism, out_dtype=np.int32, **varlen):
    n = len(varlen["offsets"]) - 1 if varlen else len(keys)
    out = np.full(n, -1, dtype=out_dtype)
    assert assign_keys_to_operators(keys, out, parallelism, max_parallelism, **varlen) is None
    return out.tolist()


@given(st.sampled_from(INT_DTYPES).flatmap(
           lambda dt: hnp.arrays(dt, st.integers(0, 60))),
       parallelisms(), st.sampled_from(OUT_DTYPES))
def test_integer_arrays_as_the_scalar_assignment(keys, pm, out_dtype):
    p, mp = pm
    assert _assign(keys, p, mp, out_dtype) == _scalar([int(k) for k in keys], p, mp)


@given(hnp.arrays(np.int64, st.integers(0, 60),
                  elements=st.sampled_from([0, 1, -1, 2**31 - 1, -2**31, 2**31, -2**31 - 1,
                                            2**63 - 1, -2**63, 1 << 40])),
       parallelisms())
def test_int64_keys_at_the_integer_and_long_boundaries(keys, pm):
    p, mp = pm
    assert _assign(keys, p, mp) == _scalar([int(k) for k in keys], p, mp)


@given(hnp.arrays(np.uint64, st.integers(0, 40),
                  elements=st.integers(2**63 - 3, 2**64 - 1) | st.integers(0, 2**33)),
       parallelisms())
def test_uint64_keys_beyond_int64_hash_as_bigintegers(keys, pm):
    p, mp = pm
    assert _assign(keys, p, mp) == _scalar([int(k) for k in keys], p, mp)


def _per_distinct(keys, parallelism, max_parallelism):
    """The scalar assignment of every key, computed once per distinct key."""
    table = {k: assign_key_to_operator(k, parallelism, max_parallelism) for k in set(keys)}
    return [table[k] for k in keys]


@st.composite
def narrow_keys(draw):
    """Integer keys of a narrow range anywhere in their type, its ends
    included, often more than twice as many as the range's values (looked
    up in a table), and sometimes one key far out, past the first 256 keys
    or among them (then hashed one by one)."""
    dtype = draw(st.sampled_from(INT_DTYPES))
    info = np.iinfo(dtype)
    span = draw(st.sampled_from([0, 1, 2, 255, 256]) | st.integers(0, 600))
    span = min(span, int(info.max) - int(info.min))
    around_zero = max(int(info.min), min(-1, int(info.max) - span))
    lo = draw(st.sampled_from([int(info.min), int(info.max) - span, around_zero])
              | st.integers(int(info.min), int(info.max) - span))
    n = draw(st.integers(0, 3 * span + 40))
    offsets = draw(hnp.arrays(np.int64, n, elements=st.integers(0, span)))
    keys = [lo + int(o) for o in offsets]
    if keys and draw(st.booleans()):
        at = draw(st.integers(0, len(keys) - 1))
        keys[at] = draw(st.sampled_from([int(info.min), int(info.max)]))
    return np.array(keys, dtype=object).astype(dtype)


@given(narrow_keys(), parallelisms(), st.sampled_from(OUT_DTYPES))
def test_integer_keys_of_a_narrow_range_as_the_scalar_assignment(keys, pm, out_dtype):
    p, mp = pm
    assert _assign(keys, p, mp, out_dtype) == _per_distinct([int(k) for k in keys], p, mp)


@pytest.mark.parametrize("dtype", INT_DTYPES + [np.bool_])
def test_many_keys_of_a_narrow_range_as_the_scalar_assignment(dtype):
    # More keys than the 65536 values a range table holds, at both ends of
    # the type: a table, and a range one value too wide for one.
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    rng = np.random.default_rng(7)
    cases = [rng.integers(0, 2, 200_000).astype(bool)] if info is None else []
    if info is not None:
        for lo in {int(info.min), max(int(info.min), int(info.max) - 65536)}:
            for span in (min(65535, int(info.max) - lo), min(65536, int(info.max) - lo)):
                offsets = rng.integers(0, span + 1, 200_000)
                offsets[:2] = (0, span)
                cases.append((np.asarray(lo, dtype=object) + offsets.astype(object))
                             .astype(dtype))
    for keys in cases:
        as_python = [bool(k) if info is None else int(k) for k in keys.tolist()]
        assert _assign(keys, 100, 32768, np.int8) == _per_distinct(as_python, 100, 32768)


@given(hnp.arrays(np.bool_, st.integers(0, 60)), parallelisms())
def test_boolean_arrays_as_the_scalar_assignment(keys, pm):
    p, mp = pm
    assert _assign(keys, p, mp) == _scalar([bool(k) for k in keys], p, mp)


@given(st.sampled_from([np.float32, np.float64]).flatmap(
           lambda dt: hnp.arrays(dt, st.integers(0, 60),
                                 elements=st.floats(width=32 if dt == np.float32 else 64))),
       parallelisms())
def test_float_arrays_as_the_scalar_assignment(keys, pm):
    # NaNs of every payload, infinities, -0.0: Java's Double.hashCode
    p, mp = pm
    assert _assign(keys, p, mp) == _scalar([float(k) for k in keys], p, mp)


def _varlen(values, offset_dtype, encode):
    data = [encode(v) for v in values]
    offsets = np.cumsum([0] + [len(d) for d in data]).astype(offset_dtype)
    return b"".join(data), offsets


@given(st.lists(st.text(max_size=12), max_size=40), parallelisms(),
       st.sampled_from([np.int32, np.int64]))
def test_string_keys_from_utf8_as_the_scalar_assignment(values, pm, offset_dtype):
    p, mp = pm
    data, offsets = _varlen(values, offset_dtype, str.encode)
    assert _assign(data, p, mp, offsets=offsets, utf8=True) == _scalar(values, p, mp)


@given(st.lists(st.binary(max_size=12), max_size=40), parallelisms(),
       st.sampled_from([np.int32, np.int64]))
def test_bytes_keys_as_the_scalar_assignment(values, pm, offset_dtype):
    p, mp = pm
    data, offsets = _varlen(values, offset_dtype, bytes)
    assert _assign(data, p, mp, offsets=offsets) == _scalar(values, p, mp)


@given(st.lists(st.text(max_size=6), min_size=1, max_size=20), st.data())
def test_offsets_may_start_anywhere_in_the_data(values, data):
    # An Arrow slice: its offsets point into the middle of its data buffer.
    skip = data.draw(st.integers(0, len(values)))
    raw, offsets = _varlen(values, np.int32, str.encode)
    assert _assign(raw, 7, 128, offsets=offsets[skip:], utf8=True) == \
        _scalar(values[skip:], 7, 128)


@pytest.mark.parametrize("dtype", INT_DTYPES + [np.bool_, np.float32, np.float64])
def test_empty_arrays_write_nothing(dtype):
    out = np.empty(0, dtype=np.int32)
    assign_keys_to_operators(np.empty(0, dtype=dtype), out, 3)
    assign_keys_to_operators(b"", out, 3, offsets=np.zeros(1, np.int32), utf8=True)
    assert out.size == 0


def test_key_groups_with_parallelism_equal_to_max_parallelism():
    keys = np.arange(-1000, 1000, dtype=np.int64)
    out = np.empty(len(keys), dtype=np.int16)
    assign_keys_to_operators(keys, out, 256, 256)
    from flinkbuf.io import java_hash_code, key_group_for_hash
    assert out.tolist() == [key_group_for_hash(java_hash_code(int(k)), 256) for k in keys]


def test_other_threads_run_while_a_large_array_is_assigned():
    keys = np.arange(20_000_000, dtype=np.int64)
    out = np.empty(len(keys), dtype=np.int32)
    # the GIL was released during the call
    assert ticks_during(lambda: assign_keys_to_operators(keys, out, 4)) > 5


KEYS = np.arange(6, dtype=np.int64)
OUT = np.empty(6, dtype=np.int32)
DATA, OFFSETS = b"abcdef", np.array([0, 2, 4, 6], dtype=np.int32)


@pytest.mark.parametrize("call, error, message", [
    # keys of a type it does not hash
    (lambda: assign_keys_to_operators(KEYS.astype(object), OUT, 4), TypeError, "format 'O'"),
    (lambda: assign_keys_to_operators(KEYS.astype(np.float16), OUT, 4), TypeError,
     "keys must be integers"),
    (lambda: assign_keys_to_operators(KEYS.astype(np.complex128), OUT, 4), TypeError,
     "keys must be integers"),
    (lambda: assign_keys_to_operators(np.array(["a"] * 6), OUT, 4), TypeError,
     "with their offsets"),
    (lambda: assign_keys_to_operators(list(KEYS), OUT, 4), TypeError,
     "keys must be a one-dimensional array"),
    (lambda: assign_keys_to_operators(KEYS.astype(">i8"), OUT, 4), ValueError, "byte order"),
    # shapes and layouts
    (lambda: assign_keys_to_operators(np.arange(12)[::2], OUT, 4), ValueError, "strided"),
    (lambda: assign_keys_to_operators(KEYS.reshape(2, 3), OUT, 4), ValueError,
     "2-dimensional"),
    (lambda: assign_keys_to_operators(np.int64(3), OUT, 4), ValueError, "0-dimensional"),
    (lambda: assign_keys_to_operators(KEYS, np.empty(12, np.int32)[::2], 4), ValueError,
     "out must be a contiguous"),
    # the output
    (lambda: assign_keys_to_operators(KEYS, np.empty(5, np.int32), 4), ValueError,
     "6 keys, 5 items in out"),
    (lambda: assign_keys_to_operators(KEYS, np.empty(7, np.int32), 4), ValueError,
     "6 keys, 7 items in out"),
    (lambda: assign_keys_to_operators(KEYS, np.empty(6, np.float64), 4), TypeError,
     "signed integers"),
    (lambda: assign_keys_to_operators(KEYS, np.empty(6, np.uint32), 4), TypeError,
     "signed integers"),
    (lambda: assign_keys_to_operators(KEYS, bytes(24), 4), ValueError, "writable"),
    (lambda: assign_keys_to_operators(KEYS, np.empty(6, np.int8), 200, 256), ValueError,
     "too narrow"),
    # parallelism and max parallelism
    (lambda: assign_keys_to_operators(KEYS, OUT, 0), ValueError, "parallelism must be >= 1"),
    (lambda: assign_keys_to_operators(KEYS, OUT, 129), ValueError,
     "parallelism must be <= 128, got 129 \\(max_parallelism\\)"),
    (lambda: assign_keys_to_operators(KEYS, OUT, 4, 0), ValueError, "max_parallelism"),
    (lambda: assign_keys_to_operators(KEYS, OUT, 4, 32769), ValueError,
     "max_parallelism must be <= 32768"),
    (lambda: assign_keys_to_operators(KEYS, OUT, 2**40), ValueError, "parallelism"),
    (lambda: assign_keys_to_operators(KEYS, OUT, 4.0), TypeError, "parallelism must be an int"),
    (lambda: assign_keys_to_operators(KEYS, OUT, True), TypeError, "parallelism must be an int"),
    # variable-length keys
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, utf8=True), TypeError, "offsets"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=OFFSETS, utf8=1), TypeError,
     "utf8 must be a bool"),
    (lambda: assign_keys_to_operators(DATA, OUT[:2], 4, offsets=OFFSETS), ValueError,
     "one more item than out"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=OFFSETS.astype(np.int16)),
     TypeError, "int32 or int64"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=OFFSETS.astype(np.uint32)),
     TypeError, "int32 or int64"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=[0, 2, 4, 6]), TypeError,
     "offsets must be a one-dimensional array"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=np.array([0, 2, 9, 6],
                                                                          np.int32)),
     ValueError, "key 1: its offsets lie outside the 6 bytes"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=np.array([0, 4, 2, 6],
                                                                          np.int64)),
     ValueError, "key 1: .*run backwards"),
    (lambda: assign_keys_to_operators(DATA, OUT[:3], 4, offsets=np.array([-1, 2, 4, 6],
                                                                          np.int32)),
     ValueError, "key 0"),
    (lambda: assign_keys_to_operators(b"a\xff\xfe", OUT[:1], 4,
                                      offsets=np.array([0, 3], np.int32), utf8=True),
     ValueError, "not UTF-8"),
    (lambda: assign_keys_to_operators(np.arange(12, dtype=np.uint8)[::2], OUT[:1], 4,
                                      offsets=np.array([0, 3], np.int32)),
     ValueError, "contiguous"),
])
def test_bad_arguments_raise_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("data", [
    b"\xc0\x80",            # an overlong NUL
    b"\xed\xa0\x80",        # a surrogate
    b"\xf4\x90\x80\x80",    # beyond U+10FFFF
    b"\xe2\x82",            # cut short
    b"\x80",                # a lone continuation byte
    b"\xf8\x88\x80\x80\x80",
])
def test_ill_formed_utf8_is_refused(data):
    with pytest.raises(ValueError, match="key 0"):
        assign_keys_to_operators(data, np.empty(1, np.int32), 4,
                                 offsets=np.array([0, len(data)], np.int32), utf8=True)
    # the same bytes as bytes keys hash fine
    out = np.empty(1, np.int32)
    assign_keys_to_operators(data, out, 4, offsets=np.array([0, len(data)], np.int32))
    assert out[0] == assign_key_to_operator(data, 4)


def test_a_refused_call_writes_nothing():
    out = np.full(6, -7, dtype=np.int32)
    with pytest.raises(ValueError):
        assign_keys_to_operators(np.arange(5, dtype=np.int64), out, 4)
    with pytest.raises(ValueError):
        assign_keys_to_operators(KEYS, out, 0)
    assert out.tolist() == [-7] * 6
