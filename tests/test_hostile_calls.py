"""Every public callable with hostile arguments, in a child process per
part of the API (``hostile_calls.py``): a segfault, an abort or a hang
fails the test, with the child's traceback, instead of taking the run
down.  The child asserts that every call returns or raises a clear
``Exception`` (never ``SystemError`` or an internal error)."""

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "hostile_calls.py")

# Examples per target: the hypothesis profile's budget (CI: 60).
EXAMPLES = {"ci": 60, "dev": 40, "thorough": 1000}.get(
    os.environ.get("HYPOTHESIS_PROFILE", "dev"), 40)


def _run(*args, timeout=900):
    proc = subprocess.run([sys.executable, "-X", "faulthandler", SCRIPT, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=HERE)
    assert proc.returncode == 0, (
        f"hostile calls ({' '.join(map(str, args))}) exited with {proc.returncode}:\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout


@pytest.mark.parametrize("group", ["buffer", "serialization", "selectors", "io", "network",
                                   "spark"])
def test_hostile_arguments(group):
    out = _run(group, EXAMPLES)
    assert f"{group}: " in out


def test_lists_shrinking_under_readers():
    out = _run("shrinking", 2.0)
    assert "records received" in out


def test_every_public_callable_is_a_target():
    """The groups reach every public class and function of the packages
    (a new public name must be added to a group, or it goes untested)."""
    proc = subprocess.run([sys.executable, "-c", _COVERAGE], capture_output=True, text=True,
                          timeout=120, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "all covered", proc.stdout


_COVERAGE = r"""
import importlib, inspect
import hostile_calls as h
import re
labels = {label for group in h.GROUPS.values() for label, _, _ in group()}
names = {word for label in labels for word in re.findall(r"\w+", label)}
missing = []
for modname in ("flinkbuf", "flinkbuf.io", "flinkbuf.network", "flinkbuf.serialization",
                "flinkbuf.buffer", "flinkbuf.spark"):
    mod = importlib.import_module(modname)
    for name in mod.__all__:
        obj = getattr(mod, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        if not callable(obj) or getattr(obj, "__module__", "") == "typing":
            continue            # (a type alias such as a Literal is not called)
        if name not in names:
            missing.append(f"{modname}.{name}")
print("all covered" if not missing else "missing: " + ", ".join(missing))
"""
