"""The package stays readable in parts: modules and functions small enough to
read whole, the network environment a facade, no call circle between C
units, and no module reaching into another subpackage's private names.

The Python measures: a module of at most ``MAX_MODULE_LINES`` lines, a
function of at most ``MAX_FUNCTION_LINES`` lines not counting its docstring,
a class ``NetworkEnvironment`` under ``MAX_FACADE_LINES``.  The C measures
(unit sizes, function sizes) are in test_layers.py; here the calls between
the units of one folder of ``csrc/`` must form no circle."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "flinkbuf")
CSRC = os.path.join(ROOT, "csrc")

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
MAX_FACADE_LINES = 400
# Modules allowed to import what another subpackage keeps private: the test
# hooks, which exist to reach inside.
PRIVATE_IMPORTERS = {"_testing.pyx"}


def _modules():
    for dirpath, _, files in os.walk(PKG):
        for name in sorted(files):
            if name.endswith((".py", ".pyx", ".pxi")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, PKG), path


# ---- sizes ---------------------------------------------------------------------

_DEF = re.compile(r"^(\s*)(?:async\s+def|def|cdef|cpdef)\s+(?:[\w\[\]\*, .]+\s+)*?"
                  r"\*?(\w+)\s*\(")


def _docstring_lines(lines, start, indent):
    """The lines of the docstring that opens the body after ``start`` (the
    line of the definition's colon), or 0."""
    i = start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        return 0
    body = lines[i].strip()
    for quote in ('"""', "'''"):
        if body.startswith((quote, "r" + quote)):
            rest = body[body.index(quote) + 3:]
            if quote in rest:
                return 1
            j = i + 1
            while j < len(lines) and quote not in lines[j]:
                j += 1
            return j - i + 1
    return 0


def long_functions(text):
    """(name, lines) of every function (def, cdef, cpdef) of ``text`` longer
    than MAX_FUNCTION_LINES without its docstring: a function runs from its
    definition to the last non-blank line indented deeper than it."""
    lines = text.split("\n")
    found = []
    for number, line in enumerate(lines):
        m = _DEF.match(line)
        if not m or line.rstrip().endswith(";") or " class " in line:
            continue
        indent = len(m.group(1))
        colon = number
        depth = line.count("(") - line.count(")")
        while depth > 0 and colon + 1 < len(lines):      # a signature over lines
            colon += 1
            depth += lines[colon].count("(") - lines[colon].count(")")
        if not lines[colon].rstrip().endswith(":"):
            continue                                     # a declaration, no body
        end = colon
        for j in range(colon + 1, len(lines)):
            stripped = lines[j].strip()
            if not stripped:
                continue
            if len(lines[j]) - len(lines[j].lstrip()) <= indent:
                break
            end = j
        size = end - number + 1 - _docstring_lines(lines, colon, indent)
        if size > MAX_FUNCTION_LINES:
            found.append((m.group(2), size))
    return found


@pytest.mark.parametrize("rel", sorted(rel for rel, _ in _modules()))
def test_modules_and_functions_are_small(rel):
    with open(os.path.join(PKG, rel)) as f:
        text = f.read()
    assert text.count("\n") <= MAX_MODULE_LINES, f"flinkbuf/{rel}: over {MAX_MODULE_LINES} lines"
    assert long_functions(text) == [], f"flinkbuf/{rel}: functions over {MAX_FUNCTION_LINES} lines"


def test_the_size_checker_sees_long_functions_and_skips_docstrings():
    def body(n):
        return "\n".join("    x += 1" for _ in range(n))
    doc = '    """' + "\n".join("    words" for _ in range(40)) + '\n    """\n'
    text = (f"def short(x):\n{doc}    return x\n\n"
            f"cdef int long_one(int x) except -1:\n{body(MAX_FUNCTION_LINES)}\n    return x\n\n"
            f"def documented(x,\n               y):\n{doc}{body(MAX_FUNCTION_LINES - 3)}\n\n"
            "z = 1\n")
    assert long_functions(text) == [("long_one", MAX_FUNCTION_LINES + 2)]


def test_network_environment_is_a_facade():
    path = os.path.join(PKG, "network", "environment.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "NetworkEnvironment"]
    assert len(classes) == 1
    size = classes[0].end_lineno - classes[0].lineno + 1
    assert size < MAX_FACADE_LINES, f"NetworkEnvironment is {size} lines"


def test_connections_are_opened_in_one_place():
    """Only the network layer's opener calls ``Connection._open``: every
    transport's connection is made from a typed spec there."""
    callers = []
    for rel, path in _modules():
        with open(path) as f:
            if "Connection._open(" in f.read():
                callers.append(rel)
    assert callers == [os.path.join("network", "transports.py")]


# ---- private names across subpackages ----------------------------------------------

# ``from X import a, b`` (or a parenthesised list over lines) and ``import X``.
# A cimport is left alone: a layer's ``.pxd`` is the contract other layers
# compile against, whatever its module is called.
_FROM = re.compile(r"^[ \t]*from[ \t]+(flinkbuf(?:\.\w+)*)[ \t]+import[ \t]+"
                   r"(\([^)]*\)|[^#\n]*)|^[ \t]*import[ \t]+(flinkbuf(?:\.\w+)+)", re.M)


def _subpackage(module):
    """The subpackage a dotted module of flinkbuf belongs to ('' for the
    package's own top-level modules)."""
    parts = module.split(".")
    if len(parts) >= 2 and os.path.isdir(os.path.join(PKG, parts[1])):
        return parts[1]
    return ""


def private_imports(rel, text):
    """What ``rel`` (a path under flinkbuf/) imports that another subpackage
    keeps private: a module or a name starting with one underscore."""
    own = rel.split(os.sep)[0] if os.sep in rel else ""
    found = []
    for m in _FROM.finditer(text):
        module = m.group(1) or m.group(3)
        if _subpackage(module) == own:
            continue
        if any(p.startswith("_") and not p.startswith("__") for p in module.split(".")[1:]):
            found.append(module)
            continue
        if m.group(2):
            for item in m.group(2).strip("()").split(","):
                name = item.split()[0] if item.split() else ""
                if name.startswith("_") and not name.startswith("__"):
                    found.append(f"{module}.{name}")
    return found


@pytest.mark.parametrize("rel", sorted(rel for rel, _ in _modules()
                                       if os.path.basename(rel) not in PRIVATE_IMPORTERS))
def test_no_private_names_from_another_subpackage(rel):
    with open(os.path.join(PKG, rel)) as f:
        text = f.read()
    assert private_imports(rel, text) == [], f"flinkbuf/{rel}"


def test_the_import_checker_sees_private_names():
    text = ("from flinkbuf.network.environment import _WILDCARDS\n"
            "from flinkbuf.experiments._args import fail\n"
            "from flinkbuf.spark import (\n    exchange,\n    _task,\n)\n"
            "from flinkbuf.spark._task import ok\n")
    assert private_imports(os.path.join("spark", "x.py"), text) == [
        "flinkbuf.network.environment._WILDCARDS", "flinkbuf.experiments._args"]
    assert private_imports("cli.py", text) == [
        "flinkbuf.network.environment._WILDCARDS", "flinkbuf.experiments._args",
        "flinkbuf.spark._task", "flinkbuf.spark._task"]


# ---- calls between C units ---------------------------------------------------------

_C_DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \t\*]*?\b(\w+)\(([^;]*)$", re.M)
_CALL = re.compile(r"\b(\w+)\s*\(")


def _c_units(folder):
    path = os.path.join(CSRC, folder)
    units = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".c"):
            with open(os.path.join(path, name)) as f:
                units[name[:-2]] = _strip_comments(f.read())
    return units


def _strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def unit_calls(units):
    """{unit: {other units whose non-static functions it calls}}."""
    defined = {}
    for unit, text in units.items():
        for m in _C_DEF.finditer(text):
            if not m.group(0).startswith(("typedef", "struct", "enum", "#", "return")):
                defined[m.group(1)] = unit
    calls = {}
    for unit, text in units.items():
        called = {defined[n] for n in _CALL.findall(text) if n in defined}
        calls[unit] = called - {unit}
    return calls


def circles(calls):
    """The units that take part in a circle of calls (Tarjan's strongly
    connected components of more than one unit)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in calls.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(calls):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("folder", sorted(d for d in os.listdir(CSRC)
                                          if os.path.isdir(os.path.join(CSRC, d))))
def test_no_call_circle_between_c_units(folder):
    assert circles(unit_calls(_c_units(folder))) == []


def test_the_circle_checker_sees_a_circle():
    units = {"a": "int f(int x)\n{\n    return g(x);\n}\n",
             "b": "int g(int x)\n{\n    return h(x);\n}\n",
             "c": "int h(int x)\n{\n    return f(x) + k(x);\n}\nstatic int k(int x)\n{\n    return x;\n}\n"}
    assert unit_calls(units) == {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert circles(unit_calls(units)) == [["a", "b", "c"]]
    units["c"] = "int h(int x)\n{\n    return x;\n}\n"
    assert circles(unit_calls(units)) == []
