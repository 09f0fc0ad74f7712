"""The ``arrow`` codec's records: pieces of column batches (docs/FORMAT.md 5).

A record is a ``pyarrow.RecordBatch`` or a mapping of column name ->
equal-length 1-D numpy array, and decodes to the same kind.  Column values
travel as their raw bytes where they can (numpy columns, and Arrow batches
whose columns are all of a fixed width and without nulls), so a reader
rebuilds the batch without a per-row step: its arrays are views over the
record's memory (a bytearray they keep alive).  Any other Arrow batch
travels as an Arrow IPC message, a numpy object column as a typed-codec list.

:func:`encode_parts` gives the payload as parts to copy one after the other
(large ones are copied straight from the columns into the network buffers);
:func:`decode_piece` reads a payload and treats it as hostile: every length
is checked against the payload's own before anything is allocated, and
anything malformed is a :class:`~flinkbuf.errors.CorruptRecordError`.
pyarrow is imported only for Arrow batches.
"""

import functools
import re
import struct
import sys
from collections.abc import Mapping

import numpy as np

from flinkbuf.errors import CorruptRecordError

__all__ = ["ALIGN", "ArrowValues", "KIND_ARROW_IPC", "KIND_ARROW_VALUES", "KIND_NUMPY",
           "NumpyLayout", "NumpyValues", "check_columns", "decode_piece", "encode_parts",
           "schema_values", "value_type", "value_views"]

MAGIC = b"FBC"
KIND_NUMPY, KIND_ARROW_VALUES, KIND_ARROW_IPC = 1, 2, 3
ALIGN = 16                       # every section starts at a payload offset multiple of this
_HEAD = struct.Struct("<3sBII")  # magic, kind, rows, header length
_COLUMN_NAME = struct.Struct("<H")
_COLUMN_SIZE = struct.Struct("<Q")
# numpy dtypes a numpy column may have: a byte order, a kind and an item
# size, and for datetimes and timedeltas a unit ("|O": an object column).
_DTYPE = re.compile(r"[<>|=][biufcmMSU][0-9]{1,4}(\[[0-9]*[a-zA-Z]{1,2}\])?|\|O")
_NUMPY_KINDS = "biufcmMSUO"
# Arrow columns whose values are one buffer of items of one of these widths
# (in bits) travel as those bytes, viewed as unsigned integers.
_VALUE_TYPES = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
                64: np.dtype(np.uint64)}
_PADDING = bytes(ALIGN)
_SCHEMA_CACHE_SIZE = 32


def _pad(n):
    return -n % ALIGN


# ---- writing ---------------------------------------------------------------

def check_columns(columns):
    """The columns of a mapping batch, checked: ``(names, arrays, rows)``,
    each array 1-D and of a dtype the codec carries, all of one length.
    TypeError / ValueError name the column."""
    names, arrays, rows = [], [], None
    for name, values in columns.items():
        if not isinstance(name, str):
            raise TypeError(f"column names must be str, got {type(name).__name__} ({name!r})")
        if not isinstance(values, np.ndarray):
            raise TypeError(f"column {name!r} must be a numpy array, got "
                            f"{type(values).__name__}")
        if values.ndim != 1:
            raise ValueError(f"column {name!r} must be one-dimensional, got an array of "
                             f"shape {values.shape}")
        if values.dtype.kind not in _NUMPY_KINDS or values.dtype.fields is not None \
                or (values.dtype.kind != "O" and values.dtype.itemsize == 0):
            raise TypeError(f"column {name!r} has dtype {values.dtype}, which a batch cannot "
                            f"carry (numbers, bools, datetimes, fixed-size str and bytes, "
                            f"objects)")
        if rows is None:
            rows = len(values)
        elif len(values) != rows:
            raise ValueError(f"ragged columns: column {name!r} has {len(values)} rows, "
                             f"column {names[0]!r} {rows}")
        names.append(name)
        arrays.append(values)
    return names, arrays, rows or 0


def _column_head(name, dtype):
    """A numpy column's header entry but its size: its name and dtype."""
    encoded = name.encode("utf-8")
    if len(encoded) > 0xFFFF:
        raise ValueError(f"column name {name[:40]!r}... is longer than 65535 bytes")
    return _COLUMN_NAME.pack(len(encoded)) + encoded + bytes((len(dtype),)) + dtype


class NumpyLayout:
    """The header of the numpy pieces of columns ``names`` of ``dtypes``
    (checked by :func:`check_columns`, none of Python objects), made once:
    :meth:`header` of a piece of so many rows."""

    __slots__ = ("names", "dtypes", "_struct", "_heads", "_itemsizes")

    def __init__(self, names, dtypes):
        self.names, self.dtypes = tuple(names), tuple(dtypes)
        self._heads = [_column_head(n, d.str.encode("ascii")) for n, d in zip(names, dtypes)]
        self._struct = struct.Struct("<I" + "".join(f"{len(h)}sQ" for h in self._heads))
        self._itemsizes = [d.itemsize for d in dtypes]

    def header(self, rows):
        """The header of a piece of ``rows`` rows."""
        args = [len(self._heads)]
        for head, size in zip(self._heads, self._itemsizes):
            args += (head, rows * size)
        return self._struct.pack(*args)


