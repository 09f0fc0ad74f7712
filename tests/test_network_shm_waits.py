"""The shared-memory transport's waits on their own (tests/csrc/shm_waits.c,
plain C against csrc/network/shm.c): a quiet peer, or one that last ran on
this wait's CPU, is not looked at, a running one is; garbage in what the
peer publishes about itself neither breaks the stream nor makes a wait look
at a peer whose time is no time; the bytes go across exactly while the peer
scribbles on those fields.  Built with AddressSanitizer + UBSan and with
ThreadSanitizer (any race, memory error or overflow fails)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["tests/csrc/shm_waits.c", "csrc/network/shm.c", "csrc/common/clock.c"]


@pytest.mark.parametrize("sanitizer", ["thread", "address,undefined"])
def test_shm_waits_under_sanitizer(tmp_path, sanitizer):
    cc = os.environ.get("CC", "gcc")
    assert shutil.which(cc), f"{cc} is needed to build the extension and this test"
    exe = tmp_path / "shm_waits"
    proc = subprocess.run([cc, "-O1", "-g", f"-fsanitize={sanitizer}", "-fno-sanitize-recover=all",
                           "-Werror=implicit-function-declaration", "-Icsrc", *SOURCES,
                           "-lpthread", "-lm", "-o", str(exe)],
                          cwd=ROOT, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["TSAN_OPTIONS"] = "halt_on_error=1"
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "ok"
