"""Objects created without ``__init__`` (``T.__new__(T)``), and such objects
passed where a real one is expected, must raise, never crash or hang.

Every class of every compiled flinkbuf module is tried, each in a child
process (a segfault fails the test instead of killing the run): either the
bare construction is refused with TypeError, or every member of the bare
object, called with a spread of arguments, raises or returns normally, and
the object can be garbage collected.  Then each bare object is handed to
every constructor, function and method of real objects.
"""

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import flinkbuf


def _extension_modules():
    names = []
    for info in pkgutil.walk_packages(flinkbuf.__path__, "flinkbuf."):
        if ".experiments" in info.name or info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        if getattr(mod, "__file__", "").endswith((".so", ".pyd")):
            names.append(info.name)
    return names


def _classes():
    out = []
    for modname in _extension_modules():
        mod = importlib.import_module(modname)
        for name, obj in sorted(vars(mod).items()):
            if (isinstance(obj, type) and obj.__module__ == modname
                    and not issubclass(obj, BaseException)
                    and type(obj) is type):              # not enum classes
                out.append(f"{modname}:{name}")
    return sorted(set(out))


CLASSES = _classes()

# Run inside the child: the helpers and argument spread.
PRELUDE = r'''
import faulthandler, gc, importlib, inspect, itertools, sys, warnings
faulthandler.enable()
faulthandler.dump_traceback_later(60, exit=True)   # a hang fails the test
warnings.simplefilter("ignore")
sys.unraisablehook = lambda u: None                 # reported, not a crash

VALUES = [0, 1, -1, None, b"ab", 0.5, 2**64, "x", (0, 1)]
SKIP = {"__new__", "__init__", "__init_subclass__", "__subclasshook__", "__class__",
        "__getattribute__", "__setattr__", "__delattr__", "__dir__", "__reduce__",
        "__reduce_ex__", "__getstate__", "__setstate__", "__sizeof__", "__format__",
        "__class_getitem__", "__dealloc__", "__weakref__", "__doc__", "__module__",
        "__pyx_vtable__", "__slots__", "__annotations__"}

def resolve(spec):
    mod, name = spec.split(":")
    return getattr(importlib.import_module(mod), name)

def arities(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return range(0, 3)
    req = opt = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is p.empty:
                req += 1
            else:
                opt += 1
        elif p.kind is p.VAR_POSITIONAL:
            opt += 2
    return range(req, min(req + opt, 3) + 1)

def call_spread(fn, label, values=VALUES):
    for n in arities(fn):
        combos = itertools.islice(itertools.product(values, repeat=n), 40)
        for args in combos:
            print(label, args, flush=True)
            try:
                fn(*args)
            except Exception:
                pass

def exercise(obj, label):
    for name in sorted(dir(type(obj))):
        if name in SKIP:
            continue
        print(label, name, flush=True)
        try:
            member = getattr(obj, name)
        except Exception:
            continue
        if callable(member) and not isinstance(member, type):
            call_spread(member, f"{label}.{name}")
    for fn in (repr, str, hash, len, bool, iter, next, memoryview, lambda o: o == o,
               lambda o: o < o):
        try:
            fn(obj)
        except Exception:
            pass
'''


@pytest.mark.parametrize("spec", CLASSES)
def test_bare_instance_is_refused_or_safe(spec):
    code = PRELUDE + textwrap.dedent(f"""
        cls = resolve({spec!r})
        try:
            obj = cls.__new__(cls)
        except TypeError:
            print("refused"); raise SystemExit(0)
        exercise(obj, {spec!r})
        try:
            obj.__del__()
        except Exception:
            pass
        del obj
        gc.collect()
        print("survived")
    """)
    _run(code)


# Real objects whose methods receive the bare ones.
FACTORIES = r'''
import numpy as np
import flinkbuf as fb
from flinkbuf import io as fio

def real_objects():
    nbp = fb.NetworkBufferPool(16, 256)
    pool = nbp.create_buffer_pool(1, 4)
    part = fio.create_partition(nbp, 2)
    gate = fb.InputGate([(part, 0)])
    writer = fb.RecordWriter(part, "round_robin", buffer_timeout=None)
    ser = fb.RecordSerializer()
    des = fb.RecordDeserializer()
    seg = fb.MemorySegment.allocate(64)
    buf = pool.request_buffer()
    objs = [nbp, pool, part, gate, writer, ser, des, seg, buf, part.subpartition(1),
            fb.HashSelector(), fb.CustomSelector(lambda r, n: 0), des.records(),
            fb.UserEvent(b"x")]
    return objs, (lambda: [writer.fail(), gate.close(), buf.recycle(), seg.free(),
                           nbp.destroy()])

def feed_to_real_objects(b):
    """Pass ``b`` to every method of a fresh set of real objects."""
    tag = type(b).__name__
    objs, teardown = real_objects()
    for obj in objs:
        for name in sorted(dir(type(obj))):
            if name in SKIP or name in ("__exit__", "__del__"):
                continue
            try:
                member = getattr(obj, name)
            except Exception:
                continue
            if not callable(member) or isinstance(member, type):
                continue
            for args in ((b,), (b, 0), (0, b)):
                print(type(obj).__name__, name, tag, len(args), flush=True)
                try:
                    member(*args)
                except Exception:
                    pass
    try:
        teardown()
    except Exception:
        pass
    del objs
    gc.collect()


def public_callables():
    seen = []
    for mod in (fb, fio):
        for name in sorted(getattr(mod, "__all__", dir(mod))):
            obj = getattr(mod, name)
            if callable(obj) and not (isinstance(obj, type) and issubclass(obj, BaseException)):
                seen.append((f"{mod.__name__}.{name}", obj))
    return seen
'''


def test_bare_instances_as_arguments():
    code = PRELUDE + FACTORIES + textwrap.dedent(f"""
        bare = []
        for spec in {CLASSES!r}:
            cls = resolve(spec)
            try:
                bare.append(cls.__new__(cls))
            except TypeError:
                pass
        assert bare or True
        for b in bare:
            tag = type(b).__name__
            for label, fn in public_callables():
                for args in ((b,), (b, 1), (1, b), (b, b)):
                    print(label, tag, len(args), flush=True)
                    try:
                        fn(*args)
                    except Exception:
                        pass
            feed_to_real_objects(b)
        print("survived")
    """)
    _run(code)


def _run(code):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                          capture_output=True, text=True, timeout=240, env=env)
    tail = "\n".join(proc.stdout.splitlines()[-5:])
    assert proc.returncode == 0, (f"exit {proc.returncode}; last calls:\n{tail}\n"
                                  f"{proc.stderr[-3000:]}")
    assert proc.stdout.strip().endswith(("survived", "refused")), tail
