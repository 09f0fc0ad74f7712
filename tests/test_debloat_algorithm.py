"""Buffer debloating's arithmetic (csrc/io/debloat.c through BufferDebloater)
and its configuration (BufferDebloatConfig): the properties the algorithm
promises, and every step against a pure-Python model of the same formulas."""

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import flinkbuf
from flinkbuf._testing import debloater_ema, debloater_rising, debloater_sample_ns
from flinkbuf.io import BufferDebloatConfig, BufferDebloater

INT32_MAX = 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
NS = 1e9


def _saturate(x):
    """A non-negative float as an int64, INT64_MAX from 2**63 on (as the C)."""
    return INT64_MAX if x >= 2.0 ** 63 else int(x)


def _seconds_ns(seconds):
    return _saturate(seconds * NS + 0.5)


class Model:
    """The algorithm in Python floats, in the C's order of operations."""

    def __init__(self, config, segment_size):
        self.target_ns = max(1, _seconds_ns(config.target))
        self.alpha = 2.0 / (config.samples + 1.0)
        self.threshold = config.threshold
        self.min = min(config.min_size, segment_size)
        self.max = segment_size
        self.ema = float(segment_size)
        self.size = segment_size
        self.throughput = 0
        self.time_to_consume_ns = 0
        self.rising = 0

    def sample(self, nbytes, active_ns, buffers):
        """The size to announce, or None."""
        nbytes, buffers = max(0, nbytes), max(1, buffers)
        if active_ns > 0:
            self.throughput = _saturate(float(nbytes) * NS / float(active_ns))
        desirable = float(self.throughput) * float(self.target_ns) / NS / buffers
        if desirable >= 2.0 * self.ema:
            self.rising = min(2, self.rising + 1)
            desirable = 2.0 * self.ema
        else:
            self.rising = 0
        if self.rising == 2:
            self.ema = desirable
        else:
            self.ema += self.alpha * (desirable - self.ema)
        self.ema = min(max(self.ema, float(self.min)), float(self.max))
        new = math.floor(self.ema + 0.5)
        self.time_to_consume_ns = _saturate(
            float(new) * buffers * NS / float(max(1, self.throughput)))
        if new == self.size or (self.min < new < self.max and
                                abs(new - self.size) * 100 < self.size * self.threshold):
            return None
        self.size = new
        return new


# ---- strategies -----------------------------------------------------------------------

configs = st.builds(BufferDebloatConfig, enabled=st.booleans(),
                    target=st.floats(1e-6, 3600), period=st.floats(0.001, 3600),
                    samples=st.integers(1, 1000), threshold=st.integers(0, 100),
                    min_size=st.integers(1, 1 << 20))
segment_sizes = st.one_of(st.integers(1, 1 << 17), st.integers(1, INT32_MAX))
# (bytes, active seconds, buffers in use): what a gate takes in a period.
steps = st.tuples(st.integers(0, 1 << 40), st.sampled_from([0.0, 1e-9, 0.001, 0.2, 1.0, 7.5]),
                  st.integers(0, 5000))
histories = st.lists(steps, max_size=30)


def _debloater(config, segment_size, history=()):
    d = BufferDebloater(config, segment_size)
    for step in history:
        d.sample(*step)
    return d


def _bounds(d):
    return min(d.config.min_size, d.segment_size), d.segment_size


# ---- properties -----------------------------------------------------------------------

@given(configs, segment_sizes, histories, steps, st.integers(0, 1 << 40))
def test_size_grows_with_throughput(config, segment_size, history, step, more):
    nbytes, active, buffers = step
    low, high = (_debloater(config, segment_size, history) for _ in range(2))
    low.sample(nbytes, active, buffers)
    high.sample(nbytes + more, active, buffers)
    assert debloater_ema(high) >= debloater_ema(low)
    assert high.buffer_size >= low.buffer_size


