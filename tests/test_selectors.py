"""Channel selectors, Flink's key-group assignment and Java hash codes.

The expected numbers below were derived with a small Java program (it is in
``JAVA_REFERENCE``; the test that compiles and runs it is skipped where no
JDK is installed): Java's own ``hashCode()`` of each key, then Flink's
documented ``KeyGroupRangeAssignment`` (``murmurHash(hashCode) %
maxParallelism``, then ``keyGroup * parallelism / maxParallelism``), with
``MathUtils.murmurHash`` written out.  That murmur itself is checked against
the published MurmurHash3_x86_32 test vectors (seed 0): the four bytes
00000000 hash to 0x2362F9DE, ffffffff to 0x76293B50 and 21436587 to
0xF55B516B (Flink makes the result non-negative).
"""

import collections
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import flinkbuf as fb
from flinkbuf import io

# label, Java hashCode, murmur, key group (max parallelism 128), operator
# index for parallelism 1, 2, 3, 4, 7, 10, 128 (max parallelism 128).
JAVA_VALUES = [
    (0, 0, 593689054, 94, [0, 1, 2, 2, 5, 7, 94]),
    (1, 1, 68075478, 86, [0, 1, 2, 2, 4, 6, 86]),
    (2, 2, 1085422463, 127, [0, 1, 2, 3, 6, 9, 127]),
    (3, 3, 847579505, 113, [0, 1, 2, 3, 6, 8, 113]),
    (4, 4, 1889779975, 7, [0, 0, 0, 0, 0, 0, 7]),
    (5, 5, 236698494, 126, [0, 1, 2, 3, 6, 9, 126]),
    (42, 42, 1134849565, 29, [0, 0, 0, 0, 1, 2, 29]),
    (1000, 1000, 3506311, 7, [0, 0, 0, 0, 0, 0, 7]),
    (123456789, 123456789, 1088346449, 81, [0, 1, 1, 2, 4, 6, 81]),
    (-1, -1, 1982413648, 80, [0, 1, 1, 2, 4, 6, 80]),
    (-42, -42, 189366624, 96, [0, 1, 2, 3, 5, 7, 96]),
    (2147483647, 2147483647, 1653689534, 62, [0, 0, 1, 1, 3, 4, 62]),
    (-2147483648, -2147483648, 1718298732, 108, [0, 1, 2, 3, 5, 8, 108]),
    (-2023406815, -2023406815, 178564757, 21, [0, 0, 0, 0, 1, 1, 21]),   # 0x87654321
    (2147483648, -2147483648, 1718298732, 108, [0, 1, 2, 3, 5, 8, 108]),  # Long
    (1 << 40, 256, 1409940790, 54, [0, 0, 1, 1, 2, 4, 54]),
    (-(1 << 40), -256, 910361053, 93, [0, 1, 2, 2, 5, 7, 93]),
    (9876543210, 1286608616, 1962744443, 123, [0, 1, 2, 3, 6, 9, 123]),
    ("", 0, 593689054, 94, [0, 1, 2, 2, 5, 7, 94]),
    ("a", 97, 1455541201, 81, [0, 1, 1, 2, 4, 6, 81]),
    ("flink", 97520992, 1330823394, 98, [0, 1, 2, 3, 5, 7, 98]),
    ("hello world", 1794106052, 1522757468, 92, [0, 1, 2, 2, 5, 7, 92]),
    ("key-17", -1134722988, 1460463584, 96, [0, 1, 2, 3, 5, 7, 96]),
    ("\u00e9t\u00e9", 227742, 157703301, 5, [0, 0, 0, 0, 0, 0, 5]),
    ("\u65e5\u672c", 835047, 1762503263, 95, [0, 1, 2, 2, 5, 7, 95]),
    ("\U0001F600x", 54959989, 1998616508, 60, [0, 0, 1, 1, 3, 4, 60]),  # surrogate pair
    (b"abc", 126145, 774285724, 28, [0, 0, 0, 0, 1, 2, 28]),
    (b"\xff\x00", 930, 1083896330, 10, [0, 0, 0, 0, 0, 0, 10]),
    (0.0, 0, 593689054, 94, [0, 1, 2, 2, 5, 7, 94]),
    (-0.0, -2147483648, 1718298732, 108, [0, 1, 2, 3, 5, 8, 108]),
    (1.5, 1073217536, 1684538177, 65, [0, 1, 1, 2, 3, 5, 65]),
    (-2.25, -1073610752, 1833515292, 28, [0, 0, 0, 0, 1, 2, 28]),
    (1e100, 1898351312, 1494666151, 39, [0, 0, 0, 1, 2, 3, 39]),
    (True, 1231, 1090530765, 77, [0, 1, 1, 2, 4, 6, 77]),
    (False, 1237, 1530821891, 3, [0, 0, 0, 0, 0, 0, 3]),
    ((1, 2), 33, 1605105309, 29, [0, 0, 0, 0, 1, 2, 29]),     # Flink Tuple2
    (("a", 7), 3014, 3114485, 117, [0, 1, 2, 3, 6, 9, 117]),
]
PARALLELISMS = [1, 2, 3, 4, 7, 10, 128]

