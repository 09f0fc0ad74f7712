"""The plain C: the pool and the network connections under threads, built
with ThreadSanitizer and with AddressSanitizer + UBSan (any race, memory
error, leak or broken invariant fails), the clock both extension modules
share, buffer debloating's arithmetic, and the one library every unit of
csrc/ is compiled into."""

import glob
import os
import re
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def c_units(*dirs):
    """Every C unit under the csrc/ directories ``dirs`` (paths from ROOT)."""
    return sorted(os.path.relpath(path, ROOT)
                  for d in dirs for path in glob.glob(os.path.join(ROOT, "csrc", d, "*.c")))


SOURCES = ["tests/csrc/stress_pool.c", *c_units("common", "buffer")]
CONNECTION_SOURCES = ["tests/csrc/stress_connection.c",
                      *c_units("common", "buffer", "io", "network")]


@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_pool_stress_under_sanitizer(tmp_path, sanitizer):
    cc = os.environ.get("CC", "gcc")
    assert shutil.which(cc), f"{cc} is needed to build the extension and this test"
    exe = tmp_path / "stress"
    subprocess.run([cc, "-O1", "-g", f"-fsanitize={sanitizer}", "-fno-sanitize-recover=all",
                    "-Icsrc", *SOURCES, "-lpthread", "-lm", "-o", str(exe)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    proc = subprocess.run([str(exe), "20000"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.fixture(scope="module")
def connection_stress_exe(tmp_path_factory):
    """The connection stress program, built once per sanitizer."""
    built = {}

    def build(sanitizer):
        if sanitizer not in built:
            cc = os.environ.get("CC", "gcc")
            assert shutil.which(cc), f"{cc} is needed to build the extension and this test"
            exe = tmp_path_factory.mktemp("stress") / "stress_connection"
            proc = subprocess.run([cc, "-O1", "-g", f"-fsanitize={sanitizer}",
                                   "-fno-sanitize-recover=all", "-Werror=int-conversion",
                                   "-Werror=implicit-function-declaration",
                                   "-Werror=incompatible-pointer-types", "-Icsrc",
                                   *CONNECTION_SOURCES,
                                   "-lcrypto", "-lpthread", "-lm", "-o", str(exe)],
                                  cwd=ROOT, check=False, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            built[sanitizer] = exe
        return built[sanitizer]

    return build


@pytest.mark.parametrize("transport", ["unix", "tcp", "shm", "lend", "sealed"])
@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_connection_stress_under_sanitizer(connection_stress_exe, sanitizer, transport):
    """Two connections in one process (a socket pair, TCP loopback, or
    shared memory over a socket pair, copying or lending the producers'
    buffers, or TCP sealed both ways):
    producers serving subpartitions under backpressure, consumers reading
    them through remote channels with exclusive and floating buffers, with
    direct reads and caller sends on and off, channels cancelled and
    connections closed mid-stream.  Exactly-once in-order delivery, and
    every segment back after every round (the program checks; the
    sanitizers abort on races, memory errors and leaks)."""
    exe = connection_stress_exe(sanitizer)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    proc = subprocess.run([str(exe), "2000", transport], check=False, capture_output=True,
                          text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize("sanitizer", ["address,undefined"])
def test_clock_deadlines_and_timed_waits(tmp_path, sanitizer):
    cc = os.environ.get("CC", "gcc")
    exe = tmp_path / "clock_check"
    subprocess.run([cc, "-O1", "-g", f"-fsanitize={sanitizer}", "-fno-sanitize-recover=all",
                    "-Icsrc", "tests/csrc/clock_check.c", "csrc/common/clock.c", "-lpthread", "-lm",
                    "-o", str(exe)], cwd=ROOT, check=True, capture_output=True, text=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_debloating_arithmetic_alone(tmp_path):
    """csrc/io/debloat.c with every warning an error and the sanitizers on
    (float-cast-overflow too: a double cast out of an integer's range is
    what its saturation exists to avoid): its configuration check, worked
    steps, and every extreme of its inputs."""
    cc = os.environ.get("CC", "gcc")
    exe = tmp_path / "debloat_check"
    proc = subprocess.run([cc, "-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                           "-fsanitize=address,undefined,float-cast-overflow",
                           "-fno-sanitize-recover=all", "-Icsrc", "tests/csrc/debloat_check.c",
                           "csrc/io/debloat.c", "-lm", "-o", str(exe)],
                          cwd=ROOT, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.parametrize("module", ["flinkbuf.buffer._buffer", "flinkbuf.io._io"])
def test_both_extensions_share_one_clock_semantics(module):
    """Both extension modules reach csrc/common/clock.c's functions (the
    exchange once had its own copy, where a negative timeout meant
    "forever"; now both link the one library of csrc/): a timeout
    <= 0 or NaN is a deadline of now, +inf or a huge one is forever."""
    import ctypes
    import importlib

    lib = ctypes.CDLL(importlib.import_module(module).__file__)
    lib.fb_deadline_after.restype = ctypes.c_int64
    lib.fb_deadline_after.argtypes = [ctypes.c_double]
    lib.fb_monotonic_ns.restype = ctypes.c_int64
    forever = (1 << 63) - 1
    for timeout in (0.0, -1.0, -1e-9, float("-inf"), float("nan")):
        before = time.monotonic_ns()        # CLOCK_MONOTONIC, as csrc/common/clock.c
        deadline = lib.fb_deadline_after(timeout)
        assert before <= deadline <= time.monotonic_ns(), timeout
    assert lib.fb_deadline_after(float("inf")) == forever
    assert lib.fb_deadline_after(1e300) == forever
    before = time.monotonic_ns()
    assert before + 10**9 <= lib.fb_deadline_after(1.0) <= time.monotonic_ns() + 10**9
    assert before <= lib.fb_monotonic_ns() <= time.monotonic_ns()


def _defined_functions(path):
    """The functions a shared object defines, exported or not (``nm``)."""
    out = subprocess.run(["nm", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines()
            if line.split()[-2:-1] in (["T"], ["t"])}


def _c_functions(unit):
    """The functions a unit of csrc/ defines that are not static: a name
    at the start of a line, its parameters, then a body."""
    with open(os.path.join(ROOT, unit)) as f:
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", f.read(), flags=re.S)
    found = set()
    for m in re.finditer(r"^(?!static\b|typedef\b|extern\b)[A-Za-z_][\w \t\*]*?\b(\w+)\(",
                         text, re.M):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if text[i:].lstrip().startswith("{"):
            found.add(m.group(1))
    return found


def test_every_c_unit_is_compiled_once():
    """Every unit of csrc/ is in the one library beside the package, and no
    extension module has a copy of any of it: a unit that two layers call
    (the clock, the exchange queues) exists once in a process, with its
    state (the pool's debug counters) and its behaviour."""
    import importlib

    import flinkbuf

    assert shutil.which("nm"), "nm (binutils) is needed to read the shared objects"
    library = os.path.join(os.path.dirname(flinkbuf.__file__), "libflinkbuf.so.0")
    in_library = _defined_functions(library)
    units = set()
    for unit in c_units("common", "buffer", "io", "network"):
        functions = _c_functions(unit)
        assert functions, unit
        assert functions <= in_library, (unit, sorted(functions - in_library))
        units |= functions
    for name in ("flinkbuf.buffer._buffer", "flinkbuf.serialization._serialization",
                 "flinkbuf.io._io", "flinkbuf.network._network", "flinkbuf._testing"):
        path = importlib.import_module(name).__file__
        copied = sorted(_defined_functions(path) & units)
        assert copied == [], f"{name} has its own copy of {copied}"


def test_the_unit_reader_sees_functions_not_declarations(tmp_path):
    unit = tmp_path / "u.c"
    unit.write_text("/* int fb_commented(void) */\nstatic int fb_hidden(void)\n{\n}\n"
                    "int fb_declared(int x);\nint64_t fb_defined(const char *p,\n"
                    "                  size_t n)\n{\n}\nvoid *fb_pointer(void)\n{\n}\n"
                    "int fb_two_lines(int a,\n                 int b);\n")
    assert _c_functions(str(unit)) == {"fb_defined", "fb_pointer"}


def test_zero_timeouts_try_once_and_negative_ones_are_refused():
    """What the clock semantics mean at the public API: a zero timeout makes
    one attempt and returns at once; a negative one is a ValueError (never
    "wait forever"); None waits without a deadline."""
    import threading

    import flinkbuf as fb
    from flinkbuf import io

    nbp = fb.NetworkBufferPool(4, 64)
    pool = nbp.create_buffer_pool(1, 3)
    held, *others = [pool.request_buffer() for _ in range(3)]   # 1 segment left free
    t0 = time.monotonic()
    with pytest.raises(fb.BufferRequestTimeoutError):
        pool.request_buffer_blocking(timeout=0)
    assert pool.wait_available(0) is False
    with pytest.raises(fb.BufferRequestTimeoutError):
        nbp.request_unpooled_segments(2, timeout=0)
    assert time.monotonic() - t0 < 1.0
    for bad in (-1, -1e-9, float("-inf"), float("nan")):
        with pytest.raises(ValueError):
            pool.request_buffer_blocking(timeout=bad)
        with pytest.raises(ValueError):
            pool.wait_available(bad)
    threading.Timer(0.05, held.recycle).start()
    with pool.request_buffer_blocking(timeout=None):
        pass
    for b in others:
        b.recycle()
    t = time.monotonic_ns()
    assert t <= io.monotonic_ns() <= time.monotonic_ns()
    pool.destroy()
    assert nbp.num_available_segments == nbp.num_segments