@given(configs, segment_sizes, histories, steps, st.integers(0, 5000))
def test_size_shrinks_with_buffers_in_use(config, segment_size, history, step, more):
    nbytes, active, buffers = step
    few, many = (_debloater(config, segment_size, history) for _ in range(2))
    few.sample(nbytes, active, buffers)
    many.sample(nbytes, active, buffers + more)
    assert debloater_ema(many) <= debloater_ema(few)
    assert many.buffer_size <= few.buffer_size


@given(configs, segment_sizes, histories)
def test_size_stays_within_min_size_and_segment_size(config, segment_size, history):
    d = BufferDebloater(config, segment_size)
    low, high = _bounds(d)
    assert low == min(config.min_size, segment_size) and d.buffer_size == high
    for step in history:
        announced = d.sample(*step)
        assert announced is None or low <= announced <= high
        assert low <= d.buffer_size <= high
        assert low <= debloater_ema(d) <= high


@given(configs, segment_sizes, histories, steps)
def test_one_step_moves_alpha_of_the_way_and_at_most_doubles(config, segment_size, history,
                                                              step):
    d = _debloater(config, segment_size, history)
    before, rising = debloater_ema(d), debloater_rising(d)
    d.sample(*step)
    after = debloater_ema(d)
    assert after <= 2 * before
    low, high = _bounds(d)
    desired = d.throughput * max(1, _seconds_ns(config.target)) / NS
    aim = desired / max(1, step[2])
    desirable = min(aim, 2 * before)
    alpha = 2 / (config.samples + 1)
    if aim >= 2 * before and rising >= 1:       # the second in a row: doubles
        expected = min(max(2 * before, low), high)
    else:
        expected = min(max(before + alpha * (desirable - before), low), high)
    assert after == pytest.approx(expected, rel=1e-12)
    assert debloater_rising(d) == (min(2, rising + 1) if aim >= 2 * before else 0)


@given(st.integers(1, 1000), st.integers(2, 1 << 20), st.integers(1, 64))
def test_a_consumer_that_sped_up_doubles_the_size_from_the_second_sample(
        samples, segment_size, buffers):
    """From the minimum, samples that each aim at the whole segment: the
    first moves alpha of the way to twice the size, every later one
    doubles it, so the size reaches the segment in about log2 steps."""
    config = BufferDebloatConfig(samples=samples, threshold=0, min_size=1)
    d = BufferDebloater(config, segment_size, start_small=True)
    debloater_sample_ns(d, 1, 10 ** 9, 1)              # the start: the minimum
    assert debloater_ema(d) == 1.0
    fast = segment_size * buffers * 1000             # aims far past the segment
    debloater_sample_ns(d, fast, 10 ** 9, buffers)
    alpha = 2 / (samples + 1)
    assert debloater_ema(d) == pytest.approx(min(1 + alpha, segment_size), rel=1e-12)
    steps = 1
    while d.buffer_size < segment_size:
        before = debloater_ema(d)
        debloater_sample_ns(d, fast, 10 ** 9, buffers)
        assert debloater_ema(d) == pytest.approx(min(2 * before, segment_size), rel=1e-12)
        steps += 1
    assert steps <= 2 + math.ceil(math.log2(segment_size))
    debloater_sample_ns(d, 0, 10 ** 9, buffers)        # slower again: smoothing, no doubling
    assert debloater_rising(d) == 0


@given(st.integers(1, 10), st.floats(1e-3, 10), st.integers(4, 1 << 20), st.data(),
       st.floats(0, 4), st.integers(0, 100))
