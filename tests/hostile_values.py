"""The hostile arguments of ``hostile_calls.py``: objects whose
``__index__``, ``__len__``, ``__getitem__``, ``__eq__``, ``__repr__`` or
buffer misbehave, lists that shrink while they are read, references to the
example's own flinkbuf objects, and the hypothesis strategies that draw
argument lists of them (with plausible values for the keywords that most
calls take)."""

import collections

import numpy as np
from hypothesis import strategies as st

import flinkbuf as fb

# ---- hostile objects ----------------------------------------------------------------

class BadIndex:
    def __index__(self):
        raise ArithmeticError("__index__ refuses")

    def __int__(self):
        raise ArithmeticError("__int__ refuses")


class HugeIndex:
    def __index__(self):
        return 2 ** 100


class LyingLength(list):
    """Claims a million items; holds two."""

    def __len__(self):
        return 10 ** 6


class Shrinking(list):
    """Loses its last item whenever one is read."""

    def __getitem__(self, i):
        if len(self) > 0:
            self.pop()
        return list.__getitem__(self, i)

    def __iter__(self):
        while len(self):
            yield self.pop()


class ShrinkingTuple(tuple):
    def __len__(self):
        return max(0, tuple.__len__(self) - 3)


class BadEq:
    def __eq__(self, other):
        raise ValueError("__eq__ refuses")

    def __hash__(self):
        raise ValueError("__hash__ refuses")


class BadRepr:
    def __repr__(self):
        raise ValueError("__repr__ refuses")


class BadBuffer:
    def __buffer__(self, flags):
        raise BufferError("no buffer")


def _released_view():
    m = memoryview(bytearray(b"abcd"))
    m.release()
    return m


Pair = collections.namedtuple("Pair", "key value")


