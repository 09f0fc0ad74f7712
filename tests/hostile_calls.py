"""Every public callable of flinkbuf, called with hostile arguments (the
child process of ``test_hostile_calls.py``).

    python tests/hostile_calls.py GROUP MAX_EXAMPLES

For each target of GROUP (a constructor, a function, every public method
and every settable property of a real object), hypothesis draws argument
lists: out-of-range and huge integers, wrong types, sequences of every
length, objects whose ``__index__``/``__len__``/``__getitem__``/``__eq__``
misbehave, lists that shrink while they are read, numpy values, callables
that return nonsense, and the example's own flinkbuf objects.  Every call
must return or raise an ``Exception`` that says what is wrong; a crash, a
hang (woken first by closing the example's objects from another thread, as
a user would), a ``SystemError`` or an internal error (``AttributeError``,
``NameError``, ``ZeroDivisionError``, ``AssertionError``, ...) fails.
"""

import collections
import faulthandler
import gc
import inspect
import os
import resource
import sys
import threading
import time
import traceback
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flinkbuf as fb
import flinkbuf.buffer
import flinkbuf.io as fio
import flinkbuf.serialization as fser

HANG_SECONDS = 60          # one call that long is a hang: dump and exit
WAKE_SECONDS = 0.05        # then the example's objects are closed under the call

# Errors that say the program has a bug rather than that the arguments
# were wrong.  (AttributeError from a setattr of a read-only property is
# the language's own answer and allowed there.)
INTERNAL = (SystemError, AttributeError, NameError, ZeroDivisionError, AssertionError,
            RecursionError, UnboundLocalError, KeyboardInterrupt, SystemExit)


from hostile_values import ARGS, HOSTILE, PLAUSIBLE, Fresh, Ref  # noqa: E402


# ---- the example's objects ------------------------------------------------------------

class World:
    """Fresh objects for one example, and closing them all (which must wake
    any call that waits on them)."""

    def __init__(self, network=False):
        self.nbp = fb.NetworkBufferPool(32, 256)
        self.pool = self.nbp.create_buffer_pool(2, 8, num_subpartitions=2,
                                                max_buffers_per_channel=4)
        self.buffer = self.pool.request_buffer()
        self.segment = fb.MemorySegment.allocate(64)
        self.partition = fb.create_partition(self.nbp, 2, name="hostile")
        self.subpartition = self.partition.subpartition(0)
        self.selector = fb.HashSelector(0)
        self.writer = fb.RecordWriter(self.partition, self.selector, buffer_timeout=None)
        self.batch_partition = fb.create_partition(self.nbp, 2)
        self.batch_writer = fb.BatchWriter(self.batch_partition, "k", buffer_timeout=None)
        self.batch_gate = fb.InputGate([(self.batch_partition, 0), (self.batch_partition, 1)],
                                       codec="arrow")
        self.gate = fb.InputGate([(self.partition, 0), (self.partition, 1)])
        self.channel = fb.LocalInputChannel(fb.create_partition(self.nbp, 1), 0)
        # A gate whose second input is not known yet (its update may come).
        self.unknown = fb.UnknownInputChannel("hostile", 0)
        self.pending_gate = fb.InputGate([(fb.create_partition(self.nbp, 1), 0), self.unknown])
        self.serializer = fb.RecordSerializer()
        self.deserializer = fb.RecordDeserializer(max_record_size=1 << 16)
        self.event = fb.UserEvent(b"e")
        self.metrics = fb.TaskMetrics("hostile", writers=[self.writer], gates=[self.gate])
        self.debloat_config = fb.BufferDebloatConfig(True)
        self.debloater = fb.BufferDebloater(self.debloat_config, 256)
        self.env = None
        if network:
            from flinkbuf.network import NetworkEnvironment
            self.env = NetworkEnvironment(16, 256, secret=b"s" * 32, connect_timeout=0.2,
                                          request_timeout=0.2, io_timeout=0.5)

    def resolve(self, value, depth=0):
        if isinstance(value, Ref):
            return getattr(self, value.name)
        if isinstance(value, Fresh):
            return value.make()
        if depth < 4 and type(value) in (list, tuple):
            return type(value)(self.resolve(v, depth + 1) for v in value)
        return value

    def close(self):
        for step in (self.gate.close, self.pending_gate.close,
                     lambda: self.writer.fail(RuntimeError("closed")),
                     self.batch_gate.close,
                     lambda: self.batch_writer.fail(RuntimeError("closed")),
                     self.partition.release, self.deserializer.close,
                     lambda: self.buffer.is_recycled or self.buffer.recycle(),
                     self.pool.destroy, self.nbp.destroy,
                     lambda: self.segment.free() if not self.segment.is_freed else None,
                     lambda: self.env is not None and self.env.close()):
            try:
                step()
            except Exception:   # noqa: BLE001 - already closed, or never opened
                pass


