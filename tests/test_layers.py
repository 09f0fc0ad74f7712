"""The package's layers import only downward: every import and cimport of a
layer's files (Python, Cython, stubs) names its own layer or one below, and
the plain C in csrc/ has no Python API and includes downward too."""

import os
import re

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
# csrc units by layer (their headers may include only their layer or below).
C_LAYERS = {
    "status": 0, "clock": 0, "byteorder": 0, "arena": 0, "redistribution": 0, "pool": 0,
    "exchange": 3, "keygroup": 3,
    "connection": 4,
}

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
    return sorted(f for f in os.listdir(csrc) if f.endswith((".c", ".h")))


@pytest.mark.parametrize("name", _c_files())
def test_csrc_is_plain_c_and_includes_point_down(name):
    unit = os.path.splitext(name)[0]
    assert unit in C_LAYERS, f"csrc/{name}: give its unit a layer in C_LAYERS"
    with open(os.path.join(ROOT, "csrc", name)) as f:
        text = f.read()
    assert "Python.h" not in text and "PyObject" not in text, f"csrc/{name} uses the Python API"
    for inc in re.findall(r'#include\s+"(\w+)\.h"', text):
        assert C_LAYERS[inc] <= C_LAYERS[unit], f"csrc/{name} includes {inc}.h, a layer above"


def test_every_csrc_header_has_its_declarations_file():
    """One .pxd per C header, beside the package's other declarations."""
    headers = {os.path.splitext(f)[0] for f in _c_files() if f.endswith(".h")}
    declared = {os.path.splitext(f)[0] for f in os.listdir(os.path.join(PKG, "csrc"))
                if f.endswith(".pxd")}
    assert headers == declared
