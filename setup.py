"""Build the Cython extensions over csrc/.

Environment switches:
  FLINKBUF_DEBUG=1        live-object counters and C asserts (the test build)
  FLINKBUF_SANITIZE=address   AddressSanitizer build (implies debug, -O1 -g)

Cython and the C compiler run on every CPU this process may use, unless
``build_ext --parallel N`` (``-j N``) says otherwise.
"""

import multiprocessing
import os
import sys
from concurrent.futures import ThreadPoolExecutor

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
    # Clinic signatures (``name($self, ...)\n--\n\n`` docstrings) for
    # functions and methods; _embed_class_signatures() below gives the
    # classes theirs.
    "embedsignature.format": "clinic",
}


def _embed_class_signatures():
    """Give every cdef class a clinic signature, as "embedsignature.format":
    "clinic" does for functions and methods.

    CPython derives a type's ``__text_signature__`` (what
    ``inspect.signature(cls)`` and ``help(cls)`` show) from its docstring
    when that starts with ``Name(params)\\n--\\n\\n``.  Cython writes that
    line for functions and methods only (the "c" format puts the
    constructor's signature in the class docstring, but in C syntax and
    without the marker; cython/cython#3873), and keeps a signature for
    ``__init__`` only if it has a docstring.  This extends Cython's
    EmbedSignature transform so that the ``__init__`` of a cdef class (its
    ``__cinit__`` when it has no ``__init__``; a class with neither
    inherits its base's) signs the class, and ``__init__`` keeps its own
    signature.
    """
    from Cython.Compiler import AutoDocTransforms, Naming, Nodes
    from Cython.Compiler.StringEncoding import EncodedString

    transform = AutoDocTransforms.EmbedSignature
    needed = ("visit_DefNode", "_setup_format", "_fmt_signature", "_embed_signature")
    if not all(hasattr(transform, name) for name in needed):
        print("warning: this Cython's EmbedSignature is not the one setup.py extends: "
              "classes get no signature (inspect.signature)", file=sys.stderr)
        return
    visit_def = transform.visit_DefNode

    def visit_DefNode(self, node):
        node = visit_def(self, node)
        directives = self.current_directives
        if not (directives["embedsignature"]
                and directives["embedsignature.format"] == "clinic"
                and not directives["binding"]
                and isinstance(self.class_node, Nodes.CClassDefNode)
                and node.name in ("__init__", "__cinit__") and node.entry.is_special):
            return node
        scope = self.class_node.entry.type.scope
        if node.name == "__cinit__" and scope.lookup_here("__init__") is not None:
            return node
        self._setup_format()
        # The arguments without self (Cython's own hide_self would put "*"
        # and "/" one place too far).
        args = [arg for arg in node.args if not arg.entry.is_self_arg]
        nkargs = sum(1 for arg in args if arg.kw_only)
        npoargs = sum(1 for arg in args if arg.pos_only)
        signature = self._fmt_signature(
            None, self.class_name, args, npoargs, len(args) - nkargs - npoargs,
            node.star_arg, nkargs, node.starstar_arg)
        scope.doc = EncodedString(self._embed_signature(signature, scope.doc))
        entry = node.entry
        if node.name == "__init__" and entry.wrapperbase_cname is None and entry.doc_cname:
            # Without a docstring of its own, Cython made no slot wrapper
            # doc for __init__ (before this transform gave it one).
            entry.wrapperbase_cname = entry.doc_cname.replace(
                Naming.funcdoc_prefix, Naming.wrapperbase_prefix, 1)
        return node

    transform.visit_DefNode = visit_DefNode


_embed_class_signatures()


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not on Linux
        return os.cpu_count() or 1


def _cython_jobs():
    """Processes for Cython: forked ones only, which inherit the transform
    above (a spawned process would import a Cython without it)."""
    return _cpus() if multiprocessing.get_start_method() == "fork" else 0


MODE = f"asan-{SANITIZE}" if SANITIZE else "debug" if DEBUG else "release"
CYTHON_BUILD_DIR = f"build/cython-{MODE}"


def _c_older_than_setup():
    """Whether C generated before the last change of this file is around:
    the directives and the transform above shape the C too, but Cython
    regenerates it only when a source is newer."""
    changed = os.path.getmtime(os.path.abspath(__file__))
    for dirpath, _, files in os.walk(os.path.join(CYTHON_BUILD_DIR, "flinkbuf")):
        for name in files:
            if name.endswith(".c") and os.path.getmtime(os.path.join(dirpath, name)) < changed:
                return True
    return False


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

# Layer 0 is one shared library: every unit of csrc/ is compiled once, into
# LIBRARY beside the package (flinkbuf/), and each layer's extension module
# links against it and finds it by an rpath relative to its own file
# ($ORIGIN), wherever the package is installed.  The layers' extension modules
# (as uvloop, asyncpg's pgproto and msgpack do, each .pyx includes its layer's
# files) compile no C of csrc/ themselves, so a unit that several layers call
# (the clock, the exchange queues) exists once in a process.  The library has
# no Python API: it does not depend on the interpreter's version.
CSRC = {
    "common": ["csrc/common/clock.c"],
    "buffer": ["csrc/buffer/arena.c", "csrc/buffer/redistribution.c", "csrc/buffer/pool.c",
               "csrc/buffer/unpooled.c"],
    "io": ["csrc/io/exchange.c", "csrc/io/keygroup.c", "csrc/io/channel_order.c",
           "csrc/io/debloat.c"],
    "network": ["csrc/network/wire.c", "csrc/network/credit.c", "csrc/network/frame_reader.c",
                "csrc/network/transport.c", "csrc/network/shm.c", "csrc/network/seal.c",
                "csrc/network/lease.c", "csrc/network/conn_state.c", "csrc/network/inchan.c",
                "csrc/network/consumer.c", "csrc/network/producer.c",
                "csrc/network/lifecycle.c", "csrc/network/writer.c", "csrc/network/reader.c",
                "csrc/network/direct.c", "csrc/network/connection.c"],
}
# Sealed connections use OpenSSL's libcrypto (AES-256-GCM).
LIBRARIES = ["crypto"]
# Not an importable name (no module suffix): pkgutil and imports pass it by.
LIBRARY = "libflinkbuf.so.0"


