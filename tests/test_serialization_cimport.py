"""The cdef contract that flinkbuf._io cimports: compile a small Cython
module against flinkbuf/serialization/_serialization.pxd and drive it from C."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PYX = textwrap.dedent("""
    from flinkbuf.buffer._buffer cimport Buffer
    from flinkbuf.serialization._serialization cimport (
        RecordSerializer, RecordDeserializer, is_no_record, FULL_RECORD, FULL_BUFFER)

    def run(pool, list records, int copies):
        cdef RecordSerializer ser = RecordSerializer()
        cdef RecordDeserializer des = RecordDeserializer(max_record_size=1 << 20)
        cdef Buffer buf = pool.request_buffer()
        cdef int flags, k
        out = []
        for r in records:
            ser._serialize_record(r)
            for k in range(copies):            # broadcast: the same record again
                if k:
                    ser._reset()
                while ser._has_serialized_data():
                    flags = ser._copy_to_buffer(buf)
                    if flags & FULL_BUFFER:
                        des._feed(buf)
                        while True:
                            v = des._next_record()
                            if is_no_record(v):
                                break
                            out.append(v)
                        buf = pool.request_buffer()
                    if flags & FULL_RECORD:
                        assert not ser._has_serialized_data()
        des._feed(buf)
        while True:
            v = des._next_record()
            if is_no_record(v):
                break
            out.append(v)
        des._finish()
        des._close()
        return out
""")

SETUP = textwrap.dedent(f"""
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    setup(ext_modules=cythonize(
        [Extension("contract_user", ["contract_user.pyx"],
                   include_dirs=[{os.path.join(ROOT, "csrc")!r}, numpy.get_include()])],
        include_path=[{ROOT!r}],
        compiler_directives={{"language_level": 3}}, quiet=True))
""")


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="no compiler runs under the sanitizer preload")
def test_cdef_contract_from_another_extension(tmp_path):
    (tmp_path / "contract_user.pyx").write_text(PYX)
    (tmp_path / "setup.py").write_text(SETUP)
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp_path,
                   env=env, check=True, capture_output=True, timeout=300)
    script = textwrap.dedent("""
        import contract_user, flinkbuf as fb
        records = [(1, "a"), b"x" * 40, None, [1.5], "y" * 700]
        with fb.NetworkBufferPool(4, 7) as nbp:
            pool = nbp.create_buffer_pool(1, 4)
            out = contract_user.run(pool, records, 3)
            assert out == [r for r in records for _ in range(3)], out
            assert pool.num_requested == pool.num_available
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
