"""The channel of every row of a batch by its key, vectorized: Flink's key
groups, the channel :class:`~flinkbuf.io.HashSelector` gives each row's key
(:func:`key_partitions`; :class:`~flinkbuf.io.BatchWriter` routes rows by it).

Integer, boolean and float keys, and Arrow strings and binaries, are hashed
in C (:func:`~flinkbuf.io.assign_keys_to_operators`); numpy strings and
bytes once per distinct value, the objects of an object array one by one,
with :func:`~flinkbuf.io.java_hash_code`.  A null key (``None``, an Arrow
null) goes where the hash selector sends ``None`` (Java hash code 0).
pyarrow is imported only for Arrow keys.
"""

import numpy as np

from flinkbuf.checks import check_int
from flinkbuf.io._io import assign_key_to_operator, assign_keys_to_operators, java_hash_code

__all__ = ["check_key_type", "is_arrow", "is_key_type", "key_partitions", "key_type_error",
           "partition_dtype", "partitions"]


def partition_dtype(num_partitions):
    """The narrowest integer type that holds every partition."""
    return np.int8 if num_partitions <= 128 else np.int16


def _assign(keys, num_partitions, max_parallelism, dtype, **varlen):
    """The partition of each key of a numpy array of numbers, or of the
    bytes ``keys`` cut by ``varlen["offsets"]``, as a new array of
    ``dtype``."""
    n = len(keys) if not varlen else len(varlen["offsets"]) - 1
    out = np.empty(n, dtype=dtype)
    assign_keys_to_operators(keys, out, num_partitions, max_parallelism, **varlen)
    return out


def _numpy_partitions(values, num_partitions, max_parallelism, dtype):
    """The partition of each key of a 1-D numpy array: integers, booleans
    (Java's ``Boolean``) and floats (``Double``) in C; str and bytes once
    per distinct value and the objects of an object array one by one."""
    kind = values.dtype.kind
    if kind in "biuf":
        if kind == "f" and values.dtype.itemsize not in (4, 8):
            values = values.astype(np.float64)
        values = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("="))
        return _assign(values, num_partitions, max_parallelism, dtype)
    if kind not in "OUS":
        raise TypeError(f"cannot hash keys of dtype {values.dtype} as Java would: convert "
                        "them to int64, str or bytes first")
    if kind == "O":
        # One by one: Python's equality would merge keys that Java hashes
        # apart (1, 1.0 and True; 0.0 and -0.0).  None's hash code is 0.
        codes = np.fromiter((0 if v is None else java_hash_code(v) for v in values),
                            dtype=np.int32, count=len(values))
        return _assign(codes, num_partitions, max_parallelism, dtype)
    uniques, inverse = np.unique(values, return_inverse=True)     # str, bytes: sorted in numpy
    return _distinct_partitions(uniques.tolist(), num_partitions, max_parallelism,
                                dtype)[inverse.reshape(-1)]


def _distinct_partitions(distinct, num_partitions, max_parallelism, dtype):
    """The partition of each key of a list of distinct keys."""
    codes = np.fromiter((java_hash_code(u) for u in distinct), dtype=np.int32,
                        count=len(distinct))
    return _assign(codes, num_partitions, max_parallelism, dtype)


