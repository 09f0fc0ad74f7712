"""InputChannel as the base of channels written in Cython (remote channels,
layer 4, will be): compile a small extension whose channel subclasses it
and hands the gate whatever items the test chooses, then drive a gate
over it in a child process (a crash fails the test instead of the run)."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PYX = textwrap.dedent("""
    from libc.stdint cimport int32_t
    from libc.stdlib cimport malloc
    from libc.string cimport memcpy

    from flinkbuf.csrc.exchange cimport FB_ITEM_EVENT, fb_gate_notify, fb_item_t
    from flinkbuf.csrc.status cimport FB_EMPTY, FB_OK
    from flinkbuf.io._io cimport ChannelSelector, InputChannel, InputGate


    cdef class ListChannel(InputChannel):
        \"\"\"Hands its gate the given byte strings as event items, in order.\"\"\"
        cdef list _items
        cdef InputGate _gate

        def __init__(self, items):
            self._items = list(items)

        cdef int _connect(self, InputGate gate, int32_t index) except -1:
            self._index = index
            self._gate = gate
            if self._items:
                fb_gate_notify(&gate._c, index)
            return 0

        cdef int _poll(self, fb_item_t *out) except -1:
            if not self._items:
                return FB_EMPTY
            cdef bytes b = self._items.pop(0)
            out.data = <char *>malloc(len(b) + 1)    # the gate frees it
            memcpy(out.data, <const char *>b, len(b))
            out.pool = NULL
            out.index = -1
            out.kind = FB_ITEM_EVENT
            out.size = len(b)
            if self._items:
                fb_gate_notify(&self._gate._c, self._index)
            return FB_OK

        cdef int _release(self, InputGate gate) except -1:
            self._gate = None
            return 0

        cdef int _disconnect(self, InputGate gate) except -1:
            self._gate = None
            self._index = -1
            return 0


    cdef class FixedSelector(ChannelSelector):
        \"\"\"Picks the channel it was given, whatever the writer's size.\"\"\"
        cdef int32_t _channel

        def __init__(self, channel):
            self._channel = channel

        cdef int32_t _select(self, object record) except -1:
            return self._channel
""")

SETUP = textwrap.dedent(f"""
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    setup(ext_modules=cythonize(
        [Extension("list_channel", ["list_channel.pyx",     # the gate's C calls are linked in
                                    {os.path.join(ROOT, "csrc", "io", "exchange.c")!r},
                                    {os.path.join(ROOT, "csrc", "common", "clock.c")!r}],
                   include_dirs=[{os.path.join(ROOT, "csrc")!r}, numpy.get_include()])],
        include_path=[{ROOT!r}],
        compiler_directives={{"language_level": 3}}, quiet=True))
""")

SCRIPT = textwrap.dedent("""
    import flinkbuf as fb
    from flinkbuf.serialization import encode
    from list_channel import ListChannel

    def user_event(payload):
        return b"\\x01" + encode(payload)

    END = b"\\x00"

    # a channel subclassed in Cython works like a local one
    gate = fb.InputGate([ListChannel([user_event({"k": [1, 2]}), END]),
                         ListChannel([user_event("x"), user_event(None), END])])
    got = sorted(map(repr, gate))
    assert got == sorted(map(repr, [fb.UserEvent({"k": [1, 2]}), fb.UserEvent("x"),
                                    fb.UserEvent(None)])), got
    assert gate.is_finished
    gate.close()

    # a malformed event stops the gate for good as well
    gate = fb.InputGate([ListChannel([b"\\x07junk", user_event(1), END])])
    for attempt in range(2):
        try:
            next(gate)
        except fb.errors.CorruptRecordError as exc:
            assert "unknown event kind 7" in str(exc), exc
        else:
            raise AssertionError("a malformed event was accepted")
    gate.close()
    print("ok")
""")


@pytest.fixture(scope="module")
def list_channel_module(tmp_path_factory):
    """Build the extension (without a sanitizer preload: the compiler is not
    built for it) and return its directory."""
    where = tmp_path_factory.mktemp("list_channel")
    (where / "list_channel.pyx").write_text(PYX)
    (where / "setup.py").write_text(SETUP)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return where


def test_cython_channels_and_malformed_events(list_channel_module):
    """A channel written in Cython hands the gate raw items, as remote
    channels will; a malformed event is a CorruptRecordError that fails the
    gate for good."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(list_channel_module), ROOT]))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SCRIPT],
                          cwd=list_channel_module, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


SELECTOR_SCRIPT = textwrap.dedent("""
    import flinkbuf as fb
    from list_channel import FixedSelector

    nbp = fb.NetworkBufferPool(64, 256)
    for channel in (2, 3, 16, 2**31 - 1, -2, -3, -2**31):
        part = fb.io.create_partition(nbp, 2)
        gate = fb.InputGate([(part, 0), (part, 1)])
        writer = fb.RecordWriter(part, FixedSelector(channel), buffer_timeout=None)
        for attempt in range(3):
            try:
                writer.emit((attempt, "x" * 100))
            except IndexError as exc:
                assert f"channel {channel}, not in [0, 2)" in str(exc), exc
            else:
                raise AssertionError(f"channel {channel} was accepted")
        writer.close()                      # nothing was left half written
        assert list(gate) == []
        gate.close()
    print("ok")
""")


def test_a_cython_selector_cannot_pick_a_channel_outside_the_writer(list_channel_module):
    """A selector compiled in Cython returns whatever it likes from _select:
    the writer indexed its channel lists with it unchecked (a segfault for
    any channel past the end).  Every channel is now checked."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(list_channel_module), ROOT]))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", SELECTOR_SCRIPT],
                          cwd=list_channel_module, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"