# key groups for max parallelism 256 and 32768 (same Java program)
JAVA_KEY_GROUPS_256_32768 = {
    0: (222, 31198), 1: (214, 16342), 42: (29, 28189), -1: (80, 15184),
    "flink": (226, 16610), 1000: (135, 135),
}


@pytest.mark.parametrize("key,hash_code,murmur,key_group,indexes", JAVA_VALUES,
                         ids=[repr(v[0]) for v in JAVA_VALUES])
def test_bit_exact_with_flink_key_group_assignment(key, hash_code, murmur, key_group, indexes):
    assert io.java_hash_code(key) == hash_code
    assert io.murmur_hash(hash_code) == murmur
    assert io.key_group_for_hash(hash_code, 128) == key_group
    for p, want in zip(PARALLELISMS, indexes):
        assert io.operator_index_for_key_group(key_group, p, 128) == want
        assert io.assign_key_to_operator(key, p, 128) == want
        sel = fb.HashSelector()
        sel.setup(p)
        assert sel.select_channel(key) == want
    # the vectorized assignment (one key of its own dtype) is as bit-exact
    one = _as_array(key)
    if one is not None:
        got = [_assign_one(one, p) for p in PARALLELISMS]
        assert got == indexes


def _as_array(key):
    """``key`` as the arguments of assign_keys_to_operators, or None for a
    key it does not take (tuples)."""
    if isinstance(key, bool):
        return {"keys": np.array([key])}
    if isinstance(key, int) and -2**63 <= key < 2**63:
        return {"keys": np.array([key], dtype=np.int64)}
    if isinstance(key, float):
        return {"keys": np.array([key])}
    if isinstance(key, (str, bytes)):
        data = key.encode() if isinstance(key, str) else key
        return {"keys": data, "offsets": np.array([0, len(data)], dtype=np.int32),
                "utf8": isinstance(key, str)}
    return None


def _assign_one(args, parallelism):
    args = dict(args)
    out = np.empty(1, dtype=np.int32)
    io.assign_keys_to_operators(args.pop("keys"), out, parallelism, 128, **args)
    return int(out[0])


@pytest.mark.parametrize("key", sorted(JAVA_KEY_GROUPS_256_32768, key=repr))
def test_key_groups_for_other_max_parallelisms(key):
    h = io.java_hash_code(key)
    assert (io.key_group_for_hash(h, 256), io.key_group_for_hash(h, 32768)) == \
        JAVA_KEY_GROUPS_256_32768[key]


def test_murmur_matches_the_published_murmur3_vectors():
    def to_flink(x):
        x = x - (1 << 32) if x >= 1 << 31 else x
        return x if x >= 0 else (-x if x != -(1 << 31) else 0)

    assert io.murmur_hash(0) == to_flink(0x2362F9DE)
    assert io.murmur_hash(-1) == to_flink(0x76293B50)
    assert io.murmur_hash(-2023406815) == to_flink(0xF55B516B)   # bytes 21 43 65 87


def _murmur_reference(code):
    """MurmurHash3_x86_32 of one little-endian int, seed 0, in Python."""
    m = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    k = (code & m) * 0xCC9E2D51 & m
    k = rotl(k, 15) * 0x1B873593 & m
    h = rotl(k, 13)
    h = (h * 5 + 0xE6546B64) & m
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & m
    h ^= h >> 13
    h = h * 0xC2B2AE35 & m
    h ^= h >> 16
    h = h - (1 << 32) if h >= 1 << 31 else h
    return h if h >= 0 else (-h if h != -(1 << 31) else 0)


@given(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(1, 32768), st.integers(1, 32768))
def test_murmur_and_ranges_agree_with_a_python_reference(code, max_par, par):
    par = min(par, max_par)
    assert io.murmur_hash(code) == _murmur_reference(code)
    kg = io.key_group_for_hash(code, max_par)
    assert kg == _murmur_reference(code) % max_par
    assert io.operator_index_for_key_group(kg, par, max_par) == kg * par // max_par