class NumpyValues:
    """A piece of a mapping batch: ``layout`` (its columns'
    :class:`NumpyLayout`), ``rows`` and ``arrays`` (its columns, 1-D numpy
    arrays of the layout's dtypes).  It encodes as the mapping of the
    layout's names to the arrays would, without checking them again."""

    __slots__ = ("layout", "rows", "arrays")

    def __init__(self, layout, rows, arrays):
        self.layout, self.rows, self.arrays = layout, rows, arrays


def _numpy_parts(columns):
    names, arrays, rows = check_columns(columns)
    header, sections = [struct.pack("<I", len(names))], []
    for name, values in zip(names, arrays):
        if values.dtype.kind == "O":
            from flinkbuf.serialization._serialization import encode

            try:
                data = encode(values.tolist())
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"column {name!r}: {exc}") from exc
            dtype = b"|O"
        else:
            data = np.ascontiguousarray(values).view(np.uint8)
            dtype = values.dtype.str.encode("ascii")
        header += [_column_head(name, dtype), _COLUMN_SIZE.pack(len(data))]
        sections.append(data)
    return rows, b"".join(header), sections


def value_type(t):
    """The numpy type that an Arrow column of type ``t`` travels as when it
    has no nulls: its values' bytes, as unsigned integers of its width
    (integers, floats, dates, times, timestamps, durations, fixed-size
    binary of 1, 2, 4 or 8 bytes), or None (the batch goes as IPC)."""
    import pyarrow as pa

    if (sys.byteorder != "little" or isinstance(t, pa.ExtensionType)
            or pa.types.is_dictionary(t) or pa.types.is_boolean(t) or pa.types.is_nested(t)):
        return None
    try:
        bits = t.bit_width
    except ValueError:                   # not of a fixed width
        return None
    return _VALUE_TYPES.get(bits)


def value_views(batch, types):
    """Each column of RecordBatch ``batch`` as a numpy view of its values
    (``types``: each field's :func:`value_type`, all known), or None if a
    column has nulls or buffers not laid out as its type says."""
    views = []
    for column, t in zip(batch.columns, types):
        if column.null_count:
            return None
        buffers = column.buffers()
        if len(buffers) != 2 or buffers[1] is None:
            return None
        views.append(np.frombuffer(buffers[1], dtype=t, count=len(column),
                                   offset=column.offset * t.itemsize))
    return views


class ArrowValues:
    """A piece of an Arrow batch whose columns all travel as their values
    (:func:`schema_values`), already gathered: ``schema`` (the IPC bytes of
    the batch's schema), ``rows`` and ``arrays`` (one contiguous 1-D numpy
    array of each column's values).  It encodes as that batch's piece would,
    without an Arrow batch made of the arrays first."""

    __slots__ = ("schema", "rows", "arrays")

    def __init__(self, schema, rows, arrays):
        self.schema, self.rows, self.arrays = schema, rows, arrays


def schema_values(schema):
    """``(ipc, types)``: the IPC bytes of Arrow ``schema`` and each field's
    :func:`value_type` (types None unless every field has one)."""
    return _SchemaBytes.of(schema)


class _SchemaBytes:
    """The IPC form of the last schema written (batches of one writer
    mostly share theirs), and its fields' value types (None unless all
    have one); replaced as a whole, so threads may share it."""

    last = None

    @classmethod
    def of(cls, schema):
        last = cls.last
        if last is None or (schema is not last[0]
                            and not schema.equals(last[0], check_metadata=True)):
            types = [value_type(field.type) for field in schema]
            last = (schema, schema.serialize().to_pybytes(),
                    types if types and all(t is not None for t in types) else None)
            cls.last = last
        return last[1], last[2]


def _arrow_parts(batch):
    schema, types = _SchemaBytes.of(batch.schema)
    views = None if types is None else value_views(batch, types)
    if views is not None:
        return KIND_ARROW_VALUES, batch.num_rows, schema, [v.view(np.uint8) for v in views]
    import pyarrow as pa

    for field in batch.schema:
        if pa.types.is_dictionary(field.type):
            raise TypeError(f"column {field.name!r} is dictionary-encoded ({field.type}): "
                            f"decode it first (its dictionary does not travel with a batch)")
    return KIND_ARROW_IPC, batch.num_rows, schema, [batch.serialize()]


def _is_record_batch(record):
    return type(record).__name__ == "RecordBatch" and \
        type(record).__module__.split(".")[0] == "pyarrow"


