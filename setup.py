"""Build the Cython extensions over csrc/.

Environment switches:
  FLINKBUF_DEBUG=1        live-object counters and C asserts (the test build)
  FLINKBUF_SANITIZE=address   AddressSanitizer build (implies debug, -O1 -g)
"""

import json
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("FLINKBUF_DEBUG", "") not in ("", "0")
SANITIZE = os.environ.get("FLINKBUF_SANITIZE", "")

# The one place for compiler directives.
DIRECTIVES = {
    "language_level": 3,
    # On, everywhere.  The code has no typed memoryviews, so these two
    # govern one thing only: ``obj[i]`` with a C integer ``i`` on a list or
    # tuple.  Off, Cython reads the item without comparing ``i`` to the
    # length, so an index that user code chose (a HashSelector's key index,
    # a field of a record) reads past the object and crashes the
    # interpreter.  On, it costs a compare on the hot paths that index lists
    # (a writer's current buffer per channel), within the benchmarks' noise.
    # C arrays and pointers are never checked by Cython either way: their
    # indices are checked by our own code.
    "boundscheck": True,
    "wraparound": True,
    "initializedcheck": False,
    "cdivision": True,
    # Methods as PyMethodDef (bound: builtin methods), not cyfunctions:
    # CPython >= 3.11 specializes calls to the former (a per-record cost in
    # serialize_record/copy_to_buffer/emit loops); "clinic" signatures keep
    # them introspectable (inspect.signature, stubtest).
    "binding": False,
    # No generated pickling (it would only raise for these types, and with
    # binding=False its helpers leak into module namespaces): pickle refuses
    # them itself ("cannot pickle 'Buffer' object").
    "auto_pickle": False,
    "embedsignature": True,
    "embedsignature.format": "clinic",
}

MODE = f"asan-{SANITIZE}" if SANITIZE else "debug" if DEBUG else "release"

cflags = ["-O3", "-std=gnu11", "-Wno-unused-function", "-fno-strict-aliasing"]
ldflags = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if DEBUG or SANITIZE:
    macros.append(("FLINKBUF_DEBUG", "1"))
else:
    macros.append(("NDEBUG", "1"))
if SANITIZE:
    cflags = [f for f in cflags if not f.startswith("-O")]
    cflags += ["-O1", "-g", f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer"]
    ldflags += [f"-fsanitize={SANITIZE}"]

# Each layer is one extension module: its .pyx includes the layer's files
# (as uvloop, asyncpg's pgproto and msgpack do) and links the plain C it owns.
CSRC = {
    "buffer": ["csrc/clock.c", "csrc/arena.c", "csrc/redistribution.c", "csrc/pool.c"],
    "io": ["csrc/clock.c", "csrc/exchange.c", "csrc/keygroup.c"],
    "network": ["csrc/clock.c", "csrc/exchange.c", "csrc/connection.c"],
}


def ext(name, csrc=()):
    pyx = name.replace(".", "/") + ".pyx"
    return Extension(
        name,
        [pyx, *csrc],
        include_dirs=["csrc", "flinkbuf/serialization/codecs", numpy.get_include()],
        define_macros=macros,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )


extensions = [
    ext("flinkbuf.buffer._buffer", CSRC["buffer"]),
    ext("flinkbuf.serialization._serialization"),
    ext("flinkbuf.io._io", CSRC["io"]),
    ext("flinkbuf.network._network", CSRC["network"]),
    ext("flinkbuf._testing", ["csrc/clock.c"]),      # test and benchmark hooks
]

class BuildExt(build_ext):
    """Rebuild everything when the build mode changes: an in-place .so newer
    than its sources may still be another mode's (say, an ASan build)."""

    STAMP = os.path.join("build", "last-build-mode")

    def finalize_options(self):
        if self.build_temp is None:  # objects of each mode apart, unless told otherwise
            self.build_temp = os.path.join("build", f"temp-{MODE}")
        super().finalize_options()

    def run(self):
        try:
            with open(self.STAMP) as f:
                last = f.read().strip()
        except OSError:
            last = None
        if last != MODE:
            self.force = True
        super().run()
        os.makedirs("build", exist_ok=True)
        with open(self.STAMP, "w") as f:
            f.write(MODE)


def directives_changed(build_dir):
    """True when the generated C in ``build_dir`` was made with other
    directives (cythonize only compares file times, so a directive changed
    here would otherwise leave the C of unchanged .pyx files as it was)."""
    stamp = os.path.join(build_dir, "directives.json")
    wanted = json.dumps(DIRECTIVES, sort_keys=True)
    try:
        with open(stamp) as f:
            if f.read() == wanted:
                return False
    except OSError:
        pass
    os.makedirs(build_dir, exist_ok=True)
    with open(stamp, "w") as f:
        f.write(wanted)
    return True


# Debug and release builds must not share generated C.
CYTHON_BUILD_DIR = f"build/cython-{MODE}"

setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        include_path=["."],
        build_dir=CYTHON_BUILD_DIR,
        force=directives_changed(CYTHON_BUILD_DIR),
    ),
)