def test_murmur_agrees_with_mmh3():
    import mmh3     # a dev dependency (pyproject.toml)

    rng = random.Random(7)
    for _ in range(2000):
        code = rng.randrange(-(1 << 31), 1 << 31)
        h = mmh3.hash(code.to_bytes(4, "little", signed=True), 0, signed=True)
        assert io.murmur_hash(code) == (h if h >= 0 else (-h if h != -(1 << 31) else 0))


@given(st.text())
def test_string_hash_is_javas_over_utf16(s):
    units = s.encode("utf-16-le", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "little")) & 0xFFFFFFFF
    assert io.java_hash_code(s) == (h - (1 << 32) if h >= 1 << 31 else h)


@given(st.integers(-(1 << 200), 1 << 200))
def test_int_hash_follows_integer_long_biginteger(v):
    h = io.java_hash_code(v)
    if -(1 << 31) <= v < 1 << 31:
        assert h == v
    elif -(1 << 63) <= v < 1 << 63:
        u = v & 0xFFFFFFFFFFFFFFFF
        x = (u ^ (u >> 32)) & 0xFFFFFFFF
        assert h == (x - (1 << 32) if x >= 1 << 31 else x)
    else:   # BigInteger.hashCode
        mag, words = abs(v), []
        while mag:
            words.append(mag & 0xFFFFFFFF)
            mag >>= 32
        x = 0
        for w in reversed(words):
            x = (31 * x + w) & 0xFFFFFFFF
        x = (-x if v < 0 else x) & 0xFFFFFFFF
        assert h == (x - (1 << 32) if x >= 1 << 31 else x)


def test_long_keys_through_the_documented_long_hash_recipe():
    """java_hash_code's docstring: keying by Long.hashCode(v) matches a Flink
    job keyed by Long, also for small negative values (hashed as Integer
    by default: Long.hashCode(-1) is 0, Integer.hashCode(-1) is -1)."""
    namespace = {}
    doc = io.java_hash_code.__doc__
    recipe = doc[doc.index("def long_hash"):doc.index("HashSelector(key=")]
    exec(__import__("textwrap").dedent("    " + recipe), namespace)
    long_hash = namespace["long_hash"]
    by_key = {v[0]: v for v in JAVA_VALUES if type(v[0]) is int}
    # outside int32 Python ints already hash as Long: the recipe agrees
    for v in (2147483648, 1 << 40, -(1 << 40), 9876543210):
        assert long_hash(v) == io.java_hash_code(v) == by_key[v][1]
    # Long.valueOf(-1L).hashCode() == 0, Long.valueOf(5L).hashCode() == 5
    sel = fb.HashSelector(key=lambda r: long_hash(r[0]))
    sel.setup(7)
    assert sel.select_channel((-1, "x")) == by_key[0][4][PARALLELISMS.index(7)]
    assert sel.select_channel((5, "x")) == by_key[5][4][PARALLELISMS.index(7)]
    assert io.java_hash_code(-1) == -1 and long_hash(-1) == 0


def test_hashing_of_other_key_types():
    assert io.java_hash_code(None) == 0
    assert io.java_hash_code(bytearray(b"abc")) == io.java_hash_code(b"abc")
    assert io.java_hash_code(memoryview(b"abc")) == 126145
    assert io.java_hash_code(np.int64(42)) == 42
    assert io.java_hash_code(np.float64(1.5)) == io.java_hash_code(1.5)
    assert io.java_hash_code(float("nan")) == io.java_hash_code(float("nan"))
    assert io.java_hash_code([1, 2]) == (31 * (31 + 1) + 2)
    assert io.java_hash_code((1, (2, "a"))) == 31 * 1 + io.java_hash_code((2, "a"))
    assert io.java_hash_code(()) == 0
    with pytest.raises(TypeError, match="deterministically"):
        io.java_hash_code(object())
    with pytest.raises(TypeError):
        io.java_hash_code({"a": 1})