def _arrow_partitions(keys, num_partitions, max_parallelism, dtype):
    """:func:`partitions` for an Arrow array or chunked array ``keys``."""
    import pyarrow as pa

    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    t = keys.type
    null_mask = keys.is_null().to_numpy(zero_copy_only=False) if keys.null_count else None
    if pa.types.is_null(t):
        parts = np.empty(len(keys), dtype=dtype)
    elif pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t):
        if null_mask is not None and not pa.types.is_floating(t):
            keys = keys.fill_null(False if pa.types.is_boolean(t) else 0)
        parts = _numpy_partitions(keys.to_numpy(zero_copy_only=False), num_partitions,
                                  max_parallelism, dtype)
    elif (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
          or pa.types.is_large_binary(t)):
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        if null_mask is not None:
            keys = keys.fill_null("" if text else b"")
        _, offsets, data = keys.buffers()
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)
        offsets = offsets[keys.offset:keys.offset + len(keys) + 1]
        parts = _assign(b"" if data is None else data, num_partitions, max_parallelism,
                        dtype, offsets=offsets, utf8=text)
    else:
        encoded = keys.dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        if not uniques:
            parts = np.empty(len(keys), dtype=dtype)
        else:
            per_unique = _distinct_partitions(uniques, num_partitions, max_parallelism, dtype)
            parts = per_unique[encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    if null_mask is not None:
        parts[null_mask] = assign_key_to_operator(None, num_partitions, max_parallelism)
    return parts


def is_arrow(obj):
    """Whether ``obj`` is one of pyarrow's objects (pyarrow not imported)."""
    return type(obj).__module__.split(".")[0] == "pyarrow"


def partitions(keys, num_partitions, max_parallelism, dtype=np.int64):
    """The partition of each key of ``keys`` (an Arrow array or chunked
    array, or a 1-D numpy array) as an array of ``dtype``; arguments not
    checked."""
    if is_arrow(keys):
        return _arrow_partitions(keys, num_partitions, max_parallelism, dtype)
    return _numpy_partitions(keys, num_partitions, max_parallelism, dtype)


def is_key_type(arrow_type):
    """Whether keys of the Arrow type ``arrow_type`` hash as Java would:
    integers, floats, booleans, strings, bytes, nulls, and dictionaries of
    those (the one rule for key columns, Spark's included)."""
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    return any(test(t) for test in (
        pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
        pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
        pa.types.is_null))


def key_type_error(name, what):
    """The TypeError of key column ``name`` of a type (``what``) that
    cannot be hashed as Java would."""
    return TypeError(f"cannot hash key column {name!r} of type {what} as Java would: key "
                     f"columns hold integers, floats, booleans, strings or bytes (cast it, "
                     f"say to int64 or a string)")


def check_key_type(name, column):
    """TypeError naming column ``name`` unless its keys (an Arrow array or
    a numpy array) are of a type the hash selector hashes as Java does
    (:func:`is_key_type`; numpy: integers, floats, booleans, strings,
    bytes, and objects of those types)."""
    if is_arrow(column):
        if is_key_type(column.type):
            return
        what = str(column.type)
    elif column.dtype.kind in "biufOUS":
        return
    else:
        what = str(column.dtype)
    raise key_type_error(name, what)


def _as_key_array(keys):
    """``keys`` as a 1-D numpy array.  A sequence becomes an array of its
    objects as they are (numpy would turn ints beyond int64, or ints beside
    floats, into floats, and tuples into rows of a 2-D array)."""
    if isinstance(keys, np.ndarray):
        if keys.ndim != 1:
            raise ValueError(f"keys must be one-dimensional, got an array of shape {keys.shape}")
        return keys
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        raise TypeError(f"keys must be an Arrow array, a numpy array or a sequence of keys, "
                        f"got {type(keys).__name__}")
    items = list(keys)
    values = np.empty(len(items), dtype=object)
    values[:] = items
    return values


def key_partitions(keys, num_partitions, max_parallelism=None):
    """The partition of each key of ``keys`` among ``num_partitions``, as
    the hash selector and :func:`~flinkbuf.io.assign_key_to_operator`
    assign them (Flink's key groups), and so as
    :class:`~flinkbuf.io.BatchWriter` routes rows; returns an int64 numpy
    array.

    ``keys``: an Arrow array or chunked array, a one-dimensional numpy
    array, or a sequence of keys (pyarrow is needed for Arrow input only).
    Integer, boolean and float keys, and Arrow strings and binaries, are
    hashed vectorized in C, other keys (numpy strings, tuples, ...) once
    per distinct value.  Null keys (``None``) go where the hash selector
    sends ``None``.  ``max_parallelism``: the number of key groups, at
    least ``num_partitions`` (default:
    :func:`~flinkbuf.io.default_max_parallelism`)."""
    from flinkbuf.io import default_max_parallelism

    check_int(num_partitions, "num_partitions", 1, 32768)
    if max_parallelism is None:
        max_parallelism = default_max_parallelism(num_partitions)
    else:
        check_int(max_parallelism, "max_parallelism", num_partitions, 32768)
    if not is_arrow(keys):
        keys = _as_key_array(keys)
    return partitions(keys, num_partitions, max_parallelism)