# ---- targets --------------------------------------------------------------------------

def _methods(obj):
    names = []
    for name in dir(obj):
        if name.startswith("_") and name not in ("__getitem__", "__call__", "__next__",
                                                 "__contains__", "__eq__", "__lt__"):
            continue
        try:
            attr = getattr(obj, name)
        except Exception:       # noqa: BLE001 - a property that refuses: not a method
            continue
        if callable(attr) and not isinstance(attr, type):
            names.append(name)
    return names


def _settable(obj):
    return [name for name, d in vars(type(obj)).items()
            if not name.startswith("_") and hasattr(d, "__set__")]


def _instance_targets(attr, network=False):
    """A target per public method and settable property of the example's
    object ``attr``, labelled by its type."""
    probe = World(network)
    try:
        obj = getattr(probe, attr)
        label = type(obj).__name__
        methods, props = _methods(obj), _settable(obj)
    finally:
        probe.close()
    out = [(f"{label}.{m}()", network, (lambda m: lambda w: getattr(getattr(w, attr), m))(m))
           for m in methods]
    out += [(f"{label}.{p} =", network,
             (lambda p: lambda w: lambda v=None, *rest, **kw: setattr(getattr(w, attr), p, v))(p))
            for p in props]
    return out


def _lookup(enum):
    """An enum's lookup by value (its other calls are the standard
    library's functional API)."""
    def lookup(value):
        return enum(value)
    return lookup


def _fixed(label, fn, network=False):
    return [(label, network, lambda w: fn)]


def _selector_targets():
    out = []
    for cls in (fb.RoundRobinSelector, fb.RescaleSelector, fb.HashSelector,
                fb.BroadcastSelector, fb.ForwardSelector, fb.GlobalSelector,
                fb.CustomSelector, fb.BacklogAwareRebalanceSelector):
        out += _fixed(cls.__name__, cls)
    out += _fixed("HashSelector.by_first_field", fb.HashSelector.by_first_field)

    def set_up(make, n):
        def target(w):
            selector = make()
            selector.setup(n)
            return selector.select_channel
        return target
    for label, make in (("HashSelector(0)", lambda: fb.HashSelector(0)),
                        ("HashSelector(1)", lambda: fb.HashSelector(1)),
                        ("HashSelector(3)", lambda: fb.HashSelector(3)),
                        ("HashSelector()", fb.HashSelector),
                        ("HashSelector(key=fn)", lambda: fb.HashSelector(key=lambda r: r)),
                        ("HashSelector.by_first_field()", fb.HashSelector.by_first_field),
                        ("RoundRobinSelector()", fb.RoundRobinSelector),
                        ("CustomSelector(fn)", lambda: fb.CustomSelector(lambda r, n: r)),
                        ("GlobalSelector()", fb.GlobalSelector)):
        for n in (1, 4):
            out.append((f"{label}.select_channel [{n} channels]", False, set_up(make, n)))
    for label, selector in (("key index 1", lambda: fb.HashSelector(1)),
                            ("pairs", fb.HashSelector.by_first_field),
                            ("custom", lambda: fb.CustomSelector(lambda r, n: r)),
                            ("backlog aware", fb.BacklogAwareRebalanceSelector)):
        def emit(w, selector=selector):
            writer = fb.RecordWriter(fb.create_partition(w.nbp, 3), selector(),
                                     buffer_timeout=None)
            return writer.emit
        out.append((f"RecordWriter({label}).emit", False, emit))
    return out