def test_deeply_nested_and_self_referencing_keys_raise_instead_of_crashing():
    """Hashing recursed in C without a bound: a key nested 100,000 deep, or a
    list that holds itself, overflowed the C stack (a segfault)."""
    deep = ()
    for _ in range(100_000):
        deep = (deep,)
    looped = [1]
    looped.append(looped)
    sel = fb.HashSelector()
    sel.setup(3)
    for key in (deep, looped, [[looped]]):
        with pytest.raises(ValueError, match="nested deeper than 100"):
            io.java_hash_code(key)
        with pytest.raises(ValueError, match="nested deeper than 100"):
            sel.select_channel(key)
        with pytest.raises(ValueError, match="nested deeper than 100"):
            io.assign_key_to_operator(key, 4)
    # as deep as the typed codec goes (100 containers) still hashes, as Java would
    ok = 7
    for _ in range(100):
        ok = (ok,)
    assert io.java_hash_code(ok) == 7
    with pytest.raises(ValueError, match="nested deeper than 100"):
        io.java_hash_code((ok,))
    assert io.java_hash_code([[5]]) == 31 + (31 + 5)


def _sanitizer_env():
    """What a child needs to load a sanitizer build (make asan), else nothing."""
    return {k: v for k, v in os.environ.items() if k in ("LD_PRELOAD", "ASAN_OPTIONS")}


def test_string_keys_hash_the_same_in_every_process():
    code = ("import flinkbuf.io as io; "
            "print([io.assign_key_to_operator(k, 7) for k in ('a', 'key-17', 'x' * 40)])")
    import sys
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**_sanitizer_env(), "PYTHONHASHSEED": seed, "PATH": ""},
                           check=True).stdout
            for seed in ("1", "2", "3")}
    assert len(outs) == 1


def test_hash_selector_key_forms_and_limits():
    sel = fb.HashSelector(key=1, max_parallelism=256)
    sel.setup(4)
    assert sel.select_channel(("x", 42)) == 29 * 4 // 256
    sel = fb.HashSelector(key=lambda r: r["k"])
    sel.setup(3)
    assert sel.select_channel({"k": 2}) == 127 * 3 // 128
    with pytest.raises(ValueError, match="exceed max_parallelism"):
        fb.HashSelector(max_parallelism=4).setup(5)
    with pytest.raises(ValueError):
        fb.HashSelector(max_parallelism=40000)
    with pytest.raises(TypeError):
        fb.HashSelector(key="name")
    with pytest.raises(ValueError):
        fb.HashSelector(key=-1)
    # HashSelector(0, 256) read like "key 0, 256 channels": max_parallelism is keyword-only
    with pytest.raises(TypeError, match="positional argument"):
        fb.HashSelector(0, 256)
    assert fb.HashSelector(0).max_parallelism == 128


_FIELD = st.one_of(st.integers(), st.text(max_size=4), st.none(), st.booleans(),
                   st.binary(max_size=4))
_SEQUENCES = st.lists(_FIELD, max_size=6).flatmap(
    lambda xs: st.sampled_from([xs, tuple(xs), collections.namedtuple(
        "R", [f"f{i}" for i in range(len(xs))])(*xs)]))


@given(_SEQUENCES, st.integers(0, 7), st.integers(1, 8))
def test_hash_selector_key_index_on_records_of_every_length(record, index, n):
    """A key index takes that field of a tuple or list (a named tuple too)
    when the record has it, and raises IndexError naming the key and the
    record's length otherwise: never reads past the record."""
    sel = fb.HashSelector(index)
    sel.setup(n)
    if index < len(record):
        assert sel.select_channel(record) == io.assign_key_to_operator(record[index], n)
    else:
        with pytest.raises(IndexError, match=rf"key index {index} is out of range for a "
                                             rf"record of length {len(record)} |an empty record"):
            sel.select_channel(record)


def test_hash_selector_key_index_errors_name_the_key_and_the_record():
    sel = fb.HashSelector(1)
    sel.setup(4)
    with pytest.raises(IndexError, match=r"key index 1 .* length 1 \(tuple\): \(7,\)"):
        sel.select_channel((7,))
    with pytest.raises(IndexError, match=r"key index 1 .* length 0 \(str\)"):
        sel.select_channel("")
    with pytest.raises(KeyError, match=r"key index 1 .* length 1 \(dict\)"):
        sel.select_channel({0: "a"})
    with pytest.raises(TypeError, match="records of type int have no fields"):
        sel.select_channel(5)
    assert sel.select_channel("ab") == io.assign_key_to_operator("b", 4)   # a sequence
    with pytest.raises(IndexError) as info:
        sel.select_channel(("x" * 100_000,))
    assert len(str(info.value)) < 200             # the record is shown shortened


