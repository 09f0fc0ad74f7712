"""The plain-C pool under threads, built with ThreadSanitizer and with
AddressSanitizer + UBSan: any race, memory error or broken invariant fails."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/csrc/stress_pool.c", "csrc/pool.c", "csrc/arena.c", "csrc/redistribution.c"]


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
