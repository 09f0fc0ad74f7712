"""Running ``python -m flinkbuf`` as a user does, for the tests of the
command line: pressing Ctrl-C at a given moment, and finding the processes
a command left behind."""

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def marked_environment():
    """(this process's environment with a marker variable, the marker): every
    process the command starts inherits it, so :func:`processes_with` finds
    them (needs /proc)."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc to find the command's processes")
    marker = f"FLINKBUF_TEST_{uuid.uuid4().hex}"
    return dict(os.environ, FLINKBUF_TEST_MARKER=marker), marker


def interrupt(args, cwd, ready, *, delay=0.0, env=None, timeout=120):
    """Start ``python -m flinkbuf args`` in a session of its own, wait for
    ``ready`` in its standard output and ``delay`` seconds more, then press
    Ctrl-C (SIGINT to its whole process group, as a terminal does);
    (status, stdout, stderr)."""
    env = dict(env or os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "flinkbuf", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err = [], []
    seen = threading.Event()

    def read_out():
        for line in proc.stdout:
            out.append(line)
            if ready in line:
                seen.set()
        seen.set()

    readers = [threading.Thread(target=read_out),
               threading.Thread(target=lambda: err.extend(proc.stderr))]
    for t in readers:
        t.start()
    try:
        assert seen.wait(timeout), "".join(out)
        time.sleep(delay)
        assert proc.poll() is None, ("it ended before Ctrl-C", "".join(out), "".join(err))
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for t in readers:
            t.join(10)
    return proc.returncode, "".join(out), "".join(err)


def processes_with(marker):
    """Processes whose environment holds ``marker`` (this test's children)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def none_left(marker, timeout=20.0):
    deadline = time.monotonic() + timeout
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_with(marker) == []