@given(st.one_of(_SEQUENCES, _FIELD), st.integers(1, 8))
def test_by_first_field_keys_pairs_by_their_first_field_and_others_whole(record, n):
    sel = fb.HashSelector.by_first_field()
    sel.setup(n)
    if isinstance(record, (tuple, list)):
        if record:
            assert sel.select_channel(record) == io.assign_key_to_operator(record[0], n)
        else:
            with pytest.raises(IndexError, match="empty record"):
                sel.select_channel(record)
    else:
        assert sel.select_channel(record) == io.assign_key_to_operator(record, n)


def test_by_first_field_takes_max_parallelism_only():
    assert fb.HashSelector.by_first_field(max_parallelism=512).max_parallelism == 512
    with pytest.raises(TypeError):
        fb.HashSelector.by_first_field(0)
    with pytest.raises(ValueError):
        fb.HashSelector.by_first_field(max_parallelism=0)


def test_a_writer_refuses_a_record_without_its_key_and_goes_on():
    """The key index is checked on every entry point: a writer's emit
    raises and the writer stays usable for the next record."""
    with fb.NetworkBufferPool(16, 256) as nbp:
        partition = fb.create_partition(nbp, 2)
        gate = fb.InputGate([(partition, 0), (partition, 1)])
        with partition:
            writer = fb.RecordWriter(partition, fb.HashSelector(2))
            for bad in ([1, 2], (), (1,)):
                with pytest.raises(IndexError, match="key index 2"):
                    writer.emit(bad)
            writer.emit([1, 2, 3])
            writer.emit((4, 5, 6, 7))
        assert sorted(map(tuple, gate)) == [(1, 2, 3), (4, 5, 6, 7)]
        gate.close()


def test_hash_selector_spreads_keys_over_every_channel():
    sel = fb.HashSelector()
    sel.setup(4)
    counts = collections.Counter(sel.select_channel(k) for k in range(10000))
    assert sorted(counts) == [0, 1, 2, 3]
    assert min(counts.values()) > 1800


def test_round_robin_cycles_from_a_random_start():
    starts = set()
    for _ in range(200):
        sel = fb.RoundRobinSelector()
        sel.setup(5)
        seq = [sel.select_channel(None) for _ in range(10)]
        assert seq[5:] == seq[:5] and sorted(seq[:5]) == [0, 1, 2, 3, 4]
        starts.add(seq[0])
    assert starts == {0, 1, 2, 3, 4}
    sel = fb.RoundRobinSelector(start=3)
    sel.setup(4)
    assert [sel.select_channel(None) for _ in range(5)] == [3, 0, 1, 2, 3]


def test_rescale_starts_at_zero_and_pointwise_wiring():
    sel = fb.RescaleSelector()
    sel.setup(3)
    assert [sel.select_channel(None) for _ in range(4)] == [0, 1, 2, 0]
    assert io.pointwise_connections(4, 2) == ([1, 1, 1, 1], [[(0, 0), (1, 0)], [(2, 0), (3, 0)]])
    assert io.pointwise_connections(2, 4) == ([2, 2], [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)]])
    assert io.pointwise_connections(3, 3) == ([1, 1, 1], [[(0, 0)], [(1, 0)], [(2, 0)]])


@given(st.integers(1, 40), st.integers(1, 40))
def test_pointwise_wiring_uses_every_subpartition_once(p, c):
    subparts, inputs = io.pointwise_connections(p, c)
    pairs = [pair for ins in inputs for pair in ins]
    assert sorted(pairs) == sorted((i, s) for i in range(p) for s in range(subparts[i]))
    assert all(inputs)
    # contiguous: consumers read producers in order
    flat = [i for ins in inputs for i, _ in ins]
    assert flat == sorted(flat)


@pytest.mark.parametrize("args", [(32769, 1), (1, 32769), (2**31, 2), (2, 2**63), (0, 1),
                                  (1, -1)])
def test_pointwise_wiring_refuses_more_tasks_than_flink_allows(args):
    """Each side has at most 32768 tasks: a larger count is a ValueError
    at once, not a list of billions of pairs."""
    with pytest.raises(ValueError, match="num_producers|num_consumers"):
        io.pointwise_connections(*args)


def test_pointwise_wiring_at_flinks_limit():
    subparts, inputs = io.pointwise_connections(32768, 1)
    assert subparts == [1] * 32768 and inputs == [[(i, 0) for i in range(32768)]]
    subparts, inputs = io.pointwise_connections(1, 32768)
    assert subparts == [32768] and inputs == [[(0, k)] for k in range(32768)]