def test_the_aim_is_at_most_twice_the_size(samples, target, segment_size, data, factor,
                                           buffers):
    """From a state well below the segment size, samples that aim below,
    at and beyond twice the size: the step takes min(aim, 2 * size)."""
    config = BufferDebloatConfig(target=target, samples=samples, threshold=0, min_size=1)
    size = data.draw(st.integers(1, segment_size // 4))
    d = BufferDebloater(config, segment_size)
    target_ns = _seconds_ns(target)
    for _ in range(60):        # down to size
        debloater_sample_ns(d, size * max(1, buffers), target_ns, buffers)
    before = debloater_ema(d)
    nbytes = int(factor * before * max(1, buffers))
    debloater_sample_ns(d, nbytes, target_ns, buffers)     # desired / buffers ~= factor * ema
    alpha = 2 / (samples + 1)
    aim = min(d.throughput * target_ns / NS / max(1, buffers), 2 * before)
    expected = min(max(before + alpha * (aim - before), 1), segment_size)
    assert debloater_ema(d) == pytest.approx(expected, rel=1e-12)
    assert debloater_ema(d) <= 2 * before


@given(config=configs, segment_size=st.integers(1, 1 << 20),
       nbytes=st.integers(1, 1 << 40), active=st.integers(1, 10 ** 10),
       buffers=st.integers(1, 4096))
def test_started_small_the_first_sample_aims_at_once(config, segment_size, nbytes, active,
                                                      buffers):
    """A debloater started small begins at the minimum; a sample without
    active time announces nothing, and the first one with it sets the size
    to its aim at once (clamped), announced even when unchanged; smoothing
    resumes after it."""
    d = BufferDebloater(config, segment_size, start_small=True)
    low = min(config.min_size, segment_size)
    assert d.buffer_size == low and debloater_ema(d) == low
    assert debloater_sample_ns(d, nbytes, 0, buffers) == 0 and d.buffer_size == low
    aim = math.floor(nbytes * 1e9 / active) * config.target / buffers   # bytes/s truncated
    expected = min(max(aim, low), segment_size)
    assert debloater_sample_ns(d, nbytes, active, buffers) == d.buffer_size
    assert abs(d.buffer_size - expected) <= 1 + expected * 1e-9
    before = debloater_ema(d)
    debloater_sample_ns(d, 10 ** 15, 1, 1)            # now smoothed: at most doubled
    assert debloater_ema(d) <= 2 * before + 1e-9


def test_worked_steps():
    """samples=1 (alpha 1), target 1 s, 1 s of activity, 1 buffer: the size
    is the bytes taken, at most twice the last, announced past 25 %."""
    config = BufferDebloatConfig(target=1.0, samples=1, threshold=25, min_size=100)
    d = BufferDebloater(config, 4096)
    assert d.sample(1000, 1.0, 1) == 1000 and d.buffer_size == 1000
    assert d.estimated_time_to_consume == 1.0
    assert d.sample(751, 1.0, 1) is None and debloater_ema(d) == 751.0   # moved 24.9 %
    assert d.sample(1000, 1.0, 1) is None                                 # back: unchanged
    assert d.sample(1249, 1.0, 1) is None                                 # 24.9 % up
    assert d.sample(1250, 1.0, 1) == 1250                                 # 25 % up
    assert d.sample(10 ** 6, 1.0, 1) == 2500 and debloater_ema(d) == 2500.0   # doubled
    assert d.sample(10 ** 6, 1.0, 2) == 4096                              # the bound
    assert d.sample(4000, 1.0, 1) is None                                 # 2.3 % down
    assert d.sample(3072, 1.0, 1) == 3072                                 # exactly 25 % down
    assert d.sample(3000, 1.0, 40) == 100                                 # the lower bound
    assert d.sample(110, 1.0, 1) is None and d.buffer_size == 100         # 10 %: kept
    assert d.sample(0, 2.0, 1) is None and debloater_ema(d) == 100.0      # as announced
    assert d.throughput == 0 and d.estimated_time_to_consume == 100.0     # 100 B at 1 B/s
    narrow = BufferDebloater(config.replace(threshold=100, min_size=900), 1000)
    assert narrow.sample(950, 1.0, 1) is None                             # 5 %: kept
    assert narrow.sample(900, 1.0, 1) == 900                              # min_size: told
    assert narrow.sample(1000, 1.0, 1) == 1000                            # segment size: told
    assert narrow.sample(1000, 1.0, 1) is None                            # unchanged


@given(configs, segment_sizes, histories)
def test_the_threshold_is_respected(config, segment_size, history):
    d = BufferDebloater(config, segment_size)
    low, high = _bounds(d)
    for step in history:
        last = d.buffer_size
        announced = d.sample(*step)
        if announced is None:
            assert d.buffer_size == last
            continue
        assert announced != last and d.buffer_size == announced
        at_bound = announced <= low or announced >= high
        assert at_bound or abs(announced - last) * 100 >= last * config.threshold


@given(st.integers(1, 50), st.integers(0, 100), st.floats(0.01, 10), st.integers(1, 1 << 20),
       st.integers(1, 1 << 30), st.integers(0, 200), st.integers(1, 1 << 12))
def test_constant_throughput_converges(samples, threshold, target, segment_size, throughput,
                                       buffers, min_size):
    config = BufferDebloatConfig(samples=samples, threshold=threshold, target=target,
                                 min_size=min_size)
    d = BufferDebloater(config, segment_size)
    for _ in range(1200):
        d.sample(throughput, 1.0, buffers)            # bytes/s = throughput exactly
    assert d.throughput == throughput
    low, high = _bounds(d)
    aim = min(max(throughput * _seconds_ns(target) / NS / max(1, buffers), low), high)
    assert abs(debloater_ema(d) - aim) <= 1
    size = d.buffer_size
    # Stuck within the threshold of the aim, or on it.
    assert abs(size - aim) <= 1 or abs(size - aim) < size * threshold / 100 + 1
    if threshold == 0:
        assert abs(size - aim) <= 1
        expected = size * max(1, buffers) / throughput
        assert d.estimated_time_to_consume == pytest.approx(expected, rel=1e-9, abs=2e-9)


@given(configs, segment_sizes, st.integers(1, 1 << 40), st.integers(0, 1 << 40),
       st.integers(0, 100))
def test_zero_active_time_keeps_the_throughput(config, segment_size, nbytes, more, buffers):
    d = BufferDebloater(config, segment_size)
    assert d.throughput == 0
    d.sample(nbytes, 0.5, buffers)
    throughput = d.throughput
    assert throughput == int(nbytes * NS / 5e8)
    d.sample(more, 0.0, buffers)
    d.sample(more, 1e-12, buffers)                   # under half a nanosecond: none
    assert d.throughput == throughput
    assert 0 <= debloater_sample_ns(d, more, 0, buffers) <= segment_size
    assert d.throughput == throughput


@pytest.mark.parametrize("segment_size", [1, 32768, INT32_MAX])
def test_huge_inputs_saturate(segment_size):
    config = BufferDebloatConfig(target=3600, samples=1, threshold=0, min_size=1)
    d = BufferDebloater(config, segment_size)
    for nbytes, active in ((2 ** 62, 1e-9), (INT64_MAX, 1e-9), (2 ** 62, 3600.0)):
        d.sample(nbytes, active, INT32_MAX)
        assert 0 < d.throughput <= INT64_MAX and 1 <= d.buffer_size <= segment_size
    debloater_sample_ns(d, INT64_MAX, 1, 1)
    assert d.throughput == INT64_MAX and d.buffer_size == segment_size
    d2 = BufferDebloater(config, segment_size)           # throughput 0: time saturates
    debloater_sample_ns(d2, 0, 0, INT32_MAX)
    assert d2.estimated_time_to_consume == pytest.approx(
        min(INT64_MAX, 1 * INT32_MAX * 1e9) / NS, rel=1e-9)
    d.sample(INT64_MAX, 1e300, INT32_MAX)       # the time saturates at INT64_MAX ns too
    assert d.throughput == 10 ** 9


def test_negative_inputs_of_the_fast_path_count_as_nothing():
    config = BufferDebloatConfig(samples=1, threshold=0, min_size=1)
    d, model = BufferDebloater(config, 4096), Model(config, 4096)
    assert debloater_sample_ns(d, 10 ** 6, 10 ** 9, 4) == (model.sample(10 ** 6, 10 ** 9, 4) or 0)
    for nbytes, active, buffers in ((-5, 10 ** 9, 3), (100, -1, -7), (-1, -1, 0)):
        assert debloater_sample_ns(d, nbytes, active, buffers) == (
            model.sample(nbytes, active, buffers) or 0)
        assert d.throughput == model.throughput and d.buffer_size == model.size
    assert d.throughput == 0            # the first negative sample took 0 bytes in 1 s


def test_the_python_method_refuses_what_the_fast_path_forgives():
    d = BufferDebloater(BufferDebloatConfig(), 4096)
    for args, error in (((-1, 1.0, 1), ValueError), ((1, -1.0, 1), ValueError),
                        ((1, 1.0, -1), ValueError), ((1, float("nan"), 1), ValueError),
                        ((1, float("inf"), 1), ValueError), ((True, 1.0, 1), TypeError),
                        ((1.5, 1.0, 1), TypeError), ((1, "1", 1), TypeError),
                        ((2 ** 63, 1.0, 1), ValueError), ((1, 1.0, 2 ** 31), ValueError)):
        with pytest.raises(error):
            d.sample(*args)
    assert d.throughput == 0 and d.buffer_size == 4096
    with pytest.raises(TypeError):
        BufferDebloater(None, 4096)
    for segment_size, error in ((0, ValueError), (2 ** 31, ValueError), (1.0, TypeError)):
        with pytest.raises(error, match="segment_size"):
            BufferDebloater(BufferDebloatConfig(), segment_size)
    with pytest.raises(RuntimeError):
        d.__init__(BufferDebloatConfig(), 4096)
    bare = BufferDebloater.__new__(BufferDebloater)
    with pytest.raises(RuntimeError):
        bare.sample(1, 1.0, 1)
    assert bare.config is None and bare.buffer_size == 0


def test_a_debloater_reports_its_configuration():
    config = BufferDebloatConfig(min_size=100_000)
    d = BufferDebloater(config, 32768)
    assert d.config is config and d.segment_size == 32768 and d.buffer_size == 32768
    assert d.estimated_time_to_consume == 0.0 and d.throughput == 0
    # min_size above the segment size: the segment size is the only size.
    assert d.sample(0, 1.0, 1) is None and d.buffer_size == 32768
    assert debloater_ema(d) == 32768.0


# ---- the configuration -----------------------------------------------------------------

OPTION = {"enabled": "buffer_debloat", "target": "buffer_debloat_target",
          "period": "buffer_debloat_period", "samples": "buffer_debloat_samples",
          "threshold": "buffer_debloat_threshold", "min_size": "buffer_debloat_min_size"}
NAN, INF = float("nan"), float("inf")
BAD = [("enabled", v, TypeError) for v in (1, 0, None, "yes", 1.0)] + \
    [("target", v, ValueError) for v in (0, 0.0, -1.0, 3600.5, 10 ** 6, NAN, INF, -INF)] + \
    [("target", v, TypeError) for v in ("1", True, None, b"1", [1.0])] + \
    [("period", v, ValueError) for v in (0.0009, 0, -0.2, 3601, NAN, INF)] + \
    [("period", v, TypeError) for v in ("0.2", True, False, None)] + \
    [("samples", v, ValueError) for v in (0, -1, 1001, 2 ** 40)] + \
    [("samples", v, TypeError) for v in (True, 20.0, "20", None)] + \
    [("threshold", v, ValueError) for v in (-1, 101, 2 ** 40)] + \
    [("threshold", v, TypeError) for v in (True, False, 25.0, "25", None)] + \
    [("min_size", v, ValueError) for v in (0, -1, 2 ** 31)] + \
    [("min_size", v, TypeError) for v in (True, 256.0, "256", None)]


@pytest.mark.parametrize("field, value, error", BAD)
def test_every_bad_value_is_refused_naming_its_option(field, value, error):
    match = rf"^{OPTION[field]} must be"
    with pytest.raises(error, match=match):
        BufferDebloatConfig(**{field: value})
    if value is not None:                     # None: unchanged, the default's
        with pytest.raises(error, match=match):
            BufferDebloatConfig().replace(**{field: value})
        with pytest.raises(error, match=match):
            BufferDebloatConfig.from_options(**{OPTION[field]: value})


def test_defaults_and_bounds():
    config = BufferDebloatConfig()
    assert (config.enabled, config.target, config.period, config.samples, config.threshold,
            config.min_size) == (False, 1.0, 0.2, 20, 25, 256)
    assert type(config.target) is float and type(config.samples) is int
    edge = BufferDebloatConfig(True, 3600, 0.001, 1000, 100, 2 ** 31 - 1)
    assert edge.target == 3600.0 and edge.period == 0.001 and edge.min_size == 2 ** 31 - 1
    assert BufferDebloatConfig(target=5e-324, samples=1, threshold=0, min_size=1).target > 0
    assert flinkbuf.BufferDebloatConfig is BufferDebloatConfig
    assert flinkbuf.BufferDebloater is BufferDebloater


def _fields(config):
    return (config.enabled, config.target, config.period, config.samples, config.threshold,
            config.min_size)


@given(configs, configs)
def test_equality_hash_repr_and_pickling(a, b):
    from pyspark import cloudpickle

    same = BufferDebloatConfig(*_fields(a))
    assert a == same and not a != same and hash(a) == hash(same)
    assert (a == b) == (_fields(a) == _fields(b)) and (a != b) == (_fields(a) != _fields(b))
    assert a != _fields(a) and not a == object()
    assert eval(repr(a), {"BufferDebloatConfig": BufferDebloatConfig}) == a
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(a))
        assert type(copy) is BufferDebloatConfig and copy == a and hash(copy) == hash(a)
    assert len({a, same, b}) == (1 if a == b else 2)


@given(configs, st.sampled_from(list(OPTION)), configs)
def test_replace_changes_one_field(config, field, other):
    changed = config.replace(**{field: getattr(other, field)})
    for name in OPTION:
        source = other if name == field else config
        assert getattr(changed, name) == getattr(source, name)
    assert config.replace() == config
    assert config.replace(**{name: None for name in OPTION}) == config
    with pytest.raises(TypeError, match="size"):
        config.replace(size=1)
    with pytest.raises(TypeError):
        config.replace(True)


def test_a_config_is_immutable_and_final():
    config = BufferDebloatConfig()
    for name in OPTION:
        with pytest.raises(AttributeError):
            setattr(config, name, getattr(config, name))
    with pytest.raises(AttributeError):
        config.extra = 1
    with pytest.raises(TypeError):
        type("Sub", (BufferDebloatConfig,), {})
    config.__init__(enabled=True)                 # object's __init__: nothing changes
    assert config == BufferDebloatConfig()


def _option_values():
    return st.fixed_dictionaries({}, optional={
        "buffer_debloat_target": st.floats(1e-3, 3600),
        "buffer_debloat_period": st.floats(0.001, 3600),
        "buffer_debloat_samples": st.integers(1, 1000),
        "buffer_debloat_threshold": st.integers(0, 100),
        "buffer_debloat_min_size": st.integers(1, 1 << 20)})


@given(st.one_of(st.none(), configs), st.one_of(st.none(), st.booleans(), configs),
       _option_values())
def test_from_options_merges(default, base, options):
    got = BufferDebloatConfig.from_options(base, **options, default=default)
    expected = default if default is not None else BufferDebloatConfig()
    if isinstance(base, bool):
        expected = expected.replace(enabled=base)
    elif base is not None:
        expected = base
    expected = expected.replace(**{field: options[option] for field, option in OPTION.items()
                                   if option in options})
    assert got == expected
    assert BufferDebloatConfig.from_options(**{o: None for o in OPTION.values()},
                                            default=default) == (default or BufferDebloatConfig())


def test_from_options_refuses_other_types():
    with pytest.raises(TypeError, match="^buffer_debloat must be a bool, a BufferDebloatConfig"):
        BufferDebloatConfig.from_options(1)
    with pytest.raises(TypeError, match="^default must be a BufferDebloatConfig"):
        BufferDebloatConfig.from_options(default=True)
    with pytest.raises(TypeError):
        BufferDebloatConfig.from_options(True, 1.0, 0.2, 20, 25, 256, BufferDebloatConfig())
    assert BufferDebloatConfig.from_options(True, 2, 0.5, 3, 4, 5) == BufferDebloatConfig(
        True, 2.0, 0.5, 3, 4, 5)


# ---- against the model, step by step ---------------------------------------------------

class DebloaterMachine(RuleBasedStateMachine):
    """Arbitrary samples, through the Python method and the gate's fast
    path, each checked against the model from the debloater's own state."""

    @initialize(config=configs, segment_size=segment_sizes)
    def start(self, config, segment_size):
        self.d = BufferDebloater(config, segment_size)
        self.model = Model(config, segment_size)

    def _check(self, announced, expected, buffers):
        model, d = self.model, self.d
        assert d.throughput == model.throughput
        assert debloater_ema(d) == pytest.approx(model.ema, rel=1e-12)
        assert (announced is None) == (expected is None)
        if announced is not None:
            assert abs(announced - expected) <= 1 and d.buffer_size == announced
        assert abs(d.buffer_size - model.size) <= 1
        assert d.estimated_time_to_consume == pytest.approx(
            model.time_to_consume_ns / NS, rel=1e-6, abs=max(1, buffers) * 1e-9 + 1e-9)
        # From the debloater's state on: the model follows it, not its own drift.
        model.ema, model.size = debloater_ema(d), d.buffer_size

    @rule(nbytes=st.one_of(st.integers(0, 1 << 40), st.integers(0, INT64_MAX)),
          active=st.one_of(st.sampled_from([0.0, 1e-9, 0.2]), st.floats(0, 1e6)),
          buffers=st.integers(0, INT32_MAX))
    def sample(self, nbytes, active, buffers):
        expected = self.model.sample(nbytes, _seconds_ns(active), buffers)
        self._check(self.d.sample(nbytes, active, buffers), expected, buffers)

    @rule(nbytes=st.integers(-(1 << 40), 1 << 40), active_ns=st.integers(-10, 10 ** 10),
          buffers=st.integers(-5, 10_000))
    def sample_ns(self, nbytes, active_ns, buffers):
        expected = self.model.sample(nbytes, active_ns, buffers)
        announced = debloater_sample_ns(self.d, nbytes, active_ns, buffers) or None
        self._check(announced, expected, buffers)

    @rule(buffers=st.integers(0, 64))
    def idle(self, buffers):
        expected = self.model.sample(0, 0, buffers)
        self._check(self.d.sample(0, 0.0, buffers), expected, buffers)

    @invariant()
    def within_bounds(self):
        low, high = _bounds(self.d)
        assert low <= self.d.buffer_size <= high and low <= debloater_ema(self.d) <= high


TestDebloaterMachine = DebloaterMachine.TestCase
TestDebloaterMachine.settings = settings(settings(), stateful_step_count=40,
                                         max_examples=max(100, settings().max_examples * 2))
