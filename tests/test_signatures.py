"""Every public class and function of the compiled modules shows its real
parameters to ``inspect.signature`` and ``help()``, and they are the
parameters its stub declares (the stubs are checked against the runtime as
a side effect).  The Spark layer's stubs are compared the same way.

Classes get their signature from the clinic line ``Name(params)\\n--\\n\\n``
that the build writes at the start of their docstring (setup.py), methods
and functions from theirs ("embedsignature.format": "clinic")."""

import ast
import enum
import importlib
import inspect
import os
import pydoc

import pytest

import flinkbuf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("flinkbuf", "flinkbuf.buffer", "flinkbuf.serialization", "flinkbuf.io",
            "flinkbuf.network", "flinkbuf.spark")
# The plain Python class whose constructor takes anything and refuses it
# (its instances are its three class attributes): its signature is the real
# (*args, **kwargs), checked against the stub like the others.
REFUSES_ANY_ARGUMENTS = {"SerializationResult"}
# Methods of a class that are compared with the stub besides the public ones
# (other dunders are C slots, whose signatures are CPython's).
DUNDERS = {"__init__", "__new__", "__enter__", "__exit__"}


def _is_compiled(module_name):
    spec = importlib.util.find_spec(module_name)
    return spec is not None and spec.origin is not None and spec.origin.endswith(".so")


def _stub_path(module_name):
    return os.path.join(ROOT, *module_name.split(".")) + ".pyi"


def public_objects():
    """(name, object) for every class and function exported by the
    packages that is defined in a compiled module or has a stub."""
    found = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or callable(obj)):
                continue
            home = getattr(obj, "__module__", None) or ""
            if home.startswith("flinkbuf.") and (
                    _is_compiled(home) or os.path.exists(_stub_path(home))):
                found.setdefault(f"{home}.{name}", obj)
    return sorted(found.items())


PUBLIC = public_objects()
CLASSES = [(n, o) for n, o in PUBLIC if inspect.isclass(o) and not issubclass(o, enum.Enum)]
FUNCTIONS = [(n, o) for n, o in PUBLIC if not inspect.isclass(o)]


# ---- the stubs ----------------------------------------------------------------------

_STUBS = {}


