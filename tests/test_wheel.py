"""The wheel works: built from a copy of the sources, installed into a fresh
virtualenv outside the source tree (numpy from the package index), and run
from a directory that is not the source tree, without matplotlib."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every module a user imports; none may need an extra (PySpark, matplotlib) to import.
PUBLIC_MODULES = ("flinkbuf", "flinkbuf.buffer", "flinkbuf.serialization", "flinkbuf.io",
                  "flinkbuf.io.metrics", "flinkbuf.io.pipeline", "flinkbuf.network",
                  "flinkbuf.network.addresses", "flinkbuf.network.config",
                  "flinkbuf.network.environment", "flinkbuf.network.transports",
                  "flinkbuf.errors", "flinkbuf.cli", "flinkbuf.experiments",
                  "flinkbuf.experiments.spark_demo", "flinkbuf.experiments.spark_launcher",
                  "flinkbuf.spark", "flinkbuf.spark.exchange", "flinkbuf.spark.arrow",
                  "flinkbuf.spark.driver", "flinkbuf.spark.live_text")
# Generated or local state a copy of the sources must not carry along.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "out", "*.so", "__pycache__", ".pytest_cache",
    ".hypothesis", ".benchmarks", ".mypy_cache", "corpus*", "*.egg-info")


def _copy_sources(dest):
    """The checkout's files (tracked and new ones, without ignored ones) into
    ``dest``; a plain copy without the generated state if git is missing."""
    try:
        listed = subprocess.run(
            ["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(ROOT, dest, ignore=_NOT_SOURCES, symlinks=True)
        return
    for rel in filter(None, listed):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src) and not os.path.islink(src):   # skip .venv and moved files
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def _env(**extra):
    """The environment without this checkout's build switches, search paths
    and sanitizer runtime (the wheel is a plain release build); pip's own
    settings stay: they may be how the index is reached."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLINKBUF_", "ASAN_", "UBSAN_", "LSAN_"))
           and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONMALLOC",
                         "VIRTUAL_ENV", "LD_PRELOAD")}
    env.update(extra)
    return env


def _run(cmd, cwd, timeout, **kwargs):
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def _version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def _module_name(path):
    """``flinkbuf/x/_y.cpython-311-x86_64-linux-gnu.so`` -> ``flinkbuf.x._y``."""
    directory, base = os.path.split(path)
    return ".".join([*directory.split("/"), base.split(".")[0]])


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    src, wheels, env_dir, run_dir = (tmp_path / d for d in ("src", "wheels", "venv", "run"))
    _copy_sources(src)
    run_dir.mkdir()

    # Build with the build tools of this environment (no download), release mode.
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "--disable-pip-version-check", "-q", "-w", str(wheels), "."], src, 300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = wheels.glob("flinkbuf-*.whl")

    # Every module, stub, Cython declaration and typed marker of every package.
    names = set(zipfile.ZipFile(wheel).namelist())
    for d, _, files in os.walk(src / "flinkbuf"):
        for f in files:
            if f.endswith((".py", ".pyi", ".pxd")) or f == "py.typed":
                rel = os.path.relpath(os.path.join(d, f), src).replace(os.sep, "/")
                assert rel in names, f"{rel} is not in the wheel"
    compiled = sorted(_module_name(n) for n in names if n.endswith(".so"))
    assert compiled, sorted(names)
    # The C of every layer, once, beside the package: the compiled modules
    # find it there by their rpath (their imports below need it).
    assert "flinkbuf/libflinkbuf.so.0" in names, sorted(names)
    assert "flinkbuf/experiments/__init__.py" in names

    # A plain virtualenv (not --system-site-packages) outside the source tree.
    proc = _run([sys.executable, "-m", "venv", str(env_dir)], tmp_path, 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    py = env_dir / "bin" / "python"
    proc = _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                 "--timeout", "60", "--only-binary", ":all:", "--find-links", str(wheels),
                 f"flinkbuf=={_version()}"], run_dir, 240)
    if proc.returncode != 0 and re.search(
            r"No matching distribution found for numpy|NewConnectionError|"
            r"Temporary failure in name resolution|Network is unreachable", proc.stderr):
        pytest.skip(f"numpy could not be fetched from the package index: "
                    f"{proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    # The command, from a directory that is not the source tree.
    proc = _run([str(env_dir / "bin" / "flinkbuf"), "--version"], run_dir, 60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"flinkbuf {_version()}\n", "")

    proc = _run([str(env_dir / "bin" / "flinkbuf"), "experiment", "slow-subpartition",
                 "--phase-seconds", "1", "--out", str(run_dir / "out")], run_dir, 120)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0 or (proc.returncode == 1 and "FAILED" in proc.stdout), \
        proc.stdout + proc.stderr
    assert "pip install 'flinkbuf[plot]'" in proc.stdout          # no matplotlib there
    assert sorted(os.listdir(run_dir / "out")) == ["slow-subpartition.csv",
                                                    "slow-subpartition.json"]

    # The Spark demo without the spark extra: one line saying what to install.
    proc = _run([str(env_dir / "bin" / "flinkbuf"), "spark-demo", "--out", str(run_dir / "s")],
                run_dir, 60)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "flinkbuf spark-demo: error: PySpark is not installed: "
        "pip install 'flinkbuf[spark]'"], proc.stderr

    # Every public module and every compiled one imports from the installed wheel.
    modules = [*PUBLIC_MODULES, *compiled]
    proc = _run([str(py), "-c", "import importlib, sys\n"
                 "for m in sys.argv[1:]:\n"
                 "    print(m, importlib.import_module(m).__file__)\n", *modules], run_dir, 60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(modules)
    site = str(env_dir)
    for line in lines:
        name, path = line.split(" ", 1)
        assert path.startswith(site), f"{name} came from {path}, not from the wheel"