def test_default_max_parallelism_is_flinks():
    assert [io.default_max_parallelism(p) for p in (1, 85, 86, 100, 200, 30000)] == \
        [128, 128, 256, 256, 512, 32768]


def test_simple_selectors_and_their_checks():
    g = fb.GlobalSelector()
    g.setup(4)
    assert {g.select_channel(i) for i in range(10)} == {0}
    f = fb.ForwardSelector()
    f.setup(1)
    assert f.select_channel("x") == 0
    with pytest.raises(ValueError):
        fb.ForwardSelector().setup(2)
    b = fb.BroadcastSelector()
    b.setup(3)
    assert b.is_broadcast
    with pytest.raises(RuntimeError):
        b.select_channel(1)
    with pytest.raises(RuntimeError, match="not set up"):
        fb.RoundRobinSelector().select_channel(1)
    c = fb.CustomSelector(lambda rec, n: rec % n)
    c.setup(3)
    assert c.select_channel(7) == 1

    class Mine(fb.CustomSelector):
        def select(self, record, num_channels):
            return num_channels - 1

    m = Mine()
    m.setup(5)
    assert m.select_channel("x") == 4
    with pytest.raises(TypeError, match="needs a function"):
        fb.CustomSelector()
    with pytest.raises(RuntimeError, match="inside a RecordWriter"):
        s = fb.BacklogAwareRebalanceSelector()
        s.setup(2)
        s.select_channel(1)


def test_selectors_in_python_are_custom_selectors():
    """A Python subclass of ChannelSelector that overrode select_channel
    looked fine, but a writer calls the C-level _select: every emit raised
    NotImplementedError.  The abstract base and subclasses the writer would
    ignore are now refused when constructed, pointing at CustomSelector."""
    with pytest.raises(TypeError, match="abstract.*CustomSelector"):
        fb.ChannelSelector()

    class Direct(fb.ChannelSelector):
        def select_channel(self, record):
            return 0

    with pytest.raises(TypeError, match="subclass CustomSelector and override select"):
        Direct()

    class OverridesSelectChannel(fb.CustomSelector):
        def select_channel(self, record):
            return 0

    class OverridesSetup(fb.CustomSelector):
        def select(self, record, num_channels):
            return 0

        def setup(self, num_channels):
            super().setup(num_channels)

    for cls, method in ((OverridesSelectChannel, "select_channel"), (OverridesSetup, "setup")):
        with pytest.raises(TypeError, match=rf"overrides {method}\(\).*override select"):
            cls()
        with pytest.raises(TypeError, match="overrides"):
            cls(lambda record, n: 0)

    class NoSelect(fb.CustomSelector):
        pass

    with pytest.raises(TypeError, match="needs a function"):
        NoSelect()
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        fb.CustomSelector(3)

    # the supported ways, through a writer
    class ByParity(fb.CustomSelector):
        def select(self, record, num_channels):
            return record % 2

    class Fallback(fb.CustomSelector):       # no override: fn decides
        pass

    nbp = fb.NetworkBufferPool(16, 128)
    for sel in (ByParity(), Fallback(lambda record, n: record % 2)):
        part = fb.create_partition(nbp, 2)
        gates = [fb.InputGate([(part, c)]) for c in range(2)]
        with fb.RecordWriter(part, sel) as w:
            for i in range(6):
                w.emit(i)
        assert [list(g) for g in gates] == [[0, 2, 4], [1, 3, 5]]
        for g in gates:
            g.close()
        part.pool.destroy()
    assert nbp.num_available_segments == nbp.num_segments


def test_custom_selectors_may_return_any_integer():
    """A channel computed with numpy (np.int64) was refused as "not an int"."""
    import enum

    class Lane(enum.IntEnum):
        LEFT = 0
        RIGHT = 2

    answers = [np.int64(2), np.uint8(1), np.int32(0), Lane.RIGHT, 1]
    sel = fb.CustomSelector(lambda record, n: answers[record])
    sel.setup(3)
    assert [sel.select_channel(i) for i in range(len(answers))] == [2, 1, 0, 2, 1]
    assert all(type(sel.select_channel(i)) is int for i in range(len(answers)))
    for bad, error, message in [
            (True, TypeError, "returned bool, not an integer"),
            (1.0, TypeError, "returned float"),
            (np.float64(1), TypeError, "returned float64"),
            ("1", TypeError, "returned str"),
            (None, TypeError, "returned NoneType"),
            (np.int64(-1), IndexError, r"channel -1, not in \[0, 3\)"),
            (3, IndexError, "channel 3"),
            (np.uint64(2**64 - 1), IndexError, "channel 18446744073709551615"),
            (1 << 80, IndexError, "not in"),
            (-(1 << 80), IndexError, "not in")]:
        with pytest.raises(error, match=message):
            s = fb.CustomSelector(lambda record, n: bad)
            s.setup(3)
            s.select_channel(0)
    # through a writer, numpy channels from a vectorised computation
    nbp = fb.NetworkBufferPool(16, 128)
    part = fb.create_partition(nbp, 3)
    gates = [fb.InputGate([(part, c)]) for c in range(3)]
    lanes = np.arange(9, dtype=np.int64) % 3
    with fb.RecordWriter(part, lambda record, n: lanes[record]) as w:
        for i in range(9):
            w.emit(i)
    assert [list(g) for g in gates] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    for g in gates:
        g.close()
    part.pool.destroy()
    assert nbp.num_available_segments == nbp.num_segments