def _check_libcrypto():
    import sysconfig
    dirs = [sysconfig.get_config_var("INCLUDEDIR") or "/usr/include", "/usr/include",
            "/usr/local/include"]
    if not any(os.path.exists(os.path.join(d, "openssl", "evp.h")) for d in dirs):
        sys.exit("flinkbuf needs the headers of OpenSSL's libcrypto to build "
                 "(Debian/Ubuntu: apt-get install libssl-dev; Fedora: dnf install openssl-devel)")


_check_libcrypto()


def ext(name):
    pyx = name.replace(".", "/") + ".pyx"
    return Extension(
        name,
        [pyx],
        include_dirs=["csrc", "flinkbuf/serialization/codecs", numpy.get_include()],
        define_macros=macros,
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )


extensions = [
    ext("flinkbuf.buffer._buffer"),
    ext("flinkbuf.serialization._serialization"),
    ext("flinkbuf.io._io"),
    ext("flinkbuf.network._network"),
    ext("flinkbuf._testing"),  # test hooks
]


def _csrc_headers():
    for dirpath, _, files in os.walk("csrc"):
        for name in files:
            if name.endswith(".h"):
                yield os.path.join(dirpath, name)


def _older_than_any(target, sources):
    """Whether ``target`` is missing or older than one of ``sources``."""
    if not os.path.exists(target):
        return True
    built = os.path.getmtime(target)
    return any(os.path.getmtime(s) > built for s in sources)


class BuildExt(build_ext):
    """Build LIBRARY first, then the extension modules linked against it.

    Rebuild everything when the build mode changes: an in-place .so newer
    than its sources may still be another mode's (say, an ASan build)."""

    STAMP = os.path.join("build", "last-build-mode")

    def finalize_options(self):
        if self.build_temp is None:  # objects of each mode apart, unless told otherwise
            self.build_temp = os.path.join("build", f"temp-{MODE}")
        super().finalize_options()
        if self.parallel in (None, True):
            self.parallel = _cpus()

    def run(self):
        try:
            with open(self.STAMP) as f:
                last = f.read().strip()
        except OSError:
            last = None
        if last != MODE:
            self.force = True
        super().run()    # setuptools builds into build_lib, then copies in place
        os.makedirs("build", exist_ok=True)
        with open(self.STAMP, "w") as f:
            f.write(MODE)

    def _library(self):
        """Where LIBRARY is built: beside the package in build_lib."""
        return os.path.join(self.build_lib, "flinkbuf", LIBRARY)

    def build_extensions(self):
        self._build_library()
        library = self._library()
        for e in self.extensions:
            # flinkbuf._testing sits beside the library, flinkbuf.io._io one below
            up = "/.." * (e.name.count(".") - 1)
            e.extra_link_args = [*ldflags, library, f"-Wl,-rpath,$ORIGIN{up}"]
        # The largest C first, so that parallel jobs end close together.
        self.extensions.sort(key=lambda e: -sum(map(os.path.getsize, e.sources)))
        super().build_extensions()

    def _build_library(self):
        library = self._library()
        sources = [unit for units in CSRC.values() for unit in units]
        assert len(set(sources)) == len(sources), "a csrc unit is listed twice"
        headers = sorted(_csrc_headers())
        if not (self.force or _older_than_any(library, [*sources, *headers, __file__])):
            return
        def compile_unit(source):
            return self.compiler.compile([source], output_dir=self.build_temp, macros=macros,
                                         include_dirs=["csrc"], extra_postargs=cflags,
                                         depends=headers)
        with ThreadPoolExecutor(max_workers=self.parallel) as jobs:
            objects = [o for unit in jobs.map(compile_unit, sources) for o in unit]
        # The soname is what each extension records and the loader looks
        # for along the extension's rpath.
        self.compiler.link_shared_object(objects, library, libraries=LIBRARIES,
                                         extra_postargs=[*ldflags, f"-Wl,-soname,{LIBRARY}"])

    def _inplace_library(self):
        build_py = self.get_finalized_command("build_py")
        return os.path.join(build_py.get_package_dir("flinkbuf"), LIBRARY)

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        # Beside a copy that a running process may have mapped: replace the
        # file rather than write over it.
        target = self._inplace_library()
        self.copy_file(self._library(), target + ".new", level=self.verbose)
        os.replace(target + ".new", target)

    def _get_output_mapping(self):
        yield from super()._get_output_mapping()
        if self.inplace:
            yield (self._library(), self._inplace_library())

    def get_outputs(self):
        outputs = super().get_outputs()
        return outputs if self.inplace else sorted([*outputs, self._library()])


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        include_path=["."],
        # Debug and release builds must not share generated C.
        build_dir=CYTHON_BUILD_DIR,
        force=_c_older_than_setup() or None,
        nthreads=_cython_jobs(),
    ),
)