def _closing(cls):
    """``cls``'s constructor (its signature too), closing what it made: a
    live view made with plausible arguments serves on loopback."""
    import functools

    @functools.wraps(cls)
    def make(*args, **kwargs):
        made = cls(*args, **kwargs)
        made.close()
        return made
    return make


_VIEW = []


def _live_view_method(name):
    def target(w):
        from flinkbuf.spark import LiveView

        if not _VIEW:
            _VIEW.append(LiveView())        # one per child process, on loopback
        return getattr(_VIEW[0], name)
    return target


def _spark_targets():
    from flinkbuf import spark
    out = []
    for name in ("key_partitions", "local_pipeline", "LocalPipeline", "pipelined_exchange",
                 "arrow_exchange", "ExchangeTask", "current_task", "close_rendezvous",
                 "live_view"):
        out += _fixed(f"spark.{name}", getattr(spark, name))
    out += _fixed("spark.LiveView", _closing(spark.LiveView))
    from flinkbuf.spark import arrow
    out += _fixed("spark.arrow.default_segment_size", arrow.default_segment_size)
    out += [(f"LiveView.{m}()", False, _live_view_method(m))
            for m in ("snapshot", "prometheus", "close")]
    return out


def _network_targets():
    from flinkbuf import network
    out = _fixed("NetworkEnvironment", network.NetworkEnvironment)
    out += _fixed("format_address", network.format_address)
    out += _fixed("Connection", network.Connection)
    out += _fixed("RemoteInputChannel", network.RemoteInputChannel)
    out += _instance_targets("env", network=True)
    return out


GROUPS = {
    "buffer": lambda: (
        _fixed("NetworkBufferPool", fb.NetworkBufferPool)
        + _fixed("MemorySegment", fb.MemorySegment)
        + _fixed("MemorySegment.allocate", fb.MemorySegment.allocate)
        + _fixed("redistribute", fb.redistribute)
        + _fixed("DataType", _lookup(fb.DataType))
        + _fixed("debug_counters", fb.buffer.debug_counters)
        + _instance_targets("nbp") + _instance_targets("pool")
        + _instance_targets("buffer") + _instance_targets("segment")),
    "serialization": lambda: (
        _fixed("RecordSerializer", fb.RecordSerializer)
        + _fixed("RecordDeserializer", fb.RecordDeserializer)
        + _fixed("encode", fser.encode) + _fixed("decode", fser.decode)
        + _fixed("SerializationResult", _lookup(fb.SerializationResult))
        + _instance_targets("serializer")
        + _instance_targets("deserializer")),
    "selectors": _selector_targets,
    "io": lambda: (
        [(f"io.{name}", False, (lambda f: lambda w: f)(getattr(fio, name)))
         for name in ("create_partition", "ResultPartition", "RecordWriter", "InputGate",
                      "BatchWriter",
                      "LocalInputChannel", "UnknownInputChannel", "UserEvent",
                      "pointwise_connections",
                      "assign_key_to_operator", "assign_keys_to_operators",
                      "order_by_channel",
                      "java_hash_code", "key_group_for_hash", "partition_buffers",
                      "task_segments",
                      "murmur_hash", "operator_index_for_key_group",
                      "default_max_parallelism", "monotonic_ns", "ChannelSelector",
                      "Event", "InputChannel", "BufferDebloatConfig", "BufferDebloater")]
        + _fixed("BufferDebloatConfig.from_options", fb.BufferDebloatConfig.from_options)
        + _fixed("TaskMetrics", fb.TaskMetrics)
        + _instance_targets("partition")
        + _instance_targets("subpartition")
        + _instance_targets("writer") + _instance_targets("gate")
        + _instance_targets("batch_writer") + _instance_targets("batch_gate")
        + _instance_targets("channel") + _instance_targets("unknown")
        + _instance_targets("pending_gate") + _instance_targets("event")
        + _instance_targets("metrics")
        + _instance_targets("debloat_config") + _instance_targets("debloater")),
    "network": _network_targets,
    "spark": _spark_targets,
}


