"""Build the Cython extensions over csrc/.

Environment switches:
  FLINKBUF_DEBUG=1        live-object counters and C asserts (the test build)
  FLINKBUF_SANITIZE=address   AddressSanitizer build (implies debug, -O1 -g)
"""

import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("FLINKBUF_DEBUG", "") not in ("", "0")
SANITIZE = os.environ.get("FLINKBUF_SANITIZE", "")

# The one place for compiler directives.  Indexing into C arrays is
# checked by our own code, so Cython's bounds/wraparound checks are off.
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "initializedcheck": False,
    "cdivision": True,
    "embedsignature": True,
}

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

CSRC = {
    "core": ["csrc/arena.c", "csrc/redistribution.c", "csrc/pool.c"],
    "io": ["csrc/exchange.c", "csrc/keygroup.c"],
}


def ext(name, pyx, csrc=()):
    return Extension(
        name,
        [pyx, *csrc],
        include_dirs=["csrc", numpy.get_include()],
        define_macros=macros,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )


# Layer by layer; a module whose source is not there yet is skipped.
extensions = [
    e for e in (
        ext("flinkbuf._core", "flinkbuf/_core.pyx", CSRC["core"]),
        ext("flinkbuf._serialization", "flinkbuf/_serialization.pyx"),
        ext("flinkbuf._io", "flinkbuf/_io.pyx", CSRC["io"]),
    )
    if os.path.exists(e.sources[0])
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        include_path=["flinkbuf"],
        # Debug and release builds must not share generated C.
        build_dir=f"build/cython-{'asan' if SANITIZE else 'debug' if DEBUG else 'release'}",
    ),
)