class Ref:
    """One of the example's own flinkbuf objects, by name (resolved when
    the example runs: each example has fresh objects)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Ref({self.name})"


class Fresh:
    """An object made when the example runs: one that hypothesis must not
    hash or keep (its hash raises, it is used up or released)."""

    def __init__(self, name, make):
        self.name = name
        self.make = make

    def __repr__(self):
        return self.name


def _returning(value):
    def fn(*args, **kwargs):
        return value
    fn.__qualname__ = f"returning({value!r})"
    return fn


def _raising(*args, **kwargs):
    raise LookupError("a user function raised")


INTS = st.one_of(
    st.integers(-3, 10),
    st.sampled_from([2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 32, 2 ** 63 - 1,
                     2 ** 63, -2 ** 63, -2 ** 63 - 1, 2 ** 64, 2 ** 100, -2 ** 100]),
    st.integers(-2 ** 70, 2 ** 70),
)
SCALARS = st.one_of(
    INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-12, 0.5, 1e300, float("nan"), float("inf"), -float("inf")]),
    st.none(), st.booleans(),
    st.text(max_size=4), st.binary(max_size=8),
    st.sampled_from(["typed", "bytes", "pickle", "hash", "round_robin", "broadcast",
                     "forward", "backlog_aware", "", "\udcff"]),
    st.sampled_from([np.int64(-1), np.uint64(2 ** 64 - 1), np.int8(5), np.float64("nan"),
                     np.bool_(True), np.float32(2.5)]),
)
SPECIAL = st.sampled_from([
    BadIndex(), HugeIndex(), BadBuffer(), object(), Fresh("BadRepr()", BadRepr),
    Fresh("BadEq()", BadEq), Fresh("released memoryview", _released_view),
    Fresh("iter([1, 2])", lambda: iter([1, 2])),
    bytearray(b"xyz"), memoryview(b"xyz"), memoryview(b"abcdef")[::2],
    np.zeros(0), np.arange(6).reshape(2, 3), np.arange(10)[::3], np.array(7),
    np.array([None, "x"], dtype=object), np.ma.masked_array([1, 2], mask=[0, 1]),
    Pair(1, 2), Pair("k", None), range(3), {1: 2}, {"k": [1]}, set(),
    _returning(-1), _returning(2 ** 70), _returning(None), _returning(1.5),
    _returning(np.int64(1)), _returning(True), _raising, print,
])
REFS = st.sampled_from(["nbp", "pool", "buffer", "segment", "partition", "subpartition",
                        "writer", "gate", "channel", "serializer", "deserializer",
                        "selector", "event"]).map(Ref)


def _hostile():
    base = st.one_of(SCALARS, SPECIAL, REFS)
    return st.recursive(
        base,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.lists(inner, max_size=5).map(tuple),
            st.lists(inner, max_size=5).map(LyingLength),
            st.lists(inner, max_size=6).map(Shrinking),
            st.lists(inner, max_size=6).map(ShrinkingTuple),
            st.dictionaries(st.one_of(st.integers(-2, 4), st.text(max_size=2)), inner,
                            max_size=3),
            st.builds(_returning, inner),
        ),
        max_leaves=6)


HOSTILE = _hostile()
KEYWORDS = ("timeout", "channel", "codec", "max_parallelism", "key", "name", "start",
            "max_record_size", "buffer_timeout", "num_subpartitions", "min_buffers",
            "max_buffers", "max_buffers_per_channel", "max_overdraft_buffers", "alignment",
            "window", "writers", "gates", "selector", "big_endian", "data_type", "secret",
            "host", "port", "transport")
ARGS = st.tuples(st.lists(HOSTILE, max_size=4),
                 st.dictionaries(st.sampled_from(KEYWORDS), HOSTILE, max_size=2))

# Plausible values by parameter name: most parameters of an example get
# one, so that the hostile ones reach past the first check of a call.
_SMALL = st.integers(0, 64)
_FIELDS = st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=5)
_RECORDS = st.one_of(st.tuples(st.integers(-5, 5), st.integers()), _FIELDS, _FIELDS.map(tuple),
                     _FIELDS.map(Shrinking), _FIELDS.map(ShrinkingTuple), _FIELDS.map(LyingLength),
                     st.text(max_size=3), st.binary(max_size=8), st.none(), st.integers())
PLAUSIBLE = {
    **dict.fromkeys(("offset", "index", "start", "reader_index", "writer_index", "position",
                     "length", "n", "count", "size", "src_offset", "dst_offset", "value"),
                    _SMALL),
    "num_segments": st.integers(1, 64), "segment_size": st.integers(1, 4096),
    "alignment": st.sampled_from([64, 4096]),
    **dict.fromkeys(("min_buffers", "num_buffers", "max_overdraft_buffers"), st.integers(0, 4)),
    **dict.fromkeys(("max_buffers", "max_buffers_per_channel"),
                    st.one_of(st.none(), st.integers(1, 8))),
    **dict.fromkeys(("num_subpartitions", "num_channels", "parallelism", "num_partitions",
                     "num_tasks"), st.integers(1, 4)),
    **dict.fromkeys(("subpartition", "channel", "key_group"), st.one_of(st.none(), st.integers(0, 3))),
    **dict.fromkeys(("timeout", "buffer_timeout", "window", "interval"),
                    st.sampled_from([0, 0.001, 0.01, 0.5, None])),
    "big_endian": st.booleans(),
    **dict.fromkeys(("record", "data", "payload", "key", "obj", "hash_code", "code"), _RECORDS),
    "records": st.lists(_RECORDS, max_size=4),
    "codec": st.sampled_from(["typed", "bytes", "pickle"]),
    "name": st.one_of(st.none(), st.text(max_size=4)),
    "max_parallelism": st.one_of(st.none(), st.integers(1, 256)),
    "max_record_size": st.integers(1, 1 << 20),
    "selector": st.one_of(st.sampled_from(["hash", "round_robin", "broadcast", "backlog_aware"]),
                          st.builds(fb.HashSelector, st.sampled_from([None, 0, 1]))),
    **dict.fromkeys(("partition", "producer"), st.just(Ref("partition"))),
    **dict.fromkeys(("network_pool", "network_buffer_pool", "nbp"), st.just(Ref("nbp"))),
    "pool": st.just(Ref("pool")), "buffer": st.just(Ref("buffer")),
    **dict.fromkeys(("segment", "target", "other"), st.just(Ref("segment"))),
    "event": st.just(Ref("event")),
    "writers": st.just([Ref("writer")]), "gates": st.just([Ref("gate")]),
    "channels": st.just([(Ref("partition"), 0)]),
    **dict.fromkeys(("fn", "callback", "listener", "monitor"),
                    st.sampled_from([_returning(0), _returning(None)])),
    **dict.fromkeys(("exc", "cause", "error"), st.just(RuntimeError("hostile"))),
    "secret": st.just(b"s" * 32), "host": st.just("127.0.0.1"), "port": st.just(0),
    "transport": st.sampled_from(["auto", "tcp", "unix", "shm"]),
    "keys": st.lists(st.one_of(st.integers(), st.text(max_size=2)), max_size=5),
    **dict.fromkeys(("enabled", "buffer_debloat"), st.booleans()),
    **dict.fromkeys(("period", "active_seconds", "buffer_debloat_period"),
                    st.sampled_from([0.001, 0.2, 1.0])),
    **dict.fromkeys(("samples", "threshold", "buffer_debloat_samples",
                     "buffer_debloat_threshold"), st.integers(1, 100)),
    **dict.fromkeys(("min_size", "buffer_debloat_min_size", "buffers_in_use"),
                    st.integers(0, 512)),
    "bytes": st.integers(0, 1 << 40),
}