def encode_parts(record):
    """The payload of ``record`` (a ``pyarrow.RecordBatch`` or a mapping of
    column name -> 1-D numpy array) as a list of bytes-like parts."""
    if type(record) is ArrowValues:
        kind, rows, header = KIND_ARROW_VALUES, record.rows, record.schema
        sections = [a.view(np.uint8) for a in record.arrays]
    elif type(record) is NumpyValues:
        kind, rows, header = KIND_NUMPY, record.rows, record.layout.header(record.rows)
        sections = [np.ascontiguousarray(a).view(np.uint8) for a in record.arrays]
    elif _is_record_batch(record):
        kind, rows, header, sections = _arrow_parts(record)
    elif isinstance(record, Mapping):
        kind = KIND_NUMPY
        rows, header, sections = _numpy_parts(record)
    else:
        raise TypeError(f"the arrow codec takes a pyarrow.RecordBatch or a mapping of column "
                        f"name -> numpy array, got {type(record).__name__}")
    if rows > 0xFFFFFFFF:
        raise ValueError(f"a batch of {rows} rows is too large for one record")
    head = _HEAD.pack(MAGIC, kind, rows, len(header))
    parts = [head, header]
    at = len(head) + len(header)
    for data in sections:
        pad = _pad(at)
        if pad:
            parts.append(_PADDING[:pad])
        parts.append(data)
        at += pad + len(data)
    return parts


# ---- reading ---------------------------------------------------------------

def _corrupt(reason):
    return CorruptRecordError(f"a malformed column batch: {reason}")


def decode_piece(payload):
    """The batch a payload (a bytearray, whose memory the batch's arrays
    then share) holds: a dict of numpy arrays or a ``pyarrow.RecordBatch``.
    CorruptRecordError if it is malformed."""
    size = len(payload)
    if size < _HEAD.size:
        raise _corrupt(f"{size} bytes, less than its {_HEAD.size}-byte head")
    magic, kind, rows, header_len = _HEAD.unpack_from(payload)
    if magic != MAGIC:
        raise _corrupt("not a column batch (wrong magic bytes)")
    if header_len > size - _HEAD.size:
        raise _corrupt(f"a header of {header_len} bytes in a record of {size}")
    header = memoryview(payload)[_HEAD.size:_HEAD.size + header_len]
    start = _HEAD.size + header_len          # each section starts after its padding
    if kind == KIND_NUMPY:
        return _decode_numpy(payload, rows, header, start)
    if kind in (KIND_ARROW_VALUES, KIND_ARROW_IPC):
        return _decode_arrow(payload, kind, rows, header, start)
    raise _corrupt(f"unknown kind {kind}")


def _numpy_header(header):
    """``[(name, dtype, nbytes)]`` of a numpy batch's header."""
    try:
        (count,) = struct.unpack_from("<I", header)
        at, columns, names = 4, [], set()
        for _ in range(count):           # each column takes >= 11 header bytes
            (n,) = _COLUMN_NAME.unpack_from(header, at)
            if at + 2 + n > len(header):
                raise struct.error("truncated")
            name = bytes(header[at + 2:at + 2 + n]).decode("utf-8")
            at += 2 + n
            d = header[at]
            dtype = bytes(header[at + 1:at + 1 + d]).decode("ascii")
            at += 1 + d
            (nbytes,) = _COLUMN_SIZE.unpack_from(header, at)
            at += _COLUMN_SIZE.size
            if name in names:
                raise _corrupt(f"column {name!r} twice")
            names.add(name)
            columns.append((name, _dtype(dtype), nbytes))
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise _corrupt(f"a truncated or garbled header ({exc})") from None
    if at != len(header):
        raise _corrupt(f"{len(header) - at} bytes after the header's columns")
    return columns


@functools.lru_cache(maxsize=_SCHEMA_CACHE_SIZE)
def _dtype(text):
    """The dtype a column's header names (``text``), checked; the last
    ones read are remembered (a piece's columns mostly repeat the last's)."""
    if not _DTYPE.fullmatch(text):
        raise _corrupt(f"dtype {text!r} is not one a batch carries")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as exc:
        raise _corrupt(f"dtype {text!r}: {exc}") from None
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.subdtype is not None \
            or (dtype.kind != "O" and dtype.itemsize == 0):
        raise _corrupt(f"dtype {text!r} is not one a batch carries")
    return dtype