def test_backlog_aware_threshold_from_the_pool():
    nbp = fb.NetworkBufferPool(40, 64)
    part = fb.create_partition(nbp, 2, min_buffers=16)
    sel = fb.BacklogAwareRebalanceSelector()
    w = fb.RecordWriter(part, sel)
    assert sel.max_backlog == 16 // 4
    capped = fb.create_partition(nbp, 2, min_buffers=10, max_buffers_per_channel=7)
    sel2 = fb.BacklogAwareRebalanceSelector()
    w2 = fb.RecordWriter(capped, sel2)
    assert sel2.max_backlog == 4
    fixed = fb.BacklogAwareRebalanceSelector(max_backlog=9)
    assert fixed.max_backlog == 9
    assert fb.BacklogAwareRebalanceSelector(9).max_backlog == 9
    with pytest.raises(TypeError, match="positional argument"):   # start is keyword-only
        fb.BacklogAwareRebalanceSelector(None, 0)
    with pytest.raises(ValueError, match="already serves a RecordWriter"):
        fb.RecordWriter(fb.create_partition(nbp, 2), sel)
    w.close()
    w2.close()


def test_reading_max_backlog_has_no_side_effects():
    """Reading max_backlog on a bound selector recomputed the threshold
    from the pool and restarted the countdown to the next refresh: a
    property read changed which channels counted as blocked."""
    nbp = fb.NetworkBufferPool(40, 64)
    part = fb.create_partition(nbp, 2, min_buffers=8, max_buffers=16)
    assert part.pool.num_buffers == 16
    sel = fb.BacklogAwareRebalanceSelector(start=0)
    w = fb.RecordWriter(part, sel, buffer_timeout=None)
    assert sel.max_backlog == 16 // 4          # what the first record will use
    sel.select_channel(None)                   # in force now, refreshed every 1024 records
    part.pool.set_num_buffers(8)
    for _ in range(3):
        assert sel.max_backlog == 4, "a read must not refresh the threshold"
    for _ in range(1023):
        sel.select_channel(None)
    assert sel.max_backlog == 4
    sel.select_channel(None)                   # the 1025th: refreshed from the pool
    assert sel.max_backlog == 8 // 4
    w.close()
    part.pool.destroy()


def test_backlog_aware_is_plain_round_robin_while_nothing_is_blocked():
    nbp = fb.NetworkBufferPool(40, 64)
    part = fb.create_partition(nbp, 3, min_buffers=12)
    sel = fb.BacklogAwareRebalanceSelector(start=1)
    w = fb.RecordWriter(part, sel)
    assert [sel.select_channel(None) for _ in range(6)] == [1, 2, 0, 1, 2, 0]
    assert sel.num_steered == 0
    w.close()