def _stub_module(module_name):
    if module_name not in _STUBS:
        with open(_stub_path(module_name)) as f:
            _STUBS[module_name] = {node.name: node for node in ast.parse(f.read()).body
                                   if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    return _STUBS[module_name]


def _default(node):
    try:
        value = ast.literal_eval(node)
    except ValueError:           # not a literal: only its presence is compared
        return ...
    return value


def stub_parameters(fn, drop_first):
    """[(name, kind, default or ... or inspect.Parameter.empty)] of a stub's def."""
    a = fn.args
    positional = [(p, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs] + \
                 [(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + \
               [_default(d) for d in a.defaults]
    params = [(p.arg, kind, d) for (p, kind), d in zip(positional, defaults)]
    if drop_first:
        params = params[1:]
    if a.vararg:
        params.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append((p.arg, inspect.Parameter.KEYWORD_ONLY,
                       inspect.Parameter.empty if d is None else _default(d)))
    if a.kwarg:
        params.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return params


def _is_static(fn):
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def stub_constructor(module_name, class_name):
    """The stub's ``__init__`` or ``__new__`` of a class, looked up along
    its bases in the same stub; None: object's (no parameters)."""
    stubs = _stub_module(module_name)
    cls = stubs[class_name]
    for name in ("__init__", "__new__"):
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in stubs:
            found = stub_constructor(module_name, base.id)
            if found is not None:
                return found
    return None


def runtime_parameters(sig, drop_self=False):
    params = list(sig.parameters.values())
    if drop_self and params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _same(runtime, stub):
    """Names and kinds equal; defaults equal where the stub gives a literal."""
    if [(n, k) for n, k, _ in runtime] != [(n, k) for n, k, _ in stub]:
        return False
    for (_, _, r), (_, _, s) in zip(runtime, stub):
        if (r is inspect.Parameter.empty) != (s is inspect.Parameter.empty):
            return False
        if s is not ... and s is not inspect.Parameter.empty and r != s:
            return False
    return True


# ---- the tests ----------------------------------------------------------------------

def test_the_public_objects_are_found():
    names = {n.rsplit(".", 1)[1] for n, _ in PUBLIC}
    assert {"RecordWriter", "InputGate", "HashSelector", "NetworkBufferPool", "MemorySegment",
            "RecordSerializer", "RecordDeserializer", "ResultPartition", "LocalBufferPool",
            "Connection", "RemoteInputChannel", "java_hash_code", "redistribute", "encode",
            "ExchangeTask", "pipelined_exchange", "arrow_exchange", "local_pipeline",
            } <= names
    assert len(CLASSES) >= 25 and len(FUNCTIONS) >= 15


@pytest.mark.parametrize("qualname, cls", CLASSES, ids=[n for n, _ in CLASSES])
def test_class_signature_is_the_stubs(qualname, cls):
    sig = inspect.signature(cls)         # "no signature found" before
    stub = stub_constructor(cls.__module__, cls.__name__)
    expected = [] if stub is None else stub_parameters(stub, drop_first=True)
    assert _same(runtime_parameters(sig), expected), (str(sig), expected)


@pytest.mark.parametrize("qualname, cls", CLASSES, ids=[n for n, _ in CLASSES])
def test_methods_signatures_are_the_stubs(qualname, cls):
    stub = _stub_module(cls.__module__)[cls.__name__]
    checked = set()
    for node in stub.body:
        if not isinstance(node, ast.FunctionDef) or any(
                isinstance(d, ast.Attribute) or (isinstance(d, ast.Name) and d.id == "property")
                for d in node.decorator_list):
            continue                 # properties
        if node.name.startswith("__") and node.name not in DUNDERS:
            continue
        if node.name == "__new__" or (node.name == "__init__" and cls.__init__ is object.__init__):
            continue                 # covered by the class signature
        static = _is_static(node)
        sig = inspect.signature(getattr(cls, node.name))
        runtime = runtime_parameters(sig, drop_self=not static)
        assert _same(runtime, stub_parameters(node, drop_first=not static)), \
            (f"{cls.__name__}.{node.name}", str(sig))
        checked.add(node.name)
    public = {n for n in vars(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    assert public <= checked, public - checked     # every public method has a stub


@pytest.mark.parametrize("qualname, fn", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_function_signature_is_the_stubs(qualname, fn):
    sig = inspect.signature(fn)
    stub = _stub_module(fn.__module__)[fn.__name__]
    assert _same(runtime_parameters(sig), stub_parameters(stub, drop_first=False)), \
        (str(sig), stub_parameters(stub, drop_first=False))


def _help(obj):
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


@pytest.mark.parametrize("qualname, cls", CLASSES, ids=[n for n, _ in CLASSES])
def test_help_shows_the_class_signature(qualname, cls):
    text = _help(cls)
    sig = str(inspect.signature(cls))
    if sig != "()":                       # pydoc shows no empty signature
        assert f"{cls.__name__}{sig}" in text
    if cls.__name__ in REFUSES_ANY_ARGUMENTS:
        with pytest.raises(TypeError, match="class attributes"):
            cls()
        return
    # CPython's generic __new__ of every extension type (as in help(property))
    # is the one (*args, **kwargs) left.
    lines = [line for line in text.splitlines() if "from builtins.type" not in line]
    assert not [line for line in lines if "*args, **kwargs" in line], text


@pytest.mark.parametrize("qualname, fn", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_help_shows_the_function_signature(qualname, fn):
    text = _help(fn)
    assert f"{fn.__name__}{inspect.signature(fn)}" in text
    assert "*args, **kwargs" not in text


def test_a_constructor_signature_names_keyword_only_parameters():
    sig = inspect.signature(flinkbuf.RecordWriter)
    assert str(sig) == ("(partition, selector=None, *, codec='typed', buffer_timeout=0.1, "
                        "name=None)")
    sig.bind(object(), "hash", codec="bytes")
    with pytest.raises(TypeError):
        sig.bind(object(), "hash", "bytes")   # codec is keyword-only, as at runtime
    with flinkbuf.NetworkBufferPool(8, 64) as nbp:
        partition = flinkbuf.create_partition(nbp, 1)
        with pytest.raises(TypeError, match="positional"):
            flinkbuf.RecordWriter(partition, "hash", "bytes")
        partition.release()
    assert str(inspect.signature(flinkbuf.InputGate.__init__)) == (
        "(self, /, channels, *, codec='typed', max_record_size=67108864, name=None, "
        "buffer_debloat=None, buffer_debloat_target=None, buffer_debloat_period=None, "
        "buffer_debloat_samples=None, buffer_debloat_threshold=None, "
        "buffer_debloat_min_size=None)")
    # A class without a constructor of its own has its base's.
    assert str(inspect.signature(flinkbuf.RescaleSelector)) == "()"