# ---- running ----------------------------------------------------------------------------

def _parameters(target):
    """``target``'s parameters (positional ones, keyword-only ones), or
    None when it has no signature to read."""
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    positional, keyword = [], []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional.append(p)
        elif p.kind == p.KEYWORD_ONLY:
            keyword.append(p)
    return positional, keyword


def _draw_call(data, target):
    """Arguments for ``target``: by its signature, each parameter plausible
    three times in four and hostile otherwise, optional ones sometimes
    left out, and now and then an extra argument; free-form without a
    signature."""
    params = _parameters(target)
    if params is None:
        return data.draw(ARGS)
    positional, keyword = params
    args, kwargs = [], {}

    def value(p):
        plausible = PLAUSIBLE.get(p.name)
        if plausible is not None and data.draw(st.integers(0, 3)):
            return data.draw(plausible)
        return data.draw(HOSTILE)
    for p in positional:
        if p.default is not p.empty and not data.draw(st.booleans()):
            break
        args.append(value(p))
    for p in keyword:
        if p.default is p.empty or data.draw(st.booleans()):
            kwargs[p.name] = value(p)
    if not data.draw(st.integers(0, 9)):
        args.append(data.draw(HOSTILE))
    return args, kwargs


class Waker:
    """One thread for the whole run that closes an example's objects when
    the call into them has not returned ``WAKE_SECONDS`` after it began (a
    thread started per call would cost more than most calls)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._world = self._deadline = None
        self._woke = False
        threading.Thread(target=self._loop, name="waker", daemon=True).start()

    def arm(self, world):
        with self._cond:
            self._world, self._woke = world, False
            self._deadline = time.monotonic() + WAKE_SECONDS
            self._cond.notify()

    def disarm(self):
        """Whether the world was closed under the call."""
        with self._cond:
            self._world = None
            return self._woke

    def _loop(self):
        while True:
            with self._cond:
                while self._world is None or time.monotonic() < self._deadline:
                    self._cond.wait(None if self._world is None
                                    else self._deadline - time.monotonic())
                world, self._world, self._woke = self._world, None, True
            world.close()       # (not under the lock: a close may wait for the call)


WAKER = []


def _call(label, network, get_target, data):
    if not WAKER:
        WAKER.append(Waker())
    world = World(network)
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        target = get_target(world)
        args, kwargs = _draw_call(data, target)
        WAKER[0].arm(world)
        try:
            result = target(*world.resolve(args), **{k: world.resolve(v)
                                                     for k, v in kwargs.items()})
            if hasattr(result, "__next__") and not isinstance(result, (fb.InputGate,)):
                for _, _ in zip(range(3), result):
                    pass
            OUTCOMES[label]["returned"] += 1
        except INTERNAL as exc:
            if isinstance(exc, AttributeError) and label.endswith(" ="):
                return                              # a read-only property
            raise AssertionError(f"{label}(*{args!r}, **{kwargs!r}) raised an internal "
                                 f"error: {type(exc).__name__}: {exc}\n"
                                 + "".join(traceback.format_tb(exc.__traceback__)[-2:])) \
                from exc
        except Exception as exc:    # noqa: BLE001 - a clear refusal is the expected outcome
            OUTCOMES[label][type(exc).__name__] += 1
    finally:
        faulthandler.cancel_dump_traceback_later()
        if WAKER[0].disarm():
            OUTCOMES[label]["woken"] += 1
        world.close()


OUTCOMES = collections.defaultdict(collections.Counter)


def run(group, max_examples):
    targets = GROUPS[group]()
    assert targets, group
    failures = []
    for label, network, get_target in targets:
        print(f"-- {label}", file=sys.stderr, flush=True)

        @settings(max_examples=max_examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(st.data())
        def check(data):
            _call(label, network, get_target, data)

        try:
            check()
        except Exception as exc:    # noqa: BLE001 - reported below, with every other
            failures.append(f"{label}: {exc}")
        gc.collect()
    returned = sum(1 for label, _, _ in targets if OUTCOMES[label]["returned"])
    woken = sum(OUTCOMES[label]["woken"] for label in {label for label, _, _ in targets})
    print(f"{group}: {len(targets)} targets, {max_examples} examples each; "
          f"{returned} returned normally at least once; {woken} calls woken by closing",
          flush=True)
    if os.environ.get("HOSTILE_VERBOSE"):
        for label, counts in OUTCOMES.items():
            print(f"  {label}: {dict(counts.most_common())}")
    if failures:
        print(f"{len(failures)} of {len(targets)} targets failed:", *failures, sep="\n",
              file=sys.stderr)
        sys.exit(1)


def run_shrinking(seconds):
    """Lists that another thread shrinks and grows while selectors, a
    writer, the typed codec and the key hash read them: every read must
    see a length it can trust, and every outcome is a channel, a clear
    IndexError, or a record that decodes."""
    shared = [[1, 2, 3, 4] for _ in range(4)]
    stop = threading.Event()
    mutations = []

    def mutate():
        k = 0
        while not stop.is_set():
            for lst in shared:
                if k % 7 == 0:
                    lst.clear()
                elif lst and k & 1:
                    lst.pop()
                else:
                    lst.extend((7, 8, 9))
                k += 1
        mutations.append(k)

    nbp = fb.NetworkBufferPool(64, 256)
    readers = []
    for make in (lambda: fb.HashSelector(0), lambda: fb.HashSelector(1),
                 lambda: fb.HashSelector(3), fb.HashSelector.by_first_field, fb.HashSelector):
        selector = make()
        selector.setup(4)
        readers.append(selector.select_channel)
    partition = fb.create_partition(nbp, 2, min_buffers=16)
    writer = fb.RecordWriter(partition, fb.HashSelector(2), buffer_timeout=None)
    gate = fb.InputGate([(partition, 0), (partition, 1)])
    received, errors = [], []

    def consume():              # every record the writer sent decodes to a list
        try:
            for record in gate:
                assert type(record) is list and len(record) >= 3, record
                received.append(len(record))
        except BaseException as exc:    # noqa: BLE001 - fails the run below
            errors.append(exc)

    serializer = fb.RecordSerializer()
    readers += [writer.emit, serializer.serialize_record, fio.java_hash_code, fser.encode]
    threads = [threading.Thread(target=mutate, daemon=True),
               threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    outcomes = collections.Counter()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for read in readers:
                for lst in shared:
                    try:
                        read(lst)
                        outcomes["ok"] += 1
                    except IndexError:
                        outcomes["IndexError"] += 1
                    except RuntimeError as exc:     # the codec: "changed size"
                        assert "changed size" in str(exc), exc
                        outcomes["RuntimeError"] += 1
                    serializer.clear()
    finally:
        stop.set()
        writer.close()
        threads[1].join(HANG_SECONDS)
        threads[0].join()
        gate.close()
        nbp.destroy()
    assert not threads[1].is_alive(), "the consumer did not see the end of the partition"
    assert not errors, errors
    assert mutations and mutations[0] > 1000, "the lists were hardly changed"
    assert outcomes["ok"] and outcomes["IndexError"] and received, outcomes
    print(f"shrinking lists: {mutations[0]} changes, {dict(outcomes)}, {len(received)} "
          f"records received", flush=True)


def main():
    if sys.argv[1] == "shrinking":
        faulthandler.enable()
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        sys.setswitchinterval(1e-6)
        run_shrinking(float(sys.argv[2]))
        return
    group, max_examples = sys.argv[1], int(sys.argv[2])
    faulthandler.enable()
    # A call that tries to allocate more than 4 GiB fails with MemoryError
    # instead of taking the machine's memory (counted from what the process
    # maps now: a sanitizer's runtime maps terabytes of shadow memory).
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    limit = mapped + (4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore")
    sys.unraisablehook = lambda unraisable: None
    threading.excepthook = lambda args: None
    sys.setswitchinterval(1e-5)         # threads interleave often
    run(group, max_examples)


if __name__ == "__main__":
    main()