JAVA_REFERENCE = r"""
import java.util.Arrays;
public class KeyGroupReference {
    static int murmur(int code) {
        code *= 0xcc9e2d51; code = Integer.rotateLeft(code, 15); code *= 0x1b873593;
        code = Integer.rotateLeft(code, 13); code = code * 5 + 0xe6546b64; code ^= 4;
        code ^= code >>> 16; code *= 0x85ebca6b; code ^= code >>> 13; code *= 0xc2b2ae35;
        code ^= code >>> 16;
        if (code >= 0) return code;
        if (code != Integer.MIN_VALUE) return -code;
        return 0;
    }
    static void row(int h) {
        int m = murmur(h), kg = m % 128;
        StringBuilder sb = new StringBuilder(h + " " + m + " " + kg);
        for (int p : new int[] {1, 2, 3, 4, 7, 10, 128}) sb.append(" ").append(kg * p / 128);
        System.out.println(sb);
    }
    public static void main(String[] a) {
        for (int i : new int[] {0, 1, 2, 3, 4, 5, 42, 1000, 123456789, -1, -42,
                                Integer.MAX_VALUE, Integer.MIN_VALUE, 0x87654321})
            row(Integer.valueOf(i).hashCode());
        for (long l : new long[] {1L << 31, 1L << 40, -(1L << 40), 9876543210L})
            row(Long.valueOf(l).hashCode());
        for (String s : new String[] {"", "a", "flink", "hello world", "key-17",
                                      "\u00e9t\u00e9", "\u65e5\u672c", "\ud83d\ude00x"})
            row(s.hashCode());
        row(Arrays.hashCode(new byte[] {'a', 'b', 'c'}));
        row(Arrays.hashCode(new byte[] {(byte) 0xff, 0}));
        for (double d : new double[] {0.0, -0.0, 1.5, -2.25, 1e100}) row(Double.valueOf(d).hashCode());
        row(Boolean.TRUE.hashCode()); row(Boolean.FALSE.hashCode());
        row(31 * Integer.valueOf(1).hashCode() + Integer.valueOf(2).hashCode());
        row(31 * "a".hashCode() + Integer.valueOf(7).hashCode());
    }
}
"""


@pytest.mark.skipif(shutil.which("javac") is None or shutil.which("java") is None,
                    reason="no JDK")
def test_the_java_reference_still_agrees(tmp_path):
    (tmp_path / "KeyGroupReference.java").write_text(JAVA_REFERENCE)
    subprocess.run(["javac", "KeyGroupReference.java"], cwd=tmp_path, check=True, timeout=120)
    out = subprocess.run(["java", "-cp", ".", "KeyGroupReference"], cwd=tmp_path, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split("\n")
    rows = [list(map(int, line.split())) for line in out if line.strip()]
    assert len(rows) == len(JAVA_VALUES)
    for (key, h, m, kg, idx), row in zip(JAVA_VALUES, rows):
        assert row == [h, m, kg, *idx], key
        assert [io.java_hash_code(key), io.murmur_hash(h), io.key_group_for_hash(h),
                *[io.assign_key_to_operator(key, p) for p in PARALLELISMS]] == row


# Each selector name and the selector it stands for, in RecordWriter and in
# pipelined_exchange alike: "rebalance" is Flink's, plain round robin.
SELECTOR_NAMES = {
    "round_robin": fb.RoundRobinSelector,
    "round-robin": fb.RoundRobinSelector,
    "rebalance": fb.RoundRobinSelector,
    "backlog_aware": fb.BacklogAwareRebalanceSelector,
    "backlog-aware": fb.BacklogAwareRebalanceSelector,
    "broadcast": fb.BroadcastSelector,
}


def _spark_selector(name):
    """What a task of pipelined_exchange gives its RecordWriter for
    ``selector=name`` (checked and made as on the driver, then in the task)."""
    from flinkbuf.spark import _spec, _task
    options = _spec.check_options(2, None, num_partitions=None, key=None, selector=name,
                                  codec="typed", segment_size=4096, buffers_per_channel=2,
                                  floating_buffers=0, buffer_timeout=0.1,
                                  max_record_size=1 << 20, max_parallelism=None, host=None,
                                  timeout=10.0, monitor=None)
    return _task.make_selector(options.selector, options.key, options.max_parallelism)


@pytest.mark.parametrize("name", sorted(SELECTOR_NAMES))
def test_a_selector_name_means_one_selector_in_every_api(name):
    nbp = fb.NetworkBufferPool(16, 256)
    try:
        for selector in (name, _spark_selector(name)):
            partition = fb.create_partition(nbp, 2)
            writer = fb.RecordWriter(partition, selector, buffer_timeout=None)
            assert type(writer.selector) is SELECTOR_NAMES[name]
            writer.fail(None)
    finally:
        nbp.destroy()


def test_the_exchanges_selector_names_are_the_writers():
    from flinkbuf.spark import SELECTORS
    assert "rebalance" in SELECTORS and "backlog_aware" in SELECTORS
    assert {n for n in SELECTORS if n != "hash"} <= set(SELECTOR_NAMES)
    with pytest.raises(ValueError, match="selector must be one of hash, round_robin, rebalance, "
                                         "backlog_aware, broadcast or a callable"):
        _spark_selector("backlog")
