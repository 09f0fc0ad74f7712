"""The package's layers import only downward: every import and cimport of a
layer's files (Python, Cython, stubs) names its own layer or one below, and
the plain C in csrc/ has no Python API and includes downward too."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "flinkbuf")

# The layer of each part of the package; entry points and test hooks sit on top.
LAYERS = {
    "csrc": 0, "capi": 0, "checks": 0, "errors": 0,
    "buffer": 1,
    "serialization": 2,
    "io": 3,
    "network": 4,
    "spark": 5,
}
TOP = 6          # __init__, cli, __main__, demo, experiments, _testing
# csrc/ mirrors the package: one folder per layer it serves, ordered as the
# layers are (common/ holds what every layer uses).  A header or source may
# include its own folder or a folder below it, never one above.
C_FOLDERS = {"common": 0, "buffer": 1, "io": 3, "network": 4}

IMPORT = re.compile(
    r"^\s*(?:from\s+flinkbuf\.(\w+)[\w.]*\s+c?import|import\s+flinkbuf\.(\w+)"
    r"|from\s+flinkbuf\s+c?import\s+\(?\s*([\w ,]+))", re.M)


def _layer_of_path(rel):
    parts = rel.split(os.sep)
    if len(parts) == 1:
        return LAYERS.get(os.path.splitext(parts[0])[0], TOP)
    return LAYERS.get(parts[0], TOP)


def _sources():
    for dirpath, _, files in os.walk(PKG):
        for name in files:
            if name.endswith((".py", ".pyx", ".pxd", ".pyi")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, PKG), path


def _imported_layers(text):
    for m in IMPORT.finditer(text):
        if m.group(1) or m.group(2):
            yield m.group(1) or m.group(2)
        else:
            for name in m.group(3).replace("\n", " ").split(","):
                name = name.strip().split(" ")[0]
                if name:
                    yield name


@pytest.mark.parametrize("rel", sorted(rel for rel, _ in _sources()))
def test_imports_point_down(rel):
    layer = _layer_of_path(rel)
    with open(os.path.join(PKG, rel)) as f:
        text = f.read()
    for target in _imported_layers(text):
        target_layer = LAYERS.get(target, TOP)
        assert target_layer <= layer, (
            f"flinkbuf/{rel} (layer {layer}) imports flinkbuf.{target} (layer {target_layer})")


def test_the_checker_sees_an_upward_import(tmp_path):
    text = "from flinkbuf.io._io cimport InputGate\nfrom flinkbuf import network\n"
    assert list(_imported_layers(text)) == ["io", "network"]


def _c_files():
    csrc = os.path.join(ROOT, "csrc")
    found = []
    for dirpath, _, files in os.walk(csrc):
        for name in files:
            if name.endswith((".c", ".h")):
                found.append(os.path.relpath(os.path.join(dirpath, name), csrc))
    return sorted(found)


@pytest.mark.parametrize("rel", _c_files())
def test_csrc_is_plain_c_and_includes_point_down(rel):
    folder = rel.split(os.sep)[0]
    assert folder in C_FOLDERS and os.sep in rel, (
        f"csrc/{rel}: C lives in a layer's folder, one of {sorted(C_FOLDERS)}")
    with open(os.path.join(ROOT, "csrc", rel)) as f:
        text = f.read()
    assert "Python.h" not in text and "PyObject" not in text, f"csrc/{rel} uses the Python API"
    for inc in re.findall(r'#include\s+"([^"]+)"', text):
        assert inc.count("/") == 1, f"csrc/{rel}: include {inc!r} by its path under csrc/"
        target = inc.split("/")[0]
        assert target in C_FOLDERS, f"csrc/{rel} includes {inc}, not under a layer's folder"
        assert os.path.exists(os.path.join(ROOT, "csrc", inc)), f"csrc/{rel}: no csrc/{inc}"
        assert C_FOLDERS[target] <= C_FOLDERS[folder], (
            f"csrc/{rel} includes {inc}, a layer above")


def test_the_c_checker_sees_an_upward_include(tmp_path, monkeypatch):
    """The C check is not vacuous: a buffer/ header that includes network/ fails."""
    (tmp_path / "csrc" / "buffer").mkdir(parents=True)
    (tmp_path / "csrc" / "network").mkdir()
    (tmp_path / "csrc" / "network" / "x.h").write_text("")
    (tmp_path / "csrc" / "buffer" / "y.h").write_text('#include "network/x.h"\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    with pytest.raises(AssertionError, match="a layer above"):
        test_csrc_is_plain_c_and_includes_point_down(os.path.join("buffer", "y.h"))


def _is_internal(rel):
    return rel.endswith("_internal.h")


def test_every_csrc_header_has_its_declarations_file():
    """One .pxd per C header, named after its unit, beside the package's other
    declarations, and it declares the header by its path (a folder's
    ``*_internal.h``, shared by the units of one concept, is private)."""
    headers = {os.path.splitext(os.path.basename(f))[0]: f for f in _c_files()
               if f.endswith(".h") and not _is_internal(f)}
    declared = {os.path.splitext(f)[0] for f in os.listdir(os.path.join(PKG, "csrc"))
                if f.endswith(".pxd")}
    assert set(headers) == declared
    for unit, rel in headers.items():
        with open(os.path.join(PKG, "csrc", unit + ".pxd")) as f:
            assert f'extern from "{rel}"' in f.read(), f"flinkbuf/csrc/{unit}.pxd"


def test_internal_headers_stay_in_their_folder():
    """A private header is included only by C of its own folder, and no
    Cython declares it."""
    internal = [f for f in _c_files() if _is_internal(f)]
    assert internal, "the connection's units share their *_internal.h headers"
    for rel in _c_files():
        with open(os.path.join(ROOT, "csrc", rel)) as f:
            includes = re.findall(r'#include\s+"([^"]+)"', f.read())
        for inc in includes:
            if _is_internal(inc):
                assert inc.split("/")[0] == rel.split(os.sep)[0], f"csrc/{rel} includes {inc}"
    for dirpath, _, files in os.walk(PKG):
        for name in files:
            if name.endswith((".pxd", ".pyx", ".pxi")):
                with open(os.path.join(dirpath, name)) as f:
                    text = f.read()
                assert "_internal.h" not in text, os.path.join(dirpath, name)


# Units and functions stay small enough to read whole.
MAX_UNIT_LINES = 800
MAX_FUNCTION_LINES = 80
_FUNCTION = re.compile(r"^[A-Za-z_][\w \t\*]*?\b(\w+)\([^;]*$")


def _long_functions(text):
    """(name, lines) of each function definition over MAX_FUNCTION_LINES,
    from its signature to its closing brace at the start of a line."""
    found, name, start = [], None, 0
    for number, line in enumerate(text.split("\n")):
        m = _FUNCTION.match(line)
        if name is None and m and not line.startswith(("typedef", "struct", "enum", "#")):
            name, start = m.group(1), number
        elif name is not None and line == "}":
            if number - start + 1 > MAX_FUNCTION_LINES:
                found.append((name, number - start + 1))
            name = None
    return found


@pytest.mark.parametrize("rel", [f for f in _c_files() if f.endswith(".c")])
def test_c_units_and_functions_are_small(rel):
    with open(os.path.join(ROOT, "csrc", rel)) as f:
        text = f.read()
    assert text.count("\n") <= MAX_UNIT_LINES, f"csrc/{rel}: over {MAX_UNIT_LINES} lines"
    assert _long_functions(text) == [], f"csrc/{rel}: functions over {MAX_FUNCTION_LINES} lines"


def test_the_size_checker_sees_a_long_function():
    body = "\n".join("    x++;" for _ in range(MAX_FUNCTION_LINES))
    text = f"static int short_one(void)\n{{\n    return 0;\n}}\n\nint long_one(int x)\n{{\n{body}\n}}\n"
    assert _long_functions(text) == [("long_one", MAX_FUNCTION_LINES + 3)]


# The test hooks of layers 1-3 go through each layer's contract: they call
# C-level methods its .pxd declares and touch no field of the layer's objects.
HOOK_FILES = ("testing_buffer.pxi", "testing_serialization.pxi", "testing_io.pxi")
_ATTRIBUTE = re.compile(r"\b\w+\.(_[a-z]\w*)\b(\s*\()?")


def _declared_methods():
    names = set()
    for layer in ("buffer", "serialization", "io"):
        for dirpath, _, files in os.walk(os.path.join(PKG, layer)):
            for name in files:
                if name.endswith(".pxd"):
                    with open(os.path.join(dirpath, name)) as f:
                        names |= set(re.findall(r"^\s*cdef\s[^#\n]*?\b(_\w+)\(self", f.read(), re.M))
    return names


def hook_reaches(text, declared):
    """What ``text`` reaches of the layers' objects besides their declared
    methods: fields, and methods no .pxd declares."""
    return sorted({m.group(1) for m in _ATTRIBUTE.finditer(text)
                   if not m.group(2) or m.group(1) not in declared})


@pytest.mark.parametrize("name", HOOK_FILES)
def test_test_hooks_use_the_layers_contracts_only(name):
    with open(os.path.join(PKG, name)) as f:
        text = f.read()
    assert hook_reaches(text, _declared_methods()) == [], f"flinkbuf/{name}"


def test_the_hook_checker_sees_fields_and_undeclared_methods():
    declared = _declared_methods()
    assert {"_set_ref_count", "_reader_count", "_serialize_record"} <= declared
    text = ("buffer._refcnt = count\nbuffer._set_ref_count(count)\n"
            "n = partition._readers\nser._secret_helper()\n")
    assert hook_reaches(text, declared) == ["_readers", "_refcnt", "_secret_helper"]
