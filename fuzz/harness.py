"""What every fuzz target here shares: loading flinkbuf (the copy built with
native coverage when FLINKBUF_FUZZ_NATIVE names it), writing seeds, and
starting atheris.

A target defines ``one_input(data)`` and ``seeds()`` and calls
``harness.main(one_input, seeds)``; ``harness.flinkbuf`` is the package once
the first input (or the seeding) imported it.

Coverage: the harness and flinkbuf's Python code are instrumented by
atheris.  The Cython/C code gives coverage feedback only when it is compiled
with clang's ``-fsanitize-coverage``: fuzz/run.sh builds such a copy of the
extensions and points FLINKBUF_FUZZ_NATIVE at it (else it says so and fuzzes
with Python-level coverage only).
"""

import os
import sys

import atheris

NATIVE = os.environ.get("FLINKBUF_FUZZ_NATIVE")
SEEDING = "--write-seeds" in sys.argv
if NATIVE and not SEEDING:
    sys.path.insert(0, NATIVE)

flinkbuf = None


def export_libfuzzer():
    """atheris loads its libFuzzer (when fuzzing starts) with local symbols;
    make them global so that the instrumented extensions find its coverage
    hooks when they are imported."""
    import ctypes
    import glob
    for lib in glob.glob(os.path.join(os.path.dirname(atheris.__file__), "core_*libfuzzer*.so")):
        try:
            ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NOLOAD)
        except OSError:
            pass                                     # that one is not loaded


def import_flinkbuf():
    """Import flinkbuf (instrumented); idempotent.  Returns the package."""
    global flinkbuf
    if flinkbuf is not None:
        return flinkbuf
    if NATIVE and not SEEDING:
        export_libfuzzer()
    with atheris.instrument_imports(include=["flinkbuf"]):
        import flinkbuf as fb
        import flinkbuf._testing                     # noqa: F401  (the network layer's hooks)
        import flinkbuf.serialization                # noqa: F401
    if NATIVE and not SEEDING and not os.path.abspath(fb.__file__).startswith(
            os.path.abspath(NATIVE)):
        raise SystemExit(f"fuzz: expected the instrumented flinkbuf in {NATIVE}, "
                         f"got {fb.__file__}")
    flinkbuf = fb
    return fb


def main(one_input, seeds):
    """``--write-seeds DIR`` writes ``seeds()`` there; otherwise fuzz."""
    if SEEDING:
        import_flinkbuf()
        d = sys.argv[sys.argv.index("--write-seeds") + 1]
        os.makedirs(d, exist_ok=True)
        for i, s in enumerate(seeds()):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(s)
        return
    if not NATIVE:
        import_flinkbuf()
    # With native coverage, flinkbuf is imported by the first input: only then
    # is atheris' libFuzzer loaded, whose coverage hooks the instrumented
    # extensions link to.
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