def _decode_numpy(payload, rows, header, at):
    size = len(payload)
    out = {}
    for name, dtype, nbytes in _numpy_header(header):
        at += _pad(at)
        if nbytes > size - at:
            raise _corrupt(f"column {name!r} of {nbytes} bytes at offset {at} of a record "
                           f"of {size}")
        if dtype.kind == "O":
            out[name] = _object_column(payload, at, nbytes, rows, name)
        else:
            if nbytes != rows * dtype.itemsize:
                raise _corrupt(f"column {name!r} has {nbytes} bytes, not {rows} values of "
                               f"{dtype}")
            out[name] = (np.frombuffer(payload, dtype=dtype, count=rows, offset=at) if rows
                         else np.empty(0, dtype=dtype))
        at += nbytes
    if at != size:
        raise _corrupt(f"{size - at} bytes after the last column")
    return out


def _object_column(payload, at, nbytes, rows, name):
    from flinkbuf.serialization._serialization import decode

    items = decode(memoryview(payload)[at:at + nbytes])
    if type(items) is not list or len(items) != rows:
        raise _corrupt(f"object column {name!r} does not hold {rows} values")
    column = np.empty(rows, dtype=object)
    column[:] = items
    return column


class _Schemas:
    """Schemas read from IPC messages, by their bytes (bounded: a peer
    cannot make it grow without end)."""

    cache = {}

    @classmethod
    def read(cls, data):
        import pyarrow as pa

        key = bytes(data)
        got = cls.cache.get(key)
        if got is None:
            schema = _read_ipc(pa.ipc.read_schema, pa.py_buffer(key))
            # its names and types as text: what a peer's invalid UTF-8 breaks
            _read_ipc(lambda: [(f.name, str(f.type)) for f in schema])
            got = schema, [value_type(field.type) for field in schema]
            if len(cls.cache) >= _SCHEMA_CACHE_SIZE:
                cls.cache.clear()
            cls.cache[key] = got
        return got


def _read_ipc(read, *args, **kwargs):
    import pyarrow as pa

    try:
        return read(*args, **kwargs)
    except (pa.ArrowException, EOFError, OSError, TypeError, ValueError, IndexError,
            UnicodeDecodeError) as exc:
        raise _corrupt(f"a malformed Arrow IPC message: {exc}") from None


def _is_compressed(metadata):
    """Whether the flatbuffer ``metadata`` of an Arrow IPC record batch
    message says its body is compressed (Message.header's RecordBatch has
    a ``compression`` field): a peer could make a small compressed body
    decompress into any amount of memory.  Malformed metadata counts as
    compressed."""
    data = metadata.to_pybytes()

    def field(table, index):
        """The position of field ``index`` of the table at ``table``, or 0."""
        (soffset,) = struct.unpack_from("<i", data, table)
        vtable = table - soffset
        (vsize,) = struct.unpack_from("<H", data, vtable)
        if vsize > len(data) or 4 + 2 * index + 2 > vsize:
            return 0
        (off,) = struct.unpack_from("<H", data, vtable + 4 + 2 * index)
        return table + off if off else 0

    try:
        (root,) = struct.unpack_from("<I", data, 0)
        header = field(root, 2)              # Message.header (a union's table)
        if not header:
            return True
        (rel,) = struct.unpack_from("<I", data, header)
        return field(header + rel, 3) != 0   # RecordBatch.compression
    except struct.error:
        return True


def _decode_arrow(payload, kind, rows, header, at):
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise ImportError("reading Arrow batches needs pyarrow: pip install "
                          "'flinkbuf[arrow]'") from exc
    schema, types = _Schemas.read(header)
    view, size = memoryview(payload), len(payload)
    if kind == KIND_ARROW_IPC:
        at += _pad(at)
        if at > size:
            raise _corrupt("no room for its Arrow IPC message")
        message = _read_ipc(pa.ipc.read_message, pa.py_buffer(view[at:]))
        if message.type != "record batch" or _is_compressed(message.metadata):
            raise _corrupt(f"an Arrow IPC message of type {message.type!r} (a batch travels "
                           f"as an uncompressed record batch)")
        batch = _read_ipc(pa.ipc.read_record_batch, message, schema)
        _read_ipc(batch.validate, full=True)
        if batch.num_rows != rows:
            raise _corrupt(f"{batch.num_rows} rows, its head says {rows}")
        return batch
    if not types or any(t is None for t in types):
        raise _corrupt("values of columns that are not all of a fixed width")
    columns = []
    for field, t in zip(schema, types):
        at += _pad(at)
        nbytes = rows * t.itemsize
        if nbytes > size - at:
            raise _corrupt(f"column {field.name!r} ({field.type}) needs {nbytes} bytes at "
                           f"offset {at} of a record of {size}")
        columns.append(pa.Array.from_buffers(field.type, rows,
                                             [None, pa.py_buffer(view[at:at + nbytes])]))
        at += nbytes
    if at != size:
        raise _corrupt(f"{size - at} bytes after the last column")
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    try:
        batch.validate(full=True)             # the values of dates and times, say
    except pa.ArrowException as exc:
        raise _corrupt(f"values not valid for their types: {exc}") from None
    return batch
