"""Hardening of layer 2 against hostile input and misuse: objects made
without ``__init__``, and inputs that would make decoding super-linear."""

import subprocess
import sys
import textwrap

import pytest

import flinkbuf as fb
from flinkbuf import _serialization as S
from test_bare_instances import CLASSES, FACTORIES, PRELUDE, _run

CRE = fb.CorruptRecordError
SER_CLASSES = [c for c in CLASSES if c.startswith("flinkbuf._serialization:")]


# -- objects made without __init__ ---------------------------------------------

def _child(code):
    """Run ``code`` in a child process: a crash fails the test."""
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_bare_records_iterator_is_refused():
    """The iterator records() returns never exists without its deserializer
    (its __next__, a per-record path, does not check)."""
    out = _child("""
        import flinkbuf as fb
        it_type = type(fb.RecordDeserializer().records())
        for args in ((), (None,), (1,), (fb.RecordSerializer(),), (1, 2)):
            try:
                it = it_type.__new__(it_type, *args)
            except TypeError as e:
                print("refused", e)
            else:
                raise SystemExit(f"made a bare iterator with {args!r}")
        print("survived")
    """)
    assert out.strip().endswith("survived")
    assert out.count("refused") == 5
    assert "RecordDeserializer.records()" in out


def test_records_iterator_made_with_a_deserializer_works():
    des = fb.RecordDeserializer()
    it_type = type(des.records())
    it = it_type.__new__(it_type, des)
    des.feed(S._stage((1, 2)) + S._stage("x"))
    assert list(it) == [(1, 2), "x"]


def test_no_record_is_the_only_instance_of_its_type():
    import copy
    import pickle
    with pytest.raises(TypeError, match="use NO_RECORD"):
        S.NoRecordType.__new__(S.NoRecordType)
    assert copy.copy(S.NO_RECORD) is S.NO_RECORD
    assert pickle.loads(pickle.dumps(S.NO_RECORD)) is S.NO_RECORD
    assert fb.RecordDeserializer().next_record() is S.NO_RECORD


def test_bare_serialization_objects_as_arguments():
    """Like tests/test_bare_instances.py's test_bare_instances_as_arguments,
    with the bare objects of this module only (so that a crash in another
    layer cannot hide one here)."""
    code = PRELUDE + FACTORIES + textwrap.dedent(f"""
        from flinkbuf import _serialization as S
        bare = []
        for spec in {SER_CLASSES!r}:
            cls = resolve(spec)
            try:
                bare.append(cls.__new__(cls))
            except TypeError:
                pass
        funcs = [(n, getattr(S, n)) for n in ("encode", "decode", "_stage", "_stage_general",
                                              "_c_round_trip", "_result_by_name")]
        for b in bare:
            tag = type(b).__name__
            for label, fn in public_callables() + funcs:
                for args in ((b,), (b, 1), (1, b), (b, b), (b, b, None, []), (b, b, None, [1])):
                    print(label, tag, len(args), flush=True)
                    try:
                        fn(*args)
                    except Exception:
                        pass
            objs, teardown = real_objects()
            nbp = fb.NetworkBufferPool(4, 64)
            pool = nbp.create_buffer_pool(1, 4)
            for args in ((b, fb.RecordDeserializer(), pool, [1, 2]),
                         (fb.RecordSerializer(), b, pool, [1, 2])):
                try:
                    S._c_round_trip(*args)
                except Exception:
                    pass
            nbp.destroy()
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
        print("survived")
    """)
    _run(code)


def test_bare_user_types_behave_as_default_constructed():
    """RecordSerializer / RecordDeserializer made with __new__ alone are
    usable and equal to default-constructed ones (typed codec, default
    max_record_size)."""
    ser = S.RecordSerializer.__new__(S.RecordSerializer)
    des = S.RecordDeserializer.__new__(S.RecordDeserializer)
    assert ser.codec == des.codec == "typed"
    assert des.max_record_size == fb.RecordDeserializer().max_record_size
    nbp = fb.NetworkBufferPool(4, 64)
    try:
        pool = nbp.create_buffer_pool(1, 4)
        assert S._c_round_trip(ser, des, pool, [1, "x" * 100, (2, None)]) == [1, "x" * 100,
                                                                             (2, None)]
    finally:
        nbp.destroy()
